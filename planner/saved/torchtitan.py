"""What torchtitan 0.3.0's own blocks save for backward (Llama 3 attention or DeepSeek-V3's MLA,
SwiGLU FeedForward, the MoE block with its grouped experts and token dispatcher)."""

from __future__ import annotations

from planner.layout import Training
from planner.model import ModelSpec
from planner.saved.base import SP, TP, WHOLE, Saved


def torchtitan_attention_saved(model: ModelSpec, training: Training) -> list[Saved]:
    """torchtitan 0.3.0 attention_norm and GQAttention (models/common/attention.py; Llama 3's block
    and Qwen3's, dense or MoE), torchtitan_llama_saved's first half, per token on CUDA.
    nn.RMSNorm is torch's fused rms_norm on CUDA, which keeps its input and an fp32 rstd per row
    (torch 2.13 derivatives.yaml _fused_rms_norm -> _fused_rms_norm_backward(grad, input, rstd));
    the fused wqkv (common/attention.py FusedQKVLinear) keeps the norm output, all-gathered whole on
    every TP rank under SP (models/llama3/sharding.py: Replicate before the linears); ComplexRoPE
    multiplies by its cache buffer and CosSinRoPE (common/rope.py, Qwen3) by views of its cos/sin
    cache, keeping nothing per token; FlexAttention keeps q, k, v, its output (wo's input:
    .contiguous() of it is a view) and the fp32 logsumexp and max_scores per head. Qwen3's
    q_norm / k_norm (nn.RMSNorm over the head width) keep their input and an rstd per head."""
    e = training.precision.element_bytes
    h, q, kv, a = model.hidden, model.q_width, model.kv_width, model.heads
    norm = [Saved("attention norm input", e * h, SP), Saved("attention norm rstd (fp32)", 4.0, SP),
            Saved("wqkv input (norm output)", e * h, WHOLE)]
    if model.qk_norm:  # torchtitan qwen3: q_norm / k_norm (nn.RMSNorm over the head width): input and rstd per head
        norm += [Saved("q norm input", e * q, TP), Saved("q norm rstd (fp32)", 4.0 * a, TP),
                 Saved("k norm input", e * kv, TP), Saved("k norm rstd (fp32)", 4.0 * model.kv_heads, TP)]
    attention = [Saved("q after rotary", e * q, TP), Saved("k after rotary", e * kv, TP), Saved("v", e * kv, TP),
                 Saved("flex output (wo input)", e * q, TP), Saved("flex logsumexp (fp32)", 4.0 * a, TP, core=True),
                 Saved("flex max_scores (fp32)", 4.0 * a, TP, core=True)]
    return norm + attention


def torchtitan_mla_attention_saved(model: ModelSpec, training: Training) -> list[Saved]:
    """torchtitan 0.3.0 attention_norm and models/deepseek_v3/model.py Attention.forward (multi-head
    latent attention, DeepSeekV3TransformerBlock's first half, dense-first or MoE), per token on CUDA:
    the attention norm (input, fp32 rstd: torchtitan_attention_saved); wq, or wq_a and wkv_a, read
    the norm output (all-gathered whole under SP; the down projections and their norms are
    replicated over TP: deepseek_v3/sharding.py); q_norm (nn.RMSNorm over q_lora_rank) keeps wq_a's
    output and an rstd, wq_b its output; kv_norm runs on `torch.split(wkv_a(x), [c, dr])[0]`, a
    strided view, and the fused CUDA rms_norm keeps its input as given, so the whole wkv_a output,
    rotary part included, stays (the CPU decomposition keeps an fp32 copy of the c part instead:
    tests/test_activations_torchtitan_mla.py); wkv_b keeps kv_norm's output; ComplexRoPE
    (common/rope.py) upcasts q_pe and k_pe and multiplies by a view of its cache, keeping nothing
    per token; torch.cat makes q [b, s, a, dn + dr] and k (k_pe expanded over the heads) full
    copies; v is a split view of wkv_b's output, so FlexAttention keeps all of it beside q, k, its
    output (wo's input: .contiguous() of it is a view, a dv wide) and the fp32 logsumexp and
    max_scores per head. Per token, bf16, TP 1, r = q_lora_rank (0: wq, no r terms), c =
    kv_lora_rank: 4h + 4 + (4r + 4) + 2(c + dr) + 4 + 2c + 2a(dn + dv) + 4a(dn + dr) + 2a dv + 8a."""
    e = training.precision.element_bytes
    h, a, r, c, dr = model.hidden, model.heads, model.q_lora_rank, model.kv_lora_rank, model.qk_rope_head_dim
    dn, dv = model.dim_per_head - dr, model.v_head_dim or model.dim_per_head
    out = [Saved("attention norm input", e * h, SP), Saved("attention norm rstd (fp32)", 4.0, SP),
           Saved("wq or wq_a, and wkv_a input (norm output)", e * h, WHOLE)]
    if r:
        out += [Saved("q_norm input (wq_a output)", e * r, WHOLE), Saved("q_norm rstd (fp32)", 4.0, WHOLE),
                Saved("wq_b input (q_norm output)", e * r, WHOLE)]
    out += [Saved("kv_norm input: wkv_a's whole output (a split view of it)", e * (c + dr), WHOLE),
            Saved("kv_norm rstd (fp32)", 4.0, WHOLE), Saved("wkv_b input (kv_norm output)", e * c, WHOLE),
            Saved("wkv_b output (v is a view of it)", e * a * (dn + dv), TP),
            Saved("q (torch.cat of its non-rotary and rotary parts)", e * a * (dn + dr), TP),
            Saved("k (torch.cat of k_nope and k_pe expanded over the heads)", e * a * (dn + dr), TP),
            Saved("flex output (wo input)", e * a * dv, TP), Saved("flex logsumexp (fp32)", 4.0 * a, TP, core=True),
            Saved("flex max_scores (fp32)", 4.0 * a, TP, core=True)]
    return out


def torchtitan_block_attention_saved(model: ModelSpec, training: Training) -> list[Saved]:
    """A torchtitan block's attention half: MLA (DeepSeek-V3's Attention) where kv_lora_rank is
    set, else GQAttention (Llama 3, Qwen3)."""
    if model.kv_lora_rank:
        return torchtitan_mla_attention_saved(model, training)
    return torchtitan_attention_saved(model, training)


def torchtitan_ffn_norm_saved(e: float, h: int) -> list[Saved]:
    """torchtitan 0.3.0 ffn_norm (nn.RMSNorm, fused on CUDA): its input and an fp32 rstd per token
    (torchtitan_attention_saved)."""
    return [Saved("ffn norm input", e * h, SP), Saved("ffn norm rstd (fp32)", 4.0, SP)]


def torchtitan_swiglu_saved(e: float, h: int, w: int, where: str = "") -> list[Saved]:
    """torchtitan 0.3.0 FeedForward.forward w2(silu(w1 x) * w3 x) (models/common/feed_forward.py),
    eager: w1/w3's input x (the ffn norm output, whole on every TP rank under SP), w1's output,
    silu's output, w3's output and their product (w2's input)."""
    return [Saved(f"{where}w1/w3 input (norm output)", e * h, WHOLE)] + \
        [Saved(f"{where}{name}", e * w, TP) for name in ("w1 output", "silu output", "w3 output", "w2 input")]


def torchtitan_llama_saved(model: ModelSpec, training: Training) -> list[Saved]:
    """torchtitan 0.3.0 Llama3TransformerBlock (models/llama3/model.py) as it runs on CUDA without
    activation checkpointing, per token: 8h + 4q + 4kv + 8a + 8f + 8 bytes in bf16 (TP 1): the
    attention of torchtitan_attention_saved, ffn_norm, and FeedForward (torchtitan_swiglu_saved).
    Counted on torchtitan's own block (tests/test_activations_real.py, with the CPU-only RMSNorm
    decomposition translated). DeepSeek-V3's dense-first blocks (models/deepseek_v3/model.py
    DeepSeekV3TransformerBlock with feed_forward) are the same with the MLA attention
    (torchtitan_mla_attention_saved; tests/test_activations_torchtitan_mla.py)."""
    e = training.precision.element_bytes
    return torchtitan_block_attention_saved(model, training) + torchtitan_ffn_norm_saved(e, model.hidden) + \
        torchtitan_swiglu_saved(e, model.hidden, model.mlp_width_per_token)


def torchtitan_topk_saved(model: ModelSpec) -> tuple:
    """(values, indices) of torch.topk in torchtitan 0.3.0 TokenChoiceTopKRouter.forward
    (models/common/moe.py) over the fp32 router scores (CUDA's autocast(dtype=torch.float32) runs
    the gate in fp32): 4k and 8k (int64) bytes a token. EP off, every TP rank routes all tokens
    (models/common/moe_sharding.py: router input Replicate): whole."""
    k = model.experts_per_token
    return Saved("router top-k values (fp32)", 4.0 * k, WHOLE), Saved("router top-k indices (int64)", 8.0 * k, WHOLE)


def torchtitan_moe_saved(model: ModelSpec, training: Training) -> list[Saved]:
    """torchtitan 0.3.0 MoE block as it runs on CUDA without activation checkpointing or expert
    parallelism: Qwen3TransformerBlock (models/qwen3/model.py) with moe, and DeepSeek-V3's MoE
    blocks (models/deepseek_v3/model.py DeepSeekV3TransformerBlock, the MLA attention of
    torchtitan_mla_attention_saved; tests/test_activations_torchtitan_mla.py): the attention of
    torchtitan_block_attention_saved, ffn_norm, then models/common/moe.py MoE.forward,
    per token, bf16, TP 1 (E experts, top-k k, expert width f, shared width fs):
    4h + 4 + 4h + 4E + 8k (+ 4k + 4 with route_norm) + 16k + 2kh + 8kf + 4kh + 4k
    (+ 2h + 8fs with shared experts). Counted on torchtitan's own Qwen3 MoE model
    (calibrate/engines/torchtitan_moe.py, tests/test_activations_torchtitan_moe.py). Per layer, not per
    token, so left out: the gate's fp32 weight copy (4Eh) and grouped_mm's int32 offsets (4E)."""
    e = training.precision.element_bytes
    h, n, k, f, fs = model.hidden, model.experts, model.experts_per_token, model.ffn, model.shared_expert_ffn
    out = torchtitan_block_attention_saved(model, training) + torchtitan_ffn_norm_saved(e, h)
    if e != 4.0 or not fs:
        # TokenChoiceTopKRouter.forward: torch.autocast(dtype=torch.float32) around self.gate(x): the mm
        # keeps the fp32 copy of the norm output (in fp32 the norm output itself, shared with the shared experts')
        out.append(Saved("router gate input (fp32 autocast copy)", 4.0 * h, WHOLE))
    # TokenChoiceTopKRouter.forward: softmax or sigmoid keeps its fp32 output; scores.gather(-1, topk ids)
    # keeps the topk indices
    out += [Saved("router scores (softmax or sigmoid output, fp32)", 4.0 * n, WHOLE), torchtitan_topk_saved(model)[1]]
    if model.norm_topk_prob:  # route_norm: topk_scores / (sum + 1e-20) keeps both
        out += [Saved("top-k scores before route_norm (fp32)", 4.0 * k, WHOLE),
                Saved("route_norm denominator (fp32)", 4.0, WHOLE)]
    # common/token_dispatcher.py LocalTokenDispatcher._local_reorder: topk_scores[argsort] keeps the argsort
    # output, x[argsort // k] keeps that quotient (combine's deterministic_scatter_add keeps it again)
    out += [Saved("argsort of the expert ids (int64)", 8.0 * k, WHOLE),
            Saved("token of each sorted pair (int64)", 8.0 * k, WHOLE),
            Saved("tokens gathered to their experts (w1/w3 grouped_mm input)", e * k * h, WHOLE)]
    # common/moe.py GroupedExperts.forward: silu(grouped_mm w1) * grouped_mm w3, then grouped_mm w2, eager
    out += [Saved(f"experts' {name}", e * k * f, TP) for name in ("w1 output", "silu output", "w3 output", "w2 input")]
    # LocalTokenDispatcher.combine: routed_output.to(float32) * sorted scores keeps both
    out += [Saved("experts' output (fp32 copy)", 4.0 * k * h, WHOLE),
            Saved("sorted top-k scores (fp32)", 4.0 * k, WHOLE)]
    if fs:  # MoE.forward: shared_experts(x), a FeedForward; out + shared_out keeps nothing
        out += torchtitan_swiglu_saved(e, h, fs, "shared ")
    return out
