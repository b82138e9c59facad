"""The built-in demo: a seeded sales table with thousands of store x item
groups, one tuned Ridge per group, on all cores, against a serial run."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

FEATURES = ["price", "promo", "trend", "season_sin", "season_cos"] + [f"dow_{d}" for d in range(6)]
ALPHAS = (0.1, 1.0, 10.0)


def make_sales(stores: int = 48, items: int = 50, days: int = 365, seed: int = 0) -> pd.DataFrame:
    """A daily sales table: one row per store, item and day, with a price, a
    promotion flag and seasonality; each store x item has its own response."""
    rng = np.random.default_rng(seed)
    groups = stores * items
    day = np.tile(np.arange(days), groups)
    store = np.repeat([f"s{s:03d}" for s in range(stores)], items * days)
    item = np.tile(np.repeat([f"i{i:03d}" for i in range(items)], days), stores)
    base = np.repeat(rng.gamma(4.0, 10.0, groups), days)
    elasticity = np.repeat(rng.normal(-2.0, 0.7, groups), days)
    lift = np.repeat(rng.gamma(2.0, 4.0, groups), days)
    price = np.repeat(rng.uniform(2, 20, groups), days) * rng.normal(1.0, 0.08, groups * days)
    promo = (rng.random(groups * days) < 0.15).astype(np.int8)
    season = np.sin(2 * np.pi * day / 365.25)
    sales = (base + elasticity * price + lift * promo + 5 * season + (day % 7 >= 5) * 4
             + rng.normal(0, 3, groups * days))
    frame = pd.DataFrame({
        "store": store, "item": item, "day": day, "price": price, "promo": promo,
        "trend": day / days, "season_sin": season,
        "season_cos": np.cos(2 * np.pi * day / 365.25),
        "sales": np.maximum(sales, 0.0),
    })
    for d in range(6):
        frame[f"dow_{d}"] = (day % 7 == d).astype(np.int8)
    return frame


class RidgeModel:
    """A ridge regression fitted with NumPy (the intercept not penalised), so
    that the demo runs on the core install; scikit-learn's ``Ridge`` gives the
    same coefficients."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha

    def fit(self, X: np.ndarray, y: np.ndarray) -> RidgeModel:
        x_mean, y_mean = X.mean(axis=0), y.mean()
        Xc = X - x_mean
        gram = Xc.T @ Xc + self.alpha * np.eye(X.shape[1])
        self.coef_ = np.linalg.solve(gram, Xc.T @ (y - y_mean))
        self.intercept_ = float(y_mean - x_mean @ self.coef_)
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        return X @ self.coef_ + self.intercept_

    def score(self, X: np.ndarray, y: np.ndarray) -> float:
        residual = ((y - self.predict(X)) ** 2).sum()
        total = ((y - y.mean()) ** 2).sum()
        if total == 0:  # a constant target: 1 if predicted exactly, else 0, as scikit-learn says
            return 1.0 if residual == 0 else 0.0
        return float(1 - residual / total)


def fit_store_item(df: pd.DataFrame) -> tuple[object, dict[str, float]]:
    """Pick the ridge's alpha on the last 20% of days, refit on all, report metrics."""
    X = df[FEATURES].to_numpy(dtype=float)
    y = df["sales"].to_numpy(dtype=float)
    cut = int(len(df) * 0.8)
    scores = {}
    for alpha in ALPHAS:
        model = RidgeModel(alpha).fit(X[:cut], y[:cut])
        scores[alpha] = model.score(X[cut:], y[cut:])
    best = max(scores, key=scores.get)
    model = RidgeModel(best).fit(X, y)
    mae = float(np.mean(np.abs(model.predict(X[cut:]) - y[cut:])))
    return model, {"holdout_r2": scores[best], "holdout_mae": mae, "alpha": best}


def run_demo(stores: int = 48, items: int = 50, workers: int | None = None,
             compare_serial: bool = True, progress: bool = True,
             to_stderr: bool = False) -> dict[str, float]:
    """Train the demo, print a summary table, and return its numbers. The
    table goes to standard error ``to_stderr``: where the numbers go to
    standard output as JSON (``--json -``), which a table before them would
    leave unreadable to ``jq`` or ``json.load``."""
    from rich.console import Console
    from rich.table import Table

    from ..api import train  # (not `import manymodels`: the layer contract sees these)
    from ..inputs.sources import groups

    console = Console(stderr=to_stderr)
    table = make_sales(stores, items)
    source = groups(table, by=["store", "item"])
    console.print(f"[bold]manymodels demo[/]: {len(table):,} rows, "
                  f"{stores * items:,} store x item groups, a tuned Ridge each")
    run = train(fit_store_item, source, workers=workers, progress=progress)
    summary = run.summary()
    if summary.ok == 0:
        raise RuntimeError("every demo group failed; the first error:\n"
                           + str(run.failed["error"].iloc[0]))
    numbers = {"groups": summary.tasks, "ok": summary.ok, "failed": summary.failed,
               "wall_s": summary.wall_s, "task_time_s": summary.task_time_s,
               "workers": summary.workers, "utilization": summary.utilization}
    if compare_serial:
        begin = time.perf_counter()
        train(fit_store_item, source, backend="serial", progress=progress)
        numbers["serial_wall_s"] = time.perf_counter() - begin
        numbers["speedup"] = numbers["serial_wall_s"] / summary.wall_s

    out = Table(title="manymodels demo: one model per store x item")
    out.add_column("measure")
    out.add_column("value", justify="right")
    out.add_row("models ok / failed", f"{summary.ok:,} / {summary.failed:,}")
    out.add_row("workers (processes)", str(summary.workers))
    out.add_row("wall time", f"{summary.wall_s:.2f} s")
    out.add_row("sum of fit times", f"{summary.task_time_s:.2f} s")
    out.add_row("utilization (fit time / wall x workers)", f"{summary.utilization:.2f}")
    if compare_serial:
        out.add_row("same tasks one after another", f"{numbers['serial_wall_s']:.2f} s")
        out.add_row("speed-up over serial", f"{numbers['speedup']:.2f}x")
    best = run.results.sort_values("holdout_r2", ascending=False)
    out.add_row("median holdout R^2", f"{best['holdout_r2'].median():.3f}")
    console.print(out)
    return numbers
