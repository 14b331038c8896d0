"""What a worker rank uses to hand its result to the launcher (see calibrate/launch.py)."""

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
