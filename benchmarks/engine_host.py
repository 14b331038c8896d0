"""Engine host time against the shipped reference: `python benchmarks/engine_host.py` runs
calibrate.benches.engine_host (DeepSpeed's ZeRO-3 fetches and FSDP2's unit hooks on one gloo rank) and prints
each measured host time beside data/references/engine_host_cpu.json's, as a ratio (expected 0.3-3 on
an idle machine; wall-clock, so only a benchmark: tests/test_engine_host_real.py checks the counts)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "data" / "references" / "engine_host_cpu.json"


def main() -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    sys.path.insert(0, str(ROOT))
    from calibrate.benches import engine_host

    record, measured = json.loads(SHIPPED.read_text()), engine_host.measure()
    pairs = [("ZeRO-3 fetch, per module and pass", measured["zero3_fetch"], record["zero3_fetch"])]
    pairs += [(f"FSDP2 unit hooks, {p}", measured["fsdp_unit"][p], record["fsdp_unit"][p]) for p in ("forward", "backward")]
    for name, got, want in pairs:
        ratio = got["host_s"] / want["host_s"]
        flag = "" if 0.3 < ratio < 3 else "   outside 0.3-3 (a loaded machine?)"
        print(f"{name:36s} {got['host_s'] * 1e3:8.3f} ms   shipped {want['host_s'] * 1e3:8.3f} ms   x{ratio:.2f}{flag}")


if __name__ == "__main__":
    main()
