"""The servers bench/serve_bench.py compares manymodels serve with, on the
same Ridge store: a plain FastAPI endpoint that unpickles the model's own
file for each request (no check of its bytes), and Ray Serve's multiplexed
deployment of the store (``manymodels.serve.ray``) with its cache of models
per replica raised to the bench's ``--cache-models``."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path


def export_pickles(store_path: Path, stores: Path) -> Path:
    """Each model of the store as its own pickle file (the plain endpoint's),
    kept beside the cached stores."""
    import manymodels as mm

    out = stores / f"pickles-{store_path.name}"
    if (out / "done").is_file():
        return out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    store = mm.Store(store_path)
    for key, model in store.models().items():
        (out / f"{key}.pkl").write_bytes(pickle.dumps(model))
    store.close()
    (out / "done").write_text("")
    return out

FASTAPI = """
import pickle, sys
import numpy as np, uvicorn
from fastapi import FastAPI, Request
app = FastAPI()
folder = sys.argv[1]
@app.post("/v1/predict")
async def predict(request: Request):
    rows = (await request.json())["rows"]
    out = []
    for row in rows:
        with open(f"{folder}/{row['key']}.pkl", "rb") as f:
            model = pickle.load(f)  # unverified bytes, every request
        out.append(float(model.predict(np.array([[row["x"], row["z"]]]))[0]))
    return {"predictions": out}
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[-1]), log_level="warning")
"""

RAY = """
import sys, time
import ray
from ray import serve
from manymodels.serve.ray import deployment
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[-1])})
serve.run(deployment(sys.argv[1], max_models_per_replica=int(sys.argv[2]), poll=None,
                     ray_actor_options={"num_cpus": 0}).bind(), route_prefix="/")
while True:
    time.sleep(3600)
"""
