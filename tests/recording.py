"""A calibrate recorder (`python -m calibrate.<room>.<name> --out PATH`) re-run in a process of its own, as
the slow tests that check a committed reference under data/references/ do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def rerecord(module: str, out: Path, timeout_s: int, only: list[str] | None = None) -> list[dict]:
    """The rows `module` records now, with DeepSpeed on its CPU accelerator; with `only`, those named
    alone (the recorder's --only)."""
    only_args = ["--only", ",".join(only)] if only else []
    proc = subprocess.run([sys.executable, "-m", module, "--out", str(out), *only_args], capture_output=True,
                          text=True, timeout=timeout_s, cwd=str(ROOT), env={**os.environ, "DS_ACCELERATOR": "cpu"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())["rows"]
