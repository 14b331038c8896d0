"""Cases of PyTorch's own engines: FSDP2 on a small transformers Llama (calibrate/fsdp_worker.py),
each with the planner's prediction for the same layout (planner.memory terms, fsdp engine)."""

from __future__ import annotations

import json

from calibrate.record import Case
from calibrate.fsdp_worker import LLAMA

RANKS = 2


def fsdp_prediction(precision: str, zero: int, mbs: int, seq: int) -> dict:
    """The planner's per-rank model-state bytes at the optimizer step for this FSDP2 run."""
    from planner import layout, memory
    from planner.hf_config import from_hf_config

    model = from_hf_config({**LLAMA, "model_type": "llama"})
    training = layout.Training(seq_len=seq, precision=precision, engine="fsdp")
    lay = layout.single(dp=RANKS, zero=zero, mbs=mbs)
    weights = float(memory.weight_bytes(model, training, lay, 0)[0])
    grads = float(memory.grad_bytes(model, training, lay, 0, at_step=True)[0])
    optimizer = float(memory.optimizer_bytes(model, training, lay, 0)[0])
    return {"model_state_bytes": weights + grads + optimizer, "grad_bytes": grads}


def _reduce(ranks: list) -> dict:
    worst = max(ranks, key=lambda r: r["param_bytes"] + r["grad_bytes"] + r["optimizer_bytes"])
    return {"model_state_bytes": worst["param_bytes"] + worst["grad_bytes"] + worst["optimizer_bytes"],
            "grad_bytes": worst["grad_bytes"], "param_dtype": worst["param_dtype"]}


def cases(profile_kind: str) -> list:
    out = []
    for mixed in (True, False):
        for reshard in (True, False):
            cfg = {"mixed": mixed, "reshard_after_forward": reshard, "mbs": 2, "seq": 32}
            precision, zero = ("bf16" if mixed else "fp32"), (3 if reshard else 2)
            out.append(Case(
                name=f"fsdp2/{'bf16-mixed' if mixed else 'fp32'}/reshard-{str(reshard).lower()}", kind="memory",
                config={"engine": "fsdp", "llama": LLAMA, "worker": cfg, "layout": {"dp": RANKS, "zero": zero}},
                predict=lambda p=precision, z=zero: fsdp_prediction(p, z, 2, 32), reduce=_reduce,
                module="calibrate.fsdp_worker", args=[json.dumps(cfg)], nproc=RANKS, timeout_s=180))
    return out
