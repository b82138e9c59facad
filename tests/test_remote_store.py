"""A store on an object store (``store="s3://..."``), against an S3 API server
on loopback (moto's server mode): model files uploaded by the workers, the
index published whole from a local copy, read back from another machine
(another cache folder), a killed driver's runs kept, and what is refused."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import manymodels as mm
from conftest import s3_server
from manymodels.cli import app
from manymodels.store import StoreError, StoreIntegrityError
from serve_helpers import Server, call

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

#: The suite's engines this module uses, kept up from the module before (conftest).
SHARED_ENGINES = ("dask",)


@pytest.fixture(scope="module")
def s3():
    """An S3 API server on loopback with a bucket "bucket"; yields a function
    that makes a store's URI there (the endpoint and keys in its query, so
    that workers need nothing in their environment) and a pyarrow filesystem
    on it, to look at the objects."""
    for options, filesystem in s3_server():

        def uri(name: str, bucket: str = "bucket", options: str = options) -> str:
            return f"s3://testing:testing@{bucket}/{name}?{options}"

        yield uri, filesystem


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """Switch to "another machine": a cache folder of its own for the copies
    of remote stores' indexes (workers started after the switch inherit it)."""
    def switch(name: str) -> str:
        folder = tmp_path / f"cache-{name}"
        monkeypatch.setenv("MANYMODELS_CACHE_DIR", str(folder))
        return str(folder)

    switch("a")
    return switch


def objects(filesystem, prefix: str) -> dict[str, int]:
    from pyarrow import fs

    found = filesystem.get_file_info(fs.FileSelector(f"bucket/{prefix}", recursive=True,
                                                     allow_not_found=True))
    return {entry.path[len(f"bucket/{prefix}/"):]: entry.size for entry in found
            if entry.type == fs.FileType.File}


class Scaled:
    """A model whose size the test picks: large ones (1 MiB or more) are
    files of the store, uploaded by the worker; small ones are packed in the
    index."""

    def __init__(self, factor: float, size: int) -> None:
        self.factor, self.padding = factor, np.zeros(size)

    def predict(self, X):
        return np.asarray(X, dtype=float)[:, 0] * self.factor


def fit_scaled(df):
    group = int(df["g"].iloc[0])
    return Scaled(float(df["x"].sum()), 200_000 if group % 2 else 4), {"rows": len(df)}


def table(groups: int = 6, shift: float = 0.0) -> pd.DataFrame:
    return pd.DataFrame({"g": np.repeat(np.arange(groups), 4),
                         "x": np.arange(groups * 4, dtype=float) + shift})


def test_a_store_on_an_object_store_trains_reuses_and_serves_from_another_machine(
        s3, machine, tmp_path, monkeypatch):
    """The workers upload the large models, the driver publishes the index;
    another machine's re-run reuses every model, reads them back checked, and
    predicts with them; its models are served by `manymodels serve`."""
    from manymodels.engine import modelfiles

    uri, filesystem = s3
    location = uri("models")
    uploaded_here = []  # by the driver (the workers are other processes)
    real_upload = modelfiles.upload
    monkeypatch.setattr(modelfiles, "upload", lambda where, data: (
        uploaded_here.append(where), real_upload(where, data)))
    run = mm.train(fit_scaled, mm.groups(table(), by="g"), store=location,
                   backend="processes", workers=2, progress=False)
    monkeypatch.setattr(modelfiles, "upload", real_upload)
    assert (run.results["status"] == "ok").all()
    # the driver put only the run's marker there: the models are the workers'
    assert len(uploaded_here) == 1 and "/.run-1-" in uploaded_here[0]
    files = objects(filesystem, "models")
    large = {name for name in files if name.startswith("artifacts/")}
    assert len(large) == 3 and all(files[name] > 2**20 for name in large)
    assert not any("/.run-" in name or "/.tmp-" in name for name in files)  # markers gone
    published = [name for name in files if name.startswith("indexes/")]
    assert len(published) == 1 and "index.current" in files

    machine("b")
    again = mm.train(fit_scaled, mm.groups(table(), by="g"), store=location,
                     backend="processes", workers=2, progress=False)
    assert again.results["reused"].all()
    store = mm.Store(location)
    assert list(store.runs()["reused"]) == [0, 6]
    assert "testing:***@" in repr(store) and ":testing@" not in repr(store)
    for group in range(6):
        model = store.load(group)
        assert model.factor == table()[table().g == group].x.sum()
    # one published index is kept: the one it replaced is gone
    assert len([n for n in objects(filesystem, "models") if n.startswith("indexes/")]) == 1

    rows = pd.DataFrame({"g": [0, 1, 5, 9], "x": [1.0, 2.0, 3.0, 4.0]})
    predicted = store.predict(rows, by="g", workers=2)
    assert predicted[:3].tolist() == [1.0 * store.load(0).factor, 2.0 * store.load(1).factor,
                                      3.0 * store.load(5).factor]
    assert np.isnan(predicted[3])

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(  # the server unpickles Scaled
        [os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    with open(tmp_path / "serve.log", "w") as log:
        server = Server(location, "--poll", "0.5", log=log)
        try:
            answer = call(f"{server.url}/v1/predict", "POST",
                          {"rows": [{"g": 1, "x": 2.0}]})
            assert answer.status == 200, answer.body
            assert answer.json()["predictions"] == [2.0 * store.load(1).factor]
            # a run published from a third machine is served once polled
            machine("c")
            mm.train(fit_scaled, mm.groups(table(shift=1.0), by="g"), store=location,
                     backend="serial", progress=False)
            expected = 2.0 * mm.Store(location).load(1).factor
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                answer = call(f"{server.url}/v1/predict", "POST",
                              {"rows": [{"g": 1, "x": 2.0}]})
                if answer.json()["predictions"] == [expected]:
                    break
                time.sleep(0.5)
            assert answer.json()["predictions"] == [expected]
        finally:
            server.close()


_KILLED_DRIVER = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np, pandas as pd
    import manymodels as mm

    def fit(df):
        if int(df["g"].iloc[0]) == 5 and sys.argv[2] == "kill":  # after 5 tasks committed
            time.sleep(3)
            os.kill(int(os.environ["DRIVER_PID"]), signal.SIGKILL)
            time.sleep(30)
        return np.zeros(4) + len(df)

    os.environ["DRIVER_PID"] = str(os.getpid())
    frame = pd.DataFrame({"g": np.repeat(np.arange(8), 3), "x": np.arange(24.0)})
    mm.train(fit, mm.groups(frame, by="g"), store=sys.argv[1], backend="processes",
             workers=1, progress=False)
""")


def _killed_driver(location: str, kill: bool = True) -> None:
    """A driver killed (SIGKILL, by its worker) after 5 of its 8 tasks; with
    ``kill=False``, the same job run to its end."""
    done = subprocess.run([sys.executable, "-c", _KILLED_DRIVER, location,
                           "kill" if kill else "run"],
                          capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert done.returncode == (-9 if kill else 0), done.stderr


def test_a_killed_drivers_finished_tasks_are_published_by_the_next_open(s3, machine):
    """A driver killed mid-run published nothing; its finished tasks are in
    its machine's copy, published by the next open there: another machine
    then sees them, and its re-run reuses them."""
    uri, _ = s3
    location = uri("killed")
    _killed_driver(location)
    machine("b")
    with pytest.raises(StoreError, match="does not exist"):
        mm.Store(location, read_only=True)
    machine("a")
    mm.Store(location).close()  # the next open on machine a publishes
    machine("b")
    runs = mm.Store(location, read_only=True).runs()
    assert list(runs["status"]) == ["interrupted"] and runs["ok"].iloc[0] == 5
    _killed_driver(location, kill=False)
    runs = mm.Store(location, read_only=True).runs()
    assert list(runs["status"]) == ["interrupted", "finished"]
    assert list(runs["reused"]) == [0, 5] and runs["ok"].iloc[1] == 8


def _respelled(location: str) -> str:
    """The store at ``location`` spelled otherwise: no keys in the URI (the
    SDK's own, from the environment), its options in reverse order, a
    trailing slash."""
    from urllib.parse import urlsplit

    parts = urlsplit(location)
    return parts._replace(netloc=parts.netloc.rpartition("@")[2], path=parts.path + "/",
                          query="&".join(reversed(parts.query.split("&")))).geturl()


def test_one_store_spelled_two_ways_shares_this_machines_copy(s3, machine, monkeypatch):
    """A driver killed on one spelling of the store's URI; the re-run with
    another (options reordered, the keys from the environment, not the URI)
    finds its finished tasks in the same copy: it publishes and reuses them,
    and the first spelling then opens, not refused as another machine's."""
    from manymodels.store.remote import RemoteIndex

    uri, _ = s3
    location = uri("respelled")
    other = _respelled(location)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "someone-else")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "other-secret")
    _killed_driver(location)
    _killed_driver(other, kill=False)
    for spelling in (location, other):
        runs = mm.Store(spelling).runs()
        assert list(runs["status"]) == ["interrupted", "finished"]
        assert list(runs["reused"]) == [0, 5] and runs["ok"].iloc[1] == 8
    assert RemoteIndex(location).copy == RemoteIndex(other).copy


def test_a_stores_copy_is_named_by_the_store_not_by_its_uris_text():
    """What names the copy: the bucket, the path and the endpoint (another
    server); not the keys, the region, the protocol or the options' order."""
    from manymodels.store.localcopy import copy_folder

    def copy(location: str):
        return copy_folder(location)  # (no server reached)

    base = "s3://K1:S1@bucket/models?endpoint_override=127.0.0.1:9000&scheme=http&region=x"
    same = ["s3://bucket/models/?region=y&endpoint_override=127.0.0.1:9000",
            "s3://K2:S2@bucket/models?scheme=https&endpoint_override=http://127.0.0.1:9000/"
            "&access_key=K3&secret_key=S3&allow_bucket_creation=true",
            "S3://bucket/%6Dodels?endpoint_override=127.0.0.1%3A9000"]
    assert {copy(location) for location in same} == {copy(base)}
    others = ["s3://bucket/models?endpoint_override=127.0.0.1:9001",
              "s3://bucket/models", "s3://bucket/models2?endpoint_override=127.0.0.1:9000",
              "s3://bucket2/models?endpoint_override=127.0.0.1:9000"]
    assert len({copy(location) for location in [base, *others]}) == 5


def test_an_endpoint_given_by_the_environment_names_the_copy_too(monkeypatch):
    """AWS_ENDPOINT_URL (the SDK's own way to name another server) was left
    out of the copy's name: two servers' stores at one bucket and path
    shared one copy of their indexes."""
    from manymodels.store.localcopy import copy_folder

    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    plain = copy_folder("s3://bucket/models")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    by_environment = copy_folder("s3://bucket/models")
    assert by_environment != plain
    assert by_environment == copy_folder("s3://bucket/models?endpoint_override=127.0.0.1:9000")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "https://127.0.0.1:9001/")  # the S3 one first
    assert copy_folder("s3://bucket/models") == copy_folder(
        "s3://bucket/models?endpoint_override=127.0.0.1:9001")
    assert copy_folder("s3://bucket/models?endpoint_override=127.0.0.1:9000") == by_environment


def _as_an_earlier_version_left_it(location: str, record: bool = True):
    """Move this machine's copy of ``location`` to the folder an earlier
    version named by the URI's text (without its record of what it was
    synced with where ``record`` is false: a store never published then);
    that folder."""
    import hashlib
    import shutil

    from manymodels.inputs.objectstores import shown
    from manymodels.store.localcopy import cache_folder
    from manymodels.store.remote import RemoteIndex

    copy = RemoteIndex(location).copy
    older = cache_folder() / "stores" / hashlib.sha256(
        shown(location).rstrip("/").encode()).hexdigest()[:32]
    assert older != copy
    shutil.move(copy, older)
    if not record:
        (older / "remote.json").unlink()
    return older


def test_a_copy_made_by_an_earlier_version_is_taken_over(s3, machine):
    """A killed run's copy in the folder an earlier version named by the
    URI's text: the next open, spelled that way or (where the copy says
    which store's it is) another, moves it to the store's folder and
    publishes its run, not refused; a re-run reuses its tasks."""
    from manymodels.store.remote import RemoteIndex

    uri, _ = s3
    location = uri("earlier")
    mm.train(lambda df: len(df), mm.groups(table(), by="g"), store=location,
             backend="serial", progress=False)
    _killed_driver(location)
    older = _as_an_earlier_version_left_it(location)
    mm.Store(_respelled(location).replace("s3://", "s3://testing:testing@")).close()
    assert not older.exists() and RemoteIndex(location).copy.exists()
    machine("b")
    assert list(mm.Store(location, read_only=True).runs()["status"]) == [
        "finished", "interrupted"]
    _killed_driver(location, kill=False)
    assert list(mm.Store(location, read_only=True).runs()["reused"]) == [0, 0, 5]

    machine("a")  # a store never published: its copy has no record, found by its text
    location = uri("earlier-unpublished")
    _killed_driver(location)
    older = _as_an_earlier_version_left_it(location, record=False)
    mm.Store(location).close()
    assert not older.exists()
    machine("b")
    assert list(mm.Store(location, read_only=True).runs()["status"]) == ["interrupted"]


def test_two_machines_that_both_wrote_are_refused_not_merged(s3, machine):
    """Machine a's copy holds a killed run, not published; machine b has
    published since: a's open is refused, naming a's copy, and nothing is
    overwritten on the object store."""
    uri, _ = s3
    location = uri("conflict")
    mm.train(lambda df: len(df), mm.groups(table(), by="g"), store=location,
             backend="serial", progress=False)
    _killed_driver(location)  # on machine a, after the run above
    copy = machine("a")
    machine("b")
    mm.train(lambda df: len(df) + 1, mm.groups(table(), by="g"), store=location,
             backend="serial", progress=False)
    machine("a")
    with pytest.raises(StoreError, match="written from another machine") as error:
        mm.Store(location)
    assert copy in str(error.value)
    machine("c")
    assert len(mm.Store(location, read_only=True).runs()) == 2  # b's, not a's


def _two_runs_the_first_deleted(location: str) -> mm.Store:
    """Two runs of 3 large and 3 small models each, none shared; the first
    deleted (and published): the store, open."""
    first = mm.train(fit_scaled, mm.groups(table(), by="g"), store=location,
                     backend="serial", progress=False)
    mm.train(fit_scaled, mm.groups(table(shift=100.0), by="g"), store=location,
             backend="serial", progress=False)
    store = mm.Store(location)
    store.delete(first.run_id)
    return store


def test_delete_and_gc_remove_the_objects_no_run_names(s3, machine):
    """gc on an object store: the objects of a deleted run's models go (those
    a kept run names stay), and another machine sees the published result."""
    uri, filesystem = s3
    location = uri("collected")
    store = _two_runs_the_first_deleted(location)
    assert store.gc() == 6  # 3 large (objects) and 3 packed models
    left = {n for n in objects(filesystem, "collected") if n.startswith("artifacts/")}
    assert len(left) == 3
    machine("b")
    other = mm.Store(location, read_only=True)
    assert list(other.runs()["run_id"]) == [2]
    assert {f"artifacts/{a[:2]}/{a}" for a in other.results()["artifact"]
            if isinstance(a, str) and len(a) == 64} == left


def test_gc_removes_only_the_stores_own_stray_indexes(s3, machine, monkeypatch):
    """Under ``indexes/`` gc removes an old published index no pointer names
    (``<sha256>.sqlite``), not another program's files beside them."""
    import hashlib

    from manymodels.store import remote

    uri, filesystem = s3
    location = uri("foreign")
    mm.train(fit_scaled, mm.groups(table(2), by="g"), store=location, backend="serial",
             progress=False)
    stray = f"indexes/{hashlib.sha256(b'cut short').hexdigest()}.sqlite"
    foreign = ["indexes/notes.txt", "indexes/other-app.idx", "indexes/index.sqlite",
               f"indexes/{'A' * 64}.sqlite", "artifacts/README.md"]
    for name in [stray, *foreign]:
        with filesystem.open_output_stream(f"bucket/foreign/{name}") as out:
            out.write(b"not the store's")
    monkeypatch.setattr(remote, "STRAY_AGE_S", 0.0)  # (as if they were an hour old)
    time.sleep(1.1)  # (the object store's clock counts seconds)
    mm.Store(location).gc()
    left = objects(filesystem, "foreign")
    current = f"indexes/{_pointer(filesystem, 'foreign')}.sqlite"
    assert stray not in left
    assert current in left and all(name in left for name in foreign)


def test_a_changed_object_is_refused_and_trained_again(s3, machine):
    """A model object changed on the object store is never unpickled: its
    load is refused, and the next run trains its group again."""
    uri, filesystem = s3
    location = uri("changed")
    mm.train(fit_scaled, mm.groups(table(), by="g"), store=location, backend="serial",
             progress=False)
    name = sorted(n for n in objects(filesystem, "changed") if n.startswith("artifacts/"))[0]
    with filesystem.open_output_stream(f"bucket/changed/{name}") as out:
        out.write(b"x" * (2**20 + 5))
    store = mm.Store(location)
    broken = [g for g in range(6) if store.results().set_index("g").loc[g, "artifact"]
              == name.rsplit("/", 1)[1]]
    with pytest.raises(StoreIntegrityError, match="does not match"):
        store.load(broken[0])
    again = mm.train(fit_scaled, mm.groups(table(), by="g"), store=location,
                     backend="serial", progress=False, verify=True)
    assert set(again.results.loc[~again.results["reused"], "g"]) == set(broken)
    assert mm.Store(location).load(broken[0]).factor == table()[
        table().g == broken[0]].x.sum()


def test_bad_locations_are_refused_before_any_work(s3, machine, tmp_path):
    uri, _ = s3
    called = []

    def fit(df):
        called.append(1)
        return len(df)

    with pytest.raises(StoreError, match="bucket 'nobucket' does not exist"):
        mm.train(fit, mm.groups(table(), by="g"), store=uri("models", bucket="nobucket"),
                 backend="serial", progress=False)
    with pytest.raises(StoreError, match="'#'"):
        mm.Store("s3://bucket/a#b")
    assert called == []
    # the CLI names the store that is not there, in one line
    result = CliRunner().invoke(app, ["runs", uri("nothing-here")])
    assert result.exit_code == 2 and "does not exist" in result.output
    assert "testing:testing" not in result.output
    # this machine's copy of an index opens for reading only
    location = uri("copied")
    mm.train(lambda df: len(df), mm.groups(table(), by="g"), store=location,
             backend="serial", progress=False)
    copy = mm.Store(location).path
    assert mm.Store(copy).read_only and len(mm.Store(copy).runs()) == 1
    with pytest.raises(StoreError, match="opens for reading only"):
        mm.Store(copy, read_only=False)


def test_a_write_that_fails_names_the_store_by_its_uri(s3, machine):
    """A model that cannot be uploaded (its bucket removed mid-run) ends
    the run with an error that names the store as the user gave it, its
    key as ***: not this machine's copy of its index, a folder the user
    never named."""
    from pyarrow import fs

    from manymodels.store.localcopy import copy_folder

    uri, filesystem = s3
    filesystem.create_dir("doomed")
    location = uri("models", bucket="doomed")
    owner = fs.S3FileSystem(access_key="testing", secret_key="testing", scheme="http",
                            endpoint_override=location.split("endpoint_override=")[1]
                            .split("&")[0], region="us-east-1", allow_bucket_deletion=True)

    def fit(df):
        if int(df["g"].iloc[0]) == 1:
            owner.delete_dir("doomed")
        return Scaled(1.0, 200_000)  # a model file, uploaded

    with pytest.raises(StoreError) as refused:
        mm.train(fit, mm.groups(table(3), by="g"), store=location, backend="serial",
                 progress=False)
    assert "cannot write to the store 's3://testing:***@doomed/models?" in str(refused.value)
    assert str(copy_folder(location)) not in str(refused.value)


def test_mm_linear_saves_into_and_reuses_from_an_object_store(s3, machine):
    """mm.linear(store=URI): its result is published; another machine's
    unchanged re-run fits nothing and equals it."""
    from test_linear import FEATURES, sales

    uri, _ = s3
    location, frame = uri("linear"), sales(40)
    first = mm.linear(frame, by=["store", "item"], features=FEATURES, target="y",
                      store=location)
    assert first.fitted == len(first)
    machine("b")
    again = mm.linear(frame, by=["store", "item"], features=FEATURES, target="y",
                      store=location)
    assert (again.fitted, again.reused) == (0, len(first))
    pd.testing.assert_frame_equal(first.coefficients, again.coefficients)
    assert list(mm.Store(location, read_only=True).runs()["reused"]) == [0, len(first)]


def fit_neighbours(df):
    """A model any worker can unpickle (scikit-learn's): large (its training
    rows repeated past 1 MiB) for the odd groups."""
    from sklearn.neighbors import KNeighborsRegressor

    times = 20_000 if int(df["g"].iloc[0]) % 2 else 1
    return KNeighborsRegressor(n_neighbors=1).fit(np.tile(df[["x"]].to_numpy(), (times, 1)),
                                                  np.tile(df["x"].to_numpy() * 2, times))


def test_an_engine_trains_into_and_predicts_from_an_object_store(s3, machine, engine):
    """On Spark and Dask: the engine's workers upload the large models
    themselves, and Store.predict of the engine's DataFrame has each
    executor open the store by its URI (its own copy of the index)."""
    from test_engine_frames import _engine_frame

    uri, filesystem = s3
    name, _ = engine
    location = uri(f"engine-{name}")
    run = mm.train(fit_neighbours, mm.groups(table(), by="g"), store=location, backend=name,
                   progress=False)
    assert (run.results["status"] == "ok").all()
    assert len([n for n in objects(filesystem, f"engine-{name}")
                if n.startswith("artifacts/")]) == 3
    machine("b")
    rows = pd.DataFrame({"g": [0, 1, 5], "x": [1.1, 6.1, 21.1]})
    answer = mm.Store(location).predict(_engine_frame(engine, rows), by="g")
    answer = (answer.toPandas() if name == "spark" else answer.compute()).sort_values("g")
    store = mm.Store(location, read_only=True)
    first = answer["prediction"].tolist()
    assert first == [
        float(store.load(g).predict([[x]])[0]) for g, x in zip(rows["g"], rows["x"])]
    # a run published since: the executors' copies of the index (kept between
    # predictions) are brought to it, not left at the first
    machine("c")
    mm.train(fit_neighbours, mm.groups(table(shift=0.5), by="g"), store=location,
             backend="serial", progress=False)
    machine("b")
    answer = mm.Store(location).predict(_engine_frame(engine, rows), by="g")
    answer = (answer.toPandas() if name == "spark" else answer.compute()).sort_values("g")
    store = mm.Store(location, read_only=True)
    assert answer["prediction"].tolist() == [
        float(store.load(g).predict([[x]])[0]) for g, x in zip(rows["g"], rows["x"])]
    assert answer["prediction"].tolist() != first  # (new models: shifted rows)


def fit_and_look(df, location, cache):
    """Sleeps, then (the last group) reads the store as another machine
    would, while the run goes on: how many tasks it sees finished."""
    time.sleep(0.4)
    seen = -1
    if int(df["g"].iloc[0]) == 5:
        time.sleep(1.5)  # a commit and a publication after the others ended
        os.environ["MANYMODELS_CACHE_DIR"] = cache  # (this worker's own environment)
        runs = mm.Store(location, read_only=True).runs()
        seen = int(runs["ok"].iloc[-1]) if runs["status"].iloc[-1] == "running" else -2
    return len(df), {"seen_ok": seen}


def test_a_long_run_is_published_while_it_runs(s3, machine, monkeypatch, tmp_path):
    """A run publishes the index every PUBLISH_EVERY_S while it runs: another
    machine sees its finished tasks before it ends."""
    from manymodels.store import remote

    monkeypatch.setattr(remote, "PUBLISH_EVERY_S", 0.3)
    uri, _ = s3
    location = uri("long")
    run = mm.train(fit_and_look, mm.groups(table(), by="g") * mm.grid(
        location=[location], cache=[str(tmp_path / "cache-other")]),
        store=location, backend="threads", workers=1, progress=False)
    assert run.results.set_index("g").loc[5, "seen_ok"] >= 3


def test_a_publication_whose_answer_was_lost_is_not_taken_for_another_machines(
        s3, machine, monkeypatch):
    """index.current pointed at this copy's index, but the answer lost (the
    network failed right after): the run's later writes are published, not
    refused as if another machine had published since."""
    import threading

    from manymodels.store import remote

    monkeypatch.setattr(remote, "PUBLISH_EVERY_S", 0.05)
    uri, _ = s3
    location = uri("lost-answer")
    lost = threading.Event()

    def upload_losing_the_first_answer(where, data):
        remote_upload(where, data)
        if where.split("?")[0].endswith("/" + remote.POINTER) and not lost.is_set():
            lost.set()
            raise OSError("connection reset by peer")

    def fit(df):
        assert lost.wait(30)  # a publication while the run runs lost its answer
        return len(df)

    remote_upload = remote.upload
    monkeypatch.setattr(remote, "upload", upload_losing_the_first_answer)
    run = mm.train(fit, mm.groups(table(3), by="g"), store=location, backend="threads",
                   workers=1, progress=False)
    assert (run.results["status"] == "ok").all()
    machine("b")
    runs = mm.Store(location).runs()
    assert runs["status"].tolist() == ["finished"] and runs["ok"].tolist() == [3]


def test_a_write_made_while_another_publishes_is_published_next(s3, machine, monkeypatch):
    """Two writers of one machine share its copy: a commit that lands while
    the other uploads is not in that upload, and the next publication
    carries it."""
    import sqlite3

    from manymodels.store import remote

    uri, _ = s3
    location = uri("during")
    mm.train(lambda df: len(df), mm.groups(table(), by="g"), store=location,
             backend="serial", progress=False)
    store = mm.Store(location)
    store.attach(1, "before", 1)  # (published: the copy is synced)
    real_upload = remote.upload

    def upload_while_another_writes(where, data):
        with sqlite3.connect(store.path / "index.sqlite") as other:
            other.execute("UPDATE runs SET fit = 'written meanwhile'")
        real_upload(where, data)

    monkeypatch.setattr(remote, "upload", upload_while_another_writes)
    store.attach(1, "during", 2)  # its publication's upload meets the other's commit
    monkeypatch.setattr(remote, "upload", real_upload)
    machine("b")
    assert mm.Store(location, read_only=True).runs()["fit"].iloc[0] != "written meanwhile"
    machine("a")
    store.close()  # publishes what it had not
    machine("c")
    assert mm.Store(location, read_only=True).runs()["fit"].iloc[0] == "written meanwhile"


def test_writes_on_a_store_opened_before_another_machine_published(s3, machine):
    """A Store opened a while ago writes onto what was published since (its
    copy is brought up to date first): train, delete and gc on it keep the
    other machine's runs, and gc removes no object those runs name."""
    uri, filesystem = s3
    location = uri("stale")
    mm.train(fit_scaled, mm.groups(table(), by="g"), store=location, backend="serial",
             progress=False)
    opened = mm.Store(location)  # machine a, before b's run
    machine("b")
    mm.train(fit_scaled, mm.groups(table(), by="g"), store=location, backend="serial",
             progress=False)  # reuses run 1's models: its index names their objects
    machine("a")
    opened.delete(1)  # the models run 2 reused stay run 2's
    assert opened.gc() == 0
    mm.train(fit_scaled, mm.groups(table(), by="g"), store=opened, backend="serial",
             progress=False)
    machine("c")
    other = mm.Store(location)
    assert list(other.runs()["run_id"]) == [2, 3]
    assert other.verify().empty and other.load(1).factor == table()[table().g == 1].x.sum()
    assert len([n for n in objects(filesystem, "stale") if n.startswith("artifacts/")]) == 3


def test_a_broken_publication_is_refused_and_the_copy_kept(s3, machine, tmp_path):
    """An index object that is not a store's (its SHA-256 right), a pointer
    naming an index that is not there, and a copy whose record of its last
    publication was lost (a driver killed between the two): refused by
    name, or taken as what it is; the copy is never left broken."""
    import hashlib
    import json

    uri, filesystem = s3
    location = uri("broken")
    mm.train(lambda df: len(df), mm.groups(table(), by="g"), store=location,
             backend="serial", progress=False)
    good = objects(filesystem, "broken")
    with filesystem.open_input_stream("bucket/broken/index.current") as pointer:
        current = pointer.read().decode()
    garbage = b"not an index" * 100
    digest = hashlib.sha256(garbage).hexdigest()
    with filesystem.open_output_stream(f"bucket/broken/indexes/{digest}.sqlite") as out:
        out.write(garbage)
    for name, text in [(digest, "not a manymodels store's index"), ("0" * 64, "is gone")]:
        with filesystem.open_output_stream("bucket/broken/index.current") as out:
            out.write(name.encode())
        machine("b")
        with pytest.raises(StoreError, match=text):
            mm.Store(location)
    with filesystem.open_output_stream("bucket/broken/index.current") as out:
        out.write(current.encode())
    assert len(mm.Store(location).runs()) == 1  # machine b's copy was kept whole
    assert "indexes/" + current + ".sqlite" in good

    machine("a")
    store = mm.Store(location)
    record = store.path / "remote.json"
    synced_before = record.read_text()
    assert "testing:testing" not in synced_before and "secret" not in synced_before
    store.attach(1, "x", 1)  # published; then its record is lost
    record.write_text(synced_before)
    assert json.loads(record.read_text())["published"] == current
    assert mm.Store(location).attached("x", 1) == 1  # not a conflict with itself
    copy = mm.Store(store.path)  # its copy, by path: read-only, models through the SDK
    assert copy.read_only and copy.attached("x", 1) == 1


def _pointer(filesystem, prefix: str) -> str:
    with filesystem.open_input_stream(f"bucket/{prefix}/index.current") as pointer:
        return pointer.read().decode()


def test_an_index_another_sqlite_wrote_is_not_published_again_by_a_reader(s3, machine):
    """Another machine's SQLite writes its version into the index's header:
    this machine's copy of it has other bytes, and merely opening the store
    must not publish it again (which would move the pointer under a run of
    the other machine's)."""
    import hashlib

    uri, filesystem = s3
    location = uri("versions")
    mm.train(lambda df: len(df), mm.groups(table(), by="g"), store=location,
             backend="serial", progress=False)
    with filesystem.open_input_stream(f"bucket/versions/indexes/"
                                      f"{_pointer(filesystem, 'versions')}.sqlite") as source:
        data = bytearray(source.read())
    data[96:100] = (3037002).to_bytes(4, "big")  # "written by SQLite 3.37.2"
    other = hashlib.sha256(data).hexdigest()
    with filesystem.open_output_stream(f"bucket/versions/indexes/{other}.sqlite") as out:
        out.write(bytes(data))
    with filesystem.open_output_stream("bucket/versions/index.current") as out:
        out.write(other.encode())
    machine("b")
    store = mm.Store(location)
    store.close()
    assert _pointer(filesystem, "versions") == other and len(
        mm.Store(location, read_only=True).runs()) == 1


def test_deleting_the_last_run_is_published_before_gc_removes_its_models(s3, machine):
    """A store left with no run is published too: gc then removes the
    models, and no machine reads a run whose models are gone."""
    uri, filesystem = s3
    location = uri("emptied")
    mm.train(fit_scaled, mm.groups(table(), by="g"), store=location, backend="serial",
             progress=False)
    store = mm.Store(location)
    store.delete(1)
    assert store.gc() == 6
    assert not [n for n in objects(filesystem, "emptied") if n.startswith("artifacts/")]
    machine("b")
    assert mm.Store(location, read_only=True).runs().empty


def test_azure_containers_are_not_one_store(tmp_path):
    """The user part of an abfs:// URI is the container: two containers'
    stores are two local copies, and a copy's location keeps its container
    (an S3 URI's user part is its access key, dropped with its secret)."""
    from manymodels.inputs.objectstores import without_secrets
    from manymodels.store.localcopy import copy_folder

    assert without_secrets("abfs://prod:key@acct.dfs.core.windows.net/models") == \
        "abfs://prod@acct.dfs.core.windows.net/models"
    assert without_secrets("s3://key:secret@bucket/m?region=x&secret_key=y") == \
        "s3://bucket/m?region=x"
    copies = set()
    for container in ("prod", "dev"):  # (no account to reach: the copy's name)
        copies.add(copy_folder(f"abfs://{container}@acct.dfs.core.windows.net/models"))
    assert len(copies) == 2


def test_mm_linear_into_a_store_opened_before_another_machine_published(s3, machine):
    from test_linear import FEATURES, sales

    uri, _ = s3
    location, frame = uri("linear-stale"), sales(20)
    mm.linear(frame, by=["store", "item"], features=FEATURES, target="y", store=location)
    opened = mm.Store(location)
    machine("b")
    mm.linear(frame.assign(y=frame.y + 1), by=["store", "item"], features=FEATURES,
              target="y", store=location)
    machine("a")
    mm.linear(frame, by=["store", "item"], features=FEATURES, target="y", store=opened)
    machine("c")
    assert len(mm.Store(location, read_only=True).runs()) == 3


def test_gc_that_cannot_publish_removes_no_object(s3, machine, monkeypatch):
    """gc publishes the index without the dropped rows before it removes any
    object: where that fails (the network), every object stays, and so does
    the published index that names them."""
    from manymodels.store import remote

    uri, filesystem = s3
    location = uri("gc-offline")
    store = _two_runs_the_first_deleted(location)  # (published)
    before = objects(filesystem, "gc-offline")

    def unreachable(self):
        raise StoreError("the object store cannot be reached")

    monkeypatch.setattr(remote.RemoteIndex, "publish", unreachable)
    with pytest.raises(StoreError, match="cannot be reached"):
        store.gc()
    assert objects(filesystem, "gc-offline") == before


class _ListingRefused:
    """A pyarrow filesystem whose listings the object store refuses (a
    credential without ListBucket), its other calls as they are."""

    def __init__(self, filesystem) -> None:
        self.filesystem = filesystem

    def get_file_info(self, what):
        from pyarrow import fs

        if isinstance(what, fs.FileSelector):
            raise OSError("AWS Error ACCESS_DENIED during ListObjectsV2 operation: "
                          "Access Denied")
        return self.filesystem.get_file_info(what)

    def __getattr__(self, name):
        return getattr(self.filesystem, name)


def test_gc_whose_listing_is_refused_names_the_store(s3, machine, monkeypatch):
    """A listing the object store refused came out of gc as the SDK's bare
    OSError, naming neither the store nor what gc was doing."""
    from manymodels.engine import modelfiles
    from manymodels.store import remote

    uri, _ = s3
    location = uri("gc-unlisted")
    mm.train(fit_scaled, mm.groups(table(), by="g"), store=location, backend="serial",
             progress=False)
    store = mm.Store(location)
    for module in (modelfiles, remote):
        monkeypatch.setattr(module, "resolve", lambda uri, resolve=module.resolve: (
            _ListingRefused(resolve(uri)[0]), resolve(uri)[1]))
    with pytest.raises(StoreError, match=r"store 's3://testing:\*\*\*@bucket/gc-unlisted.*"
                                         r"cannot list its model files: .*Access Denied"):
        store.gc()
    monkeypatch.setattr(modelfiles, "resolve", modelfiles.resolve.__defaults__[0])
    with pytest.raises(StoreError, match=r"gc-unlisted.*cannot list its published indexes"):
        store.gc()


def test_a_train_with_select_and_evaluate_publishes_the_index_once(s3, machine, monkeypatch):
    """The run, its selection and its evaluation's record are written one
    after the other: the index is uploaded once, at the end, with all three."""
    from sklearn.linear_model import LinearRegression, Ridge

    from manymodels.store import remote

    uri, _ = s3
    location = uri("once")
    pointers = []
    real_upload = remote.upload
    monkeypatch.setattr(remote, "upload", lambda where, data: (
        pointers.append(where), real_upload(where, data)))
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"sku": np.repeat(["a", "b"], 30), "x": rng.normal(size=60),
                          "day": np.tile(np.arange(30), 2)})
    frame["sales"] = 2 * frame["x"] + 1

    def fit(df, model=None):
        from sklearn.base import clone

        return clone(model).fit(df[["x"]], df["sales"])

    run = mm.train(fit, mm.groups(frame, by="sku") * mm.grid(
        model=[LinearRegression(), Ridge(alpha=100.0)]), backend="threads", workers=2,
        progress=False, store=location, select="rmse",
        evaluate=mm.backtest("day", horizon=5, windows=2, target="sales"))
    assert len(pointers) == 1 and pointers[0].split("?")[0].endswith("/index.current")
    machine("b")  # all three are in what was published
    store = mm.Store(location)
    assert store.attached("selection", run.run_id)["metric"] == "rmse"
    assert store.attached("evaluation", run.run_id) == {"time": "day", "final_model": "all_rows"}


def test_gc_beside_a_train_in_another_thread_publishes_before_it_removes(
        s3, machine, monkeypatch):
    """One Store, two threads: a train holds its publications till its end;
    another thread's delete and gc do not wait for it. gc publishes the
    index without the deleted run before it removes that run's objects, so
    another machine never opens an index naming objects that are gone."""
    import threading

    from manymodels.store import collect

    uri, _ = s3
    location = uri("beside")
    store = mm.Store(location)
    first = mm.train(fit_scaled, mm.groups(table(4), by="g"), store=store, backend="serial",
                     progress=False)
    monkeypatch.setattr(collect, "STRAY_AGE_S", 0.0)  # (as if run 1 were an hour old)
    inside, release = threading.Event(), threading.Event()

    def held(df):
        inside.set()
        release.wait(30)
        return float(df["x"].sum())

    training = threading.Thread(target=lambda: mm.train(
        held, mm.groups(table(1, shift=100), by="g"), store=store, backend="serial",
        progress=False))
    training.start()
    try:
        assert inside.wait(30)
        store.delete(first.run_id)
        assert store.gc() >= 3  # the deleted run's large models' objects went
        machine("b")
        elsewhere = mm.Store(location)
        assert first.run_id not in set(elsewhere.runs()["run_id"])
    finally:
        release.set()
        training.join()


def test_a_sync_that_waits_too_long_for_another_process_is_refused(s3, machine, monkeypatch):
    """Another process of this machine syncing the same copy (an upload that
    hung): the wait ends, naming the lock, instead of lasting for ever."""
    import fcntl

    from manymodels.store import remote

    uri, _ = s3
    store = mm.Store(uri("locked"))
    mm.train(fit_scaled, mm.groups(table(2), by="g"), store=store, backend="serial",
             progress=False)
    monkeypatch.setattr(remote, "SYNC_WAIT_S", 0.3)
    with open(store.path / ".sync.lock", "a") as other:  # (another open: flock conflicts)
        fcntl.flock(other, fcntl.LOCK_EX)
        began = time.monotonic()
        with pytest.raises(StoreError, match=r"another process of this machine.*\.sync\.lock"):
            mm.Store(uri("locked"))
        assert time.monotonic() - began < 5
    assert len(mm.Store(uri("locked")).runs()) == 1  # once it is free


def test_the_remote_store_bench_runs(tmp_path):
    """bench/remote_store_bench.py at a small size, so that it cannot rot."""
    import json
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "bench" / "remote_store_bench.py"
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, str(bench), "--groups", "300", "--out", str(out)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "MANYMODELS_CACHE_DIR": str(tmp_path / "c")})
    assert done.returncode == 0, done.stderr[-2000:]
    numbers = json.loads(out.read_text())
    assert numbers["groups"] == 300 and numbers["object store: unchanged re-run (s)"] > 0


def _others_may_lock(shared_memory) -> bool:
    """Whether another process may take the write lock of SQLite's "dead man
    switch" byte of ``shared_memory`` (an index's ``-shm``): it may where no
    process holds its connections' shared lock there, and it then takes
    the shared memory for unused and truncates it."""
    probe = ("import fcntl, sys\n"
             "with open(sys.argv[1], 'r+b') as f:\n"
             "    try:\n"
             "        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 128)\n"
             "    except OSError:\n"
             "        sys.exit(1)\n")
    return subprocess.run([sys.executable, "-c", probe, str(shared_memory)]).returncode == 0


def test_reading_the_copys_fingerprint_keeps_this_processs_sqlite_locks(tmp_path):
    """The copy's fingerprint read the head of the index's ``-shm`` file with
    open() and closed it, and closing any descriptor of a file drops every
    POSIX lock the process holds on it, its SQLite connections' too: the
    next driver of this machine to open the index took its shared memory
    for unused and truncated it under the first driver (a bus error killed
    it mid-run, its run left 'running' with no task)."""
    import sqlite3

    from manymodels.store.indexfiles import fingerprint_of

    conn = sqlite3.connect(tmp_path / "index.sqlite")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (x)")
    conn.execute("INSERT INTO t VALUES (1)")
    conn.commit()
    assert not _others_may_lock(tmp_path / "index.sqlite-shm")  # the connection's lock
    first = fingerprint_of(tmp_path)
    assert not _others_may_lock(tmp_path / "index.sqlite-shm")  # kept
    conn.execute("INSERT INTO t VALUES (2)")
    conn.commit()
    assert fingerprint_of(tmp_path) != first  # each commit still changes it
    conn.close()


def _first_value(model, rows):
    return np.full(len(rows), float(model[0]))


def test_a_moved_copy_predicts_on_workers_from_its_own_runs(s3, machine, tmp_path):
    """The copy a refused open tells to move away opens by its path, for
    reading: its workers opened the store by its URI instead, whose
    published index (another machine's runs) lacks the copy's models."""
    import shutil

    uri, _ = s3
    location = uri("moved")
    _killed_driver(location)  # on machine a: 5 tasks in its copy, not published
    copy = machine("a")
    machine("b")
    mm.train(lambda df: np.zeros(4) - 1.0, mm.groups(table(), by="g"), store=location,
             backend="serial", progress=False)
    machine("a")
    with pytest.raises(StoreError, match="written from another machine") as error:
        mm.Store(location)
    held = str(error.value).split("(")[1].split(")")[0].strip("'")
    assert held.startswith(copy)
    moved = shutil.move(held, tmp_path / "moved-copy")
    store = mm.Store(moved)
    rows = pd.DataFrame({"g": [0, 1, 2], "x": [1.0, 2.0, 3.0]})
    expected = store.predict(rows, by="g", fn=_first_value, backend="serial", run=1)
    assert expected.tolist() == [3.0, 3.0, 3.0]
    on_workers = store.predict(rows, by="g", fn=_first_value, backend="processes", workers=2,
                               run=1)  # (its driver was killed: still "running" here)
    assert on_workers.tolist() == expected.tolist()


def test_a_store_whose_pointer_was_removed_keeps_this_machines_copy_aside(s3, machine):
    """``index.current`` gone from the object store (the store removed, or
    the pointer deleted by mistake): the next open here deleted this
    machine's copy of the index, perhaps the last record of its runs. It is
    moved aside, readable by its path, and a new store starts."""
    from pathlib import Path

    uri, filesystem = s3
    location = uri("pointerless")
    mm.train(lambda df: float(df["x"].sum()), mm.groups(table(), by="g"), store=location,
             backend="serial", progress=False)
    copy = Path(os.environ["MANYMODELS_CACHE_DIR"])
    filesystem.delete_file("bucket/pointerless/index.current")
    assert mm.Store(location).runs().empty  # a new store
    kept = list(copy.rglob("removed-*/index.sqlite"))
    assert len(kept) == 1
    assert list(mm.Store(kept[0].parent).runs()["run_id"]) == [1]
