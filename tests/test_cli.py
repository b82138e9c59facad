from __future__ import annotations

import json
import subprocess
import sys

import pytest

import manymodels as mm


def test_demo_runs_and_reports(tmp_path):
    out = tmp_path / "demo.json"
    result = subprocess.run(
        [sys.executable, "-m", "manymodels.cli", "demo", "--stores", "4", "--items", "5",
         "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "speed-up over serial" in result.stdout
    numbers = json.loads(out.read_text())
    assert numbers["groups"] == 20 and numbers["ok"] == 20 and numbers["failed"] == 0
    assert 0 < numbers["utilization"] <= 1.05
    assert numbers["serial_wall_s"] > 0


def test_help_lists_demo():
    result = subprocess.run([sys.executable, "-m", "manymodels.cli", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "demo" in result.stdout


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "manymodels.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.fixture
def sales_files(tmp_path):
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(1)
    parts = []
    for s, store in enumerate(["s000", "s001", "s002"]):
        for item in ["i000", "i001", "i002", "i003"]:
            price, promo = rng.uniform(1, 10, 150), rng.integers(0, 2, 150)
            sales = 50 - (s + 1) * price + 8 * promo + rng.normal(0, 0.5, 150)
            parts.append(pd.DataFrame({"store": store, "item": item, "price": price,
                                       "promo": promo, "sales": sales}))
    table = pd.concat(parts, ignore_index=True)
    csv, parquet = tmp_path / "sales.csv", tmp_path / "sales.parquet"
    table.to_csv(csv, index=False)
    table.to_parquet(parquet)
    return table, csv, parquet


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_cli_trains_and_predicts(tmp_path, sales_files, kind):
    import pandas as pd

    table, csv, parquet = sales_files
    data = csv if kind == "csv" else parquet
    store = tmp_path / "store"
    result = _cli("train", data, "--by", "store,item", "--target", "sales",
                  "--model", "sklearn.linear_model.Ridge", "--grid", "alpha=0.01,1000",
                  "--metrics", "r2,mae", "--cv", "3", "--store", store, "--workers", "2")
    assert result.returncode == 0, result.stderr
    assert "12 ok, 0 failed of 12" in result.stdout
    opened = mm.Store(store)
    results = opened.results()
    assert {"r2", "mae", "best_alpha", "rows"} <= set(results.columns)
    assert set(results["best_alpha"]) <= {0.01, 1000}
    assert (results["r2"] > 0.9).all()  # the signal is strong: the small alpha wins
    assert (results["best_alpha"] == 0.01).all()

    new = table[table["store"] == "s000"].head(30).copy()
    unseen = new.head(5).assign(store="s999")
    rows = pd.concat([new, unseen], ignore_index=True)
    rows_path = tmp_path / ("new.parquet" if kind == "parquet" else "new.csv")
    rows.to_parquet(rows_path) if kind == "parquet" else rows.to_csv(rows_path, index=False)
    out = tmp_path / "predictions.csv"
    result = _cli("predict", store, rows_path, "--out", out)
    assert result.returncode == 0, result.stderr
    predicted = pd.read_csv(out)
    assert list(predicted["source"]) == ["group"] * 30 + ["fallback"] * 5
    features = [c for c in table.columns if c not in ("store", "item", "sales")]
    first = rows.iloc[0]
    model = opened.load((first["store"], first["item"]))
    expected = model.predict(rows[features].iloc[:1].to_numpy())[0]
    assert predicted["prediction"].iloc[0] == pytest.approx(expected)


def test_cli_bad_column_exits_non_zero_naming_it(tmp_path, sales_files):
    _, csv, _ = sales_files
    for args, name in [(("--by", "shop", "--target", "sales"), "'shop'"),
                       (("--by", "store", "--target", "revenue"), "'revenue'"),
                       (("--by", "store", "--target", "sales", "--features", "price,colour"),
                        "'colour'")]:
        result = _cli("train", csv, *args, "--model", "sklearn.linear_model.Ridge",
                      "--store", tmp_path / "s")
        assert result.returncode != 0
        assert name in result.stderr
    result = _cli("train", csv, "--by", "store", "--target", "sales", "--model",
                  "sklearn.linear_model.Ridge", "--metrics", "r3", "--store", tmp_path / "s")
    assert result.returncode != 0 and "unknown metric 'r3'" in result.stderr


def test_cli_failed_groups_set_the_exit_code(tmp_path, sales_files):
    table, _, _ = sales_files
    broken = table.copy()
    broken.loc[broken["store"] == "s001", "price"] = float("nan")  # LinearRegression fails
    data = tmp_path / "broken.parquet"
    broken.to_parquet(data)
    args = ["train", data, "--by", "store", "--target", "sales", "--model",
            "sklearn.linear_model.LinearRegression", "--store", tmp_path / "s"]
    result = _cli(*args)
    assert result.returncode == 1 and "1 group(s) failed" in result.stderr
    assert _cli(*args, "--allow-failures").returncode == 0
    shown = _cli("show", tmp_path / "s")
    assert shown.returncode == 0 and "failed" in shown.stdout


def test_cli_report(tmp_path, sales_files):
    _, csv, _ = sales_files
    store = tmp_path / "s"
    assert _cli("train", csv, "--by", "store", "--target", "sales", "--model",
                "sklearn.linear_model.Ridge", "--store", store).returncode == 0
    out = tmp_path / "r.html"
    result = _cli("report", store, "-o", out)
    assert result.returncode == 0 and out.exists()
    assert "Worker timeline" in out.read_text()


def test_cli_trains_lightgbm_by_dotted_name(tmp_path, sales_files):
    pytest.importorskip("lightgbm")
    _, _, parquet = sales_files
    store = tmp_path / "store"
    result = _cli("train", parquet, "--by", "store", "--target", "sales", "--model",
                  "lightgbm.LGBMRegressor", "--param", "n_estimators=30", "--param",
                  "verbose=-1", "--param", "n_jobs=1", "--store", store, "--workers", "2")
    assert result.returncode == 0, result.stderr
    model = mm.Store(store).load("s001")
    assert type(model).__name__ == "LGBMRegressor" and model.n_estimators == 30
    assert (mm.Store(store).results()["r2"] > 0.5).all()
