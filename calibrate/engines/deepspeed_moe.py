"""What DeepSpeed's MoE layer (deepspeed.moe.layer.MoE, Megatron-DeepSpeed's) saves for backward, per
token, counted on the real module.

    python -m calibrate.engines.deepspeed_moe [--out PATH]

Builds deepspeed.moe.layer.MoE (TopKGate + MOELayer of moe/sharded_moe.py, ep_size 1, experts a
Linear-GELU-Linear MLP as Megatron-DeepSpeed's ParallelMLP, bf16) on the CPU, one gloo rank, runs a
forward under torch.autograd.graph.saved_tensors_hooks and a backward, and sums what the forward saved,
each storage once at its size, parameters and the layer's input left out, by the code that saved it:
the gate (TopKGate.forward, top1gating / top2gating / topkgating), the dispatch (_sparse_encode: the
int64 source row of every expert slot), the combine (_sparse_decode: each token's k gathered expert
rows, their fp32 gates and int64 slots) and the experts. Per token is the difference between two token
counts over the difference of tokens, so what a layer saves once (the gate weight's fp32 copy, the
aux loss's per-expert means, the dispatch's pad row) drops out. Results go to
data/references/deepspeed_moe_cpu.json (atomically), read by tests/test_activations_deepspeed_moe.py.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "data" / "references" / "deepspeed_moe_cpu.json"
TOKENS = (96, 192)  # two micro-batches of 48 and 96 tokens x 2 sequences; capacity k S / E divides both
CONFIGS = {  # name: (experts, top-k, hidden, expert ffn)
    "E8-k1": (8, 1, 64, 96),
    "E8-k2": (8, 2, 64, 96),
    "E8-k4": (8, 4, 64, 96),  # topkgating
    "E16-k2-h48": (16, 2, 48, 80),
}


def category(frames: list) -> str:
    """Which part of the layer saved a tensor: the innermost deepspeed/moe function on the stack
    (function@class for methods)."""
    for name in frames:  # innermost first
        if name in ("_sparse_encode", "_route_slots"):
            return "dispatch"
        if name == "_sparse_decode":
            return "combine"
        if "gating" in name or name in ("_capacity", "forward@TopKGate"):
            return "gate"
        if name == "forward@Experts":
            return "experts"
    return "other"


def _frames() -> list:
    """The deepspeed/moe frames of the current stack, innermost first."""
    out, frame = [], sys._getframe(2)
    while frame is not None:
        if "/deepspeed/moe/" in frame.f_code.co_filename:
            owner = frame.f_locals.get("self")
            out.append(frame.f_code.co_name + (f"@{type(owner).__name__}" if owner is not None else ""))
        frame = frame.f_back
    return out


def _saved_by_part(moe, tokens: int, hidden: int) -> dict:
    """Bytes by part the graph still holds once the forward has returned (calibrate/benches/saved.py
    LiveSavedCounter: a node on a branch nothing uses, such as the gate's gating-decision counts,
    frees what it saved during the forward)."""
    import torch

    from calibrate.benches.saved import LiveSavedCounter

    class ByPart(LiveSavedCounter):
        def __init__(self, exclude):
            super().__init__(exclude)
            self.parts = []  # beside self.packed, in the same order

        def pack(self, t):
            self.parts.append(category(_frames()))
            return super().pack(t)

    x = torch.randn(2, tokens // 2, hidden, dtype=torch.bfloat16, requires_grad=True)
    counter = ByPart([*moe.parameters(), x])
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
        out, l_aux, _ = moe(x)
    counter.settle()
    parts, seen = {}, set()
    for (ref, ptr, (nbytes, *_)), part in zip(counter.packed, counter.parts):
        if ptr in counter.saved and ref() is not None and ptr not in seen:
            seen.add(ptr)
            parts[part] = parts.get(part, 0) + nbytes
    (out.float().sum() + l_aux).backward()  # the layer trains on what was saved
    assert x.grad is not None and torch.isfinite(x.grad).all()
    return parts


def measure() -> list[dict]:
    import torch

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import deepspeed
    from deepspeed.moe.layer import MoE

    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    rows = []
    for name, (experts, k, hidden, ffn) in CONFIGS.items():
        torch.manual_seed(0)
        expert = torch.nn.Sequential(torch.nn.Linear(hidden, ffn), torch.nn.GELU(), torch.nn.Linear(ffn, hidden))
        moe = MoE(hidden_size=hidden, expert=expert, num_experts=experts, ep_size=1, k=k).to(torch.bfloat16).train()
        small, large = (_saved_by_part(moe, n, hidden) for n in TOKENS)
        per_token = {p: (large.get(p, 0) - small.get(p, 0)) / (TOKENS[1] - TOKENS[0]) for p in sorted({*small, *large})}
        gate = moe.deepspeed_moe.gate
        rows.append({"name": name, "deepspeed": deepspeed.__version__, "torch": torch.__version__,
                     "experts": experts, "topk": k, "hidden": hidden, "ffn": ffn, "tokens": list(TOKENS),
                     "capacity_factor": float(gate.capacity_factor), "min_capacity": int(gate.min_capacity),
                     "bytes_per_token": per_token})
        print(rows[-1], flush=True, file=sys.stderr)
    return rows


def main(argv=None) -> int:
    import warnings

    warnings.filterwarnings("ignore")
    from calibrate.harness.recording import run_cli

    return run_cli(argv, __doc__, OUT, "python -m calibrate.engines.deepspeed_moe: deepspeed.moe.layer.MoE (TopKGate, "
                   "MOELayer, Linear-GELU-Linear experts, ep_size 1, bf16) on one gloo rank, bytes its forward saves "
                   "per token by part (saved_tensors_hooks, each storage once, parameters and the input left out; "
                   "the difference of two token counts)", measure, "deepspeed")


if __name__ == "__main__":
    sys.exit(main())
