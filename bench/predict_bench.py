"""Prediction of many groups' new rows from a store: on the engine vs serially.

Three ways to predict G groups x R new rows with the G LinearRegression
models a store holds, all checked to give the same predictions:

* ``serial_store``: the serial ``Store.predict`` of commit a2f87ac (before
  prediction ran on the engine), kept below as ``old_predict``: the driver
  groups the rows, then loads each group's model and predicts, one by one;
* ``groupby_loop``: a hand-written ``df.groupby(by)`` + loop over models
  already loaded in memory (the loop users write; its model loading is not
  even timed, so it flatters the loop);
* ``engine``: ``Store.predict(table, by=..., workers=N)`` (this version).

Usage: python bench/predict_bench.py [--groups 10000] [--rows 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.linear_model import LinearRegression

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
import manymodels as mm  # noqa: E402

FEATURES = ["x1", "x2", "x3"]


def fit(df: pd.DataFrame) -> Any:
    return LinearRegression().fit(df[FEATURES], df["y"])


def make_rows(groups: int, rows: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    n = groups * rows
    frame = pd.DataFrame({"g": np.repeat(np.arange(groups), rows),
                          **{f: rng.normal(size=n) for f in FEATURES}})
    frame["y"] = frame["x1"] * 2 - frame["x2"] + rng.normal(size=n)
    return frame.sample(frac=1.0, random_state=seed).reset_index(drop=True)  # unsorted


def old_predict(store: mm.Store, frame: pd.DataFrame, by: str) -> pd.Series:
    """``Store.predict`` as it was at a2f87ac: serial, in the driver (the
    fallback and warning branches left out: every group has a model here)."""
    from manymodels.inputs.keys import encode_key, key_parts
    from manymodels.sklearn._routing import group_positions, route_rows
    from manymodels.store.registry import StoredModel

    by_columns = [by]
    artifacts = store._model_artifacts(None)
    loaded: dict[str, Any] = {}

    def model_of(key: Any) -> Any:
        code = encode_key(key_parts(key))
        if code in artifacts:
            if code not in loaded:
                loaded[code] = StoredModel(store, artifacts[code], f"key {key!r}").load()
            return loaded[code], "group"
        return None

    def call(model: Any, rows: Any) -> Any:
        names = list(getattr(model, "feature_names_in_", [])) or [
            c for c in frame.columns if c not in by_columns]
        part = frame.iloc[rows][names]
        if not hasattr(model, "feature_names_in_"):
            part = part.to_numpy()
        return model.predict(part)

    routed = route_rows(group_positions(frame[by_columns]), len(frame), model_of, call)
    return pd.Series(routed.values, index=frame.index)


def groupby_loop(models: dict, frame: pd.DataFrame, by: str) -> pd.Series:
    out = pd.Series(np.nan, index=frame.index)
    for key, rows in frame.groupby(by, sort=False):
        out.loc[rows.index] = models[key].predict(rows[FEATURES])
    return out


def timed(fn: Any) -> tuple[float, Any]:
    begin = time.perf_counter()
    value = fn()
    return time.perf_counter() - begin, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--rows", type=int, default=5)
    parser.add_argument("--train-rows", type=int, default=20)
    parser.add_argument("--workers", type=int, default=_common.cores())
    parser.add_argument("--engine-only", action="store_true",
                        help="time only the engine (and training): for large sizes")
    parser.add_argument("--out", type=Path,
                        default=_common.BENCH_DIR / "results" / "predict_bench.json")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="mm-predict-bench-"))
    try:
        store = mm.Store(root / "store")
        train_s, run = timed(lambda: mm.train(
            fit, mm.groups(make_rows(args.groups, args.train_rows, 0), by="g"),
            store=store, workers=args.workers, progress=False))
        new = make_rows(args.groups, args.rows, 1)[["g", *FEATURES]]
        results: dict[str, dict[str, float]] = {}
        engine_s, engine = timed(lambda: store.predict(new, by="g", workers=args.workers))
        results["engine"] = {"wall_s": engine_s}
        checks = []
        if not args.engine_only:
            old_s, old = timed(lambda: old_predict(store, new, "g"))
            results["serial_store"] = {"wall_s": old_s}
            models = {key: model for key, model in run.models.items()}  # loaded: not timed
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                loop_s, loop = timed(lambda: groupby_loop(models, new, "g"))
            results["groupby_loop"] = {"wall_s": loop_s}
            checks = [("serial_store", old), ("groupby_loop", loop)]
        else:  # a sample of groups checked against their models
            for key in list(run.models)[:50]:
                rows = (new["g"] == key).to_numpy()
                expected = run.models[key].predict(new.loc[rows, FEATURES])
                if not np.allclose(engine[rows].to_numpy(), expected):
                    raise AssertionError(f"group {key}: the engine's prediction differs")
        for name, values in checks:
            if not np.allclose(values.to_numpy(), engine.to_numpy(), rtol=1e-9, atol=1e-9):
                raise AssertionError(f"{name} disagrees with the engine's predictions")
        for name in results:
            results[name]["speedup_of_engine"] = results[name]["wall_s"] / engine_s
        data = {"machine": _common.machine_info(), "groups": args.groups,
                "rows_per_group": args.rows, "workers": args.workers,
                "train_wall_s": train_s, "results": results}
        print(f"predict {args.groups} groups x {args.rows} rows on {args.workers} worker(s)"
              f" (training them took {train_s:.2f} s)")
        print(f"{'way':<14}{'wall s':>10}{'engine faster by':>18}")
        for name, row in results.items():
            print(f"{name:<14}{row['wall_s']:>10.2f}{row['speedup_of_engine']:>17.1f}x")
        _common.write_json(args.out, data)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
