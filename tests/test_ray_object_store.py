"""Groups on an object store (``s3://``, an S3 API server on loopback: moto's
server mode) read by Ray's workers with ``read_on_workers=True``: the driver
reads the key columns only, each Ray task reads its batch's groups from the
objects through pyarrow's S3 filesystem."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

import manymodels as mm
from manymodels.inputs.parquetgroups import ParquetGroups
from test_read_on_workers import _UNTIMED, _write_both, s3  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.slow, pytest.mark.ray]


@pytest.fixture
def ray_after_s3(s3):  # noqa: F811 (the fixture imported above)
    """A local Ray started once the AWS SDK's variables name the server: its
    workers find the endpoint and the keys in their environment, as the
    workers of a cluster configured for S3 do."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield s3
    ray.shutdown()


def rows_and_process(df):
    return {"rows": len(df), "sum_y": float(df["y"].sum()), "pid": os.getpid()}


def test_ray_workers_read_the_groups_from_the_object_store(ray_after_s3, tmp_path, sales,
                                                           monkeypatch):
    ordered = sales.sort_values(["store", "item"], kind="stable")
    stores = ordered["store"].unique()  # objects in key order: scanned, nothing staged
    parts = {f"part-{i}.parquet": ordered[ordered["store"].isin(chunk)]
             for i, chunk in enumerate(np.array_split(stores, 3))}
    location = _write_both(ray_after_s3, tmp_path, "ray", parts)
    source = mm.groups(location, by="store", read_on_workers=True)

    def read_here(*args, **kwargs):
        raise AssertionError("the driver read the groups' rows")

    monkeypatch.setattr(ParquetGroups, "read", read_here)  # in this process only
    lazy = mm.train(rows_and_process, source, backend="ray", workers=2, progress=False)
    monkeypatch.undo()
    eager = mm.train(rows_and_process, mm.groups(tmp_path / "ray", by="store"),
                     backend="serial", progress=False)
    assert getattr(source, "_sorted_groups", None) is None  # scanned, not sorted here
    assert lazy.failed.empty and len(lazy.results) == len(stores)
    assert os.getpid() not in set(lazy.results["pid"])  # fit ran in Ray's workers
    pd.testing.assert_frame_equal(lazy.results.drop(columns=[*_UNTIMED, "pid"]),
                                  eager.results.drop(columns=[*_UNTIMED, "pid"]))
