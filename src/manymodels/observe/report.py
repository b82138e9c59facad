"""The HTML run report: one self-contained file (inline CSS and SVG, no script
and nothing fetched), so it opens anywhere, offline, and can be mailed.

Sections: summary, worker timeline (each task a bar on its worker's row),
duration histogram, metric distributions, slowest tasks, failures with their
tracebacks.
"""

from __future__ import annotations

import html
import math
import os
import shutil
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..engine.messages import FAILURE_STATUSES
from ..engine.metriccolumns import metric_column_names
from ..store.registry import STORE_RESULT_COLUMNS

_STATUS_COLORS = {"ok": "#4c78a8", "failed": "#e45756", "crashed": "#b279a2",
                  "timeout": "#f58518", "memory": "#9d755d", "cancelled": "#bab0ac"}
_MAX_TIMELINE_BARS = 20_000

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.2em; margin-top: 2em; }
table { border-collapse: collapse; font-size: 0.9em; }
td, th { padding: 3px 10px; border-bottom: 1px solid #ddd; text-align: left; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
svg { background: #fcfcfc; border: 1px solid #e5e5e5; }
svg text { font-size: 11px; fill: #444; }
pre { background: #f6f6f6; padding: 8px; overflow-x: auto; font-size: 0.8em; }
.legend span { display: inline-block; margin-right: 1em; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; }
"""


def _esc(value: Any) -> str:
    return html.escape(str(value))


def _table(rows: list[list[Any]], header: list[str]) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = []
        for value in row:
            if isinstance(value, float):
                cells.append(f'<td class="num">{value:.4g}</td>')
            elif isinstance(value, (int, np.integer)):
                cells.append(f'<td class="num">{value}</td>')
            else:
                cells.append(f"<td>{_esc(value)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _histogram(values: np.ndarray, title: str, color: str = "#4c78a8",
               width: int = 520, height: int = 220) -> str:
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return f"<p>{_esc(title)}: no values</p>"
    low, high = float(values.min()), float(values.max())
    if high == low:
        high = low + (abs(low) or 1.0) * 1e-6 + 1e-12
    # a range too narrow (a rounding apart), or too wide for finite bins (wider
    # than a float's: numpy warned of its overflow): one bar
    try:
        with np.errstate(over="raise", invalid="raise"):
            counts, edges = np.histogram(
                values, bins=min(30, max(5, int(math.sqrt(len(values))))), range=(low, high))
    except (ValueError, FloatingPointError):
        counts, edges = np.array([len(values)]), np.array([low, high])
    left, bottom, plot_w, plot_h = 50, 30, width - 60, height - 60
    top = counts.max()
    bars = []
    bar_w = plot_w / len(counts)
    for i, count in enumerate(counts):
        h = plot_h * count / top if top else 0
        x = left + i * bar_w
        bars.append(
            f'<rect x="{x:.1f}" y="{height - bottom - h:.1f}" width="{max(bar_w - 1, 1):.1f}" '
            f'height="{h:.1f}" fill="{color}"><title>{edges[i]:.4g} to {edges[i + 1]:.4g}: '
            f"{count}</title></rect>")
    axis = (f'<line x1="{left}" y1="{height - bottom}" x2="{left + plot_w}" '
            f'y2="{height - bottom}" stroke="#888"/>'
            f'<text x="{left}" y="{height - 10}">{low:.4g}</text>'
            f'<text x="{left + plot_w}" y="{height - 10}" text-anchor="end">{high:.4g}</text>'
            f'<text x="{left - 5}" y="{height - bottom - plot_h + 4}" '
            f'text-anchor="end">{top}</text>'
            f'<text x="{width / 2}" y="16" text-anchor="middle">{_esc(title)}</text>')
    return (f'<svg class="chart" width="{width}" height="{height}" '
            f'xmlns="http://www.w3.org/2000/svg">{axis}{"".join(bars)}</svg>')


def _timeline(results: pd.DataFrame, gpus: bool = False, width: int = 1060) -> str:
    """Each task a bar on its worker's row; with ``gpus`` (the run gave its
    workers GPUs, and ``results`` has its ``gpu`` column) a row is named by
    its GPU too. Not from the column's name alone: a metric may be called
    ``gpu`` in a run without GPUs."""
    done = results[results["started_s"].notna() & results["duration_s"].notna()]
    if done.empty:
        return "<p>No task ran.</p>"
    note = ""
    if len(done) > _MAX_TIMELINE_BARS:
        done = done.nlargest(_MAX_TIMELINE_BARS, "duration_s")
        note = f"<p>Showing the {_MAX_TIMELINE_BARS:,} longest tasks.</p>"
    workers = sorted(int(w) for w in done["worker"].unique())
    names = {w: f"worker {w}" for w in workers}
    if gpus and "gpu" in done.columns:  # "w3 · GPU 1": the GPU(s) each worker ran on
        for worker, gpu in done[["worker", "gpu"]].drop_duplicates("worker").itertuples(
                index=False):
            if gpu is not None and gpu == gpu:
                names[int(worker)] = f"w{int(worker)} \u00b7 GPU {gpu}"
    row_of = {w: i for i, w in enumerate(workers)}
    longest = max(len(name) for name in names.values())
    row_h, left, top = max(8, min(28, 400 // max(1, len(workers)))), max(70, 7 * longest), 20
    height = top + row_h * len(workers) + 30
    end = float((done["started_s"] + done["duration_s"]).max()) or 1.0
    scale = (width - left - 10) / end
    bars = []
    for started, duration, worker, status in done[
            ["started_s", "duration_s", "worker", "status"]].itertuples(index=False):
        x = left + started * scale
        bars.append(
            f'<rect x="{x:.2f}" y="{top + row_of[int(worker)] * row_h + 1}" '
            f'width="{max(duration * scale, 0.6):.2f}" height="{row_h - 2}" '
            f'fill="{_STATUS_COLORS.get(status, "#888")}"/>')
    labels = "".join(
        f'<text x="{left - 6}" y="{top + i * row_h + row_h / 2 + 4}" text-anchor="end">'
        f"{_esc(names[w])}</text>" for i, w in enumerate(workers))
    axis = (f'<text x="{left}" y="{height - 8}">0 s</text>'
            f'<text x="{width - 10}" y="{height - 8}" text-anchor="end">{end:.2f} s</text>')
    legend = "".join(
        f'<span><span class="swatch" style="background:{color}"></span>{status}</span>'
        for status, color in _STATUS_COLORS.items() if status in set(done["status"]))
    return (f'{note}<svg class="chart" id="timeline" width="{width}" height="{height}" '
            f'xmlns="http://www.w3.org/2000/svg">{labels}{axis}{"".join(bars)}</svg>'
            f'<div class="legend">{legend}</div>')


def _metric_values(column: pd.Series) -> np.ndarray | None:
    """A metric's values as floats (NaN where a task has none, or no number);
    ``None`` for a metric that has no number at all. A metric that is a number
    for most tasks and text for some (``"n/a"``), or a whole number past
    64 bits for one, is a column of objects: it is drawn from its numbers, as
    the dashboard draws it, not left out."""
    if pd.api.types.is_bool_dtype(column):  # (numeric to pandas; not to the dashboard)
        return None
    if pd.api.types.is_numeric_dtype(column):
        return column.to_numpy(dtype=float, na_value=np.nan)
    values = np.fromiter(map(_number, column), dtype=float, count=len(column))
    return values if np.isfinite(values).any() else None


def _number(value: Any) -> float:
    """``value`` as a float where it is a number (not a bool), else NaN."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        return math.nan
    try:
        return float(value)
    except OverflowError:  # a whole number past a float's range
        return math.nan


def render_report(results: pd.DataFrame, summary: dict[str, Any], title: str,
                  key_columns: list[str], metric_columns: list[str],
                  gpus: bool = False) -> str:
    """The report as an HTML string; ``results`` has one row per task with
    ``started_s`` (seconds after the run started), ``duration_s``, ``worker``,
    ``status``, ``error`` and metric columns. ``metric_columns`` are named by
    the caller, who knows which columns its run added (a metric may have any
    name: ``rows``, ``size``, ``gpu``); the numeric ones get a chart.
    ``gpus``: the run gave its workers GPUs (its ``gpu`` column names them)."""
    ran = results[results["duration_s"].notna()]
    parts = [f"<h1>{_esc(title)}</h1>",
             _table([[k, v] for k, v in summary.items()], ["", ""])]
    parts += ["<h2>Worker timeline</h2>", _timeline(results, gpus)]
    parts += ["<h2>Task durations</h2>",
              _histogram(ran["duration_s"].to_numpy(dtype=float), "duration (s)")]
    charted = [(c, values) for c in metric_columns
               if (values := _metric_values(results[c])) is not None][:8]
    if charted:
        parts.append("<h2>Metrics</h2><div class='charts'>")
        for column, values in charted:
            parts.append(_histogram(values, column, color="#54a24b"))
        parts.append("</div>")
    slowest = ran.nlargest(20, "duration_s")
    parts += ["<h2>Slowest tasks</h2>", _table(
        [[*(row[c] for c in key_columns), row["status"], row["duration_s"], row["worker"]]
         for _, row in slowest.iterrows()],
        [*key_columns, "status", "duration s", "worker"])]
    parts += _resumed_section(results, key_columns)
    failures = results[results["status"].isin(FAILURE_STATUSES)]
    parts.append(f"<h2>Failures ({len(failures)})</h2>")
    if failures.empty:
        parts.append("<p>None.</p>")
    elif len(failures) > FAILURES_SHOWN:
        parts.append(f"<p>The first {FAILURES_SHOWN} of {len(failures)}, in task order; "
                     "<code>run.failed</code> holds them all.</p>")
    for _, row in failures.head(FAILURES_SHOWN).iterrows():
        key = ", ".join(f"{c}={row[c]}" for c in key_columns)
        parts.append(f"<details><summary>{_esc(key)}: {_esc(row['status'])}</summary>"
                     f"<pre>{_esc(clipped_error(row['error']))}</pre></details>")
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>"
            f"{''.join(parts)}</body></html>")


#: Failures the report shows, and the characters of each one's error (its
#: last ones, where a traceback ends with the exception): a report of 10,000
#: failed tasks, each with a 1 MB message, stays a page a browser opens.
FAILURES_SHOWN = 100
ERROR_CHARACTERS = 20_000


def clipped_error(error: Any, whole_in: str = "run.failed",
                  keep: int = ERROR_CHARACTERS) -> str:
    """``error``'s last ``keep`` characters (a missing one: ``""``), saying
    how many are left out and where they are kept whole (``whole_in``): the
    report and the dashboard's failures both show it."""
    if not isinstance(error, str):  # None, or NaN in a results table
        return ""
    if len(error) <= keep:
        return error
    return (f"[the first {len(error) - keep:,} of {len(error):,} characters are "
            f"left out; {whole_in} holds them]\n" + error[-keep:])


def _resumed_section(results: pd.DataFrame, key_columns: list[str]) -> list[str]:
    """The tasks that resumed from a checkpoint, or refused one, and from what."""
    if "resumed_from" not in results.columns:
        return []
    rows = results[results["resumed_from"].notna()]
    if rows.empty:
        return []
    return [f"<h2>Resumed from checkpoints ({int(results['resumed'].sum())})</h2>", _table(
        [[*(row[c] for c in key_columns), row["status"], row["attempts"], row["resumed_from"]]
         for _, row in rows.head(200).iterrows()],
        [*key_columns, "status", "attempts", "resumed from"])]


def summary_facts(results: pd.DataFrame, reused: pd.Series, *, wall_s: float, workers: int,
                  backend: str, batches: int | None = None,
                  worker_start_s: float = 0.0, planned: int | None = None) -> dict[str, Any]:
    """The report's summary of a run, from its results table: what ``Run.report``
    and the store's report both show. ``reused`` marks the tasks whose models
    came from an earlier run (their fit time is not this run's work);
    ``planned``: the tasks the run was to run, where some have no row yet
    (a run going on, or one whose driver died)."""
    task_time = float(results["duration_s"][~reused.to_numpy(dtype=bool)].sum())
    capacity = wall_s * workers if wall_s == wall_s else float("nan")
    facts = {
        "tasks": len(results) if planned is None or planned == len(results) else
        f"{planned} ({len(results)} done)",
        **{f"status {k}": int(v) for k, v in results["status"].value_counts().items()},
        "reused from the store": int(reused.sum()),
        **({"resumed from a checkpoint": int(results["resumed"].sum())}
           if "resumed" in results.columns and results["resumed"].any() else {}),
        "backend": f"{backend}, {workers} worker{'' if workers == 1 else 's'}",
        "wall time (s)": wall_s,
        "sum of task times (s)": task_time,
        "utilization": (task_time / capacity if capacity and capacity == capacity
                        else float("nan")),
    }
    if worker_start_s > 0:  # inside the wall time, outside the task times
        facts["worker start (s)"] = worker_start_s
        started = (wall_s - worker_start_s) * workers
        facts["utilization once started"] = task_time / started if started > 0 else 0.0
    if batches is not None:
        facts["batches"] = batches
    return facts


def _wall_s(info: Any, results: pd.DataFrame) -> float:
    """A stored run's wall time; for one whose driver died (none recorded),
    from its start to its last task's end."""
    if pd.notna(info["wall_s"]):
        return float(info["wall_s"])
    ends = (results["started_at"] + results["duration_s"]).dropna()
    if not len(ends):
        return float("nan")
    return float(ends.max()) - info["started_at"].timestamp()


def store_report(store: Any, run: int | None, path: str | Path) -> Path:
    """Write the report of a run kept in a store."""
    results = store.results(run)
    run_id = store._run_row(run)[0]  # not from results: a run just started has no row yet
    runs = store.runs().set_index("run_id")
    info = runs.loc[run_id]
    reused = results["reused_from"].notna()
    # a reused task ran in an earlier run: its time and worker are not this run's
    results.loc[reused, ["duration_s", "started_at"]] = np.nan
    results.loc[reused, "worker"] = None
    key_columns = list(results.columns[:results.columns.get_loc("run_id")])
    metric_columns = [c for c in results.columns
                      if c not in STORE_RESULT_COLUMNS and c not in key_columns]
    if "started_s" in metric_columns:  # a metric of that name: the timeline's column is added
        free = metric_column_names(["started_s"], set(results.columns))["started_s"]
        results = results.rename(columns={"started_s": free})
        metric_columns[metric_columns.index("started_s")] = free
    started = results["started_at"].dropna()
    origin = float(started.min()) if len(started) else 0.0
    results["started_s"] = results["started_at"] - origin
    summary = {
        "run": run_id,
        "started": datetime.fromtimestamp(info["started_at"].timestamp()).strftime(
            "%Y-%m-%d %H:%M:%S"),  # a UTC timestamp (Store.runs), in local time
        "status": info["status"], "fit": info["fit"], "source": info["source"],
        **summary_facts(results, reused, wall_s=_wall_s(info, results),
                        workers=int(info["workers"] or 1), backend=str(info["backend"]),
                        planned=int(info["tasks"]) if pd.notna(info["tasks"]) else None),
    }
    return write_whole(path, render_report(results, summary, f"manymodels run {run_id}",
                                           key_columns, metric_columns))  # (no GPUs kept)


def write_whole(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file beside it, renamed
    over it once whole (with the old file's permissions): a write cut short
    (a full disk, a kill) leaves an earlier report as it was, and no part of
    a new one. A link is followed: the file it names is replaced."""
    path = Path(path)
    target = path.resolve() if path.is_symlink() else path
    if not target.parent.is_dir():
        raise FileNotFoundError(f"cannot write {str(path)!r}: its folder "
                                f"{str(target.parent)!r} does not exist")
    temporary = target.with_name(f".{target.name}.{os.getpid()}-{threading.get_ident()}.partial")
    try:
        temporary.write_text(text, encoding="utf-8")
        if target.is_file():
            shutil.copymode(target, temporary)
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path
