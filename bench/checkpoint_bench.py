"""Checkpoints inside tasks (issue 41): what a SIGKILLed driver's re-run
saves, and what saving costs.

    python bench/checkpoint_bench.py [--tasks 16] [--workers 2] [--task-s 60]
                                     [--save-every 5] [--state-mb 10] [--kill-at 0.45]

Workload: ``--tasks`` tasks, each a training loop of ``--task-s`` seconds of
CPU work in steps of 0.1 s, holding a ``--state-mb`` MB state (a NumPy
array changed at every step), on ``--workers`` process workers with a store.
Two jobs, the same loop: ``plain`` (fit takes no checkpoint) and
``checkpointed`` (fit saves its state whenever ``checkpoint.every(save_every)``).

Cases, each job in a fresh driver process:

1. uninterrupted: the sum of the tasks' durations; the cost of checkpointing
   is the checkpointed sum over the plain one, minus one, and (measured
   inside the fits) the time spent in ``checkpoint.save`` over the task time.
2. interrupted: the driver SIGKILLed at ``--kill-at`` of the uninterrupted
   wall time, then the same call again: the re-run's wall time, and per
   task that was running at the kill, the work lost (seconds of steps done
   before the kill that the re-run did again: at most one save interval with
   checkpoints; everything done so far without).

The defaults are the issue's figures (about 8 minutes a run, four runs:
35 minutes); ``--tasks 4`` keeps the issue's task, state and interval in 9
minutes, and ``--task-s 6 --save-every 0.5 --state-mb 1`` scales time and
state by ten. A table is printed, and JSON written to
bench/results/checkpoint_bench.json.

Two figures of cost: the sum of the tasks' durations against the plain
job's (what the issue asks for, but the 0.1 s steps are timed by the wall
clock, and on a loaded machine each overshoots by what the scheduler
decides: a few percent that differ from one job to the other), and the
time spent inside ``checkpoint.save`` over the task time, measured in the
fits themselves, which that noise does not reach.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

STEP_S = 0.1


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _loop(item, log, task_s, state_mb, checkpoint=None, save_every=5.0):
    """The training loop: ``task_s / STEP_S`` steps of CPU work; returns the
    time spent saving."""
    steps = int(round(task_s / STEP_S))
    saved = checkpoint.load() if checkpoint is not None else None
    if saved is None:
        start, state = 0, np.zeros(int(state_mb * 2**20) // 8)
    else:
        start, state = saved["step"], saved["state"]
    with Path(log, f"{item}.starts").open("a") as starts:
        starts.write(f"{start}\n")
    saving = 0.0
    for step in range(start, steps):
        _spin(STEP_S)
        state[step % len(state)] += 1.0
        Path(log, f"{item}.progress").write_text(str(step + 1))
        if checkpoint is not None and checkpoint.every(save_every):
            began = time.perf_counter()
            checkpoint.save({"step": step + 1, "state": state})
            saving += time.perf_counter() - began
    return {"save_s": saving, "total": float(state.sum())}


def fit_plain(item, log, task_s, state_mb):
    return _loop(item, log, task_s, state_mb)


def fit_checkpointed(item, checkpoint, log, task_s, state_mb, save_every):
    return _loop(item, log, task_s, state_mb, checkpoint, save_every)


DRIVER = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {bench!r})
    import manymodels as mm
    import checkpoint_bench as bench
    args = json.loads(sys.argv[1])
    fit = bench.fit_checkpointed if args.pop("checkpointed") else bench.fit_plain
    store, workers, tasks = args.pop("store"), args.pop("workers"), args.pop("tasks")
    began = time.perf_counter()
    run = mm.train(fit, mm.items(list(range(tasks))), shared=args, store=store,
                   workers=workers, progress=False)
    wall = time.perf_counter() - began
    r = run.results
    print(json.dumps({{"wall_s": wall, "task_s": float(r["duration_s"][~r["reused"]].sum()),
                      "save_s": float(r["save_s"][~r["reused"]].sum()),
                      "ok": int((r["status"] == "ok").sum()),
                      "resumed": int(r["resumed"].sum())}}))
""").format(bench=str(Path(__file__).parent))


def _driver(args: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(args)],
                            stdout=subprocess.PIPE, text=True)


def _finish(process: subprocess.Popen) -> dict:
    out, _ = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"driver failed ({process.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def _read_ints(path: Path) -> list[int]:
    try:
        return [int(v) for v in path.read_text().split()]
    except (OSError, ValueError):
        return []


def run_job(options: argparse.Namespace, checkpointed: bool, kill_after: float | None) -> dict:
    work = Path(tempfile.mkdtemp(prefix="mm-ckbench-"))
    log = work / "log"
    log.mkdir()
    args = {"checkpointed": checkpointed, "store": str(work / "store"),
            "workers": options.workers, "tasks": options.tasks, "log": str(log),
            "task_s": options.task_s, "state_mb": options.state_mb}
    if checkpointed:
        args["save_every"] = options.save_every
    result: dict = {"job": "checkpointed" if checkpointed else "plain"}
    if kill_after is not None:
        driver = _driver(args)
        time.sleep(kill_after)
        at_kill = {i: (_read_ints(log / f"{i}.progress") or [0])[0]
                   for i in range(options.tasks)}
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        time.sleep(1.0)  # its workers end with it (PR_SET_PDEATHSIG)
        started = {i for i in range(options.tasks) if (log / f"{i}.starts").exists()}
        result["killed_at_s"] = kill_after
    rerun = _finish(_driver(args))
    result.update(rerun)
    if kill_after is not None:
        steps = int(round(options.task_s / STEP_S))
        lost = []
        for item in started:
            starts = _read_ints(log / f"{item}.starts")
            if at_kill[item] >= steps or len(starts) < 2:
                continue  # finished (committed or not) before the kill
            lost.append((at_kill[item] - starts[-1]) * STEP_S)
        result["interrupted_tasks"] = len(lost)
        result["lost_s_max"] = max(lost, default=0.0)
        result["lost_s_mean"] = float(np.mean(lost)) if lost else 0.0
    shutil.rmtree(work, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--task-s", type=float, default=60.0)
    parser.add_argument("--save-every", type=float, default=5.0)
    parser.add_argument("--state-mb", type=float, default=10.0)
    parser.add_argument("--kill-at", type=float, default=0.45)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" /
                                             "checkpoint_bench.json"))
    options = parser.parse_args()
    rows = []
    for checkpointed in (False, True):
        whole = run_job(options, checkpointed, None)
        whole["case"] = "uninterrupted"
        rows.append(whole)
    ideal = options.tasks * options.task_s / options.workers
    kill_after = options.kill_at * max(r["wall_s"] for r in rows)
    for checkpointed in (False, True):
        killed = run_job(options, checkpointed, kill_after)
        killed["case"] = "driver killed, re-run"
        rows.append(killed)
    plain, checked = rows[0], rows[1]
    cost = checked["task_s"] / plain["task_s"] - 1
    save_share = checked["save_s"] / checked["task_s"]
    print(f"{options.tasks} tasks x {options.task_s:g} s on {options.workers} workers, "
          f"{options.state_mb:g} MB state saved every {options.save_every:g} s; ideal wall "
          f"{ideal:.1f} s; {platform.node()}, {os.cpu_count()} CPUs")
    print(f"{'case':<24}{'job':<14}{'wall s':>8}{'task s':>9}{'save s':>8}"
          f"{'interrupted':>12}{'lost max s':>11}{'lost mean s':>12}")
    for row in rows:
        print(f"{row['case']:<24}{row['job']:<14}{row['wall_s']:>8.1f}{row['task_s']:>9.1f}"
              f"{row['save_s']:>8.2f}{row.get('interrupted_tasks', ''):>12}"
              f"{row.get('lost_s_max', float('nan')):>11.2f}"
              f"{row.get('lost_s_mean', float('nan')):>12.2f}")
    print(f"checkpointing cost: {cost:+.2%} of the task time (sum of durations); "
          f"time inside save(): {save_share:.2%}")
    out = Path(options.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"options": vars(options), "rows": rows, "cost": cost,
                               "save_share": save_share, "ideal_wall_s": ideal,
                               "machine": platform.node(), "cpus": os.cpu_count()}, indent=1))


if __name__ == "__main__":
    main()
