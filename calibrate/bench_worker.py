"""Worker: collective bus bandwidth against message size, run under torchrun (gloo on CPU, NCCL on
GPUs). Each op is timed as the median of repeats after a warm-up; rank 0 reports.
Usage: python -m torch.distributed.run --nproc_per_node N -m calibrate.bench_worker '{"sizes": [...]}'"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import torch.distributed as dist

from calibrate.worker_io import rank, write_result

OPS = ("all_reduce", "all_gather", "reduce_scatter")


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_op(op: str, nbytes: int, n: int, device, repeats: int) -> float:
    """Median seconds of one `op` whose full buffer is `nbytes` (nccl-tests' size convention: the
    all-reduce buffer, the all-gather output, the reduce-scatter input)."""
    elems = max(n, nbytes // 4 // n * n)
    full = torch.ones(elems, dtype=torch.float32, device=device)
    part = torch.ones(elems // n, dtype=torch.float32, device=device)
    call = {"all_reduce": lambda: dist.all_reduce(full),
            "all_gather": lambda: dist.all_gather_into_tensor(full, part),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, full)}[op]
    call()
    times = []
    for _ in range(repeats):
        dist.barrier()
        _sync(device)
        start = time.perf_counter()
        call()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(cfg: dict) -> None:
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(rank() % torch.cuda.device_count())
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda" if cuda else "cpu")
    n = dist.get_world_size()
    rows = []
    for op in cfg.get("ops", OPS):
        for nbytes in cfg["sizes"]:
            seconds = time_op(op, nbytes, n, device, cfg.get("repeats", 5))
            rows.append({"op": op, "bytes": (max(n, nbytes // 4 // n * n)) * 4, "ranks": n, "collective_s": seconds})
    write_result({"rows": rows})
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
