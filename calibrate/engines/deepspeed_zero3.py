"""How many parameter elements DeepSpeed ZeRO-3 keeps gathered at once under its live, reuse and
prefetch knobs, counted on the real engine.

    python -m calibrate.engines.deepspeed_zero3 [--out PATH] [--only NAME,...]

Launches calibrate/engines/deepspeed_zero3_worker.py on 2 gloo ranks under DeepSpeed's launcher: a 3-layer
Llama (Linears of 32,768 to 180,224 elements, 2,475,776 in all) and a 2-layer Mixtral (its 4 experts
one 147,456-element module a layer), bf16, ZeRO-3, persistence threshold 10, trained 3 steps per knob
setting, with and without gradient checkpointing (non-reentrant, and reentrant); in the last step
the elements of every gathered or in-flight parameter are summed after each submodule fetch, and each
fetch is counted as gathered ahead (the prefetcher had started it) or on demand, and the elements
all-gathered are summed. The largest sums and the counts, in forward and backward, go to
data/references/deepspeed_zero3_live_cpu.json (atomically), read by tests/test_deepspeed_zero3_live.py.
--only records the named runs alone (each model's modules on its first), to an --out of its own.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "data" / "references" / "deepspeed_zero3_live_cpu.json"
# name: (stage3_max_live_parameters, stage3_max_reuse_distance, stage3_prefetch_bucket_size, checkpointing:
# False, True (non-reentrant, transformers 5's default) or "reentrant"),
# on the worker's Llama, or its Mixtral where the name says so
KNOBS = {
    "nothing-ahead": (0, 0, 0, False),
    "nothing-ahead-checkpointed": (0, 0, 0, True),
    "prefetch-1": (10**9, 0, 1, False),
    "prefetch-1-checkpointed": (10**9, 0, 1, True),
    "prefetch-200k": (10**9, 0, 200_000, False),
    "live-300k": (300_000, 0, 10**6, False),
    "live-300k-checkpointed": (300_000, 0, 10**6, True),
    "live-500k-prefetch-50k": (500_000, 0, 50_000, False),
    "live-400k": (400_000, 0, 50_000, False),
    "live-400k-checkpointed": (400_000, 0, 50_000, True),
    "live-600k": (600_000, 0, 50_000, False),
    "live-600k-checkpointed": (600_000, 0, 50_000, True),
    "live-400k-reuse-600k": (400_000, 600_000, 50_000, False),
    "live-400k-reuse-600k-checkpointed": (400_000, 600_000, 50_000, True),
    "reuse-300k": (0, 300_000, 0, False),
    "reuse-600k": (0, 600_000, 0, False),
    "reuse-1e9": (0, 10**9, 0, False),
    "reuse-300k-checkpointed": (0, 300_000, 0, True),
    "reuse-600k-checkpointed": (0, 600_000, 0, True),
    "reuse-1m-checkpointed": (0, 10**6, 0, True),
    "reuse-1e9-checkpointed": (0, 10**9, 0, True),
    # transformers' use_reentrant=True: torch.utils.checkpoint's CheckpointFunction, as deepspeed.checkpointing
    "reuse-300k-reentrant": (0, 300_000, 0, "reentrant"),
    "reuse-600k-reentrant": (0, 600_000, 0, "reentrant"),
    "live-300k-reuse-1e9": (300_000, 10**9, 10**6, False),
    "live-reuse-1m": (10**6, 10**6, 50_000, False),
    "live-reuse-1m-checkpointed": (10**6, 10**6, 50_000, True),
    "defaults": (10**9, 10**9, 50_000_000, False),
    "defaults-checkpointed": (10**9, 10**9, 50_000_000, True),
    # the defaults scaled to this model as they stand to a Llama-3-70B block (856M elements): live and
    # reuse 1e9 -> 862k, prefetch bucket 5e7 -> 43k
    "scaled-defaults-checkpointed": (862_000, 862_000, 43_000, True),
    "scaled-defaults": (862_000, 862_000, 43_000, False),
    "mixtral-nothing-ahead": (0, 0, 0, False),
    "mixtral-nothing-ahead-checkpointed": (0, 0, 0, True),
    "mixtral-live-100k": (100_000, 0, 10**6, False),
    "mixtral-defaults": (10**9, 10**9, 50_000_000, False),
}


def measure(only: list[str] | None = None) -> list[dict]:
    """The rows of every run of KNOBS, or of those named in `only` (in KNOBS' order)."""
    from calibrate.harness.launch import launch

    runs = [{"name": name, "checkpointing": ckpt, "model": "mixtral" if name.startswith("mixtral") else "llama",
             "zero_optimization": {"stage3_max_live_parameters": live, "stage3_max_reuse_distance": reuse,
                                   "stage3_prefetch_bucket_size": prefetch}}
            for name, (live, reuse, prefetch, ckpt) in KNOBS.items() if only is None or name in only]
    outcome = launch("calibrate.engines.deepspeed_zero3_worker", [json.dumps({"runs": runs})], nproc=2,
                     launcher="deepspeed", env={"DS_ACCELERATOR": "cpu"}, timeout_s=600)
    if outcome.status != "ok" or len(outcome.ranks) != 2:
        raise SystemExit(f"calibrate.engines.deepspeed_zero3: the worker ended '{outcome.status}': {outcome.error}\n"
                         f"{outcome.log_tail}")
    rows = []
    for run, measured in zip(runs, outcome.ranks[0]["runs"]):
        # both ranks gather the same elements (ZeRO-3 partitions each tensor over them)
        assert all(r["runs"][len(rows)]["peak_forward"] == measured["peak_forward"] for r in outcome.ranks)
        rows.append({**run, **{k: measured[k] for k in ("peak_forward", "peak_backward", "modules_gathered_ahead",
                                                         "modules_gathered_on_demand", "elements_gathered")}})
        print(rows[-1]["name"], rows[-1]["peak_forward"], rows[-1]["peak_backward"], file=sys.stderr, flush=True)
    for kind in ("llama", "mixtral"):  # each model's modules once, on its first run
        first = next((i for i, row in enumerate(rows) if row["model"] == kind), None)
        if first is not None:
            rows[first]["modules"] = outcome.ranks[0]["runs"][first]["modules"]
    return rows


def main(argv=None) -> int:
    from calibrate.harness.recording import run_cli

    return run_cli(argv, __doc__, OUT, "python -m calibrate.engines.deepspeed_zero3: DeepSpeed ZeRO-3 on 2 gloo "
                   "ranks, a 3-layer Llama (calibrate/engines/deepspeed_zero3_worker.py LLAMA, bf16), the most "
                   "parameter elements gathered or in flight after any submodule fetch of the third step and the elements all-gathered, "
                   "forward and backward (a checkpoint's recompute counted in the backward)",
                   measure, "deepspeed", names=list(KNOBS))


if __name__ == "__main__":
    sys.exit(main())
