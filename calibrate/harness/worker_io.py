"""What a worker rank uses to hand its result to the launcher (see calibrate/harness/launch.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def rank() -> int:
    """This process's global rank (torchrun and DeepSpeed's launcher both set RANK)."""
    return int(os.environ.get("RANK", "0"))


def write_result(payload: dict) -> None:
    """Write this rank's result to $CALIBRATE_OUT/rank<R>.json, atomically (temporary file and
    os.replace: a rank killed mid-write leaves no partial result)."""
    out = Path(os.environ["CALIBRATE_OUT"])
    tmp = out / f".rank{rank()}.json.tmp"
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, out / f"rank{rank()}.json")


def cuda_memory() -> dict:
    """On a GPU: the caching allocator's peaks and what the device has in use (CUDA context and
    NCCL buffers included); {} on a CPU. Quantities as calibrate/harness/fit.py reads them."""
    import torch

    if not torch.cuda.is_available():
        return {}
    free, total = torch.cuda.mem_get_info()
    return {"allocated_peak_bytes": torch.cuda.max_memory_allocated(),
            "reserved_peak_bytes": torch.cuda.max_memory_reserved(), "device_used_bytes": total - free}


def device():
    """This rank's device: cuda:LOCAL_RANK when there is a GPU, else the CPU."""
    import torch

    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def one_gloo_rank() -> None:
    """A process group of one gloo rank on a free local port, once a process (megatron-core's
    parallel_state needs one to count a layer or a model on the CPU)."""
    import socket

    import torch

    if torch.distributed.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)


def print_counts(names: str, count) -> None:
    """A recorder's child (`--config NAME[,NAME...]`): count(name) of each as a JSON line on stdout,
    then exit without the process group's teardown."""
    import sys
    import warnings

    warnings.filterwarnings("ignore")
    for name in names.split(","):
        print(json.dumps(count(name)))
    sys.stdout.flush()
    os._exit(0)


def counted_in_child(module: str, names: list, timeout_s: float = 600) -> list[dict]:
    """`python -m module --config NAME,...` in a fresh process (parallel state and the process group
    are global) from the repository root: the rows its print_counts writes, one per name, in order."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", module, "--config", ",".join(names)], capture_output=True, text=True,
                          cwd=str(Path(__file__).resolve().parents[2]), timeout=timeout_s)
    if proc.returncode:
        raise SystemExit(f"{module} {','.join(names)}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in proc.stdout.strip().splitlines()[-len(names):]]
