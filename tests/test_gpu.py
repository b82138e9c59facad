"""``gpus_per_task`` on real GPUs: each running task sees only its own GPU(s) and
computes on them; a fraction shares a GPU between workers; a task out of GPU
memory (or past ``gpu_memory_limit``) costs only itself; a task that breaks its
worker's CUDA context gets its worker replaced. These run where ``nvidia-smi``
and PyTorch are present; CI has neither, so there they skip (test_train.py and
test_gpu_sharing.py cover the scheduling with declared ``gpus=``).

CUDA is never initialised in this (the driver) process: a forked worker of a
parent that had initialised CUDA could not use it."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

import manymodels as mm
from conftest import wait_for_workers
from manymodels.machine import visible_gpus

pytestmark = pytest.mark.skipif(
    shutil.which("nvidia-smi") is None or importlib.util.find_spec("torch") is None,
    reason="needs an NVIDIA GPU (nvidia-smi) and PyTorch",
)


def _matmul_on_gpu(seed: int) -> dict:
    import os

    import torch

    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(256, 256, generator=generator, dtype=torch.float64)
    on_gpu = (a.cuda() @ a.cuda()).cpu()
    return {
        "devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "visible": torch.cuda.device_count(),
        "max_error": float((on_gpu - a @ a).abs().max()),
    }


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_each_running_task_computes_on_its_own_detected_gpu(start_method, no_leftovers,
                                                           monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu_ids = visible_gpus()  # detected through nvidia-smi: no gpus= declared
    assert gpu_ids, "nvidia-smi is present but lists no GPU"
    # twice as many tasks as GPUs, and more workers asked for than GPUs or tasks
    run = mm.train(_matmul_on_gpu, mm.items(range(4 * len(gpu_ids))), gpus_per_task=1,
                   workers=64, start_method=start_method, progress=False)
    summary = run.summary()
    assert summary.failed == 0, run.failed.to_dict("records")
    assert summary.workers == len(gpu_ids)  # one running task per GPU, not per core
    results = run.results
    assert (results["visible"] == 1).all()  # a task sees its own GPU and no other
    assert (results["max_error"] < 1e-9).all()
    # every GPU used (the first tasks start one per worker), each by one worker
    assert sorted(results.groupby("worker")["devices"].agg(set).map(min)) == sorted(gpu_ids)
    assert (results.groupby("worker")["devices"].nunique() == 1).all()


def _shared_matmul(seed: int, rendezvous: str, count: int) -> dict:
    wait_for_workers(rendezvous, count)  # every worker holds its CUDA context at once
    result = _matmul_on_gpu(seed)
    return {**result, "pid": os.getpid()}


def test_a_fraction_shares_each_gpu_between_workers(no_leftovers, monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu_ids = visible_gpus()
    run = mm.train(_shared_matmul, mm.items(range(8 * len(gpu_ids))), gpus_per_task=0.25,
                   workers=4 * len(gpu_ids),
                   shared={"rendezvous": str(tmp_path), "count": 4 * len(gpu_ids)},
                   progress=False)
    assert not (tmp_path / "gave-up").exists()
    summary = run.summary()
    assert summary.failed == 0, run.failed.to_dict("records")
    assert summary.workers == 4 * len(gpu_ids)
    results = run.results
    assert (results["visible"] == 1).all() and (results["max_error"] < 1e-9).all()
    assert (results["devices"] == results["gpu"]).all()
    per_gpu = results.groupby("gpu")["pid"].nunique()
    assert per_gpu.to_dict() == dict.fromkeys(gpu_ids, 4)  # four workers on each GPU
    print(f"\n{summary}")


def _allocate(item: int, fraction: dict) -> dict:
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    block = torch.empty(int(total * fraction.get(item, 0.01)), dtype=torch.uint8, device="cuda")
    block.fill_(1)
    return {"pid": os.getpid(), "bytes": block.numel()}


def test_a_task_out_of_gpu_memory_costs_only_itself(no_leftovers, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    run = mm.train(_allocate, mm.items(range(6)), shared={"fraction": {2: 2.0}},
                   gpus_per_task=1, workers=1, progress=False)
    results = run.results.set_index("item")
    assert results.loc[2, "status"] == "memory", results.loc[2, "error"]
    gpu = results.loc[2, "gpu"]
    assert results.loc[2, "error"].startswith(f"GPU out of memory on GPU {gpu}:")
    assert (results.drop(index=2)["status"] == "ok").all()
    assert results["pid"].nunique() == 1  # the worker went on
    print("\n" + results.loc[2, "error"].splitlines()[0])


def test_gpu_memory_limit_caps_each_task(no_leftovers, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    run = mm.train(_allocate, mm.items(range(4)), shared={"fraction": {1: 0.4, 3: 0.1}},
                   gpus_per_task=0.25, gpu_memory_limit=0.25, workers=2, progress=False)
    results = run.results.set_index("item")
    assert results.loc[1, "status"] == "memory", results.loc[1, "error"]  # 40% > its 25%
    assert results.loc[[0, 2, 3], "status"].eq("ok").all()  # 10% fits
    print("\n" + results.loc[1, "error"].splitlines()[0])


def _device_assert(item: int) -> dict:
    import torch

    values = torch.zeros(4, device="cuda")
    if item == 1:  # an index out of bounds on the GPU: a device-side assert
        values[torch.tensor([10], device="cuda")].sum().item()
    return {"pid": os.getpid(), "sum": float(values.sum().item())}


def test_a_broken_cuda_context_gets_its_worker_replaced(no_leftovers, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    run = mm.train(_device_assert, mm.items(range(5)), gpus_per_task=1, workers=1,
                   progress=False)
    results = run.results.set_index("item")
    assert results.loc[1, "status"] == "failed"
    assert "CUDA context unusable" in results.loc[1, "error"], results.loc[1, "error"]
    ok = results.drop(index=1)
    assert (ok["status"] == "ok").all(), ok["error"].tolist()
    assert ok.loc[0, "pid"] != ok.loc[4, "pid"]  # the tasks after it ran on a fresh worker
    print("\n" + results.loc[1, "error"].splitlines()[0])
