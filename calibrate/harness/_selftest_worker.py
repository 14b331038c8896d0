"""A trivial worker for the launcher's own tests: all-reduce one tensor, or fail as told."""

import os
import sys
import time

import torch
import torch.distributed as dist

from calibrate.harness.worker_io import rank, write_result

if __name__ == "__main__":
    argv = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]  # DeepSpeed's launcher adds it first
    mode = argv[0] if argv else "ok"
    dist.init_process_group("gloo")
    if mode == "hang" and rank() == 1:
        time.sleep(3600)
    if mode == "crash" and rank() == 1:
        raise RuntimeError("rank 1 fails on purpose")
    if mode == "oom" and rank() == 1:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB (simulated)")
    x = torch.ones(4) * (rank() + 1)
    dist.all_reduce(x)
    write_result({"rank": rank(), "sum": x.tolist(), "pid": os.getpid()})
    dist.destroy_process_group()
