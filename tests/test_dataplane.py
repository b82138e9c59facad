"""The data plane's way back: large results travel in files, not pipes."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

import manymodels as mm
from conftest import BACKENDS, shm_files
from manymodels.engine import dataplane

pytestmark = pytest.mark.usefixtures("no_leftovers")


def big_model(seed):
    rng = np.random.default_rng(seed)
    # a model with one large array (spilled) and small parts (kept in the pickle)
    return [rng.normal(size=(300, 200)), np.float64(seed), [seed]], {"seed": seed}


@pytest.mark.parametrize("backend", BACKENDS)
def test_large_models_come_back_equal_and_writable(backend):
    run = mm.train(big_model, mm.grid(seed=list(range(12))), backend=backend, workers=2,
                   progress=False)
    assert run.failed.empty and len(run.models) == 12
    for seed, model in run.models.items():
        weights, bias, small = model
        np.testing.assert_array_equal(weights, big_model(seed)[0][0])
        assert bias == seed and small == [seed]
        weights[0, 0] = 1.0  # a private copy-on-write mapping: writable
    assert not shm_files()  # every spill file was removed once read


def test_spilled_buffers_round_trip_and_small_ones_stay_in_band():
    obj = {"large": np.arange(700_000, dtype=np.int64), "tiny": np.arange(3)}  # 5.6 MB: mapped
    body, spill = dataplane.dumps_spilling(obj, pickle.dumps, f"manymodels-{os.getpid()}-test", [0])
    assert spill is not None and len(spill[1]) == 1  # only the large array left the pickle
    assert len(body) < 1_000
    back = dataplane.loads_spilled(body, spill)
    np.testing.assert_array_equal(back["large"], obj["large"])
    np.testing.assert_array_equal(back["tiny"], obj["tiny"])
    back["large"][:10] = -1  # a private copy-on-write mapping: writable
    assert not shm_files()
    assert dataplane.dumps_spilling({"tiny": np.arange(3)}, pickle.dumps,
                                    f"manymodels-{os.getpid()}-test", [0])[1] is None


def test_cleanup_removes_spill_files_nobody_read():
    files = dataplane.RunFiles()
    body, spill = dataplane.dumps_spilling(np.zeros(100_000), pickle.dumps,
                                           files.spill_prefix, [0])
    assert spill is not None and shm_files()  # as a worker killed before sending leaves it
    files.cleanup()
    assert not shm_files()


def _run_file_modes(df, driver, **_shared):
    """The permission bits of this run's files, seen from inside a task."""
    import stat
    from pathlib import Path

    modes = {}
    for root in (Path("/dev/shm"), Path(__import__("tempfile").gettempdir())):
        for path in root.glob(f"manymodels-{driver}-*"):
            modes[path.name.split("-", 3)[-1]] = stat.S_IMODE(path.stat().st_mode)
    return modes, {"files": len(modes)}


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_run_files_in_shared_memory_are_owner_only(start_method):
    import pandas as pd

    frame = pd.DataFrame({"g": [1, 1, 2, 2], "x": [1.0, 2.0, 3.0, 4.0]})
    old_umask = os.umask(0o022)
    try:
        run = mm.train(_run_file_modes, mm.groups(frame, by="g"), backend="processes",
                       workers=2, start_method=start_method, progress=False,
                       shared={"driver": os.getpid(), "big": np.zeros(200_000)})
    finally:
        os.umask(old_umask)
    assert run.failed.empty
    seen = {}
    for modes in run.models.values():
        seen.update(modes)
    assert seen, "the run wrote no files to check"
    assert all(mode == 0o600 for mode in seen.values()), seen


def pickle_small_array(array):
    """:func:`dataplane.small_array_parts` joined: what a pack stores reads back as."""
    parts = dataplane.small_array_parts(array)
    return None if parts is None else b"".join(parts)


@pytest.mark.parametrize("array", [
    np.arange(3.0), np.arange(12, dtype=np.int32).reshape(3, 4), np.array([1 + 2j]),
    np.zeros(5, dtype=">f4"), np.array(["ab", "c"]), np.array([True, False]),
    np.frombuffer(b"abcdefgh"),  # read-only
    np.array(2.5),  # 0-d
])
def test_small_array_pickles_equal_the_picklers_bytes(array):
    """The fast path for tiny models must give the same bytes (so the same
    SHA-256 and store artifact) as pickle.dumps, and load back equal."""
    for values in (array, array.copy() if array.flags.writeable else array):
        data = pickle_small_array(values)
        assert data == pickle.dumps(values, protocol=5)
        again = pickle.loads(data)
        assert again.dtype == values.dtype and again.shape == values.shape
        assert again.tobytes() == values.tobytes()
    if array.flags.writeable and array.size:
        other = np.frombuffer(np.random.default_rng(0).bytes(array.nbytes), dtype=np.uint8)
        other = other.view(array.dtype).reshape(array.shape).copy()
        assert pickle_small_array(other) == pickle.dumps(other, protocol=5)


def test_small_array_pickles_follow_the_buffer_and_the_dtype_metadata():
    broadcast, _ = np.broadcast_arrays(np.arange(3.0), np.zeros((1, 3)))  # read-only buffer
    assert pickle_small_array(broadcast) == pickle.dumps(broadcast, protocol=5)
    tagged = np.arange(5.0, dtype=np.dtype("f8", metadata={}))
    assert pickle_small_array(tagged) is None
    plain = np.arange(5.0)
    assert pickle_small_array(plain) == pickle.dumps(plain, protocol=5)
    for byte in range(256):  # a one-byte probe may appear in the header: never wrong bytes
        one = np.array([byte], dtype=np.uint8)
        assert pickle_small_array(one) in (None, pickle.dumps(one, protocol=5))


def test_small_array_pickles_never_take_the_last_kind_for_another():
    """The kind last cut is reused by identity: an array that differs from
    it in writeability, shape, dtype or order must not get its cut."""
    read_only = np.frombuffer(np.arange(3.0).tobytes())
    arrays = [np.arange(3.0), read_only, np.arange(3.0) + 1, np.arange(4.0),
              np.arange(3), np.arange(3.0).astype(">f8"), np.arange(3.0, dtype=np.float32),
              np.arange(3.0).reshape(1, 3), np.arange(3.0)]
    for array in arrays + arrays[::-1]:
        assert pickle_small_array(array) == pickle.dumps(array, protocol=5)
    pickle_small_array(np.arange(3.0))
    assert pickle_small_array(np.arange(6.0)[::2]) is None  # same dtype and shape, strided


@pytest.mark.parametrize("value", [
    np.arange(6.0).reshape(2, 3).T,  # not C-ordered
    np.array([object(), 1], dtype=object),
    np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")]),  # fields
    np.array(["2020-01-01"], dtype="M8[D]"),  # no buffer to export
    np.zeros(1 << 14),  # large: its buffer goes out of band
    np.zeros(0),
    [1.0, 2.0],
    np.float64(1.0),
])
def test_small_array_pickles_refuse_what_they_cannot_copy(value):
    assert pickle_small_array(value) is None
