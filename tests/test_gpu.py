"""``gpus_per_task`` on real GPUs: each running task sees only its own GPU(s) and
computes on them. These run where ``nvidia-smi`` and PyTorch are present; CI has
neither, so there they skip (test_train.py covers the scheduling with ``gpus=``).

CUDA is never initialised in this (the driver) process: a forked worker of a
parent that had initialised CUDA could not use it."""

from __future__ import annotations

import importlib.util
import shutil

import pytest

import manymodels as mm
from manymodels._resources import visible_gpus

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
