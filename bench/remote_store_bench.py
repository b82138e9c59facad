"""A store on an object store against a local store: what publishing the
index whole costs.

    python bench/remote_store_bench.py [--groups 200000] [--out FILE]

Workload: ``--groups`` groups of 10 seeded rows, one ``np.polyfit`` line
each (a model of a few dozen bytes: packed in the index, so the index is
what grows), on 2 process workers, with ``store=`` first a local folder,
then ``s3://`` on an S3 API server on loopback (moto's server mode, in this
process: no network, so what it shows is the driver's own cost, snapshot,
hash and upload, not a real store's bandwidth). Each store: a first run, then
an unchanged re-run (every model reused, one new run published). Then the
store is opened as another machine would (an empty cache folder: the index
downloaded, checked and installed). One run of each; the machine's load
average is recorded. A table is printed, and JSON written to
bench/results/remote_store_bench.json.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import BENCH_DIR, machine_info, print_and_write  # noqa: E402


def fit(arrays):
    return np.polyfit(arrays["x"], arrays["y"], 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=200_000)
    parser.add_argument("--out", type=Path,
                        default=BENCH_DIR / "results" / "remote_store_bench.json")
    args = parser.parse_args()

    from moto.server import ThreadedMotoServer
    from pyarrow import fs

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    filesystem = fs.S3FileSystem(access_key="testing", secret_key="testing", scheme="http",
                                 endpoint_override=f"{host}:{port}", region="us-east-1",
                                 allow_bucket_creation=True)
    filesystem.create_dir("bucket")
    location = (f"s3://testing:testing@bucket/models?endpoint_override={host}:{port}"
                "&scheme=http&region=us-east-1")
    work = Path(tempfile.mkdtemp(prefix="remote-store-bench-"))
    os.environ["MANYMODELS_CACHE_DIR"] = str(work / "cache-here")
    import manymodels as mm

    rng = np.random.default_rng(0)
    groups = args.groups
    table = pd.DataFrame({"g": np.repeat(np.arange(groups), 10),
                          "x": rng.random(groups * 10), "y": rng.random(groups * 10)})
    numbers: dict = {"groups": groups, "load_average_before": os.getloadavg()[0]}
    for name, store in (("local", str(work / "local")), ("object store", location)):
        for case in ("first run", "unchanged re-run"):
            began = time.perf_counter()
            run = mm.train(fit, mm.groups(table, by="g", format="numpy"), store=store,
                           progress=False, workers=2)
            numbers[f"{name}: {case} (s)"] = round(time.perf_counter() - began, 3)
            assert (run.results["status"] == "ok").all()
    published = [entry.size for entry in filesystem.get_file_info(
        fs.FileSelector("bucket/models/indexes")) if entry.size]
    numbers["published index (MB)"] = round(sum(published) / 1e6, 1)
    os.environ["MANYMODELS_CACHE_DIR"] = str(work / "cache-elsewhere")
    began = time.perf_counter()
    opened = mm.Store(location, read_only=True)
    numbers["open on another machine (s)"] = round(time.perf_counter() - began, 3)
    assert len(opened.runs()) == 2
    numbers["load_average_after"] = os.getloadavg()[0]
    numbers["machine"] = machine_info()
    server.stop()
    print_and_write(numbers, args.out)


if __name__ == "__main__":
    main()
