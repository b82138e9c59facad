"""Shared helpers of the benchmark suite: machine info, timing, peak RSS of the
process tree, Ray start-up, running one case (every tool on the same data),
table printing and JSON writing.

A *case* is one workload at one size. Its first tool is the serial loop: it
gives the reference result every other tool is checked against, the serial
wall time (``ratio_to_serial = serial_wall / wall``) and the sum of the task
times, from which ``limit_wall = task_time / cores`` (``ratio_to_physical_limit
= limit_wall / wall``; 1.0 means every core did nothing but the user's work).
"""

from __future__ import annotations

import datetime
import gc
import json
import logging
import os
import platform
import sys
import threading
import time
import traceback
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

BENCH_DIR = Path(__file__).resolve().parent
RSS_INTERVAL_S = 0.05


# -- machine ---------------------------------------------------------------------


def cores() -> int:
    """The cores this process may run on (CPU affinity), as every tool is told."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    packages = ["manymodels", "numpy", "pandas", "pyarrow", "scikit-learn", "joblib",
                "ray", "dask", "threadpoolctl", "psutil"]
    return {
        "cores": cores(),
        "os_cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "memory_gb": round(psutil.virtual_memory().total / 1e9, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "versions": {name: _version(name) for name in packages},
    }


# -- peak RSS of the process tree ------------------------------------------------

#: Roots of process subtrees (Ray's daemons) left out of the RSS of tools that do
#: not use them: Ray stays up for the whole suite, and its daemons and idle
#: workers would otherwise be charged to every tool that runs after ray.init.
_EXCLUDED_ROOTS: set[int] = set()


#: PSS is read every this many RSS samples (reading it costs ~0.5 ms a process).
#: For a job's first EARLY_SAMPLES samples (2 s), the tree is found anew at each
#: sample and its PSS read every PSS_EVERY samples (0.2 s); after that, the tree
#: every RESCAN_LATER samples (0.5 s) and its PSS every PSS_LATER (1 s). Finding
#: the tree reads every process's parent and PSS makes the kernel walk each
#: process's page tables: at the early rates for a whole run, the sampler (a
#: thread of the driver being measured) took about 1 s of its CPU over a
#: 9-second million-model run on 2 cores (0.4-0.7 s of its wall time). A
#: worker's memory grows over seconds, not in a flash, and one started
#: later is found within half a second.
PSS_EVERY = 4
EARLY_SAMPLES = 40
RESCAN_LATER = 10
PSS_LATER = 20


class Sampler:
    """Context manager: calls :meth:`_sample` on entry, every ``interval``
    seconds on a background thread, and on exit."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sampler", daemon=True)

    def _sample(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self):  # noqa: ANN204 (the subclass)
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


class PeakRSS(Sampler):
    """Context manager: a background thread sums the RSS of this process and all
    its descendants every ``interval`` seconds and keeps the peak.

    Shared pages (``/dev/shm`` mappings, Ray's object store, pages shared after a
    fork) count once per process that touches them, as RSS always does. So the
    tree's PSS (proportional set size: a page shared by n processes counts 1/n
    in each) is summed too, every :data:`PSS_EVERY` samples (less often after
    the first seconds: see :data:`EARLY_SAMPLES`): the memory the tree really
    holds, which summed RSS overstates for tools that share.
    """

    def __init__(self, *, include_excluded: bool = False, interval: float = RSS_INTERVAL_S):
        super().__init__(interval)
        self.include_excluded = include_excluded
        self.peak = 0
        self.peak_pss = 0
        self.start = 0
        self.samples = 0
        self._procs: dict[int, psutil.Process] = {}
        self._tree: list[int] = []  # the pids found at the last scan

    def _find_tree(self) -> list[int]:
        children: dict[int, list[int]] = defaultdict(list)
        for proc in psutil.process_iter(["ppid"]):
            ppid = proc.info.get("ppid")
            if ppid is not None:
                children[ppid].append(proc.pid)
        me = os.getpid()
        tree, stack, seen = [], [me], set()
        while stack:
            pid = stack.pop()
            if pid in seen:
                continue
            seen.add(pid)
            if pid != me and pid in _EXCLUDED_ROOTS and not self.include_excluded:
                continue
            tree.append(pid)
            stack.extend(children.get(pid, ()))
        return tree

    def _tree_memory(self, with_pss: bool = False, rescan: bool = True) -> tuple[int, int]:
        if rescan or not self._tree:
            self._tree = self._find_tree()
        total, pss = 0, 0
        for pid in self._tree:
            proc = self._procs.get(pid)
            try:
                if proc is None:
                    proc = self._procs[pid] = psutil.Process(pid)
                if with_pss:
                    info = proc.memory_full_info()
                    pss += getattr(info, "pss", 0)
                else:
                    info = proc.memory_info()
                total += info.rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                self._procs.pop(pid, None)
                continue
        return total, pss

    def _sample(self) -> None:
        early, count = self.samples < EARLY_SAMPLES, self.samples
        try:
            rss, pss = self._tree_memory(
                with_pss=count % (PSS_EVERY if early else PSS_LATER) == 0,
                rescan=early or count % RESCAN_LATER == 0)
        except Exception:  # a process vanished mid-scan: skip this sample
            return
        self.samples += 1
        self.peak = max(self.peak, rss)
        self.peak_pss = max(self.peak_pss, pss)

    def __enter__(self) -> PeakRSS:
        super().__enter__()
        self.start = self.peak
        return self

    @property
    def peak_mb(self) -> float:
        return self.peak / 2**20

    @property
    def peak_pss_mb(self) -> float:
        return self.peak_pss / 2**20

    @property
    def start_mb(self) -> float:
        return self.start / 2**20


# -- Ray -------------------------------------------------------------------------

_RAY: dict[str, Any] = {"module": None, "error": None, "init_s": None}


def start_ray() -> dict[str, Any]:
    """``ray.init`` once for the whole suite; its time is reported apart and never
    counted in a tool's wall time. The bench directory goes on PYTHONPATH first,
    so that Ray's workers can import the workload modules by name."""
    path = os.environ.get("PYTHONPATH", "")
    if str(BENCH_DIR) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH_DIR), path) if p)
    # Ray installs a crash-report signal handler in the driver; Pool workers forked
    # later inherit it and print a stack trace when Pool.terminate() SIGTERMs them.
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    before = {p.pid for p in psutil.Process().children()}
    start = time.perf_counter()
    try:
        import ray

        ray.init(num_cpus=cores(), include_dashboard=False, log_to_driver=False,
                 logging_level=logging.ERROR)
        try:
            context = ray.data.DataContext.get_current()
            context.enable_progress_bars = False
            context.print_on_execution_start = False
        except Exception:
            pass
        for name in ("ray", "ray.data"):  # keep Ray Data's INFO lines out of the tables
            logging.getLogger(name).setLevel(logging.ERROR)
        _RAY["module"] = ray
    except Exception as exc:
        _RAY["error"] = f"ray.init failed: {type(exc).__name__}: {exc}"
    _RAY["init_s"] = time.perf_counter() - start
    _EXCLUDED_ROOTS.update(p.pid for p in psutil.Process().children() if p.pid not in before)
    return {"ray_init_s": _RAY["init_s"], "ray_error": _RAY["error"]}


def ray_module() -> Any:
    """The started ``ray`` module (started on first use), or an error that names
    why Ray is not there."""
    if _RAY["module"] is None and _RAY["error"] is None and _RAY["init_s"] is None:
        start_ray()
    if _RAY["module"] is None:
        raise RuntimeError(_RAY["error"] or "Ray was not started (start_ray() not called)")
    return _RAY["module"]


def stop_ray() -> None:
    if _RAY["module"] is not None:
        try:
            _RAY["module"].shutdown()
        finally:
            _RAY["module"] = None


def ray_pool() -> Any:
    """``ray.util.multiprocessing.Pool()`` with its default size (Ray's CPUs)."""
    ray_module()
    from ray.util.multiprocessing import Pool

    return Pool()


def shutdown_loky() -> None:
    """Stop joblib's reusable worker processes after a joblib row (not timed), so
    that idle loky workers are not charged to the next tool's RSS and every
    joblib row starts its workers, as a script's first Parallel call does."""
    try:
        from joblib.externals.loky import get_reusable_executor

        get_reusable_executor().shutdown(wait=True)
    except Exception:
        pass


# -- one case: every tool on the same data ---------------------------------------


@dataclass
class Tool:
    """One way to run a case. ``fn()`` does the whole job a user's script would
    (read, split, fit, collect) and returns its native result; ``result`` turns
    that into the comparable form (outside the timing). For the serial tool,
    ``fn`` returns ``(native, sum_of_task_times_s)``."""

    name: str
    fn: Callable[[], Any]
    result: Callable[[Any], Any] = lambda value: value
    uses_ray: bool = False
    #: leaves imports, threads or worker pools in this process (joblib's loky,
    #: Dask) that a tool run after it would pay for: such tools run late
    leaves_state: bool = False
    note: str = ""
    skip: str | None = None
    after: Callable[[], None] | None = None  # clean-up after the row, not timed
    details: Callable[[Any], dict] | None = None  # extra JSON fields from the result


@dataclass
class Case:
    workload: str
    title: str
    tasks: int
    params: dict[str, Any]
    serial: Tool
    peers: list[Tool]
    compare: Callable[[Any, Any], None]  # (result, reference) -> raises on mismatch
    notes: list[str] = field(default_factory=list)
    rate: bool = False  # report tasks_per_s


def check_run(run: Any) -> None:
    """A manymodels run counts only if every task trained, here and now: all ok,
    none failed, none reused from a store."""
    summary = run.summary()
    reused = getattr(summary, "reused", 0) or 0
    if summary.ok != summary.tasks or summary.failed or reused:
        raise AssertionError(f"manymodels: {summary.ok} ok, {summary.failed} failed, "
                             f"{reused} reused of {summary.tasks}")


def run_details(run: Any) -> dict[str, Any]:
    """manymodels' own account of a run, kept in the JSON next to our timing."""
    summary = run.summary()
    return {"mm_wall_s": summary.wall_s, "mm_task_time_s": summary.task_time_s,
            "mm_workers": summary.workers, "mm_utilization": summary.utilization}


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")
    return text if len(text) <= 200 else text[:197] + "..."


def _release_freed_memory() -> None:
    """Give memory freed by earlier rows back to the OS (glibc keeps freed heap
    pages), so that the driver each tool forks from starts as small as the
    previous rows allow: forked workers count the driver's pages in their RSS."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _measure(tool: Tool) -> tuple[Any, float, PeakRSS]:
    _release_freed_memory()
    with PeakRSS(include_excluded=tool.uses_ray) as rss:
        start = time.perf_counter()
        value = tool.fn()
        wall = time.perf_counter() - start
    return value, wall, rss


def run_case(case: Case) -> dict[str, Any]:
    """Run the serial tool, then every peer; check each against the serial
    result; print the table; return the case as a JSON-able dict."""
    n_cores = cores()
    rows: list[dict[str, Any]] = []
    reference = None
    serial_wall = limit_wall = task_time = None

    # Ray's tools run last: once ray.init has started its threads in this
    # process, no tool after it runs in the clean process a user's script has.
    # Before them, tools that leave state behind (joblib, Dask) run after the
    # others, so that a forked worker (which counts the driver's pages in its
    # RSS) starts from the same driver for every tool it can.
    peers = sorted(case.peers, key=lambda tool: (tool.uses_ray, tool.leaves_state))
    for position, tool in enumerate([case.serial, *peers]):
        row: dict[str, Any] = {
            "tool": tool.name, "status": "ok", "wall_s": None, "ratio_to_serial": None,
            "ratio_to_physical_limit": None, "peak_rss_mb": None, "peak_pss_mb": None,
            "start_rss_mb": None,
        }
        if case.rate:
            row["tasks_per_s"] = None
        if tool.note:
            row["note"] = tool.note
        rows.append(row)
        if tool.skip:
            row["status"] = f"skipped: {tool.skip}"
            continue
        try:
            value, wall, rss = _measure(tool)
        except Exception as exc:
            row["status"] = f"error: {_short(exc)}"
            row["traceback"] = traceback.format_exc()
            continue
        finally:
            if tool.after is not None:
                try:
                    tool.after()
                except Exception:
                    pass
        row["wall_s"] = wall
        row["peak_rss_mb"] = rss.peak_mb
        row["peak_pss_mb"] = rss.peak_pss_mb
        row["start_rss_mb"] = rss.start_mb
        if case.rate:
            row["tasks_per_s"] = case.tasks / wall if wall > 0 else None
        try:
            if position == 0:
                native, task_time = value
                reference = tool.result(native)
                serial_wall, limit_wall = wall, task_time / n_cores
            elif reference is None:
                row["status"] = "ok (not checked: the serial run failed)"
            else:
                case.compare(tool.result(value), reference)
            if tool.details is not None:
                row["details"] = tool.details(value)
        except Exception as exc:
            row["status"] = f"error: wrong result: {_short(exc)}"
            row["traceback"] = traceback.format_exc()
            continue
        finally:
            del value
        if serial_wall is not None:
            row["ratio_to_serial"] = serial_wall / wall if wall > 0 else None
            row["ratio_to_physical_limit"] = limit_wall / wall if wall > 0 else None

    ray_init_s = _RAY["init_s"]
    stop_ray()  # the next case starts, like a user's script, without Ray in the driver
    _RAY.update(module=None, error=None, init_s=None)
    out = {
        "workload": case.workload,
        "title": case.title,
        "tasks": case.tasks,
        "params": case.params,
        "ray_init_s": ray_init_s,
        "cores": n_cores,
        "serial_task_time_s": task_time,
        "limit_wall_s": limit_wall,
        "rows": rows,
        "notes": case.notes,
    }
    print_case(out)
    return out


# -- output ----------------------------------------------------------------------


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_case(case: dict[str, Any]) -> None:
    rate = any("tasks_per_s" in row for row in case["rows"])
    header = ["tool", "wall s", "x serial", "x limit", "peak RSS MB", "peak PSS MB"]
    if rate:
        header.append("tasks/s")
    header.append("status")
    lines = []
    for row in case["rows"]:
        cells = [
            row["tool"],
            _fmt(row["wall_s"], ".2f"),
            _fmt(row["ratio_to_serial"], ".2f"),
            _fmt(row["ratio_to_physical_limit"], ".2f"),
            _fmt(row["peak_rss_mb"], ".0f"),
            _fmt(row.get("peak_pss_mb"), ".0f"),
        ]
        if rate:
            cells.append(_fmt(row.get("tasks_per_s"), ",.0f"))
        status = row["status"]
        if row.get("note"):
            status = f"{status} ({row['note']})"
        cells.append(status)
        lines.append(cells)
    limit = case["limit_wall_s"]
    caption = [
        f"{case['tasks']:,} tasks on {case['cores']} cores; "
        f"limit_wall = serial task time / cores = {_fmt(limit, '.2f')} s"
    ]
    caption += case["notes"]
    title = f"({case['workload']}) {case['title']}"
    try:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title, caption="\n".join(caption), caption_justify="left")
        for position, name in enumerate(header):
            numeric = 0 < position < len(header) - 1
            table.add_column(name, justify="right" if numeric else "left",
                             overflow="fold")
        for cells in lines:
            table.add_row(*cells)
        Console(width=max(140, Console().width)).print(table)
    except ImportError:
        widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(header)]
        print(title)
        print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
        for cells in lines:
            print("  ".join(c.ljust(w) for c, w in zip(cells, widths)))
        for line in caption:
            print(line)
        print()
    sys.stdout.flush()


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(path)


def print_and_write(numbers: dict[str, Any], out: Path) -> None:
    """A bench's numbers, one per line, and as JSON in ``out``."""
    width = max(map(len, numbers))
    for name, value in numbers.items():
        print(f"{name:<{width}}  {value}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(numbers, indent=2))
    print(f"wrote {out}", file=sys.stderr)
