"""Cases of PyTorch's own engines: FSDP2 on a small transformers Llama (calibrate/engines/fsdp_worker.py),
each with the planner's prediction for the same layout (planner.memory terms, fsdp engine)."""

from __future__ import annotations

import json

from calibrate.harness.record import Case, gpu_memory, ranks_for
from calibrate.engines.fsdp_worker import LLAMA
from planner.stage import Stage



def fsdp_prediction(precision: str, zero: int, mbs: int, seq: int, ranks: int) -> dict:
    """The planner's per-rank model-state bytes at the optimizer step for this FSDP2 run."""
    from planner import layout, states
    from planner.hf_config import from_hf_config

    model = from_hf_config({**LLAMA, "model_type": "llama"})
    training = layout.Training(seq_len=seq, precision=precision, engine="fsdp")
    lay = layout.single(dp=ranks, zero=zero, mbs=mbs)
    s = Stage(model, training, lay, 0)
    weights = float(states.weight_bytes(s)[0])
    grads = float(states.grad_bytes(s, at_step=True)[0])
    optimizer = float(states.optimizer_bytes(s)[0])
    if zero == 2:
        # --zero 2 (reshard_after_forward False) books every gathered 16-bit block as weights: they
        # are held from forward into backward, the peak; after step() they are freed, so the
        # measured moment has no planner figure for the whole model states
        return {"grad_bytes": grads}
    return {"model_state_bytes": weights + grads + optimizer, "grad_bytes": grads}


def _reduce(ranks: list) -> dict:
    worst = max(ranks, key=lambda r: r["param_bytes"] + r["grad_bytes"] + r["optimizer_bytes"])
    return {"model_state_bytes": worst["param_bytes"] + worst["grad_bytes"] + worst["optimizer_bytes"],
            "grad_bytes": worst["grad_bytes"], "param_dtype": worst["param_dtype"],
            **gpu_memory(worst, 1 + (len(ranks) > 1))}


def cases(profile_kind: str) -> list:
    ranks = ranks_for(profile_kind)
    out = []
    for mixed in (True, False):
        for reshard in (True, False):
            cfg = {"mixed": mixed, "reshard_after_forward": reshard, "mbs": 2, "seq": 32}
            precision, zero = ("bf16" if mixed else "fp32"), (3 if reshard else 2)
            out.append(Case(
                name=f"fsdp2/{'bf16-mixed' if mixed else 'fp32'}/reshard-{str(reshard).lower()}", kind="memory",
                config={"engine": "fsdp", "llama": LLAMA, "worker": cfg, "layout": {"dp": ranks, "zero": zero}},
                predict=lambda p=precision, z=zero: fsdp_prediction(p, z, 2, 32, ranks), reduce=_reduce,
                module="calibrate.engines.fsdp_worker", args=[json.dumps(cfg)], nproc=ranks, timeout_s=180))
    # CPUOffloadPolicy (torchtitan's enable_cpu_offload): the shard, its gradient and AdamW's states
    # are host tensors (torch 2.13 _fsdp_param.py _init_sharded_param, _fsdp_collectives.py foreach_reduce)
    cfg = {"mixed": True, "reshard_after_forward": True, "mbs": 2, "seq": 32, "offload": True}
    out.append(Case(name="fsdp2/bf16-mixed/offload", kind="memory",
                    config={"engine": "fsdp", "llama": LLAMA, "worker": cfg,
                            "layout": {"dp": ranks, "zero": 3, "offload_optimizer": "cpu", "offload_params": "cpu"}},
                    predict=lambda: {"host_bytes": fsdp_offload_host_bytes(ranks)},
                    reduce=lambda rs: {"host_bytes": _reduce(rs)["model_state_bytes"]},
                    module="calibrate.engines.fsdp_worker", args=[json.dumps(cfg)], nproc=ranks, timeout_s=180))
    if ranks >= 2:  # FSDP2 under torch's pipelining schedule, as torchtitan composes them
        cfg = {"m": 4, "schedule": "1f1b"}
        out.append(Case(name="fsdp2/pipelined/1f1b-m4", kind="memory",
                        config={"engine": "torchtitan", "llama": LLAMA, "worker": cfg, "layout": {"dp": ranks, "zero": 3}},
                        predict=lambda: {"model_state_bytes_per_param": sum(pipelined_prediction(4, ranks)["backward"].values())},
                        reduce=_reduce_pipelined, module="calibrate.engines.fsdp_pipe_worker", args=[json.dumps(cfg)],
                        nproc=ranks, timeout_s=180))
    return out + activation_cases("cuda" if profile_kind == "gpu" else "cpu")


def fsdp_offload_host_bytes(ranks: int) -> float:
    """The planner's host bytes of one rank of the FSDP2 run with everything offloaded (bf16 mixed)."""
    from planner import layout, states
    from planner.hf_config import from_hf_config

    model = from_hf_config({**LLAMA, "model_type": "llama"})
    training = layout.Training(seq_len=32, precision="bf16", engine="fsdp")
    lay = layout.single(dp=ranks, zero=3, mbs=2, offload_optimizer="cpu", offload_params="cpu")
    return float(states.host_bytes(Stage(model, training, lay, 0))[0])


def pipelined_prediction(m: int, ranks: int) -> dict:
    """The planner's bytes per parameter of a torchtitan pipeline stage under FSDP2 (stage 0 of pp 2,
    dp `ranks`, m micro-batches): {"backward": {weights, grads, optimizer}, "reduced": {... at the step}}."""
    from planner import layout, states, sharding
    from planner.hf_config import from_hf_config

    model = from_hf_config({**LLAMA, "model_type": "llama"})
    training = layout.Training(seq_len=16, engine="torchtitan")
    lay = layout.single(pp=2, dp=ranks, zero=3, gas=m)
    s = Stage(model, training, lay, 0)
    stage_params = float(sum(sharding.rank_params(s))[0])
    per = {"weights": states.weight_bytes(s), "optimizer": states.optimizer_bytes(s)}
    per = {k: float(v[0]) / stage_params for k, v in per.items()}
    grads = {phase: float(states.grad_bytes(s, at_step=phase == "reduced")[0]) / stage_params
             for phase in ("backward", "reduced")}
    return {"backward": {**per, "grads": grads["backward"]}, "reduced": {"optimizer": per["optimizer"], "grads": grads["reduced"]}}


PIPELINED = {  # calibrate/engines/fsdp_pipe_worker.py attributes -> the planner's terms
    "weights": ("unsharded_param",), "grads": ("unsharded_accumulated_grad", "sharded_grad"),
    "optimizer": ("sharded_param", "optimizer.exp_avg", "optimizer.exp_avg_sq"),
}


def pipelined_terms(held: dict, params: int) -> dict:
    """A moment's {attribute:dtype: bytes} as bytes per parameter of the planner's terms."""
    out = {term: 0.0 for term in PIPELINED}
    for key, nbytes in held.items():
        term = next(t for t, names in PIPELINED.items() if key.split(":")[0] in names)
        out[term] += nbytes / params
    return out


def _reduce_pipelined(ranks: list) -> dict:
    worst = max(sum(pipelined_terms(x["held"], r["params"]).values()) for r in ranks for x in r["moments"])
    return {"model_state_bytes_per_param": worst}


ACTIVATION_SHAPES = (  # transformers Llama layers: (name, attention, dtype, gradient checkpointing)
    ("activations/hf-llama/sdpa-bf16", "sdpa", "bfloat16", False),
    ("activations/hf-llama/eager-bf16", "eager", "bfloat16", False),
    ("activations/hf-llama/sdpa-fp32", "sdpa", "float32", False),
    ("activations/hf-llama/sdpa-bf16-checkpointed", "sdpa", "bfloat16", True),
)
ACT_SEQ, ACT_BATCH = 32, 2


def activation_prediction(attention: str, dtype: str, checkpointing: bool) -> dict:
    """The planner's bytes one decoder layer keeps for backward (deepspeed engine: Hugging Face modules)."""
    from planner import activations, layout
    from planner.hf_config import from_hf_config

    model = from_hf_config({**LLAMA, "model_type": "llama"})
    training = layout.Training(seq_len=ACT_SEQ, precision={"bfloat16": "bf16", "float32": "fp32"}[dtype],
                               flash_attention=attention == "sdpa", engine="deepspeed")
    lay = layout.single(mbs=ACT_BATCH, recompute="full" if checkpointing else "none")
    return {"layer_saved_bytes": float(activations.kept_per_layer(model, training, lay)[0])}


def activation_cases(device: str = "cpu") -> list:
    """Saved bytes of transformers Llama layers, counted on `device` (on "cuda": CUDA's kernels'
    own saved tensors, what the planner models; on "cpu" the tests translate CPU's)."""
    from calibrate.benches.saved import hf_layer_bytes

    out = []
    for name, attention, dtype, checkpointing in ACTIVATION_SHAPES:
        hf = {**LLAMA, "attn_implementation": attention}
        out.append(Case(
            name=name, kind="activations",
            config={"llama": hf, "seq": ACT_SEQ, "batch": ACT_BATCH, "dtype": dtype, "checkpointing": checkpointing,
                    "device": device},
            predict=lambda a=attention, d=dtype, c=checkpointing: activation_prediction(a, d, c),
            reduce=lambda r: r[0],
            run_inline=lambda hf=hf, d=dtype, c=checkpointing: {
                "layer_saved_bytes": hf_layer_bytes(hf, ACT_SEQ, ACT_BATCH, d, c, device=device)}))
    return out
