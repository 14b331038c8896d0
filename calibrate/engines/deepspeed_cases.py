"""Cases of DeepSpeed's optimizer wrappers on 2 ranks (calibrate/engines/deepspeed_worker.py), each with
the planner's prediction of what the engine holds before the boundary micro-batch's step():
weights + gradients + optimizer partition (planner.memory terms, deepspeed engine)."""

from __future__ import annotations

import json

from calibrate.engines.deepspeed_worker import LLAMA
from calibrate.harness.record import Case, gpu_memory, ranks_for
from planner.stage import Stage

SCALARS_BYTES = 128
"""Loss-scale and step counters the optimizers keep as 0-d tensors (8-84 bytes measured)."""


def prediction(zero: int, gas: int, fp32_grad_accum: bool, ranks: int) -> dict:
    from planner import layout, states
    from planner.hf_config import from_hf_config

    model = from_hf_config({**LLAMA, "model_type": "llama"})
    training = layout.Training(seq_len=16, engine="deepspeed",
                               zero_config=layout.ZeroConfig(fp32_grad_accum=fp32_grad_accum))
    lay = layout.single(dp=ranks, zero=zero, gas=gas)
    s = Stage(model, training, lay, 0)
    parts = [states.weight_bytes(s), states.grad_bytes(s),
             states.optimizer_bytes(s)]
    return {"model_state_bytes": float(sum(p[0] for p in parts))}


def _reduce(ranks: list) -> dict:
    worst = max(ranks, key=lambda r: r["before_step"]["total_bytes"])
    groups = 1 + (len(ranks) > 1)  # planner.memory.process_groups: world, and DP when > 1 rank
    return {"model_state_bytes": worst["before_step"]["total_bytes"], "optimizer_class": worst["optimizer"],
            **gpu_memory(worst, groups)}


CONFIGS = (  # (name, zero, gas, fp32 accumulation): the optimizer DeepSpeed 0.19.8 picks
    ("deepspeed/bf16-optimizer/zero1-fp32-accum", 1, 2, True),  # BF16_Optimizer
    ("deepspeed/fp16-unfused/zero0-bf16", 0, 2, False),  # FP16_UnfusedOptimizer (DDP_BFLOAT16)
)


def cases(profile_kind: str) -> list:
    ranks = ranks_for(profile_kind)
    out = []
    for name, zero, gas, fp32_acc in CONFIGS:
        cfg = {"zero": zero, "gas": gas, **({"ds": {"data_types": {"grad_accum_dtype": "fp32"}}} if fp32_acc else {})}
        out.append(Case(name=name, kind="memory", config={"engine": "deepspeed", "llama": LLAMA, "worker": cfg},
                        predict=lambda z=zero, g=gas, f=fp32_acc: prediction(z, g, f, ranks), reduce=_reduce,
                        module="calibrate.engines.deepspeed_worker", args=[json.dumps(cfg)], nproc=ranks,
                        launcher="deepspeed", env={"DS_ACCELERATOR": "cpu"} if profile_kind == "cpu" else {},
                        timeout_s=240))
    from calibrate.engines import deepspeed_offload

    return out + (pipe_cases(profile_kind) if ranks >= 2 else []) + deepspeed_offload.cases(profile_kind)


def pipe_prediction(zero: int, gas: int) -> dict:
    """The planner's model-state bytes per parameter of a stage of a 2-stage DeepSpeed pipeline, one
    rank per stage (the worker's MLP stack is no catalog model: compared per parameter)."""
    from planner import layout, states, sharding
    from planner.model import lookup

    model = lookup("llama-2-7b")
    training = layout.Training(seq_len=16, engine="deepspeed")
    lay = layout.single(pp=2, dp=1, zero=zero, gas=gas)
    s = Stage(model, training, lay, 0)
    dense, expert = sharding.rank_params(s)
    held = sum(f(s)[0] for f in (states.weight_bytes, states.grad_bytes, states.optimizer_bytes))
    return {"model_state_bytes_per_param": float(held / (dense + expert)[0])}


def _reduce_pipe(ranks: list) -> dict:
    worst = max(ranks, key=lambda r: max(a["total_bytes"] for a in r["after_backward"]))
    peak = max(a["total_bytes"] for a in worst["after_backward"])
    return {"model_state_bytes_per_param": peak / worst["stage_params"], "optimizer_class": worst["optimizer"]}


def pipe_cases(profile_kind: str) -> list:
    """bf16 without ZeRO under the pipeline engine: DeepSpeed picks BF16_Optimizer."""
    cfg = {"zero": 0, "gas": 4}
    return [Case(name="deepspeed/pipe/bf16-optimizer-zero0", kind="memory", config={"engine": "deepspeed", "worker": cfg},
                 predict=lambda: pipe_prediction(0, 4), reduce=_reduce_pipe,
                 module="calibrate.engines.deepspeed_pipe_worker", args=[json.dumps(cfg)], nproc=2,
                 env={"DS_ACCELERATOR": "cpu"} if profile_kind == "cpu" else {}, timeout_s=240)]


def transient_prediction(zero: int, gas: int, ranks: int = 2, precision: str = "bf16", offload_optimizer: str = "none",
                         **zero_config) -> dict:
    """The planner's DeepSpeed buffer terms for the LLAMA of calibrate/engines/deepspeed_worker.py on `ranks`
    data-parallel ranks (calibrate/engines/deepspeed_transient_worker.py measures their transients): bytes of
    grad_bytes in backward and at the step, engine_buffers (fwd, step), deepspeed_reduce_buckets,
    deepspeed_straddle_bytes (backward, step), zero3_live_param_bytes and reduction_copy_bytes."""
    from planner import layout, memory, states, sharding
    from planner.hf_config import from_hf_config

    model = from_hf_config({**LLAMA, "model_type": "llama"})
    training = layout.Training(seq_len=16, precision=precision, engine="deepspeed",
                               zero_config=layout.ZeroConfig(**zero_config))
    lay = layout.single(dp=ranks, zero=zero, gas=gas, offload_optimizer=offload_optimizer)
    s = Stage(model, training, lay, 0)
    fwd, step = memory.engine_buffers(s)
    reduce_grads, reduce_buffers = memory.reduction_copy_bytes(s)
    terms = {"params": model.params, "grads": states.grad_bytes(s),
             "step_grads": states.grad_bytes(s, at_step=True),
             "fwd_buffers": fwd, "step_buffers": step, "buckets": memory.deepspeed_reduce_buckets(training, lay),
             "straddle_bwd": memory.deepspeed_straddle_bytes(s, at_step=False),
             "straddle_step": memory.deepspeed_straddle_bytes(s, at_step=True),
             "step_copies": memory.deepspeed_step_grad_copies(s),
             "zero3_live": memory.zero3_live_param_bytes(s),
             "oversized": sharding.oversized_tensor_params(s, training.zero_config.reduce_bucket_size),
             "reduce_grads": reduce_grads, "reduce_buffers": reduce_buffers}
    return {k: float(v if isinstance(v, (int, float)) else v[0]) for k, v in terms.items()}
