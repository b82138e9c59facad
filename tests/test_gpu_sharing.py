"""GPU sharing on any machine: placement, validation, GPU failures and the
report, with declared GPU ids (``gpus=[0, 1]``) so that CPU-only CI runs them.
The tasks read ``CUDA_VISIBLE_DEVICES`` instead of computing on a GPU; the
real-GPU tests are in test_gpu.py.

A GPU out-of-memory error is recognised by its class's name and module, so a
class named like PyTorch's (defined here, module set to ``torch.cuda``)
stands in for it, as a ``RuntimeError`` with CUDA's message does for a broken
CUDA context."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import manymodels as mm
from conftest import wait_for_workers
from manymodels.engine.gpus import check_gpus_per_task, gpu_failure, place_gpus
from manymodels.machine import cuda_visible_ids, detect_gpus, usable_cores


class OutOfMemoryError(RuntimeError):
    """Named and placed like ``torch.cuda.OutOfMemoryError``."""


OutOfMemoryError.__module__ = "torch.cuda"


class CupyOutOfMemoryError(MemoryError):
    pass


CupyOutOfMemoryError.__name__ = "OutOfMemoryError"
CupyOutOfMemoryError.__module__ = "cupy.cuda.memory"


class XlaRuntimeError(RuntimeError):
    pass


XlaRuntimeError.__module__ = "jaxlib.xla_extension"


# -- placement and validation (pure) ------------------------------------------------


def test_fractions_place_k_slots_per_gpu_spread_evenly():
    slots = place_gpus(0.25, ["0", "1"])
    assert len(slots) == 8 and all(len(s) == 1 for s in slots)
    assert [s[0] for s in slots[:4]] == ["0", "1", "0", "1"]  # the first workers alternate
    assert sorted(s[0] for s in slots).count("0") == 4
    assert place_gpus(1, ["3", "5", "7"]) == (("3",), ("5",), ("7",))
    assert place_gpus(2, ["0", "1", "2", "3", "4"]) == (("0", "1"), ("2", "3"))
    assert place_gpus(0.5, ["GPU-aa"]) == (("GPU-aa",), ("GPU-aa",))


def test_gpus_per_task_accepts_whole_numbers_and_1_over_k_only():
    assert check_gpus_per_task(0) == (0, 1)
    assert check_gpus_per_task(2) == (2, 1) and check_gpus_per_task(1.0) == (1, 1)
    assert check_gpus_per_task(0.125) == (0.125, 8)
    assert check_gpus_per_task(1 / 3)[1] == 3
    with pytest.raises(ValueError, match=r"0\.3 is not 1/k.*use 0\.25 \(4 per GPU\) or 1/3 "
                                         r"\(3 per GPU\)"):
        check_gpus_per_task(0.3)
    with pytest.raises(ValueError, match=r"0\.6 is not 1/k.*use 0\.5 \(2 per GPU\) or 1 "):
        check_gpus_per_task(0.6)
    with pytest.raises(ValueError, match="above one GPU, a task takes whole GPUs; use 1 or 2"):
        check_gpus_per_task(1.5)
    with pytest.raises(ValueError, match="at most 256 tasks share a GPU"):
        check_gpus_per_task(1e-9)
    for bad in (-1, True, "0.5", None, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="gpus_per_task must be"):
            check_gpus_per_task(bad)


def _devices(item, rendezvous=None, count=0):
    if rendezvous is not None:  # every worker runs tasks, however slowly one starts
        wait_for_workers(rendezvous, count)
    return {"devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid()}


def test_refused_before_work_with_what_would_fit(tmp_path):
    items = mm.items(range(4))
    with pytest.raises(ValueError, match=r"0\.3 is not 1/k; .*0\.25 \(4 per GPU\)") as info:
        mm.train(_devices, items, gpus=[0, 1], gpus_per_task=0.3)
    assert "gpus_per_task=0.3" in str(info.value)
    with pytest.raises(ValueError, match=r"gpus_per_task=3 but 2 GPU\(s\) are available "
                                         r"\(0, 1\): use gpus_per_task=2 at most"):
        mm.train(_devices, items, gpus=[0, 1], gpus_per_task=3)
    with pytest.raises(ValueError, match=r"gpus_per_task=0.25 but 0 GPU\(s\)"):
        mm.train(_devices, items, gpus=0, gpus_per_task=0.25)
    with pytest.raises(ValueError, match="lists a GPU twice"):
        mm.train(_devices, items, gpus=[0, 0], gpus_per_task=1)
    with pytest.raises(TypeError, match="gpus must be a count or a list"):
        mm.train(_devices, items, gpus="0,1", gpus_per_task=1)
    with pytest.raises(ValueError, match=r"gpu_memory_limit must be a fraction .* \(0, 1\]"):
        mm.train(_devices, items, gpus=2, gpus_per_task=0.5, gpu_memory_limit=1.5)
    with pytest.raises(ValueError, match="gpu_memory_limit= .* needs gpus_per_task"):
        mm.train(_devices, items, gpu_memory_limit=0.5)
    with pytest.raises(ValueError, match="serial backend cannot cap a task's GPU memory"):
        mm.train(_devices, items, gpus=1, gpus_per_task=1, gpu_memory_limit=0.5,
                 backend="serial")
    with pytest.warns(RuntimeWarning, match=r"gpu_memory_limit=0.5 with 4 tasks per GPU"):
        run = mm.train(_devices, mm.items(range(2)), gpus=1, gpus_per_task=0.25,
                       gpu_memory_limit=0.5, workers=1, progress=False)
    assert run.summary().ok == 2  # a warning, not a refusal: the run went on


def _nvidia_smi_listing(folder: Path, gpus: int) -> str:
    """A PATH whose only ``nvidia-smi`` lists ``gpus`` GPUs, as the real one does."""
    folder.mkdir(exist_ok=True)
    script = folder / "nvidia-smi"
    lines = "".join(f"echo 'GPU {i}: NVIDIA H200 (UUID: GPU-{i}aa)'\n" for i in range(gpus))
    script.write_text("#!/bin/sh\n" + lines)
    script.chmod(0o755)
    return str(folder)


@pytest.mark.parametrize("listed", ["", "-1", "none", "foo", " , "])
def test_cuda_visible_devices_hiding_every_gpu_is_refused_saying_so(monkeypatch, tmp_path,
                                                                    listed):
    """CUDA_VISIBLE_DEVICES="" (or "-1") fell through to nvidia-smi, whose GPUs
    the tasks were given although CUDA would show them none; "foo" was taken
    as a GPU id, the tasks run on no GPU without a word."""
    monkeypatch.setenv("PATH", _nvidia_smi_listing(tmp_path / "bin", 2))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", listed)
    with pytest.raises(ValueError, match=r"gpus_per_task=1 but 0 GPU\(s\) are available "
                                         rf"\(CUDA_VISIBLE_DEVICES={listed!r} hides every GPU"):
        mm.train(_devices, mm.items(range(2)), gpus_per_task=1)


def test_gpus_are_read_from_cuda_visible_devices_as_cuda_reads_them(monkeypatch, tmp_path):
    assert cuda_visible_ids("0,-1,2") == ["0"]  # CUDA stops at the first bad entry
    assert cuda_visible_ids(" 3, 5") == ["3", "5"]
    assert cuda_visible_ids("GPU-3f1c-aa,MIG-GPU-3f1c/1/0") == ["GPU-3f1c-aa",
                                                                 "MIG-GPU-3f1c/1/0"]
    assert cuda_visible_ids("1,1") == ["1"]
    monkeypatch.setenv("PATH", _nvidia_smi_listing(tmp_path / "bin", 2))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert detect_gpus().ids == ["0", "1"]
    monkeypatch.setenv("PATH", _nvidia_smi_listing(tmp_path / "none", 0))
    assert detect_gpus().found == "nvidia-smi -L lists no GPU"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ValueError, match=r"0 GPU\(s\) are available \(no NVIDIA driver: "
                                         "nvidia-smi is not installed"):
        mm.train(_devices, mm.items(range(2)), gpus_per_task=0.25)


def test_declaring_more_gpus_than_cuda_visible_devices_lets_the_process_use_is_refused(
        monkeypatch):
    """gpus=2 under CUDA_VISIBLE_DEVICES=3 (a GPU a job scheduler gave) put the
    tasks on GPUs 0 and 1, which this process was not given."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(ValueError, match=r"gpus=2 but CUDA_VISIBLE_DEVICES='3' lets this "
                                         r"process use 1 GPU\(s\) \(3\): declare gpus=1"):
        mm.train(_devices, mm.items(range(2)), gpus=2, gpus_per_task=1)


@pytest.mark.parametrize("gpus", [[-1], [0, "foo"], [0, "GPU-"]])
def test_declared_gpu_ids_cuda_cannot_read_are_refused(gpus):
    """gpus=[-1] became a worker's CUDA_VISIBLE_DEVICES=-1: its tasks saw no GPU."""
    with pytest.raises(ValueError, match=r"gpus=.*: '.*' is no GPU id CUDA reads"):
        mm.train(_devices, mm.items(range(2)), gpus=gpus, gpus_per_task=1)


@pytest.mark.parametrize("gpus", [2, [0, 1]])
def test_gpus_without_gpus_per_task_is_refused(gpus):
    """gpus= alone was taken and ignored: every task ran without a GPU."""
    with pytest.raises(ValueError, match=r"gpus=.* declares the GPUs that gpus_per_task= "
                                         "hands out, but gpus_per_task is 0"):
        mm.train(_devices, mm.items(range(2)), gpus=gpus)
    assert mm.train(_devices, mm.items(range(1)), gpus=0, backend="serial",
                    progress=False).summary().ok == 1  # none declared: nothing lost


def test_fractional_gpus_share_each_gpu_between_workers(no_leftovers, monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    run = mm.train(_devices, mm.items(range(24)), gpus=[0, 1], gpus_per_task=0.5, workers=4,
                   shared={"rendezvous": str(tmp_path), "count": 4}, progress=False)
    summary = run.summary()
    assert summary.ok == 24 and summary.workers == 4
    results = run.results
    assert (results["devices"] == results["gpu"]).all()  # the gpu column: what it saw
    per_worker = results.groupby("worker").agg(devices=("devices", "unique"),
                                               pid=("pid", "nunique"))
    assert (per_worker["devices"].map(len) == 1).all()  # one GPU each, kept across tasks
    assert (per_worker["pid"] == 1).all()  # workers stay up across tasks
    by_gpu = per_worker["devices"].map(lambda d: d[0]).value_counts()
    assert by_gpu.to_dict() == {"0": 2, "1": 2}  # two workers on each GPU
    assert summary.worker_start_s > 0 and summary.worker_start_s < summary.wall_s

    html = run.report(tmp_path / "report.html").read_text()
    for worker, gpu in results.groupby("worker")["gpu"].first().items():
        assert f"w{worker} \u00b7 GPU {gpu}" in html
    assert "worker start (s)" in html and "utilization once started" in html


def test_default_workers_one_per_core_up_to_the_slots(no_leftovers, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    run = mm.train(_devices, mm.items(range(40)), gpus=2, gpus_per_task=0.125, progress=False)
    assert run.summary().workers == min(usable_cores(), 16)
    assert set(run.results["gpu"]) <= {"0", "1"}


# -- GPU failures -------------------------------------------------------------------


def test_gpu_errors_are_told_apart_by_class_name_module_and_message(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    oom = gpu_failure(OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
                                       "has a total capacity of 79.10 GiB"))
    assert (oom.kind, oom.device) == ("memory", "3")  # GPU 0 of the worker is the machine's 3
    assert oom.describe().startswith("GPU out of memory on GPU 3: CUDA out of memory.")
    assert gpu_failure(CupyOutOfMemoryError("Out of memory allocating 1,024 bytes")).kind == (
        "memory")
    jax = gpu_failure(XlaRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to "
                                      "allocate 17179869184 bytes."))
    assert jax.kind == "memory"
    assert gpu_failure(XlaRuntimeError("INTERNAL: something else")) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    broken = gpu_failure(RuntimeError("CUDA error: an illegal memory access was encountered\n"
                                      "CUDA kernel errors might be asynchronously reported"))
    assert broken.kind == "broken" and broken.device is None  # two GPUs: which one is unsaid
    assert "replaced" not in broken.describe()  # only a worker that retires says so
    assert gpu_failure(RuntimeError("CUDA out of memory on cuda:1")).device == "6"
    for other in (MemoryError(), ValueError("out of memory"), RuntimeError("illegal memory "
                                                                          "access in my code")):
        assert gpu_failure(other) is None


def _runs_out_of_gpu_memory(item, bad=()):
    if item in bad:
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a "
                               "total capacity of 79.10 GiB of which 1.00 GiB is free.")
    return {"pid": os.getpid()}


def test_a_gpu_out_of_memory_task_is_recorded_memory_and_only_it_is_lost(no_leftovers,
                                                                        monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    run = mm.train(_runs_out_of_gpu_memory, mm.items(range(12)), shared={"bad": (5,)},
                   gpus=[0, 1], gpus_per_task=0.5, workers=2, progress=False)
    results = run.results.set_index("item")
    assert results.loc[5, "status"] == "memory"
    gpu = results.loc[5, "gpu"]
    assert results.loc[5, "error"].startswith(f"GPU out of memory on GPU {gpu}: CUDA out of")
    assert "Traceback" in results.loc[5, "error"]
    assert (results.drop(index=5)["status"] == "ok").all()
    assert (results.groupby("worker")["pid"].nunique() == 1).all()  # no worker was replaced
    # out of GPU memory is retried like any memory failure
    again = mm.train(_runs_out_of_gpu_memory, mm.items(range(3)), shared={"bad": (1,)},
                     gpus=1, gpus_per_task=1, retries=2, progress=False)
    assert again.results["attempts"].tolist() == [1, 3, 1]


def _breaks_cuda(item, bad=()):
    if item in bad:
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel "
                           "errors might be asynchronously reported at some other API call")
    return {"pid": os.getpid()}


@pytest.mark.slow
def test_a_worker_whose_cuda_context_broke_is_replaced_and_only_its_task_lost(no_leftovers,
                                                                             monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    bad = (1, 2, 3, 4, 5, 6)  # more than the worker deaths a run tolerates outside tasks
    run = mm.train(_breaks_cuda, mm.items(range(9)), shared={"bad": bad}, gpus=[0],
                   gpus_per_task=1, progress=False)
    results = run.results.set_index("item")
    assert (results.loc[list(bad), "status"] == "failed").all()
    assert results.loc[1, "error"].startswith(
        "CUDA error on GPU 0 that leaves the worker's CUDA context unusable")
    assert "the worker was replaced" in results.loc[1, "error"]
    ok = results.drop(index=list(bad))
    assert (ok["status"] == "ok").all() and (ok["attempts"] == 1).all()
    assert ok.loc[0, "pid"] != ok.loc[7, "pid"]  # a fresh worker after the broken one
    assert ok.loc[7, "pid"] == ok.loc[8, "pid"]


def test_cpu_torch_worker_setup_is_harmless(tmp_path):
    """With PyTorch loaded in the driver, GPU workers create their CUDA context
    at start and apply gpu_memory_limit; without a GPU they skip both. In a
    process of its own: PyTorch loaded here would make every later test's
    workers spawn instead of fork."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs PyTorch (CPU is enough)")
    script = tmp_path / "torch_run.py"
    script.write_text(
        "import os, warnings\n"
        "import torch\n"
        "import manymodels as mm\n"
        "def fit(item):\n"
        "    return {'cuda': torch.cuda.is_available(), 'pid': os.getpid()}\n"
        "if __name__ == '__main__':\n"
        "    warnings.simplefilter('error')\n"
        "    run = mm.train(fit, mm.items(range(4)), gpus=1, gpus_per_task=0.5, workers=2,\n"
        "                   gpu_memory_limit=0.5, progress=False)\n"
        "    print(run.summary().ok, sorted(set(run.results['cuda'])))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=240, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "4"


@pytest.mark.ray
@pytest.mark.slow
def test_on_ray_a_fraction_becomes_fractional_num_gpus(tmp_path, monkeypatch):
    """Ray started here with two (declared) GPUs: gpus_per_task=0.5 lets four
    tasks run at once, two on each GPU, and Ray pins each to one GPU."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("a Ray instance without GPUs is already running in this process")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    run = mm.train(_devices, mm.items(range(8)), backend="ray", gpus=[0, 1],
                   gpus_per_task=0.5, workers=4,
                   shared={"rendezvous": str(tmp_path), "count": 4}, progress=False)
    assert not (tmp_path / "gave-up").exists()  # four ran at once: half a GPU each
    assert run.summary().ok == 8
    assert set(run.results["devices"]) == {"0", "1"}


@pytest.mark.slow
def test_the_gpu_benchmark_runs_end_to_end_on_the_cpu(tmp_path):
    """bench/gpu_bench.py's smoke mode: every code path but CUDA's, in seconds;
    asked for CUDA where there is none, it says so and exits."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs PyTorch (CPU is enough)")
    bench = Path(__file__).resolve().parents[1] / "bench" / "gpu_bench.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, str(bench), "--device", "cpu", "--tasks", "3",
                           "--steps", "2", "--pool", "2", "--shares", "0.5", "--out", str(out)],
                          capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [row["tool"] for row in rows] == ["serial loop", "spawn Pool(2)",
                                             "manymodels gpus_per_task=0.5"]
    assert all(row["losses_match"] and len(row["losses"]) == 3 for row in rows)
    assert "manymodels gpus_per_task=0.5" in done.stdout
    if shutil.which("nvidia-smi") is None:
        done = subprocess.run([sys.executable, str(bench), "--out", str(out)],
                              capture_output=True, text=True, timeout=240, env=env)
        assert done.returncode == 2 and "no CUDA GPU is visible to PyTorch" in done.stderr


def _ray_gpu(item):
    import ray

    return {"gpus": ",".join(map(str, ray.get_gpu_ids()))}


@pytest.mark.ray
def test_on_the_users_ray_gpus_per_task_is_asked_of_ray_not_of_the_driver(monkeypatch):
    """A driver without a GPU, on a Ray instance whose nodes have GPUs (here
    the user's own, made with two): gpus_per_task was refused for the
    driver's lack of one, though Ray places each task on its nodes' GPUs.
    Ray pins each task to one of them; a task no node can run is refused
    before any work."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("a Ray instance is already running in this process")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if shutil.which("nvidia-smi") is not None:
        pytest.skip("this driver has GPUs of its own")
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    try:
        run = mm.train(_ray_gpu, mm.items(range(4)), backend="ray", gpus_per_task=1,
                       progress=False)
        assert run.summary().ok == 4
        assert set(run.results["gpus"]) <= {"0", "1"} and len(set(run.results["gpus"])) >= 1
        with pytest.raises(mm.WorkerStartupError, match="each task needs 3 GPU"):
            mm.train(_ray_gpu, mm.items(range(2)), backend="ray", gpus_per_task=3,
                     progress=False)
    finally:
        ray.shutdown()


def test_the_serial_backend_warns_where_cuda_started_before_its_gpus(monkeypatch):
    """The serial backend pins a task's GPUs through CUDA_VISIBLE_DEVICES in
    the driver, which CUDA reads once, when it starts: once PyTorch's CUDA is
    initialised there, gpus= was ignored without a word. (A CPU build of
    PyTorch never initialises CUDA: its flag stands in for it.)"""
    torch = pytest.importorskip("torch")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not started: no word
        mm.train(_devices, mm.items(range(1)), gpus=[1], gpus_per_task=1, backend="serial",
                 progress=False)
    monkeypatch.setattr(torch.cuda, "_initialized", True)
    with pytest.warns(RuntimeWarning, match=r"gpus=\['1'\] \(gpus_per_task=\) is not "
                                            "applied: .* initialised already"):
        mm.train(_devices, mm.items(range(1)), gpus=[1], gpus_per_task=1, backend="serial",
                 progress=False)
