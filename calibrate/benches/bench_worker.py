"""Worker: collective bus bandwidth against message size, and a send/recv ping-pong's latency, run
under torchrun (gloo on CPU, NCCL on GPUs). Each op is timed as the median of repeats after a
warm-up; rank 0 reports.
Usage: python -m torch.distributed.run --nproc_per_node N -m calibrate.benches.bench_worker '{"sizes": [...]}'"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import torch.distributed as dist

from calibrate.harness.worker_io import rank, write_result

OPS = ("all_reduce", "all_gather", "reduce_scatter")


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _median_s(call, device, repeats: int) -> float:
    """Median seconds of `call` after a warm-up one, each started together after a barrier."""
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


def time_op(op: str, nbytes: int, n: int, device, repeats: int) -> float:
    """Median seconds of one `op` whose full buffer is `nbytes` (nccl-tests' size convention: the
    all-reduce buffer, the all-gather output, the reduce-scatter input)."""
    elems = max(n, nbytes // 4 // n * n)
    full = torch.ones(elems, dtype=torch.float32, device=device)
    part = torch.ones(elems // n, dtype=torch.float32, device=device)
    call = {"all_reduce": lambda: dist.all_reduce(full),
            "all_gather": lambda: dist.all_gather_into_tensor(full, part),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, full)}[op]
    return _median_s(call, device, repeats)


def time_send_recv(nbytes: int, device, repeats: int) -> float:
    """Median one-way seconds of an `nbytes` message between ranks 0 and 1: half a ping-pong (rank
    0 sends and waits for the echo); the other ranks wait at the barrier."""
    buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    me = dist.get_rank()

    def ping_pong():
        if me == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        elif me == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)

    return _median_s(ping_pong, device, repeats) / 2.0


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
    for nbytes in cfg.get("p2p_sizes", ()):
        seconds = time_send_recv(nbytes, device, cfg.get("repeats", 5))
        rows.append({"op": "send_recv", "bytes": max(1, nbytes // 4) * 4, "ranks": 2, "collective_s": seconds})
    write_result({"rows": rows})
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
