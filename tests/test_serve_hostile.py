"""``manymodels serve`` given hostile or unusual requests: each is refused
with a 4xx naming what is at fault, or answered as ``Store.predict`` would,
never a 500; the server serves on (real HTTP against a real server)."""

from __future__ import annotations

import http.client
import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from sklearn.linear_model import LinearRegression, Ridge
from starlette.testclient import TestClient
from typer.testing import CliRunner

import manymodels as mm
from manymodels.cli import app
from serve_helpers import Server, call

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def fit_frame(df):
    return Ridge(alpha=0.5).fit(df[["price", "promo"]], df["sales"])


def fit_numpy(df):
    """A model that names no features (fitted on an array): it reads every
    column but the group's, in the request's order."""
    return Ridge(alpha=0.5).fit(df[["price", "promo"]].to_numpy(), df["sales"].to_numpy())


def _sales(stores: int = 4, rows: int = 400) -> pd.DataFrame:
    rng = np.random.default_rng(5)
    frame = pd.DataFrame({"store": rng.integers(0, stores, rows), "price": rng.random(rows),
                          "promo": rng.integers(0, 2, rows)})
    frame["sales"] = frame.price * (frame.store + 1) + 3 * frame.promo + rng.random(rows)
    return frame


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = tmp_path_factory.mktemp("hostile") / "models"
    mm.train(fit_frame, mm.groups(_sales(), by="store"), store=path, backend="serial",
             progress=False)
    running = Server(path)
    yield running, mm.Store(path)
    running.close()


def _raw(server, path, body, content_type="application/json", headers=None):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.putrequest("POST" if body is not None else "GET", path)
        connection.putheader("content-type", content_type)
        for name, value in (headers or {}).items():
            connection.putheader(name, value)
        connection.putheader("content-length", str(len(body or b"")))
        connection.endheaders(body or b"")
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def _arrow(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def test_json_edge_cases_are_answered_or_refused_by_name(served):
    server, store = served
    # a prediction past a float's range: null in JSON (which has no infinity), the
    # other rows answered
    rows = [{"store": 1, "price": 1.7e308, "promo": 1.7e308},
            {"store": 2, "price": 0.4, "promo": 1}]
    body = server.predict(rows).json()
    want = store.predict(pd.DataFrame(rows), by="store")
    assert np.isinf(want.iloc[0]) and body["predictions"][0] is None
    assert body["predictions"][1] == want.iloc[1]
    status, text = _raw(server, "/v1/predict", b"[" * 5000)  # nested past the parser
    assert status == 400 and b"nested too deeply" in text
    big = "1" + "0" * 400  # a whole number past a float, beside a float
    body = '{"rows": [{"store": 1, "price": BIG, "promo": 1}, ' \
           '{"store": 1, "price": 0.5, "promo": 1}]}'
    status, text = _raw(server, "/v1/predict", body.replace("BIG", big).encode())
    assert status == 400 and b"group 1" in text
    # a column that no model reads, in some rows only: ignored
    extra = [{"store": 1, "price": 0.5, "promo": 1, "note": "x"},
             {"store": 2, "price": 0.5, "promo": 0}]
    assert server.predict(extra).json()["predictions"] == store.predict(
        pd.DataFrame(extra).drop(columns="note"), by="store").tolist()
    ragged = server.predict([{"store": 1, "price": 0.5, "promo": 1}, {"store": 2, "price": 1}])
    assert ragged.status == 422 and "row 1 has no column 'promo'" in ragged.json()["error"]
    for key in ("NaN", "Infinity", "1e999", "9" * 5000):  # no 500 for any key text
        assert call(f"{server.url}/v1/models/{key}").status in (200, 404)
    assert server.predict([{"store": 1, "price": 0.5, "promo": 1}]).status == 200


def test_arrow_edge_cases_are_answered_or_refused_by_name(served):
    server, store = served
    frame = pd.DataFrame({"store": [1, 2], "price": [0.3, 0.6], "promo": [1, 0]})
    good = _arrow(pa.Table.from_pandas(frame, preserve_index=False))
    status, answer = _raw(server, "/v1/predict", good,
                          "Application/Vnd.Apache.Arrow.Stream")  # media types: any case
    assert status == 200
    got = pa.ipc.open_stream(answer).read_all().column("prediction").to_pylist()
    assert got == store.predict(frame, by="store").tolist()
    twice = pa.Table.from_arrays([pa.array([1]), pa.array([3]), pa.array([0.5]),
                                  pa.array([1])], names=["store", "store", "price", "promo"])
    status, text = _raw(server, "/v1/predict", _arrow(twice),
                        "application/vnd.apache.arrow.stream")
    assert status == 400 and b"two columns named 'store'" in text
    union = pa.UnionArray.from_sparse(pa.array([0], pa.int8()), [pa.array([0.5])])
    odd = pa.table({"store": [1], "price": union, "promo": [1]})
    status, text = _raw(server, "/v1/predict", _arrow(odd),
                        "application/vnd.apache.arrow.stream")
    assert status == 400 and b"column 'price'" in text


def test_a_model_naming_no_features_refuses_json_rows_and_a_token_is_utf8(tmp_path):
    """JSON rows carry no column order: a model fitted on an array, of a run
    that recorded no features, would be fed them in the keys' order (the
    same row answered two ways); it asks for Arrow, which keeps the order.
    A token outside ASCII is the same on every route."""
    path = tmp_path / "models"
    mm.train(fit_numpy, mm.groups(_sales(), by="store"), store=path, backend="serial",
             progress=False)
    server = Server(path, "--token", "sécret")
    try:
        auth = {"Authorization": "Bearer sécret".encode()}
        for row in ({"store": 1, "price": 0.9, "promo": 0},
                    {"store": 1, "promo": 0, "price": 0.9}):
            status, text = _raw(server, "/v1/predict", json.dumps({"rows": [row]}).encode(),
                                headers=auth)
            assert status == 422 and b"send an Arrow IPC stream" in text
        frame = pd.DataFrame({"store": [1], "price": [0.9], "promo": [0]})
        status, answer = _raw(server, "/v1/predict",
                              _arrow(pa.Table.from_pandas(frame, preserve_index=False)),
                              "application/vnd.apache.arrow.stream", auth)
        assert status == 200
        got = pa.ipc.open_stream(answer).read_all().column("prediction").to_pylist()
        assert got == mm.Store(path).predict(frame, by="store").tolist()
        for route in ("/v1/models/1", "/metrics"):
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            connection.putrequest("GET", route)
            connection.putheader("Authorization", auth["Authorization"])
            connection.endheaders()
            assert connection.getresponse().status == 200, route
            connection.close()
    finally:
        server.close()
    with pytest.raises(ValueError, match="without surrounding spaces"):
        mm.serve_app(path, token=" spaced ")


def test_a_store_path_that_is_a_file_is_said_to_be_one(tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    done = CliRunner().invoke(app, ["serve", str(a_file)])
    assert done.exit_code == 2 and "is a file" in done.output


def test_a_store_object_of_a_path_with_no_store_is_said_to_be_missing(tmp_path):
    # (it said "has no index now (removed?)", as of a store removed while served)
    missing = tmp_path / "typo"
    with pytest.raises(ValueError, match="does not exist") as raised:
        mm.serve_app(mm.Store(missing), poll=None)
    assert str(missing) in str(raised.value) and "removed" not in str(raised.value)
    assert not missing.exists()


# -- the keys of a request, read as they were stored -------------------------------


def _app(path):
    from starlette.testclient import TestClient

    return TestClient(mm.serve_app(path, poll=None))


def fit_x(df):
    return LinearRegression().fit(df[["x"]], df["y"])


def _keyed(path, keys, values):
    """A store of one LinearRegression per key, each predicting its own value."""
    frame = pd.DataFrame({"k": np.repeat(keys, 5), "x": np.random.default_rng(0).normal(
        size=5 * len(keys)), "y": np.repeat(values, 5)})
    mm.train(fit_x, mm.groups(frame, by="k"), store=path, backend="serial", progress=False)
    return _app(path)


def test_a_decimal_or_bytes_key_is_named_in_the_store_s_tagged_form(tmp_path):
    """``GET /v1/models/{key}`` read a key as text, a number or a bool: a
    group of decimals or bytes had no URL that named it (404 for every
    one). The store's tagged form names it; a malformed one is a 400."""
    import decimal

    for name, keys, tagged in (("dec", [decimal.Decimal("1.5"), decimal.Decimal("2")],
                                '{"$decimal": "1.5"}'),
                               ("raw", [b"ab", b"\x00z"], '{"$bytes": "6162"}')):
        client = _keyed(tmp_path / name, keys, [1.0, 2.0])
        answer = client.get("/v1/models/" + tagged)
        assert answer.status_code == 200, answer.text
        assert answer.json()["task_key"] == [json.loads(tagged)]
        assert answer.json()["key"] == [json.loads(tagged)]  # as asked, not b'ab'
        bad = client.get("/v1/models/" + tagged.replace('": "', '": "zz'))
        assert bad.status_code == 400 and "as the store writes it" in bad.json()["error"]


def test_integer_keys_past_2_53_stay_exact_whatever_the_other_rows_hold(tmp_path):
    ids = [10**17 + 1, 2**53, 2**53 + 1]
    client = _keyed(tmp_path / "big", np.array(ids, dtype=np.int64), [1.0, 3.0, 4.0])
    rows = [{"k": k, "x": 0.0} for k in ids]
    for extra in ([], [{"k": None, "x": 0.0}], [{"k": 0.5, "x": 0.0}]):
        body = client.post("/v1/predict", json={"rows": rows + extra}).json()
        assert body["predictions"] == pytest.approx([1.0, 3.0, 4.0] + [None] * len(extra))
        assert body["source"] == ["group"] * 3 + ["none"] * len(extra)
    # past the rows grouped in a loop (pandas groups them): the same
    body = client.post("/v1/predict", json={"rows": (rows + [{"k": None, "x": 0.0}]) * 100})
    assert body.json()["predictions"][:4] == pytest.approx([1.0, 3.0, 4.0, None])
    assert body.json()["source"][:8] == ["group"] * 3 + ["none"] + ["group"] * 3 + ["none"]
    # an Arrow int64 column with a null
    table = pa.table({"k": pa.array(ids + [None], pa.int64()), "x": [0.0] * 4})
    answer = client.post("/v1/predict", content=_arrow(table),
                         headers={"content-type": "application/vnd.apache.arrow.stream"})
    got = pa.ipc.open_stream(answer.content).read_all().to_pydict()
    assert got["prediction"][:3] == pytest.approx([1.0, 3.0, 4.0])
    assert got["source"] == ["group"] * 3 + ["none"]


def test_a_model_path_reads_the_key_as_its_column_holds_keys(tmp_path):
    texts = ["1", "1.0", "true", "null", "1e3", "[1]"]
    client = _keyed(tmp_path / "text", texts, [100.0 * (i + 1) for i in range(len(texts))])
    for text in texts:
        answer = client.get("/v1/models/" + text)
        assert answer.status_code == 200, (text, answer.json())
        assert answer.json()["task_key"] == [text] and answer.json()["key"] == [text]
    assert client.get("/v1/models/2").status_code == 404
    # a column of numbers: the text read as one
    client = _keyed(tmp_path / "ints", [1, 2, 2**53 + 1], [1.0, 2.0, 3.0])
    for text, key in [("2", 2), ("2.0", 2), (str(2**53 + 1), 2**53 + 1)]:
        assert client.get("/v1/models/" + text).json()["task_key"] == [key]
    assert client.get("/v1/models/true").status_code == 404
    # keys of several columns: a JSON list, a text column's value quoted
    frame = pd.DataFrame({"s": np.repeat(["1", "a"], 5), "n": np.repeat([7, 8], 5),
                          "x": np.arange(10.0), "y": np.repeat([1.0, 2.0], 5)})
    mm.train(fit_x, mm.groups(frame, by=["s", "n"]), store=tmp_path / "two",
             backend="serial", progress=False)
    client = _app(tmp_path / "two")
    assert client.get('/v1/models/["1",7]').json()["task_key"] == ["1", 7]
    assert client.get('/v1/models/["a",8]').json()["task_key"] == ["a", 8]
    assert client.get("/v1/models/a").status_code == 400


def test_iso_text_reaches_a_store_keyed_by_datetimes_or_dates(tmp_path):
    import datetime as dt

    days = pd.to_datetime(["2024-01-01", "2024-07-01"])
    client = _keyed(tmp_path / "naive", days, [100.0, 200.0])
    mm.Store(tmp_path / "naive").attach(1, "fallback", LinearRegression().fit(
        np.zeros((3, 1)), [-1.0] * 3))
    client = _app(tmp_path / "naive")
    rows = [{"k": "2024-01-01", "x": 0.0}, {"k": "2024-07-01T00:00:00", "x": 0.0},
            {"k": "2024-03-01", "x": 0.0}, {"k": None, "x": 0.0}]
    body = client.post("/v1/predict", json={"rows": rows}).json()
    assert body["predictions"] == pytest.approx([100.0, 200.0, -1.0, -1.0])
    assert body["source"] == ["group", "group", "fallback", "fallback"]
    answer = client.get("/v1/models/2024-07-01T00:00:00")
    assert answer.json()["source"] == "group" and answer.json()["task_key"] == [{"$datetime":
        "2024-07-01T00:00:00"}]
    assert answer.json()["key"] == ["2024-07-01T00:00:00"]
    for text, why in [("yesterday", "ISO"), ("2024-01-01T00:00:00Z", "time zone")]:
        answer = client.post("/v1/predict", json={"rows": [{"k": text, "x": 0.0}]})
        assert answer.status_code == 422 and "'k'" in answer.json()["error"], answer.json()
        assert why in answer.json()["error"]
        assert client.get("/v1/models/" + text).status_code == 422
    # keys with a time zone: any offset names the same instant; text without one is refused
    client = _keyed(tmp_path / "paris", days.tz_localize("Europe/Paris"), [1.0, 2.0])
    rows = [{"k": "2024-06-30T22:00:00Z", "x": 0.0}, {"k": "2024-01-01T00:00:00+01:00",
                                                      "x": 0.0}]
    assert client.post("/v1/predict", json={"rows": rows}).json()["predictions"] == (
        pytest.approx([2.0, 1.0]))
    assert client.get("/v1/models/2023-12-31T23:00:00Z").json()["source"] == "group"
    answer = client.post("/v1/predict", json={"rows": [{"k": "2024-01-01", "x": 0.0}]})
    assert answer.status_code == 422 and "time zone" in answer.json()["error"]
    # dates, and a key of several columns
    frame = pd.DataFrame({"s": ["a"] * 10, "d": [dt.date(2024, 1, 1)] * 5 + [
        dt.date(2024, 1, 2)] * 5, "x": np.arange(10.0), "y": np.repeat([5.0, 6.0], 5)})
    mm.train(fit_x, mm.groups(frame, by=["s", "d"]), store=tmp_path / "dates",
             backend="serial", progress=False)
    client = _app(tmp_path / "dates")
    rows = [{"s": "a", "d": "2024-01-02", "x": 0.0}, {"s": "a", "d": "2024-01-01", "x": 0.0}]
    assert client.post("/v1/predict", json={"rows": rows}).json()["predictions"] == (
        pytest.approx([6.0, 5.0]))
    described = client.get('/v1/models/["a","2024-01-02"]').json()
    assert described["key"] == ["a", "2024-01-02"]
    assert described["task_key"] == ["a", {"$date": "2024-01-02"}]
    answer = client.post("/v1/predict", json={"rows": [{"s": "a", "d": "2024-01-02T01:00",
                                                         "x": 0.0}]})
    assert answer.status_code == 422 and "'d'" in answer.json()["error"]


def test_a_row_needs_only_the_features_of_its_own_model(tmp_path):
    client = _keyed(tmp_path / "few", [1, 2], [10.0, 20.0])
    # a row whose group has no model needs no features, beside rows that have one
    rows = [{"k": 99}, {"k": 2, "x": 0.0}, {"k": 98, "other": 1}, {"k": 1, "x": 0.0}]
    body = client.post("/v1/predict", json={"rows": rows}).json()
    assert body["predictions"] == pytest.approx([None, 20.0, None, 10.0])
    assert body["source"] == ["none", "group", "none", "group"]
    # a row without a feature its own model reads is refused by its number
    rows = [{"k": 99}, {"k": 2, "x": 0.0}, {"k": 2}]
    answer = client.post("/v1/predict", json={"rows": rows})
    assert answer.status_code == 422 and "row 2 has no column 'x'" in answer.json()["error"]
    # a model naming no features reads every column of its rows: its rows need them all
    frame = _sales()
    mm.train(fit_price_numpy, mm.groups(frame[frame.store < 2], by="store"),
             store=tmp_path / "numpy", backend="serial", progress=False)
    client = _app(tmp_path / "numpy")
    body = client.post("/v1/predict", json={"rows": [{"store": 1, "price": 0.5},
                                                     {"store": 7}]}).json()
    assert body["source"] == ["group", "none"]
    answer = client.post("/v1/predict", json={"rows": [{"store": 7}, {"store": 1, "price": 0.5},
                                                       {"store": 1}]})
    assert answer.status_code == 422 and "row 2 has no column 'price'" in answer.json()[
        "error"]


def fit_price_numpy(df):
    return Ridge(alpha=0.5).fit(df[["price"]].to_numpy(), df["sales"].to_numpy())


def test_an_mm_linear_row_needs_only_the_features_of_its_own_model(tmp_path):
    """An mm.linear run refused the whole batch for one row of a group with
    no model that lacked a feature, as other runs no longer do."""
    frame = _sales()
    mm.linear(frame[frame.store < 2], by="store", features=["price"], target="sales",
              store=tmp_path / "lin")
    client = _app(tmp_path / "lin")
    want = mm.Store(tmp_path / "lin").predict(pd.DataFrame({"store": [1, 0], "price": [0.5, 1.0]}))
    rows = [{"store": 7}, {"store": 1, "price": 0.5}, {"store": 9, "other": 2},
            {"store": 0, "price": 1.0}]
    body = client.post("/v1/predict", json={"rows": rows}).json()
    assert body["source"] == ["none", "group", "none", "group"]
    assert body["predictions"][0] is None and body["predictions"][2] is None
    assert body["predictions"][1::2] == pytest.approx(want.tolist())
    answer = client.post("/v1/predict", json={"rows": [{"store": 7}, {"store": 1}]})
    assert answer.status_code == 422 and "no column 'price'" in answer.json()["error"]
    answer = client.post("/v1/predict", json={"rows": [{"store": 7}, {"store": 1, "price": 1},
                                                       {"store": 0}]})
    assert answer.status_code == 422 and "row 2 has no column 'price'" in answer.json()["error"]
    answer = client.post("/v1/predict", json={"rows": [{"store": 7}, {"store": 8}]})
    assert answer.json() == {**answer.json(), "predictions": [None, None],
                             "source": ["none", "none"]}


# -- Arrow group columns of datetimes ---------------------------------------------

_ARROW = {"content-type": "application/vnd.apache.arrow.stream"}


def _arrow_predict(client, table: pa.Table) -> dict:
    answer = client.post("/v1/predict", content=_arrow(table), headers=_ARROW)
    assert answer.status_code == 200, answer.content
    return pa.ipc.open_stream(answer.content).read_all().to_pydict()


@pytest.mark.parametrize("zone", [None, "Europe/Paris"])
def test_an_arrow_datetime_key_routes_as_store_predict_in_every_unit_and_batch(tmp_path, zone):
    """Timestamps reached no model below 256 rows in nanoseconds (NumPy's
    ``tolist()`` made them ints) and never with a time zone (``to_numpy()``
    dropped it); every unit and batch size now routes as Store.predict."""
    days = pd.date_range("2024-01-01", periods=3, freq="D", tz=zone)
    client = _keyed(tmp_path / "days", days, [10.0, 20.0, 30.0])
    store = mm.Store(tmp_path / "days")
    for unit in ("s", "ms", "us", "ns"):
        for rows in (2, 300):
            asked = pd.Series(np.resize(days[1:].append(pd.DatetimeIndex(
                ["2030-01-01"]).tz_localize(zone)), rows))
            frame = pd.DataFrame({"k": asked.astype(f"datetime64[{unit}]" if zone is None
                                                    else f"datetime64[{unit}, {zone}]"),
                                  "x": np.zeros(rows)})
            table = pa.Table.from_pandas(frame, preserve_index=False)
            assert table.schema.field("k").type == pa.timestamp(unit, zone)
            got = _arrow_predict(client, table)
            want = store.predict(frame, with_source=True, backend="serial")
            assert got["source"] == want.source.tolist(), (unit, rows)
            assert got["source"][:3] == ["group", "group", "none"][:rows]
            assert got["prediction"][:2] == pytest.approx([20.0, 30.0][:rows])
            assert [p for p, s in zip(got["prediction"], got["source"]) if s != "none"] == (
                want.prediction[want.source != "none"].tolist())
    if zone is not None:  # the same instants in another zone: the same groups
        table = pa.table({"k": pa.array(days[1:].tz_convert("UTC")), "x": [0.0, 0.0]})
        assert _arrow_predict(client, table)["prediction"] == pytest.approx([20.0, 30.0])


def test_an_arrow_datetime_key_never_reaches_an_integer_or_date_key(tmp_path):
    """A timestamp of 3 ns was read as the integer 3: another group's model."""
    client = _keyed(tmp_path / "ints", [3, 4], [3.0, 4.0])
    for rows in (2, 300):
        for kind in (pa.timestamp("ns"), pa.duration("ns")):
            table = pa.table({"k": pa.array(np.resize([3, 4], rows), pa.int64()).cast(kind),
                              "x": np.zeros(rows)})
            assert set(_arrow_predict(client, table)["source"]) == {"none"}, (kind, rows)
        table = pa.table({"k": pa.array(np.resize([3, 4], rows), pa.int64()),
                          "x": np.zeros(rows)})
        assert _arrow_predict(client, table)["prediction"][:2] == pytest.approx([3.0, 4.0])
    import datetime as dt

    dates = [dt.date(2024, 1, 1), dt.date(2024, 1, 2)]
    client = _keyed(tmp_path / "dates", dates, [1.0, 2.0])
    for rows in (2, 300):
        table = pa.table({"k": pa.array(np.resize(np.array(dates, dtype=object), rows),
                                        pa.date32()), "x": np.zeros(rows)})
        got = _arrow_predict(client, table)
        assert got["source"] == ["group"] * rows and got["prediction"][:2] == pytest.approx(
            [1.0, 2.0])



def fit_x_nan_metric(df):
    return LinearRegression().fit(df[["x"]], df["y"]), {"r2": float("nan"), "ok": 1.0}


def test_a_model_path_finds_infinite_and_nan_keys_and_says_nan_metrics_as_null(tmp_path):
    """``/v1/models/Infinity`` was a 404 on a store holding the group (which
    POST /v1/predict answered), ``/v1/models/NaN`` missed the null group
    NaN routes to, and a NaN metric (or an infinite key) made the answer a
    500: Starlette's JSONResponse refuses numbers JSON has not."""
    frame = pd.DataFrame({"k": np.repeat([1.5, np.nan, np.inf, -np.inf], 5),
                          "x": np.arange(20.0), "y": np.repeat([1.0, 2.0, 3.0, 4.0], 5)})
    mm.train(fit_x_nan_metric, mm.groups(frame, by="k"), store=tmp_path / "f",
             backend="serial", progress=False)
    client = _app(tmp_path / "f")
    for text, value in [("Infinity", 3.0), ("-Infinity", 4.0), ("NaN", 2.0), ("null", 2.0),
                        ("1.5", 1.0)]:
        answer = client.get("/v1/models/" + text)
        assert answer.status_code == 200, (text, answer.text)
        assert answer.json()["metrics"] == {"r2": None, "ok": 1.0}
        body = f'{{"rows": [{{"k": {text}, "x": 0.0}}]}}'
        predicted = client.post("/v1/predict", content=body,
                                headers={"content-type": "application/json"}).json()
        assert predicted["predictions"] == pytest.approx([value]), text
        by_model = mm.Store(tmp_path / "f").predict(
            pd.DataFrame({"k": [json.loads(text) if text != "null" else None], "x": [0.0]}),
            by="k").tolist()
        assert by_model == pytest.approx([value])
    # JSON has no infinity: its text, as the request gave it (null is the missing key's)
    assert client.get("/v1/models/-Infinity").json()["key"] == ["-Infinity"]
    assert client.get("/v1/models/NaN").json()["key"] == [None]
    # a part of a key of several columns alike: ["s1", "Infinity"] was read as text
    mm.train(fit_x_nan_metric, mm.groups(frame.assign(s="s1"), by=["s", "k"]),
             store=tmp_path / "two", backend="serial", progress=False)
    client = _app(tmp_path / "two")
    for text in ("Infinity", "-Infinity", "NaN", "1.5"):
        answer = client.get(f'/v1/models/["s1", "{text}"]')
        assert answer.status_code == 200, (text, answer.text)
        assert answer.json()["key"] == ["s1", None if text == "NaN" else json.loads(text)
                                        if text == "1.5" else text]


# -- true beside 1 in one request ---------------------------------------------------


def _alone(client, store, value):
    """One row keyed ``value``: the server's answer, checked against Store.predict's."""
    body = client.post("/v1/predict", json={"rows": [{"k": value, "x": 0.0}]}).json()
    frame = pd.DataFrame({"k": pd.Series([value], dtype=object), "x": [0.0]})
    try:
        want = store.predict(frame, with_source=True, backend="serial")
    except ValueError as exc:
        assert "no row of the table has a model" in str(exc)
        want = pd.DataFrame({"prediction": [None], "source": ["none"]})
    assert body["source"] == want.source.tolist(), value
    assert body["predictions"] == pytest.approx(
        [None if s == "none" else p for p, s in zip(want.prediction, want.source)])
    return body["predictions"][0], body["source"][0]


@pytest.mark.parametrize("linear", [False, True])
@pytest.mark.parametrize("keys", [["1", "2", "0"], [1, 2, 0]])
def test_true_and_1_in_one_request_do_not_change_each_others_answer(tmp_path, keys, linear):
    """True == 1 == 1.0 in Python and pandas: rows keyed true and 1 were one
    group, answered by whichever came first (one lost its model, or took
    another's); an mm.linear store refused the request whole."""
    if linear:
        frame = pd.DataFrame({"k": np.repeat(keys, 5), "x": np.tile(np.arange(5.0), 3),
                              "y": np.repeat([1.0, 2.0, 3.0], 5)})
        mm.linear(frame, by="k", features=["x"], target="y", store=tmp_path / "k")
        client = _app(tmp_path / "k")
    else:
        client = _keyed(tmp_path / "k", keys, [1.0, 2.0, 3.0])
    store = mm.Store(tmp_path / "k")
    values = [True, 1, 1.0, "1", False, 0, 0.0, "0", None]
    alone = {repr(v): _alone(client, store, v) for v in values}
    if keys[0] == "1":  # a text key: a boolean is not it
        assert alone["True"] == (None, "none") and alone["'1'"] == (pytest.approx(1.0), "group")
        assert alone["1"] == (pytest.approx(1.0), "group")  # as mm.train's: 1 finds "1"
    for order in (values, values[::-1]):
        for repeat in (1, 40):  # under and over the rows grouped in a loop
            rows = [{"k": v, "x": 0.0} for v in order] * repeat
            body = client.post("/v1/predict", json={"rows": rows}).json()
            got = list(zip(body["predictions"], body["source"]))
            want = [alone[repr(v)] for v in order] * repeat
            assert [s for _, s in got] == [s for _, s in want], (order, repeat)
            assert [p for p, _ in got] == pytest.approx([p for p, _ in want])


def test_a_list_key_over_arrow_and_a_huge_key_on_a_linear_store_are_400s(served, tmp_path):
    """Both were 500s with a traceback: a list<int64> group column reached the
    grouping (unhashable), and 2**70 overflowed mm.linear's lookup."""
    server, _ = served
    table = pa.table({"store": pa.array([[3], [4]], pa.list_(pa.int64())),
                      "price": [0.5, 0.5], "promo": [1, 1]})
    status, text = _raw(server, "/v1/predict", _arrow(table),
                        "application/vnd.apache.arrow.stream")
    assert status == 400 and b"column 'store'" in text, text
    assert server.predict([{"store": 1, "price": 0.5, "promo": 1}]).status == 200
    frame = _sales()
    mm.linear(frame, by="store", features=["price"], target="sales", store=tmp_path / "lin")
    client = _app(tmp_path / "lin")
    for rows in ([{"store": 2**70, "price": 0.5}],
                 [{"store": 1, "price": 0.5}, {"store": 2**70, "price": 0.5}]):
        answer = client.post("/v1/predict", json={"rows": rows})
        assert answer.status_code == 400 and "'store'" in answer.json()["error"], answer.json()
    assert client.get(f"/v1/models/{2**70}").status_code == 404  # was a 500 (OverflowError)


class OneShort:
    """A model with a bug: one prediction fewer than its rows."""

    feature_names_in_ = np.array(["price"], dtype=object)

    def predict(self, rows):
        return np.zeros(len(rows) - 1)


def test_a_model_giving_too_few_predictions_is_a_500_not_the_requests_fault(tmp_path):
    """It was a 400, "the model of group 1 refused its rows": a client told
    to mend a request that was right."""
    frame = _sales()
    mm.train(lambda df: OneShort(), mm.groups(frame, by="store"), store=tmp_path / "m",
             backend="serial", progress=False)
    client = _app(tmp_path / "m")
    rows = [{"store": 1, "price": 0.5, "promo": 1}] * 2
    answer = client.post("/v1/predict", json={"rows": rows})
    assert answer.status_code == 500, answer.json()
    assert "has 1 rows for its 2 rows" in answer.json()["error"]


LOADED_ON_THE_EVENT_LOOP: list[bool] = []


class LoadWatched(Ridge):
    """A Ridge that notes, as it is unpickled, whether on an event loop."""

    def __setstate__(self, state):
        LOADED_ON_THE_EVENT_LOOP.append(_on_an_event_loop())
        super().__setstate__(state)


def _on_an_event_loop() -> bool:
    """Whether the calling thread is running an asyncio event loop."""
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def test_a_cold_model_is_loaded_off_the_event_loop(tmp_path):
    """A small JSON request was answered on the event loop, its model's load
    too: a large model's unpickling (seconds) held up every request, /healthz
    too. A request whose models are held is answered there still."""
    mm.train(lambda df: LoadWatched().fit(df[["price", "promo"]], df["sales"]),
             mm.groups(_sales(), by="store"), store=tmp_path / "m", backend="serial",
             progress=False)
    LOADED_ON_THE_EVENT_LOOP.clear()
    with _app(tmp_path / "m") as client:
        for stores in ([1], [1, 2], [1, 2]):  # cold; one held, one cold; both held
            answer = client.post("/v1/predict", json={"rows": [
                {"store": store, "price": 0.5, "promo": 1} for store in stores]})
            assert answer.status_code == 200 and set(answer.json()["source"]) == {"group"}
        metrics = client.get("/metrics").text  # each model asked for once a request
        assert "manymodels_serve_cache_hits_total 3\n" in metrics
        assert "manymodels_serve_cache_misses_total 2\n" in metrics
    assert LOADED_ON_THE_EVENT_LOOP == [False, False]


def test_an_arrow_stream_large_once_decoded_is_a_413(tmp_path):
    """A column of type null holds any number of rows in no bytes, and a
    dictionary's long text is copied into each row it names: a body of a few
    KB under --max-body grew to any size in the server's memory."""
    from starlette.testclient import TestClient

    path = tmp_path / "m"
    mm.train(fit_frame, mm.groups(_sales(), by="store"), store=path, backend="serial",
             progress=False)
    client = TestClient(mm.serve_app(path, poll=None, max_body=8000))
    arrow = {"content-type": "application/vnd.apache.arrow.stream"}
    rows = 10_000
    nulls = pa.table({"store": pa.nulls(rows), "price": pa.nulls(rows), "promo": pa.nulls(rows)})
    answer = client.post("/v1/predict", content=_arrow(nulls), headers=arrow)
    assert answer.status_code == 413 and "30000 cells" in answer.json()["error"]
    text = pa.DictionaryArray.from_arrays(pa.array([0] * 200, pa.int32()), pa.array(["x" * 2000]))
    copied = pa.table({"store": [1] * 200, "price": text, "promo": [1] * 200})
    body = _arrow(copied)
    assert len(body) < 8000
    answer = client.post("/v1/predict", content=body, headers=arrow)
    assert answer.status_code == 413 and "column 'price'" in answer.json()["error"]
    fine = pa.table({"store": [1, 2], "price": pa.array(["0.5", "0.2"]).dictionary_encode(),
                     "promo": [1, 0]})
    assert client.post("/v1/predict", content=_arrow(fine), headers=arrow).status_code == 200


def _compressed(table: pa.Table, codec: str) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=codec)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_a_compressed_arrow_stream_is_held_to_the_limit_decoded_before_decoding(tmp_path,
                                                                                 codec):
    """A zstd or lz4 batch was decompressed whole before any size check: a
    body of a few KB under --max-body decoded to any size (here one that
    claims a terabyte, which the server tried to allocate). The decoded
    size is read from the batches' metadata first."""
    from starlette.testclient import TestClient

    path = tmp_path / "m"
    mm.train(fit_frame, mm.groups(_sales(), by="store"), store=path, backend="serial",
             progress=False)
    client = TestClient(mm.serve_app(path, poll=None, max_body=60_000))
    arrow = {"content-type": "application/vnd.apache.arrow.stream"}
    rows = 10_000  # 30,000 cells, under the limit; 240,000 bytes decoded, over it
    table = pa.table({"store": pa.array([1] * rows, pa.int64()), "price": [0.5] * rows,
                      "promo": pa.array([1] * rows, pa.int64())})
    body = _compressed(table, codec)
    assert len(body) < 60_000
    answer = client.post("/v1/predict", content=body, headers=arrow)
    assert answer.status_code == 413 and "240000 bytes decoded" in answer.json()["error"]
    claimed = bytearray(body)  # each buffer's decoded length, as its first 8 bytes say
    marker = (rows * 8).to_bytes(8, "little")
    assert claimed.count(marker) == 3
    claimed = bytes(claimed).replace(marker, (1 << 40).to_bytes(8, "little"))
    answer = client.post("/v1/predict", content=claimed, headers=arrow)
    assert answer.status_code == 413 and "bytes decoded" in answer.json()["error"]
    small = _compressed(table.slice(0, 2), codec)
    answer = client.post("/v1/predict", content=small, headers=arrow)
    assert answer.status_code == 200
    assert pa.ipc.open_stream(answer.content).read_all().num_rows == 2


PREDICTED_ON_THE_EVENT_LOOP: list[bool] = []


class SlowToPredict(Ridge):
    """A Ridge whose predictions take 20 ms (a large forest's take seconds),
    noting whether each was made on an event loop."""

    def predict(self, X):
        import time

        PREDICTED_ON_THE_EVENT_LOOP.append(_on_an_event_loop())
        time.sleep(0.02)
        return super().predict(X)


def test_a_warm_model_slow_to_predict_is_answered_off_the_event_loop(tmp_path):
    """A held model's small JSON request was answered on the event loop,
    however long its model took: a slow one held up every request there,
    /healthz too. A model's last prediction's time says where it is run."""
    mm.train(lambda df: SlowToPredict().fit(df[["price", "promo"]], df["sales"]),
             mm.groups(_sales(), by="store"), store=tmp_path / "m", backend="serial",
             progress=False)
    PREDICTED_ON_THE_EVENT_LOOP.clear()
    with _app(tmp_path / "m") as client:
        for _ in range(3):  # cold, then warm twice
            answer = client.post("/v1/predict", json={"rows": [
                {"store": 1, "price": 0.5, "promo": 1}]})
            assert answer.status_code == 200 and answer.json()["source"] == ["group"]
    assert PREDICTED_ON_THE_EVENT_LOOP == [False, False, False]


def test_a_small_json_body_is_read_once_whether_its_model_is_held_or_cold(tmp_path,
                                                                          monkeypatch):
    """A small JSON request whose model was not loaded was read on the event
    loop, found cold, and read again in a thread."""
    from manymodels.serve import requests as bodies

    mm.train(fit_frame, mm.groups(_sales(), by="store"), store=tmp_path / "m",
             backend="serial", progress=False)
    reads = []
    read = bodies.json_columns
    monkeypatch.setattr(bodies, "json_columns", lambda *a: reads.append(1) or read(*a))
    with _app(tmp_path / "m") as client:
        for _ in range(2):  # cold, then warm
            answer = client.post("/v1/predict", json={"rows": [
                {"store": 1, "price": 0.5, "promo": 1}]})
            assert answer.status_code == 200 and answer.json()["source"] == ["group"]
    assert len(reads) == 2


def _on_event_loop() -> bool:
    import asyncio

    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


def test_the_catalogs_key_kinds_are_read_off_the_event_loop(tmp_path, monkeypatch):
    """What a catalog's key columns hold is read once, from every key (4.7 s
    for a million keys of two columns, one of dates): GET /v1/models/{key},
    and a held model's request whose key came as text, read it on the event
    loop, every request and /healthz waiting."""
    from manymodels.serve.keytable import KeyTable

    read_on_the_loop = []
    kinds = KeyTable.kinds
    monkeypatch.setattr(KeyTable, "kinds", lambda self, width: read_on_the_loop.append(
        _on_event_loop()) or kinds(self, width))
    client = _keyed(tmp_path / "m", np.array([1, 2, 3]), [1.0, 2.0, 3.0])
    assert client.get("/v1/models/2").status_code == 200
    client = _app(tmp_path / "m")
    for key in (1, "1"):  # the model held, then its key as text
        answer = client.post("/v1/predict", json={"rows": [{"k": key, "x": 0.0}]})
        assert answer.status_code == 200 and answer.json()["source"] == ["group"]
        assert answer.json()["predictions"] == pytest.approx([1.0])
    assert read_on_the_loop == [False, False]


def _Body(rows: list[dict], *, declared: bool = True, chunk: int = 1 << 20) -> object:
    """A request as Ray Serve hands it to the deployment (a Starlette
    ``Request``) of ``rows``, its body streamed in chunks of ``chunk`` bytes,
    its size ``declared`` in a Content-Length or not."""
    from starlette.requests import Request

    body = json.dumps({"rows": rows}).encode()
    pieces = [body[start:start + chunk] for start in range(0, len(body), chunk)] or [b""]
    headers = [(b"content-length", str(len(body)).encode())] if declared else []

    async def receive() -> dict:
        piece = pieces.pop(0)
        return {"type": "http.request", "body": piece, "more_body": bool(pieces)}

    return Request({"type": "http", "method": "POST", "headers": headers}, receive)


def test_the_ray_deployments_body_answers_its_groups_rows(served):
    """The Ray Serve deployment's own code (Ray Serve itself left out: its
    test is slow): the model Ray Serve's multiplexing hands it answers its
    group's rows, the others come from the replica's cache."""
    import asyncio

    from manymodels.serve.ray import StoreModels

    server, store = served
    models = StoreModels(str(store.path), poll=None)
    rows = [{"store": 1, "price": 0.5, "promo": 1}, {"store": 2, "price": 0.2, "promo": 0}]

    async def answered() -> dict:
        loaded = await models.load("1")
        return json.loads((await models.answer(_Body(rows), loaded)).body)

    body = asyncio.run(answered())
    want = store.predict(pd.DataFrame(rows), by="store")
    assert body["source"] == ["group", "group"] and body["predictions"] == want.tolist()


class PredictsDates:
    """A model whose predictions are datetimes (a forecast of when)."""

    feature_names_in_ = np.array(["price"], dtype=object)

    def predict(self, rows):
        return np.array(["2024-01-31T08:00"] * len(rows), dtype="datetime64[us]")


def test_a_prediction_json_has_no_type_for_is_its_text_not_a_500(tmp_path):
    """Store.predict gives a model's datetimes; the JSON answer was a 500
    ("Object of type datetime is not JSON serializable"), logged as the
    model's failure."""
    mm.train(lambda df: PredictsDates(), mm.groups(_sales(), by="store"),
             store=tmp_path / "m", backend="serial", progress=False)
    answer = _app(tmp_path / "m").post("/v1/predict", json={"rows": [
        {"store": 1, "price": 0.5}]})
    assert answer.status_code == 200, answer.text
    assert answer.json()["predictions"] == ["2024-01-31T08:00:00"]


def _deleted_index_files(folder) -> list[str]:
    """This process's open files that are an index removed from ``folder``."""
    import os

    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (the listing's own)
            continue
        if target.startswith(f"{folder}/index.sqlite") and target.endswith("(deleted)"):
            found.append(target)
    return found


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self/fd"), reason="reads /proc")
def test_a_store_replaced_at_its_path_has_its_old_index_closed(tmp_path):
    """Each store replaced at the served path kept its index, removed, open
    (its connections sit in reference cycles): a long-running server held
    one more removed index on disk each time, until a full collection."""
    import gc
    import shutil

    from manymodels.serve.state import ServedStore

    for name in ("a", "b"):
        mm.train(fit_frame, mm.groups(_sales(stores=2, rows=40), by="store"),
                 store=tmp_path / name, backend="serial", progress=False)
    served_path = tmp_path / "m"
    shutil.copytree(tmp_path / "a", served_path)
    served = ServedStore(served_path, None, 10, 1 << 20, poll=None)
    gc.disable()  # what a collection would close by chance is not counted
    try:
        for source in ("b", "a"):
            shutil.rmtree(served_path)
            shutil.copytree(tmp_path / source, served_path)
            assert served.reload()
            assert _deleted_index_files(served_path) == []
    finally:
        gc.enable()


def test_polling_starts_again_when_the_apps_lifespan_runs_again(tmp_path):
    """stop() left its poller set: a second lifespan (a test client opened
    again) never polled, and served the first run for ever."""
    from starlette.testclient import TestClient

    mm.train(fit_frame, mm.groups(_sales(stores=2, rows=40), by="store"),
             store=tmp_path / "m", backend="serial", progress=False)
    application = mm.serve_app(tmp_path / "m", poll=0.05)
    served = application.state.served
    for _ in range(2):
        with TestClient(application) as client:
            assert client.get("/healthz").status_code == 200
            assert served.poller is not None and served.poller.is_alive()
        assert served.poller is None


def test_the_ray_deployments_unreadable_key_header_is_a_400(tmp_path):
    """A header key that cannot be read as its columns hold keys raised out
    of the multiplexed load: a 500. No header: the rows answered all the
    same (Ray Serve refuses an empty model id)."""
    import asyncio

    from manymodels.serve.ray import StoreModels

    frame = _sales(stores=2, rows=40).assign(region=1)
    mm.train(fit_frame, mm.groups(frame, by=["store", "region"]), store=tmp_path / "m",
             backend="serial", progress=False)
    models = StoreModels(str(tmp_path / "m"), poll=None)
    rows = [{"store": 1, "region": 1, "price": 0.5, "promo": 1}]

    def answered(model_id: str) -> tuple[int, dict]:
        response = asyncio.run(models.respond(_Body(rows), model_id, models.load))
        return response.status_code, json.loads(response.body)

    status, body = answered("1")
    assert status == 400 and "serve_multiplexed_model_id" in body["error"], body
    assert "JSON list of 2 values" in body["error"]
    want = mm.Store(tmp_path / "m").predict(pd.DataFrame(rows), by=["store", "region"])
    for model_id in ("[1, 1]", ""):
        status, body = answered(model_id)
        assert status == 200 and body["predictions"] == want.tolist(), body


#: Per unpickling or prediction of a :class:`RecordsItsThread` model: whether
#: it ran on an event loop.
ON_THE_LOOP: list[tuple[str, bool]] = []


class RecordsItsThread:
    """A model that notes whether its unpickling and its predictions ran on
    an event loop (a large model's unpickling takes seconds)."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __setstate__(self, state: dict) -> None:
        ON_THE_LOOP.append(("load", _on_event_loop()))
        self.__dict__.update(state)

    def predict(self, rows):
        ON_THE_LOOP.append(("predict", _on_event_loop()))
        if (np.asarray(rows, dtype=float) < 0).any():
            raise RuntimeError("this model refuses a negative price")
        return np.full(len(rows), self.value)


def test_the_ray_deployment_loads_and_predicts_off_the_event_loop(tmp_path):
    """A cold model was unpickled, and every model predicted, on the
    replica's event loop: each held up every other request of the replica.
    A model's own failure is a JSON 500 naming it, as serve_app answers it."""
    import asyncio

    from manymodels.serve.ray import StoreModels

    mm.train(lambda df: RecordsItsThread(float(df["store"].iloc[0])),
             mm.groups(_sales(stores=2, rows=40), by="store"), store=tmp_path / "m",
             backend="serial", progress=False)
    models = StoreModels(str(tmp_path / "m"), poll=None)
    rows = [{"store": 0, "price": 0.5}, {"store": 1, "price": 0.5}]
    ON_THE_LOOP.clear()
    response = asyncio.run(models.respond(_Body(rows), "1", models.load))
    assert response.status_code == 200 and json.loads(response.body)["predictions"] == [0, 1]
    assert sorted(ON_THE_LOOP) == [("load", False), ("load", False),
                                   ("predict", False), ("predict", False)]
    response = asyncio.run(models.respond(_Body([{"store": 1, "price": -1.0}]), "1",
                                          models.load))
    assert response.status_code == 500
    assert "RuntimeError: this model refuses a negative price" in json.loads(
        response.body)["error"]


def test_the_ray_deployment_refuses_what_its_replicas_would_before_ray_serve_starts(
        tmp_path, monkeypatch):
    """deployment() checked nothing: a missing store, an unknown run or a bad
    poll failed each replica's constructor once Ray Serve had started it.
    A relative path was opened in the replica's working directory (Ray's)."""
    pytest.importorskip("ray.serve")
    from manymodels.serve.ray import deployment

    mm.train(fit_frame, mm.groups(_sales(stores=2, rows=40), by="store"),
             store=tmp_path / "m", backend="serial", progress=False)
    with pytest.raises(ValueError, match="store .*nothing' does not exist"):
        deployment(str(tmp_path / "nothing"))
    with pytest.raises(ValueError, match="has no run 9"):
        deployment(str(tmp_path / "m"), run=9)
    with pytest.raises(ValueError, match="poll must be a positive number of seconds"):
        deployment(str(tmp_path / "m"), poll=0)
    monkeypatch.chdir(tmp_path)
    made = deployment("m", poll=None)
    monkeypatch.chdir(tmp_path / "m")  # elsewhere, as a replica is
    replica = made.func_or_class()
    assert replica.served.catalog.models == 2


def test_a_json_body_is_held_to_its_objects_and_read_into_columns(tmp_path):
    """64 MiB of tiny JSON rows made 20-30 times that in dicts (a server's
    memory): the rows are read into columns as parsed, and a body of more
    objects than one per 32 bytes of --max-body is a 413. A value nested in
    a row is refused by column and row; an object beside "rows" is ignored."""
    mm.train(fit_frame, mm.groups(_sales(stores=2, rows=40), by="store"),
             store=tmp_path / "m", backend="serial", progress=False)
    client = TestClient(mm.serve_app(tmp_path / "m", poll=None, max_body=3200))
    many = client.post("/v1/predict", content=b'{"rows": [' + b",".join([b"{}"] * 200) + b"]}")
    assert many.status_code == 413 and "more than 100 objects" in many.json()["error"]
    rows = [{"store": 1, "price": 0.5, "promo": 1}, {"store": 0, "promo": 0, "price": 0.2},
            {"store": 1, "promo": 1, "price": 0.9, "unused": "x"}]
    answer = client.post("/v1/predict", json={"rows": rows, "meta": {"store": 9, "price": 1}})
    want = mm.Store(tmp_path / "m").predict(pd.DataFrame(rows), by="store")
    assert answer.status_code == 200 and answer.json()["predictions"] == want.tolist()
    rows[1]["price"] = {"nested": 1}
    nested = client.post("/v1/predict", json={"rows": rows})
    assert nested.status_code == 400
    assert nested.json()["error"].startswith("column 'price' of row 1 holds a dict")
    # 60 rows, each naming a column of its own (1.3 KB): 3,600 cells, each
    # column made whole, over 3,200
    sparse = [{"store": 1, f"c{i}": 1} for i in range(60)]
    wide = client.post("/v1/predict", json={"rows": sparse})
    assert wide.status_code == 413 and "61 distinct columns" in wide.json()["error"]
    # names only an object beside "rows" holds are no cells of the rows
    meta = {f"m{i}": i for i in range(60)}
    beside = client.post("/v1/predict", json={"meta": meta, "rows": rows[:1] * 60})
    assert beside.status_code == 200 and len(beside.json()["predictions"]) == 60


def test_a_json_bodys_columns_are_in_the_order_its_rows_name_them():
    """An object beside "rows", read first, named its columns first."""
    from manymodels.serve.requests import json_columns

    body = b'{"meta": {"c": 0, "b": 0}, "rows": [{"a": 1}, {"b": 2, "a": 0, "c": 3}]}'
    columns, n = json_columns(body, (), 1 << 20)
    assert n == 2 and list(columns) == ["a", "b", "c"]


#: Whether a :class:`LoadsOnlyWhenAllowed` model may be unpickled.
LOADS_ALLOWED = [True]


class LoadsOnlyWhenAllowed:
    """A model that stands for one whose class's module is gone where it is
    served: its unpickling fails unless allowed."""

    def __init__(self) -> None:
        self.value = 0.0  # (a state: pickle calls __setstate__ only with one)

    def __setstate__(self, state: dict) -> None:
        if not LOADS_ALLOWED[0]:
            raise ModuleNotFoundError("No module named 'gone'")
        self.__dict__.update(state)

    def predict(self, rows):
        return np.zeros(len(rows))


@pytest.mark.parametrize("declared", [True, False])
def test_the_ray_deployment_holds_a_body_to_its_limit(tmp_path, declared):
    """The deployment read a request's body whole, of any size, before a
    row of it was looked at: past ``max_body`` it is a 413, by its
    Content-Length or as it streams in."""
    import asyncio

    from manymodels.serve.ray import StoreModels

    mm.train(fit_frame, mm.groups(_sales(stores=2, rows=40), by="store"),
             store=tmp_path / "m", backend="serial", progress=False)
    models = StoreModels(str(tmp_path / "m"), poll=None, max_body=2000)
    rows = [{"store": 1, "price": 0.5, "promo": 1}] * 100  # 3.4 KB
    response = asyncio.run(models.answer(_Body(rows, declared=declared, chunk=500),
                                         (None, None)))
    assert response.status_code == 413
    assert "over the limit of 2000" in json.loads(response.body)["error"]
    small = asyncio.run(models.answer(_Body(rows[:10], declared=declared, chunk=100),
                                      (None, None)))
    assert small.status_code == 200 and len(json.loads(small.body)["predictions"]) == 10


def test_the_ray_deployment_refuses_a_declared_oversize_body_before_loading(tmp_path):
    """A body whose Content-Length passes max_body was refused only after
    the model its header names was loaded (seconds for a cold one): it is
    a 413 with no model loaded."""
    import asyncio

    from manymodels.serve.ray import StoreModels

    mm.train(fit_frame, mm.groups(_sales(stores=2, rows=40), by="store"),
             store=tmp_path / "m", backend="serial", progress=False)
    models = StoreModels(str(tmp_path / "m"), poll=None, max_body=2000)
    asked: list[str] = []

    async def load(model_id: str) -> tuple:
        asked.append(model_id)
        return await models.load(model_id)

    rows = [{"store": 1, "price": 0.5, "promo": 1}] * 100  # 3.4 KB
    response = asyncio.run(models.respond(_Body(rows), "1", load))
    assert response.status_code == 413 and asked == []


@pytest.mark.parametrize("value", [1.5, 7, -(1 << 63), 1 << 63, 10 ** 30, True, None, "x",
                                   float("inf")])
def test_a_one_row_json_body_types_its_values_as_many_rows_do(value):
    """The one-row request's own path types each value as the path of many
    rows does (int64, float64, bool, or as it came)."""
    from manymodels.serve.requests import json_columns

    for keys in ((), ("v",)):  # a feature, and a group column
        one, _ = json_columns(json.dumps({"rows": [{"v": value}]}).encode(), keys)
        two, _ = json_columns(json.dumps({"rows": [{"v": value}, {"v": value}]}).encode(), keys)
        assert one["v"].dtype == two["v"].dtype
        assert one["v"].tolist() == two["v"].tolist()[:1]


@pytest.mark.parametrize("rows", ['{"store": 1, "price": BIG}',  # the one-row path
                                  '{"store": 1, "price": 0.5}, {"store": 2, "price": BIG}'])
def test_a_whole_number_past_pythons_digits_limit_is_refused_by_column_and_row(rows):
    """An integer of more than 4,300 digits was Python's int-conversion
    error, a 400 naming no column."""
    from manymodels.serve.predictor import RequestError
    from manymodels.serve.requests import json_columns

    body = '{"rows": [' + rows.replace("BIG", "-" + "9" * 5000) + "]}"
    with pytest.raises(RequestError, match=r"column 'price' of row \d holds a whole number "
                                           r"of 5000 digits, past the 4300") as raised:
        json_columns(body.encode(), ("store",), 1 << 20)
    assert raised.value.status == 400 and f"row {rows.count('{') - 1}" in str(raised.value)


def test_the_ray_deployments_model_that_does_not_unpickle_is_named(tmp_path):
    """A model that failed to unpickle in the multiplexed load gave Ray
    Serve's bare 500: it is a 500 naming the key and why."""
    import asyncio

    from manymodels.serve.ray import StoreModels

    mm.train(lambda df: LoadsOnlyWhenAllowed(), mm.groups(_sales(stores=2, rows=40),
                                                           by="store"),
             store=tmp_path / "m", backend="serial", progress=False)
    models = StoreModels(str(tmp_path / "m"), poll=None)
    LOADS_ALLOWED[0] = False
    try:
        response = asyncio.run(models.respond(_Body([{"store": 1, "price": 0.5}]), "1",
                                              models.load))
    finally:
        LOADS_ALLOWED[0] = True
    error = json.loads(response.body)["error"]
    assert response.status_code == 500 and "of key 1 does not unpickle" in error
    assert "ModuleNotFoundError: No module named 'gone'" in error



def fit_x_but_k_2(df):
    if df["k"].iloc[0] == 2:
        raise ValueError("k 2 is bad")
    return fit_x(df)


def test_a_group_that_failed_in_training_answered_by_the_fallback_is_logged_once(
        tmp_path, caplog):
    """Store.predict warns of a group that failed in training and is answered
    by the fallback; the server said nothing. Now a warning in its log, once
    per group and run, not per request (a group never trained: not said)."""
    frame = pd.DataFrame({"k": np.repeat([1, 2], 5), "x": np.arange(10.0),
                          "y": np.repeat([1.0, 2.0], 5)})
    run = mm.train(fit_x_but_k_2, mm.groups(frame, by="k"), store=tmp_path / "s",
                   backend="serial", progress=False)
    mm.Store(tmp_path / "s").attach(run.run_id, "fallback", fit_x(frame))
    client = _app(tmp_path / "s")
    rows = {"rows": [{"k": k, "x": 0.0} for k in (2, 1, 3, 2)]}
    with caplog.at_level("WARNING", logger="manymodels.serve"):
        for _ in range(3):
            assert client.post("/v1/predict", json=rows).json()["source"] == [
                "fallback", "group", "fallback", "fallback"]
    said = [r.getMessage() for r in caplog.records if "failed in training" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith("run 1: 1 group failed in training and is answered by the "
                              "fallback model: e.g. [2], status failed")


def test_the_failed_groups_said_are_those_of_the_catalogs_runs_not_of_a_later_run(
        tmp_path, caplog):
    """A catalog over several runs read the failed groups of the store's
    runs at its first fallback: a run ended since (not served yet, poll
    off) had its failed group said as one of the served runs'."""
    frame = pd.DataFrame({"k": np.repeat([1, 2], 5), "x": np.arange(10.0),
                          "y": np.repeat([1.0, 2.0], 5)})
    store = tmp_path / "s"
    first = mm.train(fit_x_but_k_2, mm.groups(frame, by="k"), store=store, backend="serial",
                     progress=False)
    mm.Store(store).attach(first.run_id, "fallback", fit_x(frame))
    mm.train(fit_x, mm.groups(frame[frame["k"] == 1], by="k"), store=store,
             backend="serial", progress=False)
    client = _app(store)  # serves runs 1 and 2
    broken = frame[frame["k"] == 1].assign(k=3, x=np.nan)  # a group 3 that fails, in run 3
    mm.train(fit_x, mm.groups(broken, by="k"), store=store, backend="serial", progress=False)
    assert mm.Store(store).results(3)["status"].tolist() == ["failed"]
    with caplog.at_level("WARNING", logger="manymodels.serve"):
        answer = client.post("/v1/predict", json={"rows": [{"k": 3, "x": 0.0},
                                                            {"k": 2, "x": 0.0}]}).json()
    assert answer["source"] == ["fallback", "fallback"]  # the catalog of runs 1 and 2
    said = [r.getMessage() for r in caplog.records if "failed in training" in r.getMessage()]
    assert len(said) == 1 and "e.g. [2]" in said[0], said  # group 3: never trained there
