"""``manymodels serve``: real HTTP against a real server process (uvicorn on
loopback), a real store of scikit-learn models; every answer equal to
``Store.predict``'s on the same rows."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from sklearn.linear_model import Ridge
from typer.testing import CliRunner

import manymodels as mm
from manymodels.cli import app
from serve_helpers import Server, call

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def fit(df):
    return Ridge(alpha=0.5).fit(df[["price", "promo"]], df["sales"])


def sales(seed: int, stores: int, rows: int = 1200) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"store": rng.integers(0, stores, rows), "price": rng.random(rows),
                          "promo": rng.integers(0, 2, rows)})
    frame["sales"] = frame.price * (frame.store + 1) + 2 * frame.promo + rng.random(rows)
    return frame


def rows_for(keys, seed: int = 1) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"store": int(k), "price": float(p), "promo": int(q)}
            for k, p, q in zip(keys, rng.random(len(keys)), rng.integers(0, 2, len(keys)))]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Stores 0-11 trained, 12-14 not; a fallback model attached."""
    path = tmp_path_factory.mktemp("serve") / "models"
    frame = sales(0, 15)
    run = mm.train(fit, mm.groups(frame[frame.store < 12], by="store"), store=path,
                   backend="serial", progress=False)
    store = mm.Store(path)
    store.attach(run.run_id, "fallback", Ridge().fit(frame[["price", "promo"]], frame["sales"]))
    return path, store


@pytest.fixture(scope="module")
def server(trained, tmp_path_factory):
    with open(tmp_path_factory.mktemp("log") / "serve.log", "w") as log:
        running = Server(trained[0], "--max-body", "20000", log=log)
        yield running
        running.close()


def expected(store, rows):
    return store.predict(pd.DataFrame(rows), by="store", with_source=True)


def test_predictions_equal_store_predict_in_row_order_with_fallback(server, trained):
    rows = rows_for([11, 3, 14, 3, 0, 12, 7, 11, 5, 13])
    answer = server.predict(rows)
    assert answer.status == 200, answer.body
    body = answer.json()
    want = expected(trained[1], rows)
    assert body["predictions"] == want["prediction"].tolist()  # the same floats, bit for bit
    assert body["source"] == want["source"].tolist()
    assert body["source"][2] == "fallback" and body["source"][1] == "group"
    assert body["run_id"] == 1


def test_a_single_row_and_a_large_batch_equal_store_predict(server, trained):
    one = rows_for([4], seed=5)
    assert server.predict(one).json()["predictions"] == expected(
        trained[1], one)["prediction"].tolist()
    many = rows_for(np.random.default_rng(3).integers(0, 15, 150), seed=4)
    body = server.predict(many).json()
    want = expected(trained[1], many)
    assert body["predictions"] == want["prediction"].tolist()
    assert body["source"] == want["source"].tolist()


def test_arrow_bulk_equals_store_predict(server, trained):
    rows = rows_for(np.random.default_rng(8).integers(0, 15, 400), seed=9)
    frame = pd.DataFrame(rows)
    sink = pa.BufferOutputStream()
    table = pa.Table.from_pandas(frame, preserve_index=False)
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    answer = call(server.url + "/v1/predict", "POST", raw=sink.getvalue().to_pybytes(),
                  headers={"content-type": "application/vnd.apache.arrow.stream"})
    assert answer.status == 200, answer.body
    got = pa.ipc.open_stream(answer.body).read_all()
    want = expected(trained[1], rows)
    assert got["prediction"].to_pylist() == want["prediction"].tolist()
    assert got["source"].to_pylist() == want["source"].tolist()
    assert got.schema.metadata[b"run_id"] == b"1"


def test_bad_requests_are_refused_and_the_server_serves_on(server):
    missing = server.predict([{"store": 1, "price": 0.5}])
    assert missing.status == 422 and "'promo'" in missing.json()["error"]
    ragged = server.predict([{"store": 1, "price": 0.5, "promo": 1}, {"store": 2, "price": 1}])
    assert ragged.status == 422 and "row 1" in ragged.json()["error"]
    no_key = server.predict([{"price": 0.5, "promo": 1}])
    assert no_key.status == 422 and "'store'" in no_key.json()["error"]
    assert call(server.url + "/v1/predict", "POST", raw=b"{not json").status == 400
    assert server.predict([{"store": 1, "price": [1, 2], "promo": 0}]).status == 400
    assert call(server.url + "/v1/predict", "POST", {"rows": []}).status == 400
    assert call(server.url + "/v1/predict", "POST", {"row": [1]}).status == 400
    assert server.predict([{"store": 1, "price": "cheap", "promo": 0}]).status == 400
    too_big = server.predict(rows_for(range(15)) * 30)  # over --max-body 20000
    assert too_big.status == 413
    assert server.predict(rows_for([1])).status == 200
    assert server.metric("reload_errors_total") == 0


def test_no_model_and_no_fallback_is_null_with_source_none(tmp_path):
    frame = sales(2, 6)
    mm.train(fit, mm.groups(frame[frame.store < 4], by="store"), store=tmp_path / "s",
             backend="serial", progress=False)
    served = Server(tmp_path / "s", "--poll", "0")
    try:
        rows = rows_for([5, 1, 4])
        body = served.predict(rows).json()
        assert body["source"] == ["none", "group", "none"]
        assert body["predictions"][0] is None and body["predictions"][2] is None
        want = mm.Store(tmp_path / "s").predict(pd.DataFrame(rows), by="store")
        assert body["predictions"][1] == want.iloc[1]
    finally:
        served.close()


def test_a_group_model_is_described(server, trained):
    body = call(server.url + "/v1/models/3").json()
    results = trained[1].results()
    row = results[results.store == 3].iloc[0]
    assert body["run_id"] == 1 and body["source"] == "group" and body["key"] == [3]
    assert body["duration_s"] == pytest.approx(row["duration_s"])
    assert body["identity"]["data_hash"]
    # the code's hash too, which the run keeps for all its tasks (it was null)
    with sqlite3.connect(f"file:{trained[0] / 'index.sqlite'}?mode=ro", uri=True) as index:
        (detail,) = index.execute("SELECT code_detail FROM runs WHERE run_id = 1").fetchone()
    assert body["identity"]["code_hash"] == json.loads(detail)["code_hash"] is not None
    assert call(server.url + "/v1/models/13").json()["source"] == "fallback"


def test_metrics_are_prometheus_text(server):
    server.predict(rows_for([1, 2]))
    text = call(server.url + "/metrics").body.decode()
    assert 'manymodels_serve_requests_total{route="/v1/predict",code="200"}' in text
    assert "manymodels_serve_request_seconds_bucket" in text
    assert server.metric("run_id") == 1
    assert server.metric("models_held") >= 2
    assert server.metric("cache_misses_total") >= 2


def test_bad_starts_are_refused_by_name(trained, tmp_path):
    runner = CliRunner()
    done = runner.invoke(app, ["serve", str(trained[0]), "--run", "99"])
    assert done.exit_code == 2 and "has no run 99" in done.output
    (tmp_path / "empty").mkdir()
    done = runner.invoke(app, ["serve", str(tmp_path / "empty")])
    assert done.exit_code == 2 and "not a manymodels store" in done.output
    done = runner.invoke(app, ["serve", str(trained[0]), "--host", "0.0.0.0"])
    assert done.exit_code == 2 and "--token" in done.output
    done = runner.invoke(app, ["serve", str(trained[0]), "--token", " x "])
    assert done.exit_code == 2 and "Invalid value for --token" in done.output
    # a host no resolver knows: said of --host (exit 1, "cannot listen", before)
    done = runner.invoke(app, ["serve", str(trained[0]), "--host", "nosuchhost.invalid",
                               "--token", "t"], env={"COLUMNS": "400"})
    assert done.exit_code == 2 and "Invalid value for --host: 'nosuchhost.invalid'" in \
        done.output, done.output
    with pytest.raises(ValueError, match="has no run 7"):
        mm.serve_app(trained[0], run=7)
    for size in ("lots", "0.5", "-1MB", True):
        with pytest.raises(ValueError, match=f"max_body must be a size .* got {size!r}"):
            mm.serve_app(trained[0], max_body=size)


def _start(store, *args):
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-m", "manymodels", "serve", str(store), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_port_0_prints_the_port_it_listens_on(trained, workers):
    """`--port 0` printed http://127.0.0.1:0/..., never the port the OS gave."""
    import re
    import select

    process = _start(trained[0], "--port", "0", "--workers", workers, "--poll", "0")
    try:
        ready, _, _ = select.select([process.stdout], [], [], 60)
        line = process.stdout.readline().decode() if ready else ""
        found = re.search(r": http://127\.0\.0\.1:([0-9]+)/v1/predict \(run 1;", line)
        assert found and found.group(1) != "0", line
        url = f"http://127.0.0.1:{found.group(1)}"
        assert call(url + "/healthz").status == 200  # answered once said (a request waits)
        answer = call(url + "/v1/predict", "POST", {"rows": rows_for([3])})
        assert answer.status == 200 and answer.json()["source"] == ["group"]
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_a_port_in_use_is_refused_in_one_line_before_any_url(trained):
    """A port in use printed the URL and "Ctrl-C stops it", then uvicorn's
    error (exit 3): now one line naming --port, and no URL."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        process = _start(trained[0], "--port", str(port))
        out, err = process.communicate(timeout=60)
    assert process.returncode != 0
    assert b"http://" not in out and b"Ctrl-C" not in out, out
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and f"--port {port}" in lines[0], lines
    assert "in use" in lines[0] and "Traceback" not in lines[0]
