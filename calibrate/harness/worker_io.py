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
