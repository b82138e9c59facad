"""``bench/device_check.sh --smoke``: the one-call script for a machine with many
cores and a GPU runs every step here at small sizes, writes the JSON the table
is made of, prints the table against the targets, and leaves nothing behind
outside its output folder (issue 43). It runs on a copy of the repository's
bench, source and GPU tests, so that a file it wrote there would show."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
STEPS = ["gpu-tests", "gpu", "linear", "million", "million-nice", "files-sweep"]


def _copy_repo(target: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "results", "published", "*.pyc")
    for folder in ("bench", "src"):
        shutil.copytree(REPO / folder, target / folder, ignore=ignore)
    (target / "tests").mkdir()
    for name in ("test_gpu.py", "conftest.py"):
        shutil.copy2(REPO / "tests" / name, target / "tests" / name)
    shutil.copy2(REPO / "pyproject.toml", target / "pyproject.toml")
    return target


def _files(root: Path) -> set[str]:
    return {str(path.relative_to(root)) for path in root.rglob("*")}


@pytest.mark.slow
def test_smoke_run_writes_the_json_and_the_table_and_nothing_else(tmp_path):
    repo = _copy_repo(tmp_path / "repo")
    before = _files(repo)
    out, temporary = tmp_path / "out", tmp_path / "tmp"
    temporary.mkdir()
    # the script's own smoke budget is 2 minutes; a loaded CI machine gets more,
    # so that every step finishes and is checked (a step out of time says so)
    env = {**os.environ, "PYTHON": sys.executable, "TMPDIR": str(temporary),
           "DEVICE_CHECK_BUDGET_S": "400"}
    env.pop("OUT", None)
    done = subprocess.run(["bash", str(repo / "bench" / "device_check.sh"), "--smoke", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert _files(repo) == before  # no bytecode, results or stores in the repository
    assert list(temporary.iterdir()) == []  # its work folder removed

    summary = json.loads((out / "device-check.json").read_text())
    assert summary["smoke"] is True
    assert list(summary["steps"]) == STEPS
    statuses = {name: step["status"] for name, step in summary["steps"].items()}
    torch = importlib.util.find_spec("torch") is not None  # not in the test extra
    for name in ("gpu-tests", "million", "million-nice", "files-sweep",
                 *(["linear"] if torch else [])):
        assert statuses[name] == "ok", statuses
    assert statuses["gpu"] in (("ok", "skipped: no GPU") if torch else
                               ("skipped: no PyTorch",)), statuses
    assert torch or statuses["linear"] == "skipped: no PyTorch"
    targets = {line["target"]: line for line in summary["targets"]}
    assert len(targets) >= 11
    million = json.loads((out / "million.json").read_text())
    rows = million["cases"]
    assert million["groups"] == 2000 and all(r["status"] == "ok" for r in rows.values())
    assert rows["mm+store"]["driver_cpu_us_per_task"] > 0
    assert rows["mm+store"]["driver_main_thread_cpu_us_per_task"] > 0
    assert "workers_cpu_beyond_fit_us_per_task" in rows["mm"]
    line = targets["million: with a store / without <= 1.15x"]
    assert line["value"] == pytest.approx(rows["mm+store"]["ratio"])
    assert line["status"] == ("met" if line["value"] <= 1.15 else "NOT met")
    nice = json.loads((out / "million-nice.json").read_text())["cases"]
    assert set(nice) == {"mm", "mm+store"}
    line = targets["million, workers nice +5: with a store / without"]
    assert line["value"] == pytest.approx(nice["mm+store"]["ratio"])
    assert line["status"] == "information"
    sweep = json.loads((out / "files-sweep.json").read_text())["sweep"]
    assert len(sweep["task_times_s"]) == 2 and sweep["longest_first_bound_s"] > 0
    assert targets["sweep: manymodels wall / longest-first bound <= 1.10"]["value"] > 0
    if shutil.which("nvidia-smi") is None:  # every GPU line says so, none pretends
        gpu_lines = [line for name, line in targets.items()
                     if name.startswith(("GPU", "mm.linear"))]
        assert len(gpu_lines) == 4
        assert all(line["status"] == "skipped: no GPU" and line["value"] is None
                   for line in gpu_lines)
    if torch:  # PyTorch on the CPU against NumPy, here
        linear = json.loads((out / "linear.json").read_text())
        assert all(row["max_rel_diff"] < 1e-6 for row in linear["rows"])

    printed = done.stdout
    assert "device check (smoke sizes: not a measurement)" in printed
    for line in summary["targets"]:  # the table prints every target with its status
        assert line["target"] in printed and line["status"] in printed
    log = (out / "device-check.log").read_text().splitlines()
    assert [line.split()[1] for line in log if line.startswith("== ")] == STEPS


def test_the_table_names_the_gpu_run_as_run_and_says_when_every_gpu_test_skipped(
        tmp_path, monkeypatch):
    """With a GPU (an ``nvidia-smi`` that lists one), the table titled the GPU
    line "32 networks ... 8-process Pool" whatever gpu_bench.py ran (a smoke
    run: 4 and 2); a linear difference of exactly 0 showed no figure; and
    tests/test_gpu.py all skipped (a PyTorch without CUDA) read "step
    gpu-tests: ok"."""
    import importlib.util

    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0aa)'\n")
    (tools / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "out"
    out.mkdir()
    rows = [{"tool": "spawn Pool(2)", "wall_s": 2.0, "losses_match": True, "ratio_to_serial": 1},
            {"tool": "manymodels gpus_per_task=0.5", "wall_s": 1.0, "losses_match": True,
             "ratio_to_serial": 2.0}]
    (out / "gpu.json").write_text(json.dumps({"tasks": 4, "pool": 2, "rows": rows}))
    (out / "linear.json").write_text(json.dumps({"device": "cuda", "rows": [
        {"family": "ols", "max_rel_diff": 0.0}]}))
    (out / "gpu-tests.xml").write_text('<testsuites><testsuite tests="6" failures="0" '
                                       'errors="0" skipped="6"/></testsuites>')
    steps = tmp_path / "steps.tsv"
    steps.write_text("gpu-tests\tok\t1\ngpu\tok\t9\nlinear\tok\t3\n")
    spec = importlib.util.spec_from_file_location("device_check_table",
                                                  REPO / "bench" / "device_check.py")
    device_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(device_check)
    assert device_check.main(["table", str(out), "--steps", str(steps), "--smoke"]) == 0
    targets = json.loads((out / "device-check.json").read_text())["targets"]
    lines = {line["target"]: line for line in targets}
    line = lines["GPU: 4 networks, best manymodels wall / 2-process Pool <= 1"]
    assert line["value"] == 0.5 and line["status"] == "met"
    assert lines["mm.linear(device='cuda') equal to the CPU to 1e-6"]["shown"] == "0.0e+00"
    tests = lines["GPU tests (tests/test_gpu.py): failed <= 0"]
    assert tests["value"] is None and "all 6 tests skipped" in tests["status"]
