"""What Hugging Face transformers' Llama-family blocks save for backward (transformers 5.25: Llama,
Mistral, Qwen2/3 and their MoE, DeepSeek-V2/V3's MLA, Llama 4), eager and SDPA, under torch.compile
where measured, and with Liger Kernel's fused RMSNorm/SwiGLU (liger-kernel)."""

from __future__ import annotations

import numpy as np

from planner.errors import InputError
from planner.layout import Training
from planner.model import ModelSpec
from planner.saved.base import SP, TP, WHOLE, Saved


def hf_rms_norm_saved(e: float, h: int, where: str, split: str = SP, rows: int = 1,
                      weight: bool = True) -> list[Saved]:
    """transformers LlamaRMSNorm.forward (eager Python, the same on CPU and CUDA; DeepseekV3RMSNorm,
    Glm4MoeRMSNorm and Llama4TextRMSNorm are copies of it): the fp32 upcast of its input (kept by pow
    and mul), the fp32 rstd per row, and the normalized input cast back to the 16-bit dtype (kept by
    the weight's mul). In fp32 both casts are no-ops and the two saved tensors are the input and the
    normalized input. `rows` norms of width `h` a token (a per-head norm: one a head, h the head
    width); weight False: a weightless norm (Llama4TextL2Norm), whose 16-bit output only what reads it
    keeps."""
    out = [Saved(f"{where} norm input, fp32", 4.0 * rows * h, split),
           Saved(f"{where} norm rstd, fp32", 4.0 * rows, split)]
    return out + ([Saved(f"{where} norm normalized input", e * rows * h, split)] if weight else [])


def hf_swiglu_mlp_saved(e: float, f: int, where: str) -> list[Saved]:
    """LlamaMLP.forward down_proj(act_fn(gate_proj(x)) * up_proj(x)) beyond its input (Qwen2MoeMLP,
    DeepseekV3MLP and Glm4MoeMLP are copies): gate and up outputs, act(gate) and down's input."""
    return [Saved(f"{where}{name}", e * f, TP, gemm_input="own" if name == "down input" else "")
            for name in ("gate output", "up output", "act(gate)", "down input")]


def hf_attention_core_saved(model: ModelSpec, training: Training, seq: float, v: Saved, q_from_cat: bool,
                            fp32_softmax: bool = True, gqa_math: bool = True) -> list[Saved]:
    """transformers 5.25 attention from q and k after rotary (heads x dim_per_head each, [b, a, s, d])
    to o_proj's input (heads x v head width), with the model's attention_implementation.
    'sdpa' (integrations/sdpa_attention.py sdpa_attention_forward): the kernel keeps q, k, v (`v`:
    what v's storage is) and its output, and an fp32 log-sum-exp per head; it writes that output in
    q's memory layout, so where q comes out of torch.cat ([b, a, s, d] contiguous, `q_from_cat`)
    rather than out of an elementwise rotary on a transposed view ([b, s, a, d] in memory),
    sdpa_attention_forward's .transpose(1, 2).contiguous() makes o_proj's input a copy.
    'eager' (modeling_llama.py eager_attention_forward): q, k and v repeated to every head (torch.matmul
    folds q and k as views, v repeated or not a copy), the fp32 softmax and its 16-bit cast (a no-op in
    fp32), and o_proj's contiguous input; fp32_softmax False (modeling_llama4.py eager_attention_forward:
    softmax in the input's dtype): the one softmax output in that dtype.
    fp32 with GQA under SDPA on CUDA (gqa_math; sdpa_attention_forward passes enable_gqa where no
    mask is given): the flash kernel takes fp16/bf16 only and the memory-efficient one no enable_gqa
    (torch sdp_utils.cpp), so SDPA runs its composite math kernel (attention.cpp
    _scaled_dot_product_attention_math): k and v repeated to every head, q and k scaled, the matmuls
    keep both scaled operands, the softmax output [b, a, s, s] and the repeated v, and the [b, a, s, d]
    output makes o_proj's input a copy. Measured on an H200 to the byte: 752 B a token more than the
    flash kernel's keep for a 4-head, 2-kv-head Llama at 32 tokens (data/calibration/h200.json
    activations/hf-llama/sdpa-fp32). The CPU's flash kernel takes fp32 and GQA: the tests translate."""
    e = training.precision.element_bytes
    q, kv, a, o = model.q_width, model.kv_width, model.heads, model.attention_out_width
    if training.flash_attention and gqa_math and e == 4.0 and model.kv_heads < model.heads:
        return [Saved("q scaled", e * q, TP), Saved("k repeated to every head, scaled", e * q, TP),
                Saved("v repeated to every head", e * o, TP), Saved("softmax output", e * a * seq, TP, core=True),
                Saved("o_proj input (contiguous copy)", e * o, TP)]
    if training.flash_attention:
        out = [Saved("q after rotary", e * q, TP), Saved("k after rotary", e * kv, TP), v,
               Saved("attention output" + ("" if q_from_cat else " (o_proj input)"), e * o, TP,
                     gemm_input="" if q_from_cat else "shared"),
               Saved("flash log-sum-exp (fp32)", 4.0 * a, TP, core=True)]
        if q_from_cat:
            out.append(Saved("o_proj input (contiguous copy)", e * o, TP, gemm_input="own"))
        return out
    out = [Saved("q after rotary", e * q, TP), Saved("k repeated to every head", e * q, TP),
           Saved("v repeated to every head", e * o, TP)]
    if fp32_softmax:
        out.append(Saved("softmax output (fp32)", 4.0 * a * seq, TP, core=True))
        if e != 4.0:  # .to(query.dtype) of the fp32 softmax
            out.append(Saved("softmax output, 16-bit", e * a * seq, TP, core=True))
    else:
        out.append(Saved("softmax output", e * a * seq, TP, core=True))
    return out + [Saved("o_proj input (contiguous)", e * o, TP, gemm_input="own")]


def hf_llama_attention_saved(model: ModelSpec, training: Training, seq: float, q_from_cat: bool = False,
                             fp32_softmax: bool = True, gqa_math: bool = True) -> list[Saved]:
    """LlamaDecoderLayer's input_layernorm and LlamaAttention (q_proj, k_proj, v_proj, rotary,
    attention, o_proj's input; Qwen3's per-head q_norm/k_norm): hf_llama_saved's first half."""
    e = training.precision.element_bytes
    h, kv = model.hidden, model.kv_width
    out = hf_rms_norm_saved(e, h, "attention") + [Saved("q/k/v input (norm output)", e * h, SP, gemm_input="own")]
    if model.qk_norm:  # Qwen3RMSNorm on q and k per head, eager like LlamaRMSNorm: one rstd per head
        out += hf_qk_norms_saved(model, e, weight=True)
    return out + hf_attention_core_saved(model, training, seq, Saved("v", e * kv, TP), q_from_cat, fp32_softmax,
                                         gqa_math)


def hf_qk_norms_saved(model: ModelSpec, e: float, weight: bool) -> list[Saved]:
    """An RMSNorm over each query and each key head (hf_rms_norm_saved, one row a head): Qwen3's
    q_norm/k_norm (weight), Llama 4's weightless Llama4TextL2Norm."""
    d = model.dim_per_head
    return (hf_rms_norm_saved(e, d, "q", TP, model.heads, weight)
            + hf_rms_norm_saved(e, d, "k", TP, model.kv_heads, weight))


def hf_llama_mlp_saved(model: ModelSpec, training: Training) -> list[Saved]:
    """LlamaDecoderLayer's post_attention_layernorm and its MLP (LlamaMLP, or the sparse MoE block of
    hf_moe_mlp_saved where experts > 1): hf_llama_saved's second half."""
    e = training.precision.element_bytes
    out = hf_rms_norm_saved(e, model.hidden, "mlp") + [Saved("gate/up input (norm output)", e * model.hidden, SP,
                                                             gemm_input="own")]
    if model.experts > 1 and model.architecture == "llama4":  # Llama4TextMoe in place of Llama4TextMLP
        return out + hf_llama4_moe_saved(model, training)
    if model.experts > 1:  # the sparse MoE block in place of LlamaMLP
        return out + hf_moe_mlp_saved(model, training)
    return out + hf_swiglu_mlp_saved(e, model.ffn, "")


def hf_llama_compiled_saved(model: ModelSpec, training: Training) -> list[Saved]:
    """transformers' LlamaDecoderLayer under torch.compile (Inductor, default mode), what AOT
    Autograd's partitioner saves (torch 2.13 _functorch/partitioners.py
    min_cut_rematerialization_partition; counted: data/references/hf_compiled_cpu.json, python -m
    calibrate.benches.hf_compiled): each RMSNorm its 16-bit output and fp32 rstd (the normalization is
    recomputed from them, not kept as fp32 copies), SDPA's q and k after rotary, v, output and fp32
    log-sum-exp, o_proj's input as a copy of that output, gate's and up's outputs and down's input
    (act(gate) recomputed): per token 4h + 6q + 4kv + 4a + 6f + 8 bytes in bf16, where eager keeps
    16h + 4q + 4kv + 4a + 8f + 8 (hf_llama_saved)."""
    e, h, q, kv, a, f = (training.precision.element_bytes, model.hidden, model.q_width, model.kv_width, model.heads,
                         model.ffn)
    o = model.attention_out_width
    norm = [Saved("norm output", e * h, SP), Saved("norm rstd (fp32)", 4.0, SP)]
    attention = [Saved("q after rotary", e * q, TP), Saved("k after rotary", e * kv, TP), Saved("v", e * kv, TP),
                 Saved("attention output", e * o, TP), Saved("flash log-sum-exp (fp32)", 4.0 * a, TP, core=True),
                 Saved("o_proj input (copy)", e * o, TP)]
    mlp = [Saved(name, e * f, TP) for name in ("gate output", "up output", "down input")]
    return norm + attention + norm + mlp


def hf_llama_saved(model: ModelSpec, training: Training, seq: float) -> list[Saved]:
    """transformers 5 LlamaDecoderLayer (modeling_llama.py; Mistral, Qwen2 and the other llama-layout
    models share it), counted with saved_tensors_hooks (tests/test_activations_real.py):
    per token 16h + 4q + 4kv + 4a + 8f + 8 bytes in bf16 with SDPA. SDPA's flash kernel keeps q and
    k after rotary, v, its output (already [b, s, a, d] in memory, so o_proj's input is a view of it)
    and an fp32 log-sum-exp per head (aten _scaled_dot_product_flash_attention, CUDA and CPU alike);
    eager attention (eager_attention_forward) keeps q, k and v repeated to all heads, the fp32
    softmax and its 16-bit cast, and o_proj's contiguous input (hf_attention_core_saved). LlamaMLP
    keeps gate, up, act(gate) and down's input (8f); a sparse MoE block (experts > 1) keeps what
    hf_moe_mlp_saved lists."""
    return hf_llama_attention_saved(model, training, seq) + hf_llama_mlp_saved(model, training)


def liger_rms_norm_saved(e: float, h: int, where: str) -> list[Saved]:
    """LigerRMSNorm, casting_mode 'llama' (liger_kernel 0.8.5 ops/rms_norm.py LigerRMSNormFunction.forward:
    save_for_backward(X, W, RSTD), RSTD fp32 in the llama casting mode): the 16-bit input and an fp32
    rstd per row, where transformers' eager norm keeps fp32 copies (hf_rms_norm_saved)."""
    return [Saved(f"{where} norm input", e * h, SP), Saved(f"{where} norm rstd, fp32", 4.0, SP)]


def hf_liger_llama_saved(model: ModelSpec, training: Training, seq: float) -> list[Saved]:
    """LlamaDecoderLayer under apply_liger_kernel_to_llama (liger_kernel 0.8.5 transformers/monkey_patch.py):
    LigerRMSNorm for both norms (liger_rms_norm_saved); Liger RoPE rotates q and k in place in their
    projections' storage (ops/rope.py rope_forward, saves only cos and sin), so SDPA keeps what it keeps
    after transformers' elementwise rotary; LigerSwiGLUMLP's LigerSiLUMulFunction keeps the gate and up
    outputs (ops/swiglu.py save_for_backward(a, b)) and down_proj its output, recomputing silu in
    backward. Per token 8h + 4q + 4kv + 4a + 6f + 8 bytes in bf16, against transformers' 16h + ... + 8f."""
    e, h, kv, f = training.precision.element_bytes, model.hidden, model.kv_width, model.ffn
    attention = liger_rms_norm_saved(e, h, "attention") + [Saved("q/k/v input (norm output)", e * h, SP)]
    if model.qk_norm:
        attention += hf_qk_norms_saved(model, e, weight=True)
    attention += hf_attention_core_saved(model, training, seq, Saved("v", e * kv, TP), q_from_cat=False)
    mlp = liger_rms_norm_saved(e, h, "mlp") + [Saved("gate/up input (norm output)", e * h, SP)]
    return attention + mlp + [Saved(name, e * f, TP) for name in ("gate output", "up output", "down input")]


def _liger_needs_llama(model, *_):
    raise InputError(f"--modules hf-liger: Liger Kernel patches dense Llama-layout blocks here; "
                     f"{model.architecture} with {model.experts} experts has no list (--modules hf)")


def hf_mla_attention_saved(model: ModelSpec, training: Training, seq: float) -> list[Saved]:
    """transformers 5.25.0 DeepseekV3Attention.forward (models/deepseek_v3/modeling_deepseek_v3.py,
    multi-head latent attention; DeepseekV2's is the same list): input_layernorm; q_proj, or q_a_proj ->
    q_a_layernorm (DeepseekV3RMSNorm over q_lora_rank) -> q_b_proj; kv_a_proj_with_mqa -> split ->
    kv_a_layernorm over kv_lora_rank (its fp32 upcast copies the strided split; in fp32 the upcast is a
    no-op and the norm keeps the whole kv_a_proj_with_mqa output, rotary part included) -> kv_b_proj;
    rotary (apply_rotary_pos_emb[_interleave]: multiplies by cos/sin, keeps nothing per layer);
    query_states = torch.cat((q_pass, q_rot)) and expand_kv's key_states (new_empty + copy_), both
    heads x (qk_nope + qk_rope) wide; value_states is a split view of kv_b_proj's output, so the SDPA
    kernel keeps all of it, heads x (qk_nope + v_head_dim). Counted per token, bf16, SDPA:
    8h + 8r + 8c + 4a(dn + dr) + 2a(dn + dv) + 2a dv (+ 2a dv where dn + dr = dv) + 4a + 12 before
    the MLP (hf_llama_mlp_saved), r = q_lora_rank (0: q_proj, no 8r + 4), c = kv_lora_rank.
    CUDA kernel: flash attention needs one head width for q, k and v (torch 2.13 sdp_utils.cpp
    check_head_dim_size_flash), so MLA with dn + dr != dv (DeepSeek-V2/V3: 192 and 128) runs the
    memory-efficient kernel (priority flash, efficient, math, cudnn), which keeps the same q, k, v,
    output and fp32 logsumexp and writes its output [b, s, a, dv] in memory whatever q's layout
    (attention.cu _efficient_attention_forward): o_proj's input is then a view. Where the widths are
    equal the flash kernel writes its output in q's layout (empty_like), as the CPU's does, and o_proj
    reads a contiguous copy. Splits: the latent down projections and their norms run whole on every
    TP rank (planner/hf_layouts.py _mla), the up projections' outputs split by heads."""
    e = training.precision.element_bytes
    h, a, r, c, dr = model.hidden, model.heads, model.q_lora_rank, model.kv_lora_rank, model.qk_rope_head_dim
    dn, dv = model.dim_per_head - dr, model.v_head_dim or model.dim_per_head
    out = hf_rms_norm_saved(e, h, "attention") + [Saved("q_a_proj/q_proj/kv_a_proj_with_mqa input (norm output)", e * h, SP)]
    if r:
        out += hf_rms_norm_saved(e, r, "q_a_layernorm", WHOLE)
        out.append(Saved("q_b_proj input (q_a_layernorm output)", e * r, WHOLE))
    out += hf_rms_norm_saved(e, c, "kv_a_layernorm", WHOLE)
    if e == 4.0:  # the no-op upcast leaves the norm holding the split view of kv_a_proj_with_mqa's output
        out.append(Saved("kv_a_proj_with_mqa output's rotary part (kept with the norm input)", 4.0 * dr, WHOLE))
    out.append(Saved("kv_b_proj input (kv_a_layernorm output)", e * c, WHOLE))
    v = Saved("kv_b_proj output (v is a view of it)", e * a * (dn + dv), TP)
    return out + hf_attention_core_saved(model, training, seq, v, q_from_cat=dn + dr == dv)


def hf_deepseek_v3_saved(model: ModelSpec, training: Training, seq: float) -> list[Saved]:
    """transformers 5.25.0 DeepseekV3DecoderLayer (models/deepseek_v3/modeling_deepseek_v3.py) and
    Glm4MoeDecoderLayer (models/glm4_moe/modeling_glm4_moe.py), counted with saved_tensors_hooks
    (tests/test_activations_deepseek.py): the attention is MLA (hf_mla_attention_saved) where
    kv_lora_rank is set, else GLM-4.5's Glm4MoeAttention, Llama's with Qwen3's optional per-head
    q_norm/k_norm and partial rotary, whose torch.cat of the rotary and pass-through parts makes q
    and k full copies [b, a, s, d] contiguous (so o_proj reads a copy of the SDPA output:
    hf_attention_core_saved); then post_attention_layernorm and DeepseekV3MLP (the dense-first
    blocks, `model.dense_block`, experts == 1) or DeepseekV3MoE (hf_moe_mlp_saved: the sigmoid
    TopkRouter in fp32, grouped_mm experts, an ungated shared MLP). DeepseekV2DecoderLayer
    (models/deepseek_v2/modeling_deepseek_v2.py) keeps the same list: its complex rotary keeps only
    the shared freqs_cis, its TopkRouter softmaxes (4E like the sigmoid) and never renormalizes
    (from_hf_config reads norm_topk_prob False for it). Left out: DeepseekV2's topk_method
    'group_limited_greedy' keeps a (T, E) bool mask (E bytes a token; ModelSpec has no topk_method),
    and per layer (no tokens in it) grouped_mm's offsets and, where the engine casts the router
    weight to the 16-bit dtype (from_pretrained keeps it fp32: _keep_in_fp32_modules_strict), the
    fp32 copy F.linear keeps of it, 4Eh bytes."""
    attention = hf_mla_attention_saved(model, training, seq) if model.kv_lora_rank else \
        hf_llama_attention_saved(model, training, seq, q_from_cat=True)
    return attention + hf_llama_mlp_saved(model, training)


def hf_moe_mlp_saved(model: ModelSpec, training: Training) -> list[Saved]:
    """transformers 5.25 sparse MoE blocks beyond their input (the post-attention norm output, which
    the router, the shared expert and its gate read): MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock
    and Qwen3MoeSparseMoeBlock (models/*/modeling_*.py) with their TopKRouter, and DeepseekV3MoE /
    Glm4MoeMoE with DeepseekV3TopkRouter, and the stacked Experts run by the default
    experts_implementation 'grouped_mm' (modeling_utils.py get_correct_experts_implementation;
    integrations/moe.py grouped_mm_experts_forward: the k T (token, expert) pairs sorted by expert,
    one grouped_mm for gate_up_proj and one for down_proj), counted with saved_tensors_hooks
    (tests/test_activations_real.py, tests/test_activations_deepseek.py), per token, bf16:
    4E + 32k + 4kh + 8kf (+ 4k + 4 where the top-k weights are renormalized) + 4k (Mixtral, DeepSeek:
    fp32 routing weights) or 2k (Qwen: cast to bf16) + with a shared expert fs wide 8fs (+ 2h + 2
    for Qwen's sigmoid gate) (+ 4h for DeepSeek's fp32 router input).
    Every row count is k T whatever the routing (grouped_mm's offsets, 4E bytes per layer, are
    left out). The config's output_router_logits is off by default, and the router logits are
    then saved by nothing. Which router: Mixtral (router_first, no shared expert) always
    renormalizes and keeps fp32 routing weights; Qwen routers cast them to the 16-bit dtype and
    renormalize under norm_topk_prob (ModelSpec.norm_topk_prob, from config.json); DeepSeek's
    (architecture deepseek_v3) runs in fp32 on an fp32 copy of its input, sigmoid scores, top-k
    indices kept by scores.gather, renormalized under norm_topk_prob, times routed_scaling_factor
    (a scalar: nothing kept); its group-limited choice (n_group, topk_group, e_score_correction_bias)
    only feeds topk indices, so what it saves (topk indices, the masked_fill mask) is freed with its
    graph branch when the forward returns.
    Splits: the engines running these modules have no TP; expert intermediates are marked TP like
    the dense MLP's, the h-, E- and k-wide tensors SP like the norm region's."""
    e = training.precision.element_bytes
    h, n, k, f, fs = model.hidden, model.experts, model.experts_per_token, model.ffn, model.shared_expert_ffn
    deepseek = model.architecture == "deepseek_v3"
    fp32_weights = deepseek or (model.router_first and not fs)  # DeepSeek's router and Mixtral's
    renormalized = model.norm_topk_prob
    out = []
    if deepseek and e != 4.0:  # DeepseekV3TopkRouter.forward F.linear(hidden_states.type(torch.float32), ...)
        out.append(Saved("router input, fp32 copy", 4.0 * h, SP))
    # MixtralTopKRouter.forward softmax(router_logits.float()); Qwen2Moe/Qwen3MoeTopKRouter softmax(dtype=float);
    # DeepseekV3TopkRouter.forward router_logits.sigmoid()
    out += hf_router_saved(n, k)
    if renormalized:  # TopKRouter.forward router_top_value /= sum: div_ keeps a clone of its input and the sum
        out += [Saved("top-k weights before the in-place div, fp32", 4.0 * k, SP),
                Saved("top-k weights' sum, fp32", 4.0, SP)]
    # integrations/moe.py grouped_mm_experts_forward: hidden_states[perm // k], sample_weights[perm],
    # weighted_out[inv_perm] keep their int64 indices; the gathered tokens feed grouped_mm
    out += [Saved("token of each sorted (token, expert) pair, int64", 8.0 * k, SP),
            Saved("sort permutation, int64", 8.0 * k, SP), Saved("inverse permutation, int64", 8.0 * k, SP),
            Saved("tokens gathered to their experts (gate_up input)", e * k * h, SP)]
    # grouped_mm_experts_forward: gate_up grouped_mm output (_default_apply_gate chunks it: silu keeps
    # gate, the product keeps up, both views of it), act(gate), act(gate) * up (down_proj's input)
    out += hf_experts_swiglu_saved(e, k, f)
    # grouped_mm_experts_forward: proj_out * sample_weights_g keeps both (Mixtral's and DeepSeek's stay fp32)
    out += [Saved("experts' down output", e * k * h, SP),
            Saved("routing weights of the sorted pairs", (4.0 if fp32_weights else e) * k, SP)]
    if fs:  # the shared expert: an MLP on the same input
        out += hf_swiglu_mlp_saved(e, fs, "shared ")
    if fs and not deepseek:  # Qwen2MoeSparseMoeBlock.forward: sigmoid(shared_expert_gate(x)) * shared_expert(x)
        out += [Saved("shared expert output", e * h, SP), Saved("shared_expert_gate sigmoid output", e, SP)]
    return out  # DeepseekV3MoE.forward: experts(...) + shared_experts(residuals), an add that keeps nothing


def hf_router_saved(n: int, k: int) -> list[Saved]:
    """A router's fp32 scores (softmax or sigmoid output, all n experts) and torch.topk's int64 indices
    (k), per token."""
    return [Saved("router scores (softmax or sigmoid output), fp32", 4.0 * n, SP),
            Saved("router top-k indices, int64 (torch.topk)", 8.0 * k, SP)]


def hf_experts_swiglu_saved(e: float, rows: float, f: int) -> list[Saved]:
    """Stacked experts run as one gate_up and one down product on `rows` (token, expert) rows a token:
    the gate_up output (its chunk's gate and up are views of it), act(gate), and act(gate) * up, the
    down product's input."""
    return [Saved("experts' gate_up output", e * 2 * rows * f, TP), Saved("experts' act(gate)", e * rows * f, TP),
            Saved("experts' down input", e * rows * f, TP)]


LLAMA4_ATTENTION_CHUNK_SIZE = 8192
"""Llama4TextConfig.attention_chunk_size (its default, and Scout's and Maverick's config.json); ModelSpec
has no field for it."""


LLAMA4_NO_ROPE_LAYER_INTERVAL = 4
"""Llama4TextConfig.no_rope_layer_interval: with no_rope_layers empty (Scout's and Maverick's config.json)
layer i is NoPE where (i + 1) % 4 == 0; ModelSpec has no field for it."""


def hf_llama4_saved(model: ModelSpec, training: Training, seq: float, mbs) -> list[Saved]:
    """transformers 5.25.0 Llama4TextDecoderLayer (models/llama4/modeling_llama4.py), counted with
    saved_tensors_hooks (tests/test_activations_llama4.py): LlamaDecoderLayer's list
    (hf_llama_attention_saved, hf_llama_mlp_saved: Llama4TextRMSNorm is LlamaRMSNorm) but for:
    - Llama4TextAttention.forward: apply_rotary_emb's complex product cast back (type_as) is q and k
      [b, s, a, d] in memory, so the SDPA output is too and o_proj reads a view of it, as Llama's; on
      RoPE layers under use_qk_norm a weightless Llama4TextL2Norm per q and k head (fp32 input and rstd,
      4q + 4a + 4kv + 4g: hf_qk_norms_saved); on NoPE layers (no rotary, no qk_norm) under
      attn_temperature_tuning query_states * attn_scales keeps the (1, s, 1, 1) fp32 scales, 4 bytes a
      position (4/mbs a token), the product cast back is q.
    - eager_attention_forward (modeling_llama4.py) softmaxes in the input's dtype: e a s, no fp32 copy.
    - SDPA on the chunked layers (the RoPE ones, layer_types 'chunked_attention') once seq reaches
      attention_chunk_size: masking_utils.create_chunked_causal_mask then builds a [b, 1, s, s] bool
      mask (below it, none and is_causal), so integrations/sdpa_attention.py use_gqa_in_sdpa is false
      and repeat_kv copies k and v to every head (e q + e o in place of 2 e kv), and torch's SDPA
      converts the mask (convert_boolean_attn_mask: where(mask, 0, -inf) in q's dtype), e s a token kept
      per layer. CUDA runs the memory-efficient kernel there (flash takes no mask): it keeps the same q,
      k, v, output (written [b, s, a, d]), fp32 logsumexp and that mask, as the CPU's flash kernel does
      (seq a multiple of 32: no padding). NoPE layers attend in full (is_causal, no mask).
    - Llama4TextMoe (hf_llama4_moe_saved): every token through every expert.
    Per token, bf16, SDPA, seq below the chunk size, a RoPE layer with qk_norm: 16h + 8q + 8kv + 8a + 4g
    + 8 before the MLP. Per-layer average: ModelSpec has no use_qk_norm, no_rope_layers or
    attention_chunk_size, so every block is counted as the default config's average layer: use_qk_norm
    on, one layer in LLAMA4_NO_ROPE_LAYER_INTERVAL NoPE (the RoPE terms times 3/4, the NoPE ones times
    1/4), chunks of LLAMA4_ATTENTION_CHUNK_SIZE. The whole model's sum is then exact where the layers are
    a multiple of 4 (Scout, Maverick: 48), a block kind's not where NoPE layers fall unevenly on dense
    and routed blocks (Maverick: half its routed blocks NoPE, no dense one); Maverick's use_qk_norm
    false makes each of its RoPE layers 4q + 4a + 4kv + 4g too high."""
    e = training.precision.element_bytes
    q, kv, o = model.q_width, model.kv_width, model.attention_out_width
    nope = 1.0 / LLAMA4_NO_ROPE_LAYER_INTERVAL  # the fraction of NoPE layers
    # Llama4TextAttention.qk_norm: Llama4TextL2Norm (Llama4TextWeightlessRMSNorm), RoPE layers only
    out = [Saved(x.name + " (L2, RoPE layers)", (1 - nope) * x.bytes_per_token, x.split)
           for x in hf_qk_norms_saved(model, e, weight=False)]
    # Llama4TextAttention.forward attn_temperature_tuning: attn_scales (1, s, 1, 1) fp32 kept by the mul
    out.append(Saved("NoPE temperature scales, fp32, one a position", nope * 4.0 / np.asarray(mbs, dtype=float), SP))
    if training.flash_attention:  # seq >= attention_chunk_size: masking_utils.py create_chunked_causal_mask's
        # mask, then sdpa_attention.py sdpa_attention_forward's repeat_kv and torch's convert_boolean_attn_mask
        chunked = (1 - nope) * (np.asarray(seq) >= LLAMA4_ATTENTION_CHUNK_SIZE)
        out += [Saved("k and v repeated to every head for a masked SDPA (beyond k and v)",
                      chunked * e * (q + o - 2 * kv), TP),
                Saved("chunked-attention mask in the 16-bit dtype (SDPA's convert_boolean_attn_mask)",
                      chunked * e * seq, WHOLE, core=True)]
    # fp32 SDPA's math-kernel fallback (hf_attention_core_saved) is not modelled for this averaged
    # layer, whose chunked layers pass a mask (k and v repeated: the memory-efficient kernel)
    return (hf_llama_attention_saved(model, training, seq, fp32_softmax=False, gqa_math=False) + out
            + hf_llama_mlp_saved(model, training))


def hf_llama4_moe_saved(model: ModelSpec, training: Training) -> list[Saved]:
    """transformers 5.25.0 Llama4TextMoe.forward (models/llama4/modeling_llama4.py) beyond its input:
    Llama4Router (an nn.Linear: torch.topk of the logits keeps its int64 indices, scatter_ them into
    -inf, sigmoid of the fp32 copy keeps its fp32 output, cast back to the 16-bit dtype: hf_router_saved);
    routed_in = the input repeated to every expert (E T rows, kept by the product) times the scores
    transposed (a reshape copy, E a token, kept too); Llama4TextExperts.forward, two torch.bmm over
    every (expert, token) pair, the non-chosen scaled by sigmoid(-inf) = 0: the product (its input),
    gate_up, act(gate), act(gate) * up (hf_experts_swiglu_saved with E rows a token, not k: no
    grouped_mm, experts_implementation does not reach it); shared_expert, a Llama4TextMLP of the
    expert width (hf_swiglu_mlp_saved); out.add_ keeps nothing. Per token, bf16: 4E + 8k + 2E + 4Eh +
    8Ef + 8fs. Only the router's indices grow with k."""
    e = training.precision.element_bytes
    h, n, f, fs = model.hidden, model.experts, model.ffn, model.shared_expert_ffn
    return (hf_router_saved(n, model.experts_per_token)
            + [Saved("router scores transposed (a reshape copy)", e * n, SP),
               Saved("input repeated to every expert", e * n * h, SP),
               Saved("experts' input (repeated input x scores)", e * n * h, SP)]
            + hf_experts_swiglu_saved(e, n, f) + hf_swiglu_mlp_saved(e, fs, "shared "))
