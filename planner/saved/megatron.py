"""What Megatron-Core's blocks with Transformer Engine save for backward (Korthikanti et al. 2022
section 4, tensor by tensor: GQA, SwiGLU, RMSNorm, MoE routing, FlashAttention)."""

from __future__ import annotations

from dataclasses import replace

from planner.engines import MoeCapacity
from planner.layout import Training
from planner.model import ModelSpec
from planner.saved.base import ROWS, SP, TP, Saved


def megatron_saved(model: ModelSpec, training: Training, seq: float, routed) -> list[Saved]:
    """What one Megatron block saves for backward, per token, with `seq` keys per query (the attention
    scores per token) and `routed` routed-expert rows per token (k dropless, about k C padded to an
    expert capacity: planner/moe.py routed_per_token). Megatron-LM's kernels: fused SwiGLU saves the [gate|up] fc1 output (2f)
    and the fc2 input (f) (core/fusions/fused_bias_swiglu.py save_for_backward); FlashAttention
    keeps its output and an fp32 log-sum-exp per head (Dao 2023 section 3.1) instead of the
    a s^2 scores; dropout keeps 1-byte masks."""
    e = training.precision.element_bytes
    h, q, kv, a = model.hidden, model.q_width, model.kv_width, model.heads
    dropout = model.dropout
    # what --recompute-modules drops (megatron-core 0.16.1; get_gpt_layer_with_transformer_engine_spec:
    # the attention norm is its own TENorm only under MLA, fused into linear_qkv otherwise; the MLP
    # norm its own only before an MoE layer, fused into linear_fc1 before a dense MLP). 'layernorm' and
    # 'mla_up_proj' are output-discarding checkpoints (tensor_parallel/random.py CheckpointWithoutOutput:
    # the function runs under no_grad, its inputs kept, its output freed once consumed); 'mlp', 'moe'
    # and 'shared_experts' checkpoint the module (its input kept, nothing inside saved)
    mla, moe = bool(model.kv_lora_rank), model.experts > 1
    up = ("mla_up_proj",) if mla else ()
    out = [
        Saved("attention norm input", e * h, SP),
        Saved("qkv input", e * h, SP, gemm_input="own", dropped_by=("layernorm",) if mla else ()),
        Saved("q", e * q, TP, dropped_by=up), Saved("k", e * kv, TP, dropped_by=up),
        Saved("v", e * model.v_width, TP, dropped_by=up),
    ]
    if not training.flash_attention and model.kv_heads < model.heads and not model.kv_lora_rank:
        # megatron-core 0.16.1 dot_product_attention.py DotProductAttention.forward (unfused): key and
        # value repeat_interleave'd to every head, new tensors its matmuls keep (counted:
        # tests/test_activations_real.py, as many bytes as MHA's q, k, v)
        out[3:] = [Saved("k repeated to every head", e * q, TP),
                   Saved("v repeated to every head", e * model.attention_out_width, TP)]
    if model.kv_lora_rank:
        # multi-head latent attention (megatron-core 0.16.1 multi_latent_attention.py MLASelfAttention
        # get_query_key_value_tensors): the duplicated down projections run on the SP shard, then
        # q_layernorm and kv_layernorm keep their input and an fp32 rstd, the column-parallel up
        # projections their input; q and k are heads x (qk_head_dim + qk_pos_emb_head_dim) wide, v
        # heads x v_head_dim (the widths above)
        # (mla_up_proj: multi_latent_attention.py qkv_up_proj_and_rope_apply checkpoints the norms and
        # up projections fused in linear_q/kv_up_proj, keeping the down projections' outputs)
        r, c = model.q_lora_rank, model.kv_lora_rank
        if r:
            out += [Saved("q_layernorm input", e * r, SP), Saved("q_layernorm rstd (fp32)", 4.0, SP, dropped_by=up),
                    Saved("q up-projection input", e * r, SP, dropped_by=up)]
        out += [Saved("kv_layernorm input", e * c, SP), Saved("kv_layernorm rstd (fp32)", 4.0, SP, dropped_by=up),
                Saved("kv up-projection input", e * c, SP, dropped_by=up)]
    if model.qk_norm:  # megatron-core qk_layernorm (TENorm): each norm keeps its input and an fp32 rstd per row
        out += [Saved("q norm input", e * q, TP), Saved("q norm rstd (fp32)", 4.0 * a, TP),
                Saved("k norm input", e * kv, TP), Saved("k norm rstd (fp32)", 4.0 * model.kv_heads, TP)]
    if training.flash_attention:
        out.append(Saved("flash log-sum-exp (fp32)", 4.0 * a, TP, core=True))
    else:
        out.append(Saved("softmax output", e * a * seq, TP, core=True))
        if dropout:
            out += [Saved("attention dropout mask", 1.0 * a * seq, TP, core=True),
                    Saved("attention dropout output", e * a * seq, TP, core=True)]
    out.append(Saved("output-projection input", e * model.attention_out_width, TP, gemm_input="shared"))
    if dropout:
        out.append(Saved("attention-output dropout mask", 1.0 * h, SP))
    # the MLP norm's output: the MoE layer's checkpointed input, the dense MLP's own (fused) internal
    out += [Saved("mlp norm input", e * h, SP),
            Saved("mlp input", e * h, SP, gemm_input="own", dropped_by=("layernorm",) if moe else ("mlp",))]
    if moe:
        out += [replace(x, dropped_by=("moe",)) for x in megatron_moe_routing_saved(model, training, routed)]
    # each token's rows in the routed experts (padding included), and the shared expert's apart
    widths = [(routed * model.ffn, ("moe",))] if moe else [(model.mlp_width(routed), ("mlp",))]
    if moe and model.shared_expert_ffn:
        widths.append((model.shared_expert_ffn, ("moe", "shared_experts")))
    for i, (w, by) in enumerate(widths):
        first = "fc1 output [gate|up]" if model.ffn_kind == "swiglu" else "activation input"
        # moe_act: the routed experts' activation output, discarded once fc2 used it (moe/experts.py
        # TEGroupedMLP activation_checkpoint, a CheckpointWithoutOutput)
        act_out = by + ("moe_act",) if moe and i == 0 else by
        out += [Saved(first, e * (2 if model.ffn_kind == "swiglu" else 1) * w, TP, dropped_by=by),
                Saved("fc2 input", e * w, TP, gemm_input="own", dropped_by=act_out)]
    if dropout:
        out.append(Saved("mlp dropout mask", 1.0 * h, SP))
    return out


def megatron_moe_routing_saved(model: ModelSpec, training: Training, routed) -> list[Saved]:
    """What a routed MoE MLP saves beyond its experts' SwiGLU, per token of the router's shard, with
    `routed` expert rows per token: the experts' first GEMM keeps its input, the permuted copy of each
    row (h wide). megatron-core 0.16.1 (counted on its MoELayer: calibrate/engines/megatron_moe.py) also keeps,
    for the fused SwiGLU's prob weighting, each row's routing prob (fusions/fused_bias_swiglu.py
    WeightedSwiGLUFunction); in the router (moe_utils.py topk_routing_with_score_function) the top-k
    indices (int64) and the fp32 softmax over them, or with moe_router_pre_softmax (which top-1 needs)
    the fp32 softmax over all E and the indices; in the dispatcher (moe_utils.py permute) the
    routing map (bool, E), the dense probs (E) and each row's sorted index (int64).
    Megatron-DeepSpeed's deepspeed.moe (DeepSpeed 0.19.8 moe/sharded_moe.py, counted on its MoE layer:
    calibrate/engines/deepspeed_moe.py): TopKGate keeps its input's fp32 copy (4h) and the fp32 softmax (4E),
    and per gating function top1gating the int64 one-hot mask (8E); top2gating both routes' fp32 masks
    (8E), the sum of their gates, its clamp and the two normalized gates (16); topkgating the fp32
    scores it gathers and divides (8E), the bool mask (E), the int64 top-k indices (8k) and the
    normalizer and its clamp (8). _sparse_encode keeps the int64 source row of every expert slot,
    _sparse_decode each token's k gathered expert rows (e h), fp32 gates and int64 slots (12)."""
    e, h, E, k = training.precision.element_bytes, model.hidden, model.experts, model.experts_per_token
    out = [Saved("expert fc1 input (permuted rows)", e * h * routed, ROWS)]
    if training.engine.moe_capacity is MoeCapacity.MEGATRON:
        router = 4.0 * E + 8 * k if k == 1 else (8 + 4.0) * k
        out += [Saved("routing prob per row (WeightedSwiGLU)", e * routed, ROWS),
                Saved("router top-k indices and softmax", router, SP),
                Saved("dispatcher routing map, dense probs, sorted row indices", (1.0 + e) * E + 8 * routed, SP)]
    elif training.engine.moe_capacity is MoeCapacity.DEEPSPEED_MOE:
        gating = {1: 8.0 * E, 2: 8.0 * E + 16}.get(k, 9.0 * E + 8 * k + 8)
        out += [Saved("gate input (fp32 copy) and softmax", 4.0 * h + 4.0 * E + gating, SP),
                Saved("dispatch source row per expert slot (int64)", 8.0 * routed, SP),
                Saved("combine: gathered expert rows, gates (fp32), slots (int64)", (e * h + 12.0) * k, SP)]
    return out


def recomputed_gemms(model: ModelSpec, modules) -> frozenset:
    """The forward GEMMs (Gemm.name) the listed modules rerun in one block of this kind: 'mlp' the
    dense MLP (transformer_layer.py recompute_mlp: not in an MoE layer), 'moe' the whole MoE layer
    with its router and shared expert (moe/moe_layer.py moe_layer_recompute), 'shared_experts' the
    shared expert alone, 'mla_up_proj' MLA's up projections (multi_latent_attention.py
    qkv_up_proj_and_rope_apply); 'core_attn' and 'layernorm' no GEMM."""
    moe, names = model.experts > 1, set()
    if "mlp" in modules and not moe:
        names |= {"fc1", "fc2"}
    if "moe" in modules and moe:
        names |= {"router", "fc1", "fc2", "shared_fc1", "shared_fc2"}
    if "shared_experts" in modules and moe:
        names |= {"shared_fc1", "shared_fc2"}
    if "mla_up_proj" in modules and model.kv_lora_rank:
        names |= {"q_up", "kv_up"}
    return frozenset(names)
