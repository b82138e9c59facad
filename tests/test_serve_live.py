"""``manymodels serve`` under change and attack, over real HTTP to a server
process: a new run swapped in under concurrent requests, a tampered model,
a store bigger than the cache, the token, and an mm.linear run."""

from __future__ import annotations

import sqlite3
import threading
import time

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import Ridge

import manymodels as mm
from manymodels.store import packs
from serve_helpers import Server, call

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def sales(stores: int, rows: int = 900, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"store": rng.integers(0, stores, rows), "price": rng.random(rows),
                          "promo": rng.integers(0, 2, rows)})
    frame["sales"] = frame.price * (frame.store + 1) + 2 * frame.promo + rng.random(rows)
    return frame


def fit(df):
    return Ridge(alpha=1.0).fit(df[["price", "promo"]], df["sales"])


def fit_again(df):  # the re-run: other models, and store 2 fails
    if df["store"].iloc[0] == 2:
        raise ValueError("no good")
    return Ridge(alpha=30.0).fit(df[["price", "promo"]], df["sales"])


ROWS = [{"store": k, "price": 0.5, "promo": 1} for k in range(6)]


def test_a_new_run_is_served_live_with_no_failed_request(tmp_path):
    path = tmp_path / "m"
    frame = sales(6)
    mm.train(fit, mm.groups(frame, by="store"), store=path, backend="serial", progress=False)
    before = mm.Store(path).predict(pd.DataFrame(ROWS), by="store")
    served = Server(path, "--poll", "0.2")
    answers: list = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            answer = served.predict(ROWS)
            answers.append((answer.status, answer.json() if answer.status == 200 else answer.body))

    clients = [threading.Thread(target=client) for _ in range(3)]
    try:
        for thread in clients:
            thread.start()
        deadline = time.monotonic() + 15  # run 1 answered before run 2 starts
        while not answers:
            assert time.monotonic() < deadline, "no answer from the server within 15 s"
            time.sleep(0.01)
        mm.train(fit_again, mm.groups(frame, by="store"), store=path, backend="serial",
                 progress=False, max_failures=1)
        deadline = time.monotonic() + 15
        while not any(a[0] == 200 and a[1]["run_id"] == 2 for a in answers[-5:]):
            assert time.monotonic() < deadline, "run 2 was not served within 15 s"
            time.sleep(0.1)
        time.sleep(0.3)
    finally:
        stop.set()
        for thread in clients:
            thread.join()
        served.close()
    assert answers and all(status == 200 for status, _ in answers), [
        a for a in answers if a[0] != 200][:3]
    runs = [body["run_id"] for _, body in answers]
    assert runs[0] == 1 and runs[-1] == 2
    last = answers[-1][1]["predictions"]
    after = mm.Store(path).predict(pd.DataFrame(ROWS), by="store")
    assert last == after.tolist()
    assert last[2] == before.iloc[2]  # the failed group keeps its last good model
    assert last[1] != before.iloc[1]  # the others are run 2's


def _tamper(store_path, key) -> None:
    locator = mm.Store(store_path)._model_artifacts(None)[f"[{key}]"]
    _, pack, offset, _ = packs.parse_locator(locator)
    with sqlite3.connect(store_path / "index.sqlite") as conn:
        blob = bytearray(conn.execute("SELECT blob FROM packs WHERE pack_id = ?",
                                      (pack,)).fetchone()[0])
        blob[offset + 20] ^= 0xFF
        conn.execute("UPDATE packs SET blob = ? WHERE pack_id = ?", (bytes(blob), pack))


def test_a_tampered_model_is_refused_by_name_and_the_cache_stays_bounded(tmp_path):
    path = tmp_path / "m"
    frame = sales(30, rows=1500)
    mm.train(fit, mm.groups(frame, by="store"), store=path, backend="serial", progress=False)
    store = mm.Store(path)
    _tamper(path, 7)
    served = Server(path, "--cache-models", "4", "--poll", "0")
    try:
        refused = served.predict([{"store": 7, "price": 0.5, "promo": 1}])
        assert refused.status == 500
        assert "key 7" in refused.json()["error"] and "SHA-256" in refused.json()["error"]
        for key in [k for k in range(30) if k != 7] * 2:
            rows = [{"store": key, "price": 0.25, "promo": 0}]
            answer = served.predict(rows)
            assert answer.status == 200
            assert answer.json()["predictions"] == store.predict(
                pd.DataFrame(rows), by="store").tolist()
            assert served.metric("models_held") <= 4
        assert served.metric("cache_evictions_total") >= 29 * 2 - 4
        assert served.predict([{"store": 7, "price": 0.5, "promo": 1}]).status == 500
    finally:
        served.close()


def test_the_token_guards_every_route_but_healthz_and_a_linear_run_is_served(tmp_path):
    path = tmp_path / "lin"
    frame = sales(8, rows=800)
    mm.linear(frame, by="store", features=["price", "promo"], target="sales", store=path,
              name="sales")
    served = Server(path, "--token", "s3cret", "--poll", "0")
    try:
        assert call(served.url + "/healthz").status == 200
        rows = [{"store": k % 10, "price": 0.1 * k, "promo": k % 2} for k in range(12)]
        assert served.predict(rows).status == 401
        assert served.predict(rows, headers={"authorization": "Bearer wrong"}).status == 401
        assert call(served.url + "/metrics").status == 401
        assert call(served.url + "/v1/models/1").status == 401
        answer = served.predict(rows, headers={"authorization": "Bearer s3cret"})
        assert answer.status == 200
        want = mm.Store(path).predict(pd.DataFrame(rows), with_source=True)
        body = answer.json()
        assert body["predictions"][:8] == want["prediction"].tolist()[:8]
        assert body["predictions"][8:10] == [None, None]
        assert body["source"] == want["source"].tolist()
        described = call(served.url + "/v1/models/3",
                         headers={"authorization": "Bearer s3cret"}).json()
        assert described["linear"] and len(described["coefficients"]) == 2
    finally:
        served.close()


def test_each_worker_logs_its_reloads(tmp_path):
    """With --workers 2 the workers logged nothing (logging was set up in the
    parent only): a reload's line never appeared."""
    path = tmp_path / "m"
    mm.train(fit, mm.groups(sales(3), by="store"), store=path, backend="serial", progress=False)
    with open(tmp_path / "serve.log", "w") as log:
        served = Server(path, "--workers", "2", "--poll", "0.2", log=log)
        try:
            # both workers serving run 1 first (the command's own line, then
            # each worker's): one that starts after run 2 is trained serves
            # run 2 from the start, and has no reload to log
            deadline = time.monotonic() + 30
            while (tmp_path / "serve.log").read_text().count("serving run 1 of") < 3:
                assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
                time.sleep(0.05)
            mm.train(fit, mm.groups(sales(3, seed=1), by="store"), store=path,
                     backend="serial", progress=False)
            deadline = time.monotonic() + 30
            while (tmp_path / "serve.log").read_text().count("serving run 2 (was run 1)") < 2:
                assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
                time.sleep(0.2)
        finally:
            served.close()


@pytest.mark.parametrize("asked", ["predict", "described", "described unread"])
def test_a_model_removed_under_the_catalog_is_answered_from_the_store_as_it_is_now(tmp_path,
                                                                                  asked):
    """The run that trained store 5's model deleted and its pack collected
    while serving: its requests were 500s until the next poll (here never:
    poll=None), and ``GET /v1/models/5`` described the deleted run's model
    until a prediction read the store again. The store changed, so it is
    read again at once, whichever asks first (a description of a run whose
    tasks were read before it was deleted, or not)."""
    from starlette.testclient import TestClient

    path = tmp_path / "m"
    frame = sales(6)
    mm.train(fit, mm.groups(frame, by="store"), store=path, backend="serial", progress=False)
    mm.train(fit_again, mm.groups(frame[frame["store"] != 5], by="store"), store=path,
             backend="serial", progress=False)
    with TestClient(mm.serve_app(path, poll=None)) as client:
        first = client.post("/v1/predict", json={"rows": ROWS[:2]})
        assert first.status_code == 200 and first.json()["source"] == ["group", "group"]
        if asked == "described":  # run 1's tasks read
            assert client.get("/v1/models/5").json()["run_id"] == 1
        store = mm.Store(path)
        store.delete(1)
        assert store.gc() > 0
        if asked.startswith("described"):
            described = client.get("/v1/models/5")
            assert described.status_code == 404, described.text
            assert "no model answers key '5' in run 2" in described.text
        answer = client.post("/v1/predict", json={"rows": [ROWS[5], ROWS[0]]})
        assert answer.status_code == 200, answer.text
        assert answer.json()["source"] == ["none", "group"]  # store 5: no model left
        assert client.get("/v1/models/5").status_code == 404


def test_a_store_removed_then_trained_again_at_its_path_is_served_from_the_new_one(tmp_path,
                                                                                   caplog):
    """The server's connection held the removed index open: its polls read
    that file, unchanged, and served its models forever. Removed, the store
    is a counted reload error and the old models serve on; trained again,
    the new store is served. Each failed reload counts, and the failure is
    logged once, not at every poll."""
    import logging
    import shutil

    from starlette.testclient import TestClient

    path = tmp_path / "m"
    mm.train(fit, mm.groups(sales(3), by="store"), store=path, backend="serial", progress=False)
    body = {"rows": ROWS[:3]}
    caplog.set_level(logging.INFO, logger="manymodels.serve")
    with TestClient(mm.serve_app(path, poll=None)) as client:
        before = client.post("/v1/predict", json=body).json()["predictions"]
        shutil.rmtree(path)
        for _ in range(3):
            answer = client.post("/v1/reload")
            assert answer.status_code == 200 and answer.json()["reloaded"] is False
        assert client.post("/v1/predict", json=body).json()["predictions"] == before
        assert "manymodels_serve_reload_errors_total 3" in client.get("/metrics").text
        failed = [r for r in caplog.records if "failed, still serving" in r.getMessage()]
        assert len(failed) == 1 and "has no index now" in failed[0].getMessage()
        mm.train(fit, mm.groups(sales(3, seed=1), by="store"), store=path,
                 backend="serial", progress=False)
        assert client.post("/v1/reload").json()["reloaded"] is True
        assert sum("works again" in r.getMessage() for r in caplog.records) == 1
        after = client.post("/v1/predict", json=body).json()["predictions"]
        assert after == mm.Store(path).predict(pd.DataFrame(ROWS[:3]), by="store").tolist()
        assert after != before


def test_a_request_on_the_old_catalog_while_another_thread_reloads_is_answered_whole(tmp_path):
    """A request read against run 1's catalog, whose model was deleted (and
    collected) under it, while another thread (here ``POST /v1/reload``; the
    poller alike) swapped in run 2's: the request's own reload found nothing
    new (the other had read it) and the request was a 500. It is answered
    from the catalog now served, whole."""
    from starlette.testclient import TestClient

    path = tmp_path / "m"
    frame = sales(3, rows=300)
    mm.train(fit, mm.groups(frame, by="store"), store=path, backend="serial", progress=False)
    app = mm.serve_app(path, poll=None)
    served = app.state.served
    reached, go = threading.Event(), threading.Event()
    get = served.cache.get

    def held(store, digest, what):  # the request, in its thread, before its model's read
        reached.set()
        assert go.wait(30)
        return get(store, digest, what)

    served.cache.get = held
    with TestClient(app) as client:
        mm.train(fit_again, mm.groups(frame[frame["store"] != 2], by="store"), store=path,
                 backend="serial", progress=False)
        store = mm.Store(path)
        store.delete(1)
        assert store.gc() > 0
        answered: list = []
        request = threading.Thread(target=lambda: answered.append(
            client.post("/v1/predict", json={"rows": ROWS[:2]})))
        request.start()
        assert reached.wait(30)
        served.cache.get = get  # the reload's own reads (a fallback's) not held
        assert client.post("/v1/reload").json()["reloaded"] is True
        go.set()
        request.join(30)
        assert answered[0].status_code == 200, answered[0].text
        assert answered[0].json()["run_id"] == 2
        assert answered[0].json()["predictions"] == store.predict(
            pd.DataFrame(ROWS[:2]), by="store").tolist()


@pytest.mark.parametrize("kind", ["fallback", "linear"])
def test_a_fallback_or_linear_description_notices_its_run_deleted(tmp_path, kind):
    """``GET /v1/models/{key}`` of the fallback model, or of an mm.linear
    run's group, went on describing the latest run's after ``Store.delete``
    of it, until a reload (a group's model noticed at once). It reads the
    store again, as a group's does, and describes the run served now."""
    from starlette.testclient import TestClient

    path = tmp_path / "m"
    frame = sales(3, rows=300)
    for seed in (1, 2):
        if kind == "linear":
            mm.linear(sales(3, rows=300, seed=seed), by="store", features=["price", "promo"],
                      target="sales", store=path, name="sales")
        else:
            run = mm.train(fit, mm.groups(frame, by="store"), store=path, backend="serial",
                           progress=False)
            mm.Store(path).attach(run.run_id, "fallback", fit(frame))
    key = "1" if kind == "linear" else "99"  # (99: no group's, the fallback answers it)
    with TestClient(mm.serve_app(path, poll=None)) as client:
        assert client.get(f"/v1/models/{key}").json()["run_id"] == 2
        mm.Store(path).delete(2)
        described = client.get(f"/v1/models/{key}")
        assert described.status_code == 200, described.text
        assert described.json()["run_id"] == 1
