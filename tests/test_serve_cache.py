"""The server's cold path: a packed model read by its byte range with its
pack's template held (serve/cache.py), and POST /v1/predict answered ahead
of Starlette's routing (serve/fastpath.py), mounted in another app too."""

from __future__ import annotations

import sqlite3

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import Ridge
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

import manymodels as mm
from manymodels.serve.cache import ModelCache
from manymodels.serve.catalog import build_catalog
from manymodels.store import StoreIntegrityError, packs


def fit_coefficients(data):
    return np.array([data["y"].mean(), data["y"].std(), float(len(data["y"]))])


@pytest.fixture(scope="module")
def arrays_store(tmp_path_factory):
    """40 groups whose models are small arrays of one kind: templated packs."""
    path = tmp_path_factory.mktemp("templated") / "m"
    rng = np.random.default_rng(4)
    frame = pd.DataFrame({"g": np.repeat(np.arange(40), 5), "y": rng.random(200)})
    mm.train(fit_coefficients, mm.groups(frame, by="g", format="numpy"), store=path,
             backend="serial", progress=False)
    return path


def _locators(path) -> dict[str, str]:
    store = mm.Store(path)
    return dict(build_catalog(store).keys.items())


def test_templated_packed_models_load_byte_for_byte_with_the_template_held(arrays_store):
    with sqlite3.connect(arrays_store / "index.sqlite") as conn:
        assert conn.execute("SELECT count(*) FROM packs WHERE length(head) > 0").fetchone()[0]
    store = mm.Store(arrays_store, read_only=True)
    wanted = store.models()
    cache = ModelCache(100, 1 << 20)
    for text, locator in _locators(arrays_store).items():
        key = int(text.strip("[]"))
        assert np.array_equal(cache.get(store, locator, f"key {key}"), wanted[key])
    assert cache.stats()["misses"] == 40 and cache._templates


def test_a_model_tampered_under_a_held_template_is_refused_by_name(arrays_store, tmp_path):
    import shutil

    path = tmp_path / "copy"
    shutil.copytree(arrays_store, path)
    locators = _locators(path)
    store = mm.Store(path, read_only=True)
    cache = ModelCache(100, 1 << 20)
    by_pack: dict[int, list[str]] = {}
    for text, locator in locators.items():
        by_pack.setdefault(packs.parse_locator(locator)[1], []).append(text)
    pack, (held, tampered, other, *_) = max(by_pack.items(), key=lambda item: len(item[1]))
    first = cache.get(store, locators[held], "key held")  # its pack's template now held
    offset = packs.parse_locator(locators[tampered])[2]
    with sqlite3.connect(path / "index.sqlite") as conn:
        blob = bytearray(conn.execute("SELECT blob FROM packs WHERE pack_id = ?",
                                      (pack,)).fetchone()[0])
        blob[offset] ^= 0xFF
        conn.execute("UPDATE packs SET blob = ? WHERE pack_id = ?", (bytes(blob), pack))
    with pytest.raises(StoreIntegrityError, match="key tampered.*SHA-256"):
        cache.get(store, locators[tampered], "key tampered")
    assert cache.get(store, locators[held], "key held") is first
    assert np.array_equal(cache.get(store, locators[other], "key other"),
                          mm.Store(path, read_only=True).models()[int(other.strip("[]"))])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # Store.predict's NaN for store 9
def test_predict_is_answered_where_the_app_is_mounted_with_its_token(tmp_path):
    rng = np.random.default_rng(2)
    frame = pd.DataFrame({"store": rng.integers(0, 6, 300), "price": rng.random(300)})
    frame["sales"] = frame.price * (frame.store + 1) + rng.random(300)
    path = tmp_path / "m"
    mm.train(lambda df: Ridge().fit(df[["price"]], df["sales"]),
             mm.groups(frame, by="store"), store=path, backend="serial", progress=False)
    service = Starlette(routes=[Mount("/models", app=mm.serve_app(path, token="t0k",
                                                                   poll=None))])
    rows = [{"store": k, "price": 0.5} for k in (3, 0, 9)]
    with TestClient(service) as client:
        assert client.post("/models/v1/predict", json={"rows": rows}).status_code == 401
        assert client.get("/models/v1/predict").status_code == 405  # as routing answers
        assert client.post("/models/v1/predict/", json={"rows": rows},
                           follow_redirects=False).status_code == 307
        answer = client.post("/models/v1/predict", json={"rows": rows},
                             headers={"authorization": "Bearer t0k"})
        assert answer.status_code == 200
        want = mm.Store(path).predict(pd.DataFrame(rows), by="store", with_source=True)
        assert answer.json()["predictions"][:2] == want["prediction"].tolist()[:2]
        assert answer.json()["source"] == ["group", "group", "none"]
        refused = client.post("/models/v1/predict", json={"rows": [{"store": 1}]},
                              headers={"authorization": "Bearer t0k"})
        assert refused.status_code == 422 and "price" in refused.json()["error"]
        assert client.get("/models/v1/predict").status_code in (404, 405)
        metrics = client.get("/models/metrics", headers={"authorization": "Bearer t0k"}).text
        assert 'manymodels_serve_requests_total{route="/v1/predict",code="200"} 1' in metrics
        assert "manymodels_serve_catalog_bytes" in metrics


def test_the_servers_startup_objects_are_frozen_out_of_the_collectors_sight():
    import gc

    from manymodels.serve.app import freeze_startup_objects

    try:
        freeze_startup_objects()
        assert gc.get_freeze_count() > 1000  # the imports: no full collection walks them
    finally:
        gc.unfreeze()
