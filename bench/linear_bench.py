"""Batched linear models (issue 21): ``mm.linear`` against one scikit-learn fit per group.

    python bench/linear_bench.py [--groups 100000,1000000] [--subset 10000]
                                 [--workers W] [--out FILE] [--publish FILE]

Workload: N groups (``--groups``) of 20 seeded rows, 3 features, a numeric
target ``y`` (each group its own coefficients, plus noise) and a 0/1 target
``label`` (a logistic draw), as one in-memory Arrow table sorted by the integer
group column ``g``. Tools, for OLS (``LinearRegression``) and logistic
(``LogisticRegression``, its defaults: lbfgs, C=1):

* ``mm.linear``: the whole call on the Arrow table (checks, grouping, fit,
  coefficients and metrics r2/rmse or log-loss/accuracy), one process; its
  ``fit_s`` (kernels + metrics, the input already grouped) is shown apart.
* ``mm.train + sklearn``: manymodels' generic path, ``mm.train(fit,
  mm.groups(table, by="g", format="numpy"), workers=W)``, ``fit`` one
  scikit-learn estimator plus the same metrics, no store. Run on the first
  ``--subset`` groups only and **scaled** to N (its wall per model x N).
* ``pandas groupby loop``: ``for key, rows in frame.groupby("g"): fit``,
  the hand-written loop, one process, on the first ``--loop-subset`` groups,
  scaled likewise.
* ``physical limit``: the bytes ``mm.linear`` must read (the key, features and
  target, 8 bytes each) over the memory bandwidth measured here (a 1 GB
  ``np.copyto``: bytes read and written / time, as a copy moves both).

Then the command line's job (``manymodels train --model
sklearn.linear_model.LinearRegression``, as ``tabular.train_table``: holdout
scores, refit, a store) on ``--cli-groups`` groups, with its batched path and
with the generic one (forced by ``copy_X=True``, a parameter the batched fit
does not take and that changes nothing in the model).

Then the cost of broom's glance row (r_squared ... nobs, issue 42) on
``--glance-groups`` OLS groups: ``mm.linear``'s ``fit_s`` with the glance
statistics left out (the function that computes them replaced by one that
returns none, in this process only) against the real one, medians of
``--repeat`` runs each, alternated (``--glance-only`` measures this alone).

Every tool's coefficients on the subset are checked against ``mm.linear``'s
(OLS 1e-8 relative; logistic 1e-3, scikit-learn's lbfgs stops at tol=1e-4).
Wall times are medians of ``--repeat`` runs for ``mm.linear``, one run for the
others. The table and JSON (``bench/results/linear.json``) say which numbers
are scaled.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import _common as c  # the bench directory is on sys.path: this script's own

BENCH_DIR = Path(__file__).resolve().parent
ROWS, FEATURES, SEED = 20, ["x1", "x2", "x3"], 0


def make_table(groups: int) -> pa.Table:
    rng = np.random.default_rng(SEED)
    n = groups * ROWS
    g = np.repeat(np.arange(groups, dtype=np.int64), ROWS)
    X = rng.normal(size=(n, 3))
    coef = rng.normal(size=(groups, 3))[g]
    y = (X * coef).sum(axis=1) + 1.0 + rng.normal(scale=0.5, size=n)
    logit = (X * coef).sum(axis=1)
    label = (rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    return pa.table({"g": g, "x1": X[:, 0], "x2": X[:, 1], "x3": X[:, 2], "y": y,
                     "label": label})


class OLSFit:
    """One group's ``LinearRegression`` and the metrics ``mm.linear`` gives."""

    def __call__(self, data: dict[str, np.ndarray]) -> tuple[Any, dict[str, float]]:
        from sklearn.linear_model import LinearRegression

        X, y = np.column_stack([data[f] for f in FEATURES]), data["y"]
        model = LinearRegression().fit(X, y)
        residual = y - model.predict(X)
        sse = float(residual @ residual)
        return model, {"r2": 1.0 - sse / float(((y - y.mean()) ** 2).sum()),
                       "rmse": float(np.sqrt(sse / len(y)))}


class LogisticFit:
    """One group's ``LogisticRegression`` and the metrics ``mm.linear`` gives."""

    def __call__(self, data: dict[str, np.ndarray]) -> tuple[Any, dict[str, float]]:
        from sklearn.linear_model import LogisticRegression

        X, y = np.column_stack([data[f] for f in FEATURES]), data["label"]
        if y.min() == y.max():  # scikit-learn refuses one class; mm.linear says single_class
            return None, {"accuracy": float("nan")}
        model = LogisticRegression().fit(X, y)
        return model, {"accuracy": float(model.score(X, y))}


def coefficients(model: Any) -> np.ndarray:
    if model is None:
        return np.full(4, np.nan)
    return np.r_[np.ravel(model.coef_), np.ravel(model.intercept_)]


def bandwidth_gbs() -> float:
    """Memory bandwidth: bytes moved (read + written) by a 1 GB copy / time."""
    source = np.ones(1 << 27)  # 1 GiB of float64
    target = np.empty_like(source)
    np.copyto(target, source)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - start)
    return 2 * source.nbytes / best / 1e9


def time_linear(table: pa.Table, family: str, repeat: int) -> tuple[Any, float, float]:
    import manymodels as mm

    target = "label" if family == "logistic" else "y"
    walls, fits, result = [], [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = mm.linear(table, by="g", features=FEATURES, target=target, family=family)
        walls.append(time.perf_counter() - start)
        fits.append(result.timings["fit_s"])
    return result, statistics.median(walls), statistics.median(fits)


def time_glance(groups: int, repeat: int) -> dict[str, Any]:
    """``mm.linear`` OLS fit time without and with the glance statistics."""
    from manymodels.models.linear import fitting

    table = make_table(groups)
    real = fitting.glance_arrays
    times: dict[str, list[float]] = {"fit_alone_s": [], "fit_with_glance_s": []}
    walls: dict[str, list[float]] = {"fit_alone_s": [], "fit_with_glance_s": []}
    try:
        for _ in range(repeat):
            for name, function in (("fit_alone_s", lambda *a, **k: {}),
                                   ("fit_with_glance_s", real)):
                fitting.glance_arrays = function
                _, wall, fit_s = time_linear(table, "ols", 1)
                times[name].append(fit_s)
                walls[name].append(wall)
    finally:
        fitting.glance_arrays = real
    out = {name: statistics.median(values) for name, values in times.items()}
    out.update({f"wall_{name}": statistics.median(values) for name, values in walls.items()})
    out.update(groups=groups, repeat=repeat,
               ratio=out["fit_with_glance_s"] / out["fit_alone_s"])
    return out


def time_generic(table: pa.Table, family: str, workers: int) -> tuple[np.ndarray, float]:
    import manymodels as mm

    fit = LogisticFit() if family == "logistic" else OLSFit()
    start = time.perf_counter()
    run = mm.train(fit, mm.groups(table, by="g", format="numpy"), workers=workers,
                   progress=False)
    wall = time.perf_counter() - start
    if len(run.failed):
        raise RuntimeError(f"the generic path failed {len(run.failed)} groups")
    models = {key[0] if isinstance(key, tuple) else key: model
              for key, model in run.models.items()}
    return np.array([coefficients(models[k]) for k in sorted(models)]), wall


def time_groupby(table: pa.Table, family: str) -> tuple[np.ndarray, float]:
    frame = table.to_pandas()
    fit = LogisticFit() if family == "logistic" else OLSFit()
    start = time.perf_counter()
    models = {}
    for key, rows in frame.groupby("g"):
        models[key] = fit({name: rows[name].to_numpy() for name in rows.columns})[0]
    wall = time.perf_counter() - start
    return np.array([coefficients(models[k]) for k in sorted(models)]), wall


def time_cli(groups: int, workers: int) -> dict[str, Any]:
    """``train_table`` with LinearRegression: the batched path, then the generic."""
    import tempfile

    from manymodels.cli.tabular import train_table

    table = make_table(groups).drop_columns(["label"])
    out: dict[str, Any] = {"groups": groups}
    for name, params in (("batched", {}), ("generic", {"copy_X": True})):
        with tempfile.TemporaryDirectory() as store:
            start = time.perf_counter()
            trained = train_table(table, by="g", target="y", store=store, params=params,
                                  model="sklearn.linear_model.LinearRegression",
                                  workers=workers)
            out[f"{name}_s"] = time.perf_counter() - start
            out[f"{name}_note"] = trained.path_note
            out[f"{name}_r2_mean"] = float(trained.run.results["r2"].mean())
    if abs(out["batched_r2_mean"] - out["generic_r2_mean"]) > 1e-9:
        raise AssertionError(f"train paths differ: {out}")
    out["speedup"] = out["generic_s"] / out["batched_s"]
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default="100000,1000000")
    parser.add_argument("--subset", type=int, default=10_000)
    parser.add_argument("--loop-subset", type=int, default=2_000)
    parser.add_argument("--workers", type=int, default=c.cores())
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cli-groups", type=int, default=5_000)
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results" / "linear.json")
    parser.add_argument("--publish", type=Path, default=None)
    parser.add_argument("--glance-groups", type=int, default=1_000_000)
    parser.add_argument("--glance-only", action="store_true")
    args = parser.parse_args(argv)
    glance = time_glance(args.glance_groups, args.repeat) if args.glance_groups else None
    if glance:
        print(f"glance statistics, OLS, {glance['groups']:,} groups: fit alone "
              f"{glance['fit_alone_s']:.2f} s, with all statistics "
              f"{glance['fit_with_glance_s']:.2f} s ({glance['ratio']:.2f}x; whole calls "
              f"{glance['wall_fit_alone_s']:.2f} s and {glance['wall_fit_with_glance_s']:.2f} s)",
              flush=True)
    if args.glance_only:
        c.write_json(args.out.with_name("linear_glance.json"),
                     {"benchmark": "linear_glance", "machine": c.machine_info(),
                      "glance": glance})
        return {"glance": glance}
    sizes = [int(s) for s in args.groups.split(",")]
    machine = c.machine_info()
    bandwidth = bandwidth_gbs()
    subset = make_table(args.subset)
    rows: list[dict[str, Any]] = []
    for family in ("ols", "logistic"):
        reference, _, _ = time_linear(subset, family, 1)
        full = np.column_stack([reference.coef, reference.intercept])
        tolerance = 1e-3 if family == "logistic" else 1e-8
        per_model = {}
        loop_table = subset.slice(0, args.loop_subset * ROWS)
        for tool, count, timer in (
                ("mm.train + sklearn", args.subset,
                 functools.partial(time_generic, subset, family, args.workers)),
                ("pandas groupby loop", args.loop_subset,
                 functools.partial(time_groupby, loop_table, family))):
            got, wall = timer()
            want = full[:len(got)]
            both = ~np.isnan(want).any(axis=1)
            error = np.max(np.abs(got[both] - want[both])) / np.max(np.abs(want[both]))
            if not error <= tolerance:
                raise AssertionError(f"{tool} {family}: coefficients differ by {error:.2e}")
            per_model[tool] = wall / count
            print(f"{family} {tool}: {count} groups in {wall:.2f} s", flush=True)
        for groups in sizes:
            table = make_table(groups)
            result, wall, fit_s = time_linear(table, family, args.repeat)
            read_bytes = table.num_rows * (len(FEATURES) + 2) * 8
            limit = read_bytes / (bandwidth * 1e9)
            row = {"family": family, "groups": groups, "rows": table.num_rows,
                   "mm_linear_s": wall, "mm_linear_fit_s": fit_s,
                   "mm_linear_models_per_s": groups / wall,
                   "statuses": result.metrics["status"].value_counts().to_dict(),
                   "physical_limit_s": limit, "bytes_read": read_bytes,
                   "subset_groups": args.subset, "loop_subset_groups": args.loop_subset}
            for tool, seconds in per_model.items():
                name = "generic" if tool.startswith("mm.train") else "groupby"
                row[f"{name}_scaled_s"] = seconds * groups
                row[f"speedup_vs_{name}"] = seconds * groups / wall
            rows.append(row)
            print(f"{family} mm.linear {groups}: {wall:.2f} s (fit {fit_s:.2f} s)", flush=True)
            del table, result
    print()
    print(f"mm.linear vs one scikit-learn fit per group; {ROWS} rows x {len(FEATURES)} "
          f"features a group; {machine['cores']} cores ({machine['cpu_model']}), load "
          f"{machine['load_average_at_start']}; bandwidth {bandwidth:.1f} GB/s")
    header = (f"{'family':9} {'groups':>9} {'mm.linear':>10} {'(fit)':>7} {'models/s':>10} "
              f"{'generic*':>10} {'x':>6} {'groupby*':>10} {'x':>6} {'limit':>7}")
    print(header)
    for r in rows:
        print(f"{r['family']:9} {r['groups']:>9,} {r['mm_linear_s']:>9.2f}s "
              f"{r['mm_linear_fit_s']:>6.2f}s {r['mm_linear_models_per_s']:>10,.0f} "
              f"{r['generic_scaled_s']:>9.0f}s {r['speedup_vs_generic']:>6.0f} "
              f"{r['groupby_scaled_s']:>9.0f}s {r['speedup_vs_groupby']:>6.0f} "
              f"{r['physical_limit_s']:>6.3f}s")
    print(f"* scaled: wall per model x groups, measured on {args.subset:,} groups (generic = "
          f"mm.train, one scikit-learn fit per group, workers={args.workers}) and "
          f"{args.loop_subset:,} groups (groupby loop, one process)")
    cli = time_cli(args.cli_groups, args.workers) if args.cli_groups else None
    if cli:
        print(f"manymodels train --model ...LinearRegression, {cli['groups']:,} groups (holdout "
              f"scores, refit, store): batched {cli['batched_s']:.1f} s, generic "
              f"{cli['generic_s']:.1f} s ({cli['speedup']:.1f}x)")
    data = {"benchmark": "linear", "command": " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
            "machine": machine, "bandwidth_gb_s": bandwidth, "workers": args.workers,
            "rows_per_group": ROWS, "features": len(FEATURES), "results": rows,
            "train_command": cli, "glance": glance}
    c.write_json(args.out, data)
    if args.publish:
        c.write_json(args.publish, data)
    return data


if __name__ == "__main__":
    main()
