"""A million models (issue 15): N groups of 10 rows, one least-squares fit each.

    python bench/million_bench.py [--groups N | --quick] [--workers W]
                                  [--case-timeout S] [--out FILE] [--profile-store FILE]
    python bench/million_bench.py --sizes 1M,3M,10M [--cases mm+store]   # scaling

Workload: ``--groups`` groups (default 1,000,000; ``--quick``: 100,000) of 10
seeded rows each, columns ``g`` (group id), ``x1``, ``x2``, ``y``, handed to
``fit`` as NumPy arrays (``format="numpy"``); ``fit`` is one ``np.linalg.lstsq``
of ``y`` on ``[x1, x2, 1]`` and returns the coefficients and ``{"rss": ...}``.

Cases, each in its own fresh interpreter, one after another (never two at
once), each with a time limit (``--case-timeout``):

1. ``serial``: the sum of the fit times over all groups, in one process, on
   NumPy slices of the (pre-sorted) table, no manymodels. The physical limit
   is that sum / workers.
2. ``pool``: a plain ``multiprocessing.Pool`` (``imap`` over chunks of
   consecutive groups), Pool start-up included.
3. ``mm``: ``mm.train(fit, mm.groups(df, by="g", format="numpy"))`` without a
   store: planning, worker start-up and collecting the results included.
4. ``mm+store``: the same with ``store=`` a fresh directory.
5. ``mm rerun``: the same again with the same store: every model reused.

Each case's wall is timed inside its interpreter around the job alone (the
table is generated first, untimed; the modules behind ``mm.train``, which
load on first use, are loaded before it, as ``multiprocessing`` is imported
before the Pool's); the interpreter's whole life
(``process_s``: start-up, imports, data) is recorded too. Memory: the
driver's peak RSS (``ru_maxrss``: the whole process's life, data generation
included) and the peak PSS summed over the driver and all its descendants,
sampled every 0.2 s while the job runs. Store size: bytes on disk (allocated
blocks, ``du``) / N, and that minus the pickled size of one model.

Every case is checked: the sum of the per-group ``rss`` metrics and the
coefficients of a seeded sample of 1,000 groups against the serial ones.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import pickle
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

import _common as c  # the bench directory is on sys.path: this script's own

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
ROWS_PER_GROUP = 10
SEED = 15
SAMPLE = 1_000  # groups whose coefficients are compared with the serial ones
POOL_CHUNK = 1_000  # groups per Pool task
CASES = ("serial", "pool", "mm", "mm+store", "mm rerun")


# -- the workload -------------------------------------------------------------------


def fit(data):
    """One group's least squares: ``y`` on ``[x1, x2, 1]``."""
    x1 = data["x1"]
    design = np.column_stack([x1, data["x2"], np.ones(len(x1))])
    coef, residuals, _, _ = np.linalg.lstsq(design, data["y"], rcond=None)
    rss = float(residuals[0]) if residuals.size else float(
        ((design @ coef - data["y"]) ** 2).sum())
    return coef, {"rss": rss}


def make_columns(groups: int) -> dict[str, np.ndarray]:
    """The seeded table as columns, sorted by ``g`` (10 rows a group)."""
    rng = np.random.default_rng(SEED)
    n = groups * ROWS_PER_GROUP
    g = np.repeat(np.arange(groups, dtype=np.int64), ROWS_PER_GROUP)
    x1 = rng.normal(size=n)
    x2 = rng.normal(size=n)
    slope = rng.normal(size=groups)[g]  # each group its own line
    y = slope * x1 - 0.5 * x2 + 1.0 + rng.normal(scale=0.3, size=n)
    return {"g": g, "x1": x1, "x2": x2, "y": y}


def group_bounds(g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start offsets and keys of the runs of equal ``g`` (the table is sorted)."""
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    return starts, g[starts]


def sample_keys(groups: int) -> np.ndarray:
    return np.sort(np.random.default_rng(SEED + 1).choice(groups, min(SAMPLE, groups),
                                                          replace=False))


# -- measuring inside a case's interpreter ------------------------------------------


def disk_usage(path: Path) -> tuple[int, int, int]:
    """(allocated bytes as ``du`` counts them, apparent bytes, files) under ``path``."""
    allocated = apparent = files = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            allocated += st.st_blocks * 512
            apparent += st.st_size
            files += 1
    return allocated, apparent, files


def pickled_size(model: Any) -> int:
    """Bytes of one model as the store pickles it (manymodels' own pickler)."""
    try:
        from manymodels.engine.execution import pickle_any

        return len(pickle_any(model))
    except Exception:
        return len(pickle.dumps(model, protocol=5))


class ThreadProfiles:
    """cProfile of the driver's main thread and of every thread it starts
    (Python 3.11's cProfile sees only the thread that enabled it)."""

    def __init__(self) -> None:
        import cProfile

        self._cProfile = cProfile
        self.main = cProfile.Profile()
        self.others: list[tuple[str, Any]] = []

    def _hook(self, *_: Any) -> None:
        profile = self._cProfile.Profile()
        self.others.append((threading.current_thread().name, profile))
        profile.enable()

    def __enter__(self) -> ThreadProfiles:
        threading.setprofile(self._hook)
        self.main.enable()
        return self

    def __exit__(self, *exc: object) -> None:
        self.main.disable()
        threading.setprofile(None)

    def report(self, path: Path, top: int = 15) -> str:
        import io
        import pstats

        stream = io.StringIO()
        stats = pstats.Stats(self.main, stream=stream)
        stream.write("== driver main thread ==\n")
        stats.sort_stats("cumulative").print_stats(top)
        stats.dump_stats(str(path))
        for name, profile in self.others:
            try:
                other = pstats.Stats(profile, stream=stream)
            except (TypeError, ValueError):  # a thread that never ran Python code
                continue
            if other.total_tt < 0.05:
                continue
            stream.write(f"== thread {name} ({other.total_tt:.2f} s) ==\n")
            other.sort_stats("cumulative").print_stats(top)
        return stream.getvalue()


# -- the cases (each runs in its own interpreter) -----------------------------------


def case_serial(cols: dict[str, np.ndarray], workers: int, **_: Any) -> dict[str, Any]:
    g, x1, x2, y = cols["g"], cols["x1"], cols["x2"], cols["y"]
    begin = time.perf_counter()
    starts, keys = group_bounds(g)
    ends = np.r_[starts[1:], len(g)]
    coefs: list[np.ndarray] = []
    rss_sum = 0.0
    fit_s = fit_cpu_s = 0.0
    clock, cpu = time.perf_counter, time.thread_time
    for a, b in zip(starts.tolist(), ends.tolist()):
        data = {"g": g[a:b], "x1": x1[a:b], "x2": x2[a:b], "y": y[a:b]}
        t0, c0 = clock(), cpu()
        coef, metrics = fit(data)
        fit_cpu_s += cpu() - c0
        fit_s += clock() - t0
        coefs.append(coef)
        rss_sum += metrics["rss"]
    wall = time.perf_counter() - begin
    sample = sample_keys(len(keys))
    return {"wall_s": wall, "fit_sum_s": fit_s, "fit_cpu_sum_s": fit_cpu_s,
            "models": len(coefs), "rss_sum": rss_sum,
            "sample_coef": np.array([coefs[k] for k in sample]).tolist(),
            "model_pickle_bytes": pickled_size(coefs[0])}


def _pool_chunk(chunk: tuple) -> list[tuple]:
    keys, offsets, x1, x2, y = chunk
    out = []
    for i, key in enumerate(keys):
        a, b = offsets[i], offsets[i + 1]
        out.append((key, *fit({"x1": x1[a:b], "x2": x2[a:b], "y": y[a:b]})))
    return out


def case_pool(cols: dict[str, np.ndarray], workers: int, **_: Any) -> dict[str, Any]:
    import multiprocessing

    g, x1, x2, y = cols["g"], cols["x1"], cols["x2"], cols["y"]

    def chunks(starts: np.ndarray, keys: np.ndarray):
        bounds = np.r_[starts, len(g)]
        for i in range(0, len(keys), POOL_CHUNK):
            lo, hi = bounds[i], bounds[min(i + POOL_CHUNK, len(keys))]
            offsets = bounds[i:min(i + POOL_CHUNK, len(keys)) + 1] - lo
            yield (keys[i:i + POOL_CHUNK].tolist(), offsets.tolist(),
                   x1[lo:hi], x2[lo:hi], y[lo:hi])

    begin = time.perf_counter()
    with CPUClocks() as clocks:
        starts, keys = group_bounds(g)
        models: dict[int, np.ndarray] = {}
        rss_sum = 0.0
        with multiprocessing.Pool(workers) as pool:  # terminated and waited for on exit
            for part in pool.imap(_pool_chunk, chunks(starts, keys)):
                for key, coef, metrics in part:
                    models[key] = coef
                    rss_sum += metrics["rss"]
    wall = time.perf_counter() - begin
    sample = sample_keys(len(keys))
    return {"wall_s": wall, "models": len(models), "rss_sum": rss_sum, **clocks.seconds(),
            "sample_coef": np.array([models[int(k)] for k in sample]).tolist(),
            "start_method": multiprocessing.get_start_method()}


def case_mm(cols: dict[str, np.ndarray], workers: int, store: str | None = None,
            expect_reused: bool = False, profile: str | None = None,
            **_: Any) -> dict[str, Any]:
    import pandas as pd

    import manymodels as mm

    frame = pd.DataFrame(cols, copy=False)  # the columns as they are: no second copy
    # the modules behind mm.train load on first use (about 0.06 s here): loaded
    # now, as `import multiprocessing` is for the Pool, so that the timing is
    # the job's (worker start-up included), not the import's
    train, groups = mm.train, mm.groups
    kwargs: dict[str, Any] = {"progress": False, "workers": workers}
    if store is not None:
        kwargs["store"] = store
    profiles = ThreadProfiles() if profile else None
    sampler = DriverRSS()
    clocks = CPUClocks()
    writer = WriterClock() if store is not None else contextlib.nullcontext()
    begin = time.perf_counter()
    with sampler, clocks, writer:
        if profiles is not None:
            with profiles:
                run = train(fit, groups(frame, by="g", format="numpy"), **kwargs)
        else:
            run = train(fit, groups(frame, by="g", format="numpy"), **kwargs)
    wall = time.perf_counter() - begin
    out: dict[str, Any] = {"wall_s": wall, "driver_peak_rss_train_mb": sampler.peak / 2**20,
                           "driver_rss_after_train_mb": sampler.last / 2**20, **clocks.seconds(),
                           **(writer.seconds() if store is not None else {})}
    if profiles is not None:
        out["profile_top"] = profiles.report(Path(profile))
        out["profile_file"] = profile
    summary = run.summary()
    out["mm_summary"] = {"tasks": summary.tasks, "ok": summary.ok, "failed": summary.failed,
                         "reused": summary.reused, "wall_s": summary.wall_s,
                         "task_time_s": summary.task_time_s, "workers": summary.workers,
                         "utilization": summary.utilization, "batches": summary.batches}
    reused = summary.reused or 0
    if summary.ok != summary.tasks or summary.failed:
        raise AssertionError(f"{summary.ok} ok, {summary.failed} failed of {summary.tasks}")
    if expect_reused and reused != summary.tasks:
        raise AssertionError(f"re-run reused {reused} of {summary.tasks} models")
    if not expect_reused and reused:
        raise AssertionError(f"first run reused {reused} models")
    # checks, outside the timing
    check_begin = time.perf_counter()
    results = run.results
    out["models"] = int(len(results))
    out["rss_sum"] = float(results["rss"].sum())
    sample = sample_keys(summary.tasks)
    models = run.models
    out["sample_coef"] = np.array([np.asarray(models[int(k)]) for k in sample]).tolist()
    out["check_s"] = time.perf_counter() - check_begin
    if store is not None:
        # the store at rest: what SQLite's write-ahead log still holds copied
        # into the index, as the last connection to close does (the log's size
        # at this moment depends on when its last checkpoint ran)
        import sqlite3

        with contextlib.closing(sqlite3.connect(Path(store) / "index.sqlite")) as conn:
            out["wal_checkpoint"] = list(conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                                         .fetchone())
        allocated, apparent, files = disk_usage(Path(store))
        one = out["sample_coef"][0]
        out["store"] = {"du_bytes": allocated, "apparent_bytes": apparent, "files": files,
                        "model_pickle_bytes": pickled_size(np.asarray(one))}
    return out


class WriterClock:
    """Whether the store's writer keeps up: the seconds its thread spent
    committing hand-overs (``writer_busy_s``, wall time inside each
    transaction; what it does after a commit, letting the committed models
    go, is not counted) and the seconds the driver's loop waited to hand one over
    because two were waiting already (``driver_waited_on_writer_s``). A
    writer busy for most of the run, with the loop waiting on it, is what
    bounds a run with a store."""

    def __init__(self) -> None:
        self.busy_s = self.waited_s = 0.0
        self.commits = 0

    def __enter__(self) -> WriterClock:
        from manymodels.store import writer

        self._writer = writer
        self._commit, self._put = writer.StoreWriter._commit, writer.StoreWriter.put
        clock, commit, put = self, self._commit, self._put

        def timed_commit(self: Any, *args: Any) -> Any:
            begin = time.perf_counter()
            try:
                return commit(self, *args)
            finally:
                clock.busy_s += time.perf_counter() - begin
                clock.commits += 1

        def timed_put(self: Any, handover: Any) -> None:
            begin = time.perf_counter()
            put(self, handover)
            clock.waited_s += time.perf_counter() - begin

        writer.StoreWriter._commit, writer.StoreWriter.put = timed_commit, timed_put
        return self

    def __exit__(self, *exc: object) -> None:
        self._writer.StoreWriter._commit, self._writer.StoreWriter.put = self._commit, self._put

    def seconds(self) -> dict[str, float]:
        return {"writer_busy_s": self.busy_s, "writer_commits": self.commits,
                "driver_waited_on_writer_s": self.waited_s}


class CPUClocks:
    """CPU seconds spent while the job ran: the driver process's (all its
    threads: ``RUSAGE_SELF``), its main thread's (``time.thread_time``: the
    loop that plans, feeds the workers and collects), and its children's
    (``RUSAGE_CHILDREN``: the workers, counted once they have exited and been
    waited for, as a run's workers are when ``train`` returns). The bench's
    sampler threads (RSS every 0.05 s, PSS every 0.2 s) are left out of the
    driver's figure (``driver_samplers_cpu_s``: they are the measuring)."""

    def __enter__(self) -> CPUClocks:
        self._samplers = self._samplers_cpu()
        self._self = self._usage(resource.RUSAGE_SELF)
        self._children = self._usage(resource.RUSAGE_CHILDREN)
        self._thread = time.thread_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread_s = time.thread_time() - self._thread
        self.self_s = self._usage(resource.RUSAGE_SELF) - self._self
        self.children_s = self._usage(resource.RUSAGE_CHILDREN) - self._children
        self.samplers_s = self._samplers_cpu() - self._samplers

    @staticmethod
    def _usage(who: int) -> float:
        usage = resource.getrusage(who)
        return usage.ru_utime + usage.ru_stime

    @staticmethod
    def _samplers_cpu() -> float:
        """CPU seconds of this bench's own sampler threads (RSS, PSS) so far:
        measuring, not the driver's work, and left out of its figure."""
        total = 0.0
        for thread in threading.enumerate():
            if thread.name == "sampler" and thread.ident is not None:
                try:
                    total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
                except (OSError, AttributeError):
                    pass
        return total

    def seconds(self) -> dict[str, float]:
        return {"driver_cpu_s": self.self_s - self.samplers_s,
                "driver_samplers_cpu_s": self.samplers_s,
                "driver_main_thread_cpu_s": self.thread_s, "workers_cpu_s": self.children_s}


class DriverRSS(c.Sampler):
    """The driver's own RSS, sampled every 0.05 s while ``mm.train`` runs (the
    checks after it, which load every model and build the results frame, are
    not the training's memory): its peak, and its value when train returned."""

    def __init__(self) -> None:
        import psutil

        super().__init__(0.05)
        self._process = psutil.Process()
        self.peak = self.last = 0

    def _sample(self) -> None:
        self.last = self._process.memory_info().rss
        self.peak = max(self.peak, self.last)


CASE_FUNCTIONS = {"serial": case_serial, "pool": case_pool, "mm": case_mm,
                  "mm+store": case_mm, "mm rerun": case_mm}


def child_main(args: argparse.Namespace) -> int:
    """Run one case in this (fresh) interpreter; write its JSON to ``--result``."""
    born = time.perf_counter()
    out: dict[str, Any] = {"case": args.case, "pid": os.getpid(),
                           "load_average_at_start": list(os.getloadavg())}
    try:
        import psutil

        gen_begin = time.perf_counter()
        cols = make_columns(args.groups)
        out["data_s"] = time.perf_counter() - gen_begin
        out["driver_rss_before_mb"] = psutil.Process().memory_info().rss / 2**20
        with c.PeakRSS() as tree:  # the tree's RSS every 0.05 s, its PSS every 0.2 s
            result = CASE_FUNCTIONS[args.case](
                cols, args.workers, store=args.store,
                expect_reused=args.case == "mm rerun", profile=args.profile)
        del cols
        out.update(result)
        out["tree_peak_pss_mb"] = tree.peak_pss / 2**20
        out["tree_peak_rss_mb"] = tree.peak_mb
        out["driver_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        out["status"] = "ok"
        code = 0
    except Exception as exc:
        out["status"] = f"error: {type(exc).__name__}: {exc}"[:300]
        out["traceback"] = traceback.format_exc()
        code = 1
    out["process_s"] = time.perf_counter() - born
    Path(args.result).write_text(json.dumps(out, default=str))
    return code


# -- the driver: run the cases one after another -------------------------------------


def stop_group(proc: subprocess.Popen) -> None:
    """Stop a case's whole process tree (its own session), gently first."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=10)
            break
        except subprocess.TimeoutExpired:
            continue


def run_case(case: str, args: argparse.Namespace, work: Path, store: Path | None,
             profile: Path | None = None) -> dict[str, Any]:
    result_file = work / f"{case.replace(' ', '_').replace('+', '_')}.json"
    command = [sys.executable, str(Path(__file__).resolve()), "--child", case,
               "--groups", str(args.groups), "--workers", str(args.workers),
               "--result", str(result_file)]
    if store is not None:
        command += ["--store", str(store)]
    if profile is not None:
        command += ["--profile", str(profile)]
    load = list(os.getloadavg())
    print(f"[{time.strftime('%H:%M:%S')}] {case}: {args.groups:,} groups, load "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    began = time.perf_counter()
    # own session, so that a timeout can stop the case's whole process tree
    proc = subprocess.Popen(command, start_new_session=True, cwd=REPO)
    try:
        code = proc.wait(timeout=args.case_timeout)
    except BaseException as stopped:  # our own time limit, or we are stopped (SIGTERM, ^C)
        stop_group(proc)  # its own session: it would outlive us
        if not isinstance(stopped, subprocess.TimeoutExpired):
            raise
        return {"case": case, "status": f"timeout after {args.case_timeout:.0f} s",
                "launcher_load_average": load,
                "elapsed_s": time.perf_counter() - began}
    elapsed = time.perf_counter() - began
    if result_file.exists():
        out = json.loads(result_file.read_text())
    else:
        out = {"case": case, "status": f"error: exit code {code}, no result"}
    out["exit_code"] = code
    out["elapsed_s"] = elapsed  # interpreter start to exit, seen from here
    out["launcher_load_average"] = load
    return out


def check(row: dict[str, Any], reference: dict[str, Any]) -> None:
    if row.get("status") != "ok" or reference.get("status") != "ok":
        return
    problems = []
    if row.get("models") != reference.get("models"):
        problems.append(f"{row.get('models')} models, serial {reference.get('models')}")
    a, b = row.get("rss_sum"), reference.get("rss_sum")
    if a is None or abs(a - b) > 1e-8 * max(1.0, abs(b)):
        problems.append(f"rss sum {a} != serial {b}")
    if not np.allclose(np.array(row.get("sample_coef")), np.array(reference["sample_coef"]),
                       rtol=1e-9, atol=1e-12):
        problems.append("sample coefficients differ from the serial ones")
    row["checked"] = not problems
    if problems:
        row["status"] = "error: wrong result: " + "; ".join(problems)


def per_task_cpu(row: dict[str, Any], bare_fit_s: float | None, groups: int) -> None:
    """The CPU clocks of a case as microseconds per task: the driver's (all its
    threads), its main loop's, and the workers' beyond the bare fit (their CPU
    less the CPU of the serial loop's fit calls; less manymodels' own task
    time too, where it ran: what supervising each task costs around the fit)."""
    if row.get("driver_cpu_s") is None:
        return
    micro = 1e6 / groups
    row["driver_cpu_us_per_task"] = row["driver_cpu_s"] * micro
    row["driver_main_thread_cpu_us_per_task"] = row["driver_main_thread_cpu_s"] * micro
    row["workers_cpu_us_per_task"] = row["workers_cpu_s"] * micro
    if bare_fit_s is not None and row.get("case") != "mm rerun":
        row["workers_cpu_beyond_fit_us_per_task"] = (row["workers_cpu_s"] - bare_fit_s) * micro
    task_time = (row.get("mm_summary") or {}).get("task_time_s")
    if task_time is not None and row.get("case") != "mm rerun":
        row["workers_cpu_beyond_task_time_us_per_task"] = (
            (row["workers_cpu_s"] - task_time) * micro)


def summarize(rows: dict[str, dict[str, Any]], workers: int, groups: int) -> None:
    """Add ratios, utilization and store bytes per model to each row."""
    serial = rows.get("serial", {})
    limit = serial.get("fit_sum_s") / workers if serial.get("status") == "ok" else None
    reference = {"pool": "mm", "mm+store": "mm", "mm rerun": "mm+store"}
    for case, row in rows.items():
        wall = row.get("wall_s")
        row["limit_wall_s"] = limit
        if wall and limit and case != "serial":
            row["utilization"] = limit / wall
        base = reference.get(case)
        base_wall = rows.get(base, {}).get("wall_s") if base else None
        if wall and base_wall:
            row["ratio"] = wall / base_wall
            row["ratio_to"] = base
        per_task_cpu(row, serial.get("fit_cpu_sum_s") if serial.get("status") == "ok" else None,
                     groups)
        store = row.get("store")
        if store:
            per_model = store["du_bytes"] / groups
            store["du_bytes_per_model"] = per_model
            store["apparent_bytes_per_model"] = store["apparent_bytes"] / groups
            store["bytes_per_model_beyond_pickle"] = per_model - store["model_pickle_bytes"]
    first, again = rows.get("mm+store", {}).get("store"), rows.get("mm rerun", {}).get("store")
    if first and again:  # a re-run records its (reused) tasks too
        again["growth_bytes_per_model"] = (again["du_bytes"] - first["du_bytes"]) / groups


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(result: dict[str, Any]) -> None:
    rows = result["cases"]
    header = ["case", "wall s", "ratio", "x limit", "driver RSS MB", "in train", "tree PSS MB",
              "store B/model", "(beyond pickle)", "driver us/task", "(main)",
              "workers +us/task", "writer busy", "load", "status"]
    lines = []
    for case in CASES:
        row = rows.get(case)
        if row is None:
            continue
        ratio = (f"{row['ratio']:.2f} of {row['ratio_to']}" if row.get("ratio") is not None
                 else ("sum of fits" if case == "serial" else "-"))
        store = row.get("store") or {}
        load = row.get("load_average_at_start") or row.get("launcher_load_average")
        lines.append([
            case, _fmt(row.get("fit_sum_s") if case == "serial" else row.get("wall_s"), ".2f"),
            ratio, _fmt(row.get("utilization"), ".2f"),
            _fmt(row.get("driver_peak_rss_mb"), ".0f"),
            _fmt(row.get("driver_peak_rss_train_mb"), ".0f"),
            _fmt(row.get("tree_peak_pss_mb"), ".0f"),
            _fmt(store.get("du_bytes_per_model"), ".0f"),
            _fmt(store.get("bytes_per_model_beyond_pickle"), ".0f"),
            _fmt(row.get("driver_cpu_us_per_task"), ".2f"),
            _fmt(row.get("driver_main_thread_cpu_us_per_task"), ".2f"),
            _fmt(row.get("workers_cpu_beyond_fit_us_per_task"), ".2f"),
            "-" if row.get("writer_busy_s") is None else
            f"{row['writer_busy_s'] / row['wall_s']:.0%} "
            f"({row['driver_waited_on_writer_s']:.2f} s)",
            "-" if not load else f"{load[0]:.2f}", row.get("status", "-"),
        ])
    widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(header)]
    print()
    print(f"a million models: {result['groups']:,} groups x {ROWS_PER_GROUP} rows, "
          f"{result['workers']} workers; limit = sum of fit times / workers = "
          f"{_fmt(rows.get('serial', {}).get('limit_wall_s'), '.2f')} s")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for cells in lines:
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths)))
    print("serial: its wall s is the sum of fit times (whole loop: "
          f"{_fmt(rows.get('serial', {}).get('wall_s'), '.2f')} s); x limit = limit / wall; "
          "load = 1-min load average at the case's start;\n"
          "driver us/task: the driver process's CPU (all threads, getrusage) / tasks; (main): "
          "its main thread's; workers +us/task: the workers' CPU (RUSAGE_CHILDREN) less the "
          "CPU of the serial loop's fit calls, / tasks;\n"
          "writer busy: the share of the wall time the store's writer thread spent "
          "committing (in brackets: the seconds the driver's loop waited to hand it tasks)")
    sys.stdout.flush()


def git_info() -> dict[str, Any]:
    info: dict[str, Any] = {}
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO,
                                        capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "src"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        info["src_dirty"] = bool(dirty)
        info["src_changes"] = dirty.splitlines()[:50]
    except OSError:
        pass
    return info


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=None,
                        help="number of groups (default 1,000,000; --quick: 100,000)")
    parser.add_argument("--quick", action="store_true", help="100,000 groups")
    parser.add_argument("--workers", type=int, default=None,
                        help="worker processes (default os.cpu_count())")
    parser.add_argument("--case-timeout", type=float, default=1800.0,
                        help="seconds a case may run before it is stopped (default 1800)")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated subset of {', '.join(CASES)}")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON output (default bench/results/million-<timestamp>.json)")
    parser.add_argument("--profile-store", type=Path, default=None,
                        help="cProfile the driver of the mm+store case; pstats file here")
    parser.add_argument("--sizes", default=None,
                        help="run --cases (default here: mm+store) at each of these numbers of "
                        "groups, e.g. 1M,3M,10M, and print how each scales against the first")
    parser.add_argument("--keep-store", action="store_true",
                        help="leave the store directory in place (its path is in the JSON)")
    # internal: one case in a fresh interpreter
    parser.add_argument("--child", choices=CASES, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--store", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--profile", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.groups is None:
        args.groups = 100_000 if args.quick else 1_000_000
    if args.workers is None:
        args.workers = os.cpu_count() or 1
    if args.sizes is not None and args.cases == ",".join(CASES):
        args.cases = "mm+store"
    args.case_list = [c.strip() for c in args.cases.split(",") if c.strip()]
    try:
        args.size_list = [_count(size) for size in (args.sizes or "").split(",") if size.strip()]
    except ValueError:
        parser.error(f"--sizes takes numbers of groups such as 1M,3M,10M, got {args.sizes!r}")
    unknown = [c for c in args.case_list if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {', '.join(CASES)}")
    return args


def _count(text: str) -> int:
    """``1000000``, ``1M``, ``300k`` as a number of groups."""
    text = text.strip().lower().replace("_", "")
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    number = int(float(text[:-1] if scale > 1 else text) * scale)
    if number < 1:
        raise ValueError(text)
    return number


def run_sizes(args: argparse.Namespace) -> int:
    """The cases at each size of ``--sizes``, each size by this script in its
    own process (its cases each in their own, as ever), and one table of how
    each scales: its wall, driver memory and CPU and store against the first
    size's."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_path = args.out or BENCH_DIR / "results" / f"million-sizes-{stamp}.json"
    combined: dict[str, Any] = {
        "benchmark": "million_bench --sizes (issue 43)", "sizes": args.size_list,
        "cases": args.case_list, "workers": args.workers, "git": git_info(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load_average_at_start": list(os.getloadavg()), "runs": {}}
    code = 0
    for size in args.size_list:
        part = out_path.with_name(f".{out_path.stem}-{size}.json")
        command = [sys.executable, str(Path(__file__).resolve()), "--groups", str(size),
                   "--workers", str(args.workers), "--cases", ",".join(args.case_list),
                   "--case-timeout", str(args.case_timeout), "--out", str(part)]
        code = subprocess.call(command, cwd=REPO) or code
        combined["runs"][str(size)] = (json.loads(part.read_text()) if part.exists()
                                       else {"status": "no result", "cases": {}})
        part.unlink(missing_ok=True)
        _write(out_path, combined)
    print_scaling(combined)
    print(f"results in {out_path}")
    return code


def print_scaling(combined: dict[str, Any]) -> None:
    """Each case at each size: its wall against the first size's, beside the
    sizes' ratio (linear: equal), and what it holds per model."""
    runs = combined["runs"]
    first = str(combined["sizes"][0])
    print(f"\nscaling, {combined['workers']} workers; x first = wall / wall at "
          f"{int(first):,} groups, against groups / {int(first):,}")
    header = (f"{'case':<9} {'groups':>11} {'wall s':>8} {'x first':>8} {'x groups':>8} "
              f"{'driver MB in train':>18} {'driver us/task':>14} {'store B/model':>13}  status")
    print(header)
    for case in combined["cases"]:
        base = runs.get(first, {}).get("cases", {}).get(case, {}).get("wall_s")
        for size, run in runs.items():
            row = run.get("cases", {}).get(case, {})
            wall = row.get("wall_s")
            ratio = wall / base if wall and base else None
            print(f"{case:<9} {int(size):>11,} {_fmt(wall, '.2f'):>8} {_fmt(ratio, '.2f'):>8} "
                  f"{int(size) / int(first):>8.2f} "
                  f"{_fmt(row.get('driver_peak_rss_train_mb'), '.0f'):>18} "
                  f"{_fmt(row.get('driver_cpu_us_per_task'), '.2f'):>14} "
                  f"{_fmt((row.get('store') or {}).get('du_bytes_per_model'), '.0f'):>13}  "
                  f"{row.get('status', run.get('status', '-'))}")


def compile_package() -> None:
    """manymodels' modules as bytecode, as an installed package has them
    (pip compiles what it installs): an editable checkout run with
    ``PYTHONDONTWRITEBYTECODE`` set compiled each module from source in every
    case's interpreter, 0.05 s of a re-run's timed 0.7 s."""
    import compileall

    import manymodels

    compileall.compile_dir(Path(manymodels.__file__).parent, quiet=1)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        args.case = args.child
        return child_main(args)
    # a SIGTERM (a time limit around this script) unwinds, stopping the running case
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.size_list:
        return run_sizes(args)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_path = args.out or BENCH_DIR / "results" / f"million-{stamp}.json"
    work = Path(tempfile.mkdtemp(prefix="mm-million-"))
    store = work / "store"
    import psutil

    result: dict[str, Any] = {
        "benchmark": "million_bench (issue 15)",
        "command": [Path(sys.executable).name, *sys.argv],
        "groups": args.groups, "rows_per_group": ROWS_PER_GROUP, "seed": SEED,
        "workers": args.workers, "case_timeout_s": args.case_timeout,
        "machine": {"os_cpu_count": os.cpu_count(),
                    "affinity": len(os.sched_getaffinity(0)),
                    "memory_gb": round(psutil.virtual_memory().total / 1e9, 1),
                    "python": platform.python_version(), "platform": platform.platform(),
                    "numpy": np.__version__},
        "git": git_info(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "notes": [
            "each case runs alone in a fresh interpreter; wall_s is timed inside it around "
            "the job (planning, worker start-up and collecting results included; generating "
            "the table not, nor loading the modules behind mm.train, which load on first "
            "use, as multiprocessing is imported before the Pool's); process_s is the "
            "interpreter's whole life",
            "serial: wall_s is the whole loop, fit_sum_s the fit calls alone; "
            "limit_wall_s = fit_sum_s / workers; utilization = limit_wall_s / wall_s",
            "driver_peak_rss_mb: ru_maxrss of the case's interpreter (its whole life, "
            "data generation included); driver_peak_rss_train_mb: the driver's RSS sampled "
            "every 0.05 s while mm.train ran (not the checks after it, which load every "
            "model); tree_peak_pss_mb: peak of the PSS summed over the "
            "interpreter and its descendants, sampled every 0.2 s during the job",
            "store du_bytes: allocated blocks under the store directory after the run; "
            "bytes_per_model_beyond_pickle = du_bytes / groups - pickled size of one model",
            "manymodels' modules are compiled to bytecode before the cases, as pip does when "
            "it installs a package: a case's first use of a module (mm.train imports its "
            "engine on first call) then reads bytecode, not source, even where "
            "PYTHONDONTWRITEBYTECODE is set",
            "driver_cpu_s: the case interpreter's CPU (user + system, all threads: "
            "getrusage RUSAGE_SELF) from just before the job to just after it; "
            "driver_main_thread_cpu_s: its main thread's (time.thread_time); workers_cpu_s: "
            "RUSAGE_CHILDREN over the same span (the workers, waited for when the job ends); "
            "*_us_per_task: those / groups; workers_cpu_beyond_fit_us_per_task: workers_cpu_s "
            "less the serial case's fit_cpu_sum_s (the fit calls' thread CPU time), / groups; "
            "the bench's sampler threads' CPU is left out of driver_cpu_s "
            "(driver_samplers_cpu_s)",
            "load_average_at_start: os.getloadavg() when the case's interpreter started; "
            "the CPU is shared with other work",
        ],
        "cases": {},
    }
    rows = result["cases"]
    compile_package()
    started = time.perf_counter()
    try:
        for case in CASES:
            if case not in args.case_list:
                continue
            if case == "mm rerun" and rows.get("mm+store", {}).get("status") != "ok":
                rows[case] = {"case": case, "status": "skipped: the store run did not finish"}
                continue
            if case == "mm+store" and store.exists():
                shutil.rmtree(store)
            profile = args.profile_store if case == "mm+store" else None
            if profile is not None:
                profile = profile.resolve()
            rows[case] = run_case(case, args, work,
                                  store if case in ("mm+store", "mm rerun") else None,
                                  profile)
            row = rows[case]
            if case != "serial" and "serial" in rows:
                check(row, rows["serial"])
            summarize(rows, args.workers, args.groups)
            print(f"    {row.get('status')}; wall {_fmt(row.get('wall_s'), '.2f')} s, "
                  f"process {_fmt(row.get('process_s'), '.1f')} s", flush=True)
            if row.get("traceback"):
                print(row["traceback"], file=sys.stderr)
            if row.get("profile_top"):
                print(row["profile_top"])
            result["elapsed_s"] = time.perf_counter() - started
            _write(out_path, result)
    finally:
        if args.keep_store:
            result["store_dir"] = str(store)
        else:
            shutil.rmtree(work, ignore_errors=True)
    for row in rows.values():
        row.pop("sample_coef", None)  # served its check; keeps the JSON small
    result["elapsed_s"] = time.perf_counter() - started
    _write(out_path, result)
    print_table(result)
    print(f"took {result['elapsed_s']:.0f} s; results in {out_path}")
    return 0 if all(r.get("status") == "ok" for r in rows.values()) else 1


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
