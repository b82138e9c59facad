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

``--million`` (issue 42's target: at most 30 s on 2 cores) times
``Store.predict`` of ``--groups`` (default then 1,000,000) groups x ``--rows``
new rows, shuffled, for two kinds of stored run, each trained first
(untimed) from 10 rows a group with ``x1``, ``x2``:

* ``tiny``: ``mm.train`` with a store, each group's model a pickled
  :class:`Line` (two coefficients and an intercept, from one ``lstsq``: the
  model ``bench/million_bench.py`` fits), predicted by the engine in chunks;
* ``linear``: an ``mm.linear`` run in a store, predicted vectorised.

It reports the wall time of ``Store.predict`` alone, the driver's CPU
seconds during it and the load average, and checks 1,000 groups' predictions
against their coefficients. Usage:
``python bench/predict_bench.py --million [--groups N] [--workers W]``.
"""

from __future__ import annotations

import argparse
import os
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
MILLION = 1_000_000
CHECKED = 1_000  # groups of the million case whose predictions are checked


class Line:
    """A tiny NumPy model: two coefficients and an intercept."""

    def __init__(self, coef: np.ndarray) -> None:
        self.coef = coef

    def predict(self, X: Any) -> np.ndarray:
        X = np.asarray(X, dtype=float)
        return X @ self.coef[:2] + self.coef[2]


def fit_line(data: dict[str, np.ndarray]) -> Line:
    """One group's least squares of ``y`` on ``[x1, x2, 1]``."""
    x1 = data["x1"]
    design = np.column_stack([x1, data["x2"], np.ones(len(x1))])
    return Line(np.linalg.lstsq(design, data["y"], rcond=None)[0])


def line_rows(groups: int, rows: int, seed: int) -> pd.DataFrame:
    """``groups`` x ``rows`` rows of ``g``, ``x1``, ``x2``, ``y``, shuffled."""
    rng = np.random.default_rng(seed)
    n = groups * rows
    g = np.repeat(np.arange(groups, dtype=np.int64), rows)
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    y = rng.normal(size=groups)[g] * x1 - 0.5 * x2 + 1.0 + rng.normal(scale=0.3, size=n)
    order = rng.permutation(n)
    return pd.DataFrame({"g": g[order], "x1": x1[order], "x2": x2[order], "y": y[order]})


def train_store(kind: str, store: mm.Store, train: pd.DataFrame, workers: int) -> Any:
    if kind == "tiny":
        return mm.train(fit_line, mm.groups(train, by="g", format="numpy"), store=store,
                        workers=workers, progress=False)
    return mm.linear(train, by="g", features=["x1", "x2"], target="y", workers=workers,
                     store=store)


def million_case(kind: str, groups: int, rows: int, workers: int, root: Path) -> dict:
    """Train a store of ``kind`` (untimed), then time its ``Store.predict``."""
    import resource

    store = mm.Store(root / kind)
    train_s, _ = timed(lambda: train_store(kind, store, line_rows(groups, 10, 0), workers))
    new = line_rows(groups, rows, 1)[["g", "x1", "x2"]]
    load = os.getloadavg()
    before = [resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                  resource.RUSAGE_CHILDREN)]
    wall, predicted = timed(lambda: store.predict(new, by="g", workers=workers))
    driver_cpu, workers_cpu = [  # the workers are children, waited for when the run ends
        (after.ru_utime - start.ru_utime) + (after.ru_stime - start.ru_stime)
        for start, after in zip(before, [resource.getrusage(who) for who in (
            resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)])]
    check_lines(store, kind, new, predicted, groups)
    return {"kind": kind, "groups": groups, "rows_per_group": rows, "workers": workers,
            "train_s": train_s, "wall_s": wall, "driver_cpu_s": driver_cpu,
            "workers_cpu_s": workers_cpu,
            "load_average_before": list(load), "checked_groups": min(CHECKED, groups)}


def check_lines(store: mm.Store, kind: str, new: pd.DataFrame, predicted: pd.Series,
                groups: int) -> None:
    """The predictions of a sample of groups against their own coefficients
    (tiny: the stored Line; linear: ``lstsq`` of the group's training rows)."""
    sample = np.random.default_rng(2).choice(groups, min(CHECKED, groups), replace=False)
    rows = new["g"].isin(sample).to_numpy()
    if kind == "tiny":
        models = {key: store.load(int(key)) for key in sample}
        expected = np.array([models[g].predict([[a, b]])[0] for g, a, b in zip(
            new.loc[rows, "g"], new.loc[rows, "x1"], new.loc[rows, "x2"])])
    else:  # the same least squares, fitted here on the sampled groups' rows
        train = line_rows(groups, 10, 0)
        coef = {g: np.linalg.lstsq(np.column_stack([part["x1"], part["x2"],
                                                    np.ones(len(part))]),
                                   part["y"], rcond=None)[0]
                for g, part in train[train["g"].isin(sample)].groupby("g")}
        expected = np.array([coef[g] @ [a, b, 1.0] for g, a, b in zip(
            new.loc[rows, "g"], new.loc[rows, "x1"], new.loc[rows, "x2"])])
    if not np.allclose(predicted[rows].to_numpy(), expected, rtol=1e-7, atol=1e-9):
        raise AssertionError(f"{kind}: predictions differ from the groups' coefficients")


def run_million(args: argparse.Namespace) -> None:
    groups = args.groups if args.groups_given else MILLION
    root = Path(tempfile.mkdtemp(prefix="mm-predict-million-"))
    try:
        cases = [million_case(kind, groups, args.rows, args.workers, root)
                 for kind in ("tiny", "linear")]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"Store.predict of {groups:,} groups x {args.rows} rows on {args.workers} "
          f"worker(s) (target: at most 30 s on 2 cores)")
    print(f"{'run':<8}{'train s':>10}{'predict s':>12}{'driver CPU s':>14}"
          f"{'workers CPU s':>15}{'load avg':>10}")
    for case in cases:
        print(f"{case['kind']:<8}{case['train_s']:>10.1f}{case['wall_s']:>12.2f}"
              f"{case['driver_cpu_s']:>14.2f}{case['workers_cpu_s']:>15.2f}"
              f"{case['load_average_before'][0]:>10.2f}")
    out = args.out if args.out_given else _common.BENCH_DIR / "results" / \
        "predict_bench_million.json"
    _common.write_json(out, {"machine": _common.machine_info(), "groups": groups,
                             "rows_per_group": args.rows, "workers": args.workers,
                             "cases": cases})


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
    parser.add_argument("--million", action="store_true",
                        help="the 1M-group case: tiny NumPy models and an mm.linear run")
    parser.add_argument("--out", type=Path,
                        default=_common.BENCH_DIR / "results" / "predict_bench.json")
    args = parser.parse_args()
    args.groups_given = any(a.startswith("--groups") for a in sys.argv[1:])
    args.out_given = any(a.startswith("--out") for a in sys.argv[1:])
    if args.million:
        run_million(args)
        return
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
