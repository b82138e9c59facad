"""Many small models on one GPU: manymodels' ``gpus_per_task`` against a serial
loop and a hand-written spawn ``multiprocessing.Pool`` sharing the GPU.

    python bench/gpu_bench.py [--tasks 32] [--steps 300] [--pool 8]
                              [--out bench/results/gpu.json]
    python bench/gpu_bench.py --device cpu --tasks 4 --steps 5      # smoke run, no GPU
    python bench/gpu_bench.py --shares 0.25,0.125                   # some rows only

The workload: ``--tasks`` trainings (default 32) of a small MLP (32 inputs,
128 hidden units, one output) on 8192 generated rows each, ``--steps`` full-
batch Adam steps (default 300), data and model on the GPU. Each training
returns its weights (on the CPU) and its final loss. Tools:

* one process, one trainings after another (the reference losses; the
  driver's CUDA context, cuBLAS and torch's lazy imports are warmed up first,
  outside its wall, and reported as its ``start s``);
* a hand-written spawn ``multiprocessing.Pool`` of ``--pool`` processes
  (default 8) sharing the GPU, ``starmap(..., chunksize=1)``; its start
  (interpreters, PyTorch, CUDA contexts) is inside its wall time;
* manymodels ``gpus_per_task`` = 1, 0.5, 0.25, 0.125: ``mm.train(fit,
  mm.items(seeds), gpus_per_task=g)`` with default workers (one per share of
  each GPU, at most one per core); its workers' start is inside the wall time
  too, and reported apart as ``worker_start_s``.

Every tool's losses are checked against the serial loop's. Without a CUDA
GPU visible to PyTorch the script says so and exits (status 2), unless
``--device cpu`` (a smoke run of the code paths: manymodels then plans with
declared GPU ids, and the trainings run on the CPU).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import _common as c  # noqa: E402  (needs the bench directory on sys.path)

ROWS, FEATURES, HIDDEN = 8192, 32, 128
SHARES = (1, 0.5, 0.25, 0.125)


def train_one(seed: int, device: str, steps: int) -> tuple[dict, float]:
    """One training: the same data and initial weights for a seed, on any device."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(ROWS, FEATURES, generator=generator)
    w = torch.randn(FEATURES, 1, generator=generator)
    y = torch.sin(x @ w) + 0.1 * torch.randn(ROWS, 1, generator=generator)
    x, y = x.to(device), y.to(device)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(),
                                torch.nn.Linear(HIDDEN, 1)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    final = float(loss.item())
    return {name: value.detach().cpu() for name, value in model.state_dict().items()}, final


def fit(seed: int, device: str, steps: int) -> tuple[dict, dict]:
    """manymodels' fit: the same training, its loss as a metric."""
    weights, loss = train_one(seed, device, steps)
    return weights, {"loss": loss}


# -- the tools ---------------------------------------------------------------------


def serial(seeds: list[int], device: str, steps: int) -> dict[str, Any]:
    start = time.perf_counter()
    losses = [train_one(seed, device, steps)[1] for seed in seeds]
    return {"wall_s": time.perf_counter() - start, "losses": losses, "workers": 1}


def pool(seeds: list[int], device: str, steps: int, processes: int) -> dict[str, Any]:
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(processes) as workers:
        results = workers.starmap(train_one, [(seed, device, steps) for seed in seeds],
                                  chunksize=1)
    return {"wall_s": time.perf_counter() - start, "losses": [loss for _, loss in results],
            "workers": processes}


def manymodels(seeds: list[int], device: str, steps: int, share: float) -> dict[str, Any]:
    import manymodels as mm

    declared = {} if device.startswith("cuda") else {"gpus": [0]}  # CPU smoke: planned only
    start = time.perf_counter()
    run = mm.train(fit, mm.items(seeds), shared={"device": device, "steps": steps},
                   gpus_per_task=share, progress=False, **declared)
    wall = time.perf_counter() - start
    summary = run.summary()
    if summary.failed:
        first = run.failed.iloc[0]
        raise RuntimeError(f"{summary.failed} trainings failed; first: {first['error']}")
    durations = sorted(run.results["duration_s"].tolist())
    return {"wall_s": wall, "losses": run.results["loss"].tolist(), "workers": summary.workers,
            "worker_start_s": summary.worker_start_s, "utilization": summary.utilization,
            "utilization_after_start": summary.utilization_after_start,
            # a worker's first training also pays its CUDA context and torch's lazy imports
            "longest_task_s": durations[-1], "median_task_s": durations[len(durations) // 2]}


# -- running and reporting -----------------------------------------------------------


def _gpu_info(device: str) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "device": device}
    if device.startswith("cuda"):
        info.update(gpu=torch.cuda.get_device_name(0), gpus=torch.cuda.device_count(),
                    cuda=torch.version.cuda,
                    mps=os.path.exists("/tmp/nvidia-mps") or "CUDA_MPS_PIPE_DIRECTORY" in
                    os.environ)
    return info


def _max_relative_difference(losses: list[float], reference: list[float]) -> float:
    return max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, reference))


def run(tasks: int, steps: int, processes: int, device: str,
        shares: tuple[float, ...] = SHARES) -> list[dict[str, Any]]:
    import torch

    seeds = list(range(tasks))
    start = time.perf_counter()
    train_one(0, device, 2)  # the driver's CUDA context, cuBLAS and torch's lazy imports
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    warm_up = time.perf_counter() - start  # outside the serial wall: reported apart
    rows = [{"tool": "serial loop", **serial(seeds, device, steps), "worker_start_s": warm_up}]
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    reference = rows[0]["losses"]
    rows.append({"tool": f"spawn Pool({processes})", **pool(seeds, device, steps, processes)})
    for share in shares:
        rows.append({"tool": f"manymodels gpus_per_task={share:g}",
                     **manymodels(seeds, device, steps, share)})
    for row in rows:
        row["ratio_to_serial"] = rows[0]["wall_s"] / row["wall_s"]
        row["max_loss_rel_diff"] = _max_relative_difference(row["losses"], reference)
        row["losses_match"] = row["max_loss_rel_diff"] < 1e-2
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    header = (f"{'tool':<34} {'workers':>7} {'wall s':>8} {'x serial':>8} {'start s':>8} "
              f"{'util':>5} {'losses':>7}")
    print(header)
    print("-" * len(header))
    for row in rows:
        start = row.get("worker_start_s")
        util = row.get("utilization")
        print(f"{row['tool']:<34} {row['workers']:>7} {row['wall_s']:>8.2f} "
              f"{row['ratio_to_serial']:>8.2f} "
              f"{'' if start is None else f'{start:.2f}':>8} "
              f"{'' if util is None else f'{util:.2f}':>5} "
              f"{'ok' if row['losses_match'] else 'DIFFER':>7}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=32, help="trainings (default 32)")
    parser.add_argument("--steps", type=int, default=300, help="Adam steps each (default 300)")
    parser.add_argument("--pool", type=int, default=8, help="Pool processes (default 8)")
    parser.add_argument("--device", default="cuda",
                        help="'cuda' (default) or 'cpu' for a smoke run without a GPU")
    parser.add_argument("--shares", default=",".join(f"{s:g}" for s in SHARES),
                        help="manymodels' gpus_per_task values (default 1,0.5,0.25,0.125)")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results" / "gpu.json")
    args = parser.parse_args(argv)
    shares = tuple(float(share) for share in args.shares.split(","))
    try:
        import torch
    except ImportError:
        print("gpu_bench needs PyTorch: pip install 'manymodels[gpu]' (or torch)",
              file=sys.stderr)
        return 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA GPU is visible to PyTorch (torch.cuda.is_available() is False): run "
              "this on a GPU machine, or pass --device cpu for a smoke run of the code paths",
              file=sys.stderr)
        return 2
    machine = {**c.machine_info(), **_gpu_info(args.device)}
    print(f"manymodels GPU bench: {args.tasks} trainings x {args.steps} Adam steps on "
          f"{machine.get('gpu', args.device)}, {machine['cores']} cores "
          f"({machine['cpu_model']}), {platform.node()}")
    rows = run(args.tasks, args.steps, args.pool, args.device, shares)
    print_table(rows)
    c.write_json(args.out, {"machine": machine, "tasks": args.tasks, "steps": args.steps,
                            "pool": args.pool, "rows": rows})
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
