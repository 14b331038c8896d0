"""What Megatron's selective recompute runs again in a block's backward: the modules of
--recompute-modules (megatron-core 0.16.1 transformer_config.py recompute_modules). Which tensors each
leaves unsaved, and which GEMMs it reruns (recomputed_gemms, which compute.flops_per_step counts too),
are planner/saved/megatron.py's; planner/timing.py block_s takes the seconds from here."""

from __future__ import annotations

import numpy as np

from planner import compute as C
from planner.compute import tokens_per_microbatch
from planner.moe import routed_per_token
from planner.saved.megatron import recomputed_gemms
from planner.stage import Step


def recompute_s(ctx: Step, core_fwd_s, a2a_s, counts_s) -> tuple:
    """(seconds, exposed communication seconds) selective recompute adds to one block's backward in
    one micro-batch: the attention core's forward under 'core_attn' (`core_fwd_s`), each listed
    module's forward GEMMs at their forward rate, the fused elementwise kernels they rerun (compute.
    fused_elementwise_bytes: a norm reads and writes e h a token; the activation function over the
    rows it covers; rotary over q and k), and under 'moe' the token dispatch and combine all-to-alls
    (`a2a_s` each, mp_comm.ep_all_to_all_s) with the routing counts' sync (`counts_s`) again."""
    model, cluster, training, lay, c = ctx
    modules = training.recompute_modules
    moe = model.experts > 1
    seconds = (core_fwd_s if "core_attn" in modules else 0.0) + C.gemm_fwd_s(ctx, recomputed_gemms(model, modules))
    e, h = training.precision.element_bytes, model.hidden
    routed = routed_per_token(model, training, lay, tokens_per_microbatch(training, lay))
    per_row = (2 if model.ffn_kind == "gelu" else 3) * e  # GeLU reads f and writes f; SwiGLU reads 2f
    # norms: MLA's attention norm and an MoE layer's MLP norm are modules of their own (layernorm);
    # a dense MLP's norm is fused into its fc1 (mlp)
    norms = ("layernorm" in modules) * (int(model.kv_lora_rank > 0) + int(moe)) + int("mlp" in modules and not moe)
    if ("mlp" in modules and not moe) or ("moe" in modules and moe):
        act = per_row * model.mlp_width(routed)
    else:  # the shared expert's or the routed rows' activation alone
        act = per_row * (("shared_experts" in modules and moe) * model.shared_expert_ffn
                         + ("moe_act" in modules and moe) * routed * model.ffn)
    rope = 2 * e * (model.q_width + model.kv_width) if "mla_up_proj" in modules and model.kv_lora_rank else 0.0
    t = lay.tp.astype(np.float64)
    sp = np.where(lay.sequence_parallel > 0, t, 1.0)
    T = tokens_per_microbatch(training, lay)
    seconds = seconds + T * (norms * 2 * e * h / sp + (act + rope) / t) / C.hbm_bytes_per_s(cluster, c)
    comm = 2.0 * a2a_s + counts_s if "moe" in modules and moe else 0.0 * t
    return seconds, comm
