"""The Ray Serve deployment (``manymodels.serve.ray``) on a real local Ray
Serve: its answers equal ``Store.predict``'s, models coming through
``@serve.multiplexed``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import Ridge

import manymodels as mm
from serve_helpers import call, free_port

pytestmark = [pytest.mark.ray, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]
serve = pytest.importorskip("ray.serve")


def fit(df):
    return Ridge().fit(df[["price", "promo"]], df["sales"])


def test_ray_serve_multiplexed_deployment_equals_store_predict(tmp_path):
    import ray

    from manymodels.serve.ray import deployment

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"store": rng.integers(0, 8, 800), "price": rng.random(800),
                          "promo": rng.integers(0, 2, 800)})
    frame["sales"] = frame.price * (frame.store + 1) + frame.promo + rng.random(800)
    mm.train(fit, mm.groups(frame[frame.store < 6], by="store"), store=tmp_path / "m",
             backend="serial", progress=False)
    store = mm.Store(tmp_path / "m")
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(deployment(str(tmp_path / "m"), max_models_per_replica=2,
                             ray_actor_options={"num_cpus": 0}).bind(), route_prefix="/")
        for key in (0, 3, 5, 0, 1, 7):
            rows = [{"store": key, "price": float(p), "promo": 1} for p in rng.random(3)]
            answer = call(f"http://127.0.0.1:{port}/", "POST", {"rows": rows},
                          headers={"serve_multiplexed_model_id": str(key)})
            assert answer.status == 200, answer.body
            body = answer.json()
            if key < 6:
                want = store.predict(pd.DataFrame(rows), by="store", with_source=True)
                assert body["predictions"] == want["prediction"].tolist()
                assert body["source"] == ["group"] * 3
            else:
                assert body["source"] == ["none"] * 3 and body["predictions"] == [None] * 3
        missing = call(f"http://127.0.0.1:{port}/", "POST", {"rows": [{"store": 1}]},
                       headers={"serve_multiplexed_model_id": "1"})
        assert missing.status == 422
    finally:
        serve.shutdown()
        ray.shutdown()
