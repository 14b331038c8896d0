"""Activation memory: the one list of tensors a transformer block saves for backward, and what
each recompute policy, pipeline stage and the output layer add to it.

After Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models")
section 4, generalized tensor by tensor to GQA, SwiGLU, RMSNorm, MoE and FlashAttention; with
GeLU 4h MLP, multi-head attention and dropout the list sums to their Table 2 exactly:
sbh(34 + 5as/h) unsplit, sbh(10 + 24/t + 5as/(ht)) with TP, sbh(34/t + 5as/(ht)) with SP.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner import fp8
from planner.engines import Buffers, MoeCapacity, Modules, SelectivePolicy
from planner.errors import InputError
from planner.layout import Layouts, Training
from planner.model import ModelSpec
from planner.modules import autocasts_fp32_params, block_modules
from planner.moe import routed_per_token
from planner.options import Recompute, RecomputeMethod
from planner.pipeline import blocks_on_stage, microbatches_in_flight, p2p_buffers
from planner.sharding import expert_tp

# how a saved tensor divides over the TP ranks
TP, SP, WHOLE, ROWS = "tp", "sp", "whole", "rows"
"""TP: split by t (inside the tensor-parallel region); SP: split by t only under sequence
parallelism (the 'replicated' LayerNorm/dropout region, Korthikanti section 4.2.2); WHOLE: every
TP rank keeps all of it (a DTensor linear's input, all-gathered before the matmul saves it); ROWS:
routed expert rows, full width, split by t / etp (the TP ranks holding other experts share the rows;
the expert-TP ranks of one expert each keep all of its rows)."""


@dataclass(frozen=True)
class Saved:
    """One tensor a block keeps for its backward, per token of one micro-batch."""

    name: str
    bytes_per_token: float
    """Bytes per token before any TP split (an array over the layouts where the micro-batch size
    changes it: hf_gpt_neox_saved's eager v)."""
    split: str
    """TP or SP."""
    core: bool = False
    """Attention-core internals that selective recompute drops (Korthikanti section 5)."""
    gemm_input: str = ""
    """A block linear layer's input, which Transformer Engine's FP8 layers keep as FP8
    (planner/fp8.py saved_input_scale): 'own' where the linear layer alone keeps it, 'shared' where
    another op keeps the same 16-bit tensor too."""


def saved_tensors(model: ModelSpec, training: Training, seq: float, routed, mbs) -> list[Saved]:
    """What one block of the job's modules (planner/modules.py block_modules) saves for backward, per
    token, with `seq` keys per query (the attention scores per token), `routed` expert rows per token
    (planner/moe.py routed_per_token: k dropless; Hugging Face and torchtitan blocks are dropless) and
    `mbs` sequences a micro-batch (only GPT-NeoX's eager attention keeps a different list at 1): the
    SAVED registry's list for (modules, architecture), else the modules' list for any architecture."""
    modules = block_modules(model, training)
    if modules is Modules.HUGGING_FACE and model.architecture == "llama" and training.compile:
        return hf_llama_compiled_saved(model, training)
    if modules is Modules.TORCHTITAN and not training.flash_attention:
        return megatron_saved(model, training, seq, routed)  # torchtitan's blocks run SDPA's flash backend only
    found = SAVED.get((modules, model.architecture)) or SAVED[(modules, None)]
    return found(model, training, seq, routed, mbs)


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
    calibrate.hf_compiled): each RMSNorm its 16-bit output and fp32 rstd (the normalization is
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
    TP rank (planner/model.py _mla), the up projections' outputs split by heads."""
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


LAYER_NORM_STATS_BYTES_PER_TOKEN = 8.0
"""torch.nn.LayerNorm's mean and rstd per row, fp32 on CUDA whatever the input dtype (torch 2.x
aten/src/ATen/native/cuda/layer_norm_kernel.cu layer_norm_cuda: at::empty({M}, acc_type)); the CPU
kernel (native/layer_norm.cpp layer_norm_cpu) keeps them in the input dtype, 2 + 2 bytes in bf16."""


def hf_layer_norm_saved(e: float, h: int, where: str) -> list[Saved]:
    """torch.nn.LayerNorm (aten native_layer_norm, derivatives.yaml native_layer_norm_backward): its
    input and the fp32 mean and rstd per token on CUDA. Its output is saved by the linear it feeds."""
    return [Saved(f"{where} input", e * h, SP),
            Saved(f"{where} mean and rstd, fp32", LAYER_NORM_STATS_BYTES_PER_TOKEN, SP)]


def hf_gpt2_saved(model: ModelSpec, training: Training, seq: float) -> list[Saved]:
    """transformers 5 GPT2Block (models/gpt2/modeling_gpt2.py GPT2Block, GPT2Attention, GPT2MLP;
    pytorch_utils.py Conv1D = addmm of the input viewed 2-D), counted with saved_tensors_hooks and
    translated to what CUDA keeps (tests/test_activations_real.py): per token, bf16,
    SDPA 16h + 4a + 10f + 16 (+ 2h of dropout masks), eager 16h + 2as + 10f + 16 (+ 3as + 2h).
    Assumes GPT2Config's defaults: activation_function 'gelu_new' (activations.py NewGELUActivation,
    eager Python 0.5 x (1 + tanh(c (x + 0.044715 x^3))): keeps x, tanh, 1 + tanh, 0.5 x and its
    output, 5f), reorder_and_upcast_attn False, attn_pdrop = resid_pdrop (model.dropout).
    SDPA: q, k and v are views of c_attn's output, so the flash kernel keeps all of it (q + 2kv); its
    output is [b, s, a, d] in memory (it follows q's strides), so c_proj's input is a view of it;
    with dropout CUDA's flash kernel keeps the same plus a philox seed/offset per call (the CPU takes
    the fp32 math path then, which CUDA does not). Eager (modeling_gpt2.py eager_attention_forward):
    matmul copies q, k^T and v contiguous, softmax keeps its bf16 output, dropout a 1-byte mask and
    its output, c_proj a contiguous copy of the attention output."""
    e = training.precision.element_bytes
    h, q, kv, a = model.hidden, model.q_width, model.kv_width, model.heads
    w = model.mlp_width_per_token
    out = hf_layer_norm_saved(e, h, "ln_1") + [Saved("c_attn input (ln_1 output)", e * h, SP)]
    if training.flash_attention:
        out += [Saved("c_attn output (SDPA keeps q, k, v views of it)", e * (q + 2 * kv), TP),
                Saved("SDPA output (c_proj input)", e * q, TP),
                Saved("flash log-sum-exp (fp32)", 4.0 * a, TP, core=True)]
    else:
        out += [Saved("q, contiguous copy", e * q, TP), Saved("k transposed, contiguous copy", e * kv, TP),
                Saved("v, contiguous copy", e * kv, TP), Saved("softmax output", e * a * seq, TP, core=True)]
        if model.dropout:
            out += [Saved("attention dropout mask", 1.0 * a * seq, TP, core=True),
                    Saved("attention dropout output", e * a * seq, TP, core=True)]
        out.append(Saved("c_proj input (contiguous)", e * q, TP))
    if model.dropout:
        out.append(Saved("attention resid_dropout mask", 1.0 * h, SP))
    out += hf_layer_norm_saved(e, h, "ln_2") + [Saved("c_fc input (ln_2 output)", e * h, SP)]
    out += [Saved(f"gelu_new {name}", e * w, TP)
            for name in ("input (c_fc output)", "0.5 x", "tanh", "1 + tanh", "output (c_proj input)")]
    if model.dropout:
        out.append(Saved("mlp dropout mask", 1.0 * h, SP))
    return out


def hf_gpt_neox_saved(model: ModelSpec, training: Training, seq: float, mbs) -> list[Saved]:
    """transformers 5 GPTNeoXLayer (models/gpt_neox/modeling_gpt_neox.py GPTNeoXLayer, GPTNeoXAttention,
    GPTNeoXMLP, apply_rotary_pos_emb), counted with saved_tensors_hooks and translated to what CUDA
    keeps (tests/test_activations_real.py, tests/test_activations_neox.py): per token, bf16, SDPA
    20h + 4a + 4f + 16 (+ 2h of dropout masks), eager 14h + 6as + 4f + 16 (with dropout 16h + 7as +
    4f + 16), + 4h in eager at micro-batch `mbs` 1.
    Assumes GPTNeoXConfig's defaults: use_parallel_residual True (both LayerNorms read the layer input,
    one storage), hidden_act 'gelu' (activations.py GELUActivation = torch's exact erf gelu: keeps its
    input); attention_dropout and hidden_dropout both on or both off (model.dropout). Any rotary_pct:
    torch.cat makes q and k full-width copies. SDPA: v is a view of query_key_value's output, so the
    flash kernel keeps all of it (q + 2kv) beside q and k after rotary; the flash output follows q's
    [b, a, s, d] layout, so dense's input is a contiguous copy; with dropout CUDA's flash kernel keeps
    the same (CPU takes the math path). Eager (eager_attention_forward): matmul keeps q and k as
    views and copies v, softmax keeps its fp32 output, then the 16-bit cast (or, with dropout, a
    1-byte mask and the dropout output) for the second matmul. torch.matmul folds v [b, a, s, d]
    to [b a, s, d] with reshape (aten native/LinearAlgebra.cpp _matmul_impl): v is a chunk of
    query_key_value's output viewed [b, s, a, 3d] and transposed, whose b and a strides merge only
    where b is 1, so there the reshape is a view and bmm keeps query_key_value's whole output
    (q + 2kv) instead of a kv copy: `mbs` (an array over layouts) picks which."""
    e = training.precision.element_bytes
    h, q, kv, a = model.hidden, model.q_width, model.kv_width, model.heads
    w = model.mlp_width_per_token
    out = [Saved("layer input (both norms' input, parallel residual)", e * h, SP),
           Saved("input_layernorm mean and rstd, fp32", LAYER_NORM_STATS_BYTES_PER_TOKEN, SP),
           Saved("post_attention_layernorm mean and rstd, fp32", LAYER_NORM_STATS_BYTES_PER_TOKEN, SP),
           Saved("query_key_value input (input_layernorm output)", e * h, SP),
           Saved("mlp input (post_attention_layernorm output)", e * h, SP),
           Saved("q after rotary (torch.cat copy)", e * q, TP), Saved("k after rotary (torch.cat copy)", e * kv, TP)]
    if training.flash_attention:
        out += [Saved("query_key_value output (SDPA keeps v, a view of it)", e * (q + 2 * kv), TP),
                Saved("SDPA output", e * q, TP, core=True),
                Saved("flash log-sum-exp (fp32)", 4.0 * a, TP, core=True)]
    else:
        v = np.where(np.asarray(mbs) == 1, e * (q + 2 * kv), e * kv)
        out += [Saved("v: a contiguous copy, at micro-batch 1 a view of query_key_value's whole output", v, TP),
                Saved("softmax output (fp32)", 4.0 * a * seq, TP, core=True)]
        if model.dropout:
            out += [Saved("attention dropout mask", 1.0 * a * seq, TP, core=True),
                    Saved("attention dropout output", e * a * seq, TP, core=True)]
        elif e != 4.0:  # .to(query.dtype) of the fp32 softmax: a no-op in fp32
            out.append(Saved("softmax output, 16-bit", e * a * seq, TP, core=True))
    out.append(Saved("dense input (contiguous)", e * q, TP))
    if model.dropout:
        out += [Saved("post_attention_dropout mask", 1.0 * h, SP), Saved("post_mlp_dropout mask", 1.0 * h, SP)]
    out += [Saved("gelu input (dense_h_to_4h output)", e * w, TP),
            Saved("dense_4h_to_h input (gelu output)", e * w, TP)]
    return out


def llm_foundry_mpt_saved(model: ModelSpec, training: Training) -> list[Saved]:
    """llm-foundry's MPTBlock as its benchmark tables ran it: attn_impl 'triton' (scripts/train/
    benchmarking/submit_benchmarks.py's default until 4952183) and low_precision_layernorm; per token
    (llm-foundry 5e85bd62d: models/layers/blocks.py MPTBlock.forward, norm.py LPLayerNorm, attention.py
    GroupedQueryAttention.forward and triton_flash_attn_fn, flash_attn_triton.py FlashAttnFunc, ffn.py
    MPTMLP). LPLayerNorm casts the residual to the autocast dtype (a copy where the residual is fp32) and
    layer_norm keeps that copy and its fp32 mean and rstd; Wqkv keeps its input; q, k and v are
    rearranged views of Wqkv's output, which FlashAttnFunc keeps (save_for_backward(q, k, v, o, lse):
    their last dimension is contiguous, so no copy) with its output, out_proj's input as a view, and
    an fp32 log-sum-exp per head (repeat_kv_for_gqa copies k and v to every head under GQA); dropout
    p 0 keeps nothing; the MLP keeps up_proj's input, nn.GELU's input and down_proj's. MHA: 32h + 4a
    + 16 bytes in bf16."""
    e = training.precision.element_bytes
    h, q, kv, a = model.hidden, model.q_width, model.kv_width, model.heads
    w = model.mlp_width_per_token
    out = [Saved("norm_1 input (autocast copy)", e * h, SP),
           Saved("norm_1 mean and rstd, fp32", LAYER_NORM_STATS_BYTES_PER_TOKEN, SP),
           Saved("Wqkv input (norm_1 output)", e * h, SP, gemm_input="own"),
           Saved("Wqkv output (q, k, v views)", e * (q + 2 * kv), TP)]
    if model.kv_heads < model.heads:  # repeat_kv_for_gqa: k and v copied to every head
        out.append(Saved("k and v repeated to every head", e * 2 * q, TP))
    return out + [Saved("attention output (out_proj input)", e * q, TP, gemm_input="shared"),
                  Saved("flash log-sum-exp (fp32)", 4.0 * a, TP, core=True),
                  Saved("norm_2 input (autocast copy)", e * h, SP),
                  Saved("norm_2 mean and rstd, fp32", LAYER_NORM_STATS_BYTES_PER_TOKEN, SP),
                  Saved("up_proj input (norm_2 output)", e * h, SP, gemm_input="own"),
                  Saved("GELU input (up_proj output)", e * w, TP),
                  Saved("down_proj input (GELU output)", e * w, TP, gemm_input="own")]


def llm_foundry_block_input_scale(model: ModelSpec, training: Training) -> float:
    """Bytes of the residual stream's elements over the training dtype's: Composer's FSDP
    mixed_precision 'DEFAULT' (composer/distributed/mosaic_parallelism.py get_mixed_precision:
    param_dtype fp32, the benchmarks' setting) leaves wte's output fp32, and each block adds its
    autocast output to that fp32 residual; 1 for every other modules. The elementwise traffic reads
    it (compute.py). A checkpoint's kept input is booked at the training dtype all the same: at 4 B
    MosaicML's MPT-13B tables (16,384 tokens at micro-batch 3 on 8 H100s, 'DEFAULT') could not have
    fit, and the mechanism that keeps it 16-bit is not found in the code read."""
    return 4.0 / training.precision.element_bytes if autocasts_fp32_params(model, training) else 1.0


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
    out = [
        Saved("attention norm input", e * h, SP),
        Saved("qkv input", e * h, SP, gemm_input="own"),
        Saved("q", e * q, TP), Saved("k", e * kv, TP), Saved("v", e * model.v_width, TP),
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
        r, c = model.q_lora_rank, model.kv_lora_rank
        if r:
            out += [Saved("q_layernorm input", e * r, SP), Saved("q_layernorm rstd (fp32)", 4.0, SP),
                    Saved("q up-projection input", e * r, SP)]
        out += [Saved("kv_layernorm input", e * c, SP), Saved("kv_layernorm rstd (fp32)", 4.0, SP),
                Saved("kv up-projection input", e * c, SP)]
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
    out += [Saved("mlp norm input", e * h, SP), Saved("mlp input", e * h, SP, gemm_input="own")]
    if model.experts > 1:
        out += megatron_moe_routing_saved(model, training, routed)
    w = model.mlp_width(routed)  # each token's rows in the routed experts (padding included) and a shared one
    if model.ffn_kind == "swiglu":
        out += [Saved("fc1 output [gate|up]", e * 2 * w, TP), Saved("fc2 input", e * w, TP, gemm_input="own")]
    else:
        out += [Saved("activation input", e * w, TP), Saved("fc2 input", e * w, TP, gemm_input="own")]
    if dropout:
        out.append(Saved("mlp dropout mask", 1.0 * h, SP))
    return out


def megatron_moe_routing_saved(model: ModelSpec, training: Training, routed) -> list[Saved]:
    """What a routed MoE MLP saves beyond its experts' SwiGLU, per token of the router's shard, with
    `routed` expert rows per token: the experts' first GEMM keeps its input, the permuted copy of each
    row (h wide). megatron-core 0.16.1 (counted on its MoELayer: calibrate/megatron_moe.py) also keeps,
    for the fused SwiGLU's prob weighting, each row's routing prob (fusions/fused_bias_swiglu.py
    WeightedSwiGLUFunction); in the router (moe_utils.py topk_routing_with_score_function) the top-k
    indices (int64) and the fp32 softmax over them, or with moe_router_pre_softmax (which top-1 needs)
    the fp32 softmax over all E and the indices; in the dispatcher (moe_utils.py permute) the
    routing map (bool, E), the dense probs (E) and each row's sorted index (int64).
    Megatron-DeepSpeed's deepspeed.moe (DeepSpeed 0.19.8 moe/sharded_moe.py, counted on its MoE layer:
    calibrate/deepspeed_moe.py): TopKGate keeps its input's fp32 copy (4h) and the fp32 softmax (4E),
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
    (calibrate/torchtitan_moe.py, tests/test_activations_torchtitan_moe.py). Per layer, not per
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


SAVED = {
    (Modules.HUGGING_FACE, "llama"): lambda m, t, seq, routed, mbs: hf_llama_saved(m, t, seq),
    (Modules.HUGGING_FACE, "llama4"): lambda m, t, seq, routed, mbs: hf_llama4_saved(m, t, seq, mbs),
    (Modules.HUGGING_FACE, "deepseek_v3"): lambda m, t, seq, routed, mbs: hf_deepseek_v3_saved(m, t, seq),
    (Modules.HUGGING_FACE, "gpt2"): lambda m, t, seq, routed, mbs: hf_gpt2_saved(m, t, seq),
    (Modules.HUGGING_FACE, "gpt_neox"): lambda m, t, seq, routed, mbs: hf_gpt_neox_saved(m, t, seq, mbs),
    (Modules.HUGGING_FACE, None): lambda m, t, seq, routed, mbs: megatron_saved(m, t, seq, routed),
    (Modules.TORCHTITAN, None): lambda m, t, seq, routed, mbs:
        torchtitan_moe_saved(m, t) if m.experts > 1 else torchtitan_llama_saved(m, t),
    (Modules.MEGATRON, None): lambda m, t, seq, routed, mbs: megatron_saved(m, t, seq, routed),
    (Modules.LLM_FOUNDRY, None): lambda m, t, seq, routed, mbs: llm_foundry_mpt_saved(m, t),
    (Modules.HF_LIGER, "llama"): lambda m, t, seq, routed, mbs:
        hf_liger_llama_saved(m, t, seq) if m.experts == 1 else _liger_needs_llama(m),
    (Modules.HF_LIGER, None): _liger_needs_llama,
}
"""Saved-tensor lists keyed by (modules, architecture); None: any architecture those modules build.
The Hugging Face lists are each family's own; a family transformers has no list here for (a layout
no ARCHITECTURES entry names) takes the fused list of Korthikanti et al., which its FlashAttention
blocks save tensor for tensor."""


def layer_bytes(model: ModelSpec, training: Training, lay: Layouts) -> tuple:
    """(every saved tensor, without the attention core, the block input alone) bytes of one block
    for one micro-batch on one rank: what no, selective and full recompute keep."""
    t = lay.tp.astype(np.float64)
    s = training.seq_len / lay.cp  # context parallelism splits the sequence
    tokens = s * lay.mbs
    sp = np.where(lay.sequence_parallel > 0, t, 1.0)
    rows_split = t / expert_tp(training, lay)
    whole, stored = 0.0, 0.0
    fp8_input = {"": 1.0, "own": fp8.saved_input_scale(training, False), "shared": fp8.saved_input_scale(training, True)}
    for x in saved_tensors(model, training, s, routed_per_token(model, training, lay, tokens), lay.mbs):
        part = tokens * x.bytes_per_token / {TP: t, SP: sp, WHOLE: 1.0, ROWS: rows_split}[x.split] * fp8_input[x.gemm_input]
        whole = whole + part
        stored = stored + (0.0 if x.core else part)
    whole = whole + cp_gathered_kv_bytes(model, training, lay)
    return whole, stored, boundary_bytes(model, training, lay) / checkpoint_partitions(training, lay)


def cp_gathered_kv_bytes(model: ModelSpec, training: Training, lay: Layouts) -> np.ndarray:
    """Where the engine all-gathers K and V over the CP ranks (Engine.cp_gathers_kv), the attention
    keeps them whole for backward: cp - 1 more sequence chunks of K and V than its own, one
    micro-batch on one rank (FlexAttention saves its key and value inputs; counted on 2 gloo ranks
    in tests/test_torch_cp_real.py). 0 elsewhere, and under selective or full recompute, where the
    gather reruns in backward instead (kept_per_layer keeps no attention input)."""
    if not training.engine.cp_gathers_kv:
        return 0.0 * lay.tp
    tokens = training.seq_len / lay.cp * lay.mbs
    return tokens * (lay.cp - 1) * training.precision.element_bytes * (model.kv_width + model.v_width) / lay.tp


def boundary_bytes(model: ModelSpec, training: Training, lay: Layouts) -> np.ndarray:
    """One micro-batch's hidden states on one rank (split by t under SP): a block's input, all full
    recompute keeps of it, and what a pipeline stage sends to the next."""
    tokens = training.seq_len / lay.cp * lay.mbs
    return tokens * training.precision.element_bytes * model.hidden / np.where(lay.sequence_parallel > 0, lay.tp, 1.0)


def checkpoint_partitions(training: Training, lay: Layouts) -> np.ndarray:
    """Parts a checkpointed layer input is split into: t where deepspeed.checkpointing partitions
    activations (DeepSpeed 0.19 runtime/activation_checkpointing/checkpointing.py
    partition_activations: each rank keeps numel / mp_size of the input, gathered back in
    backward), else 1."""
    zc = training.zero_config
    return np.where(training.engine.deepspeed_checkpointing and zc.partition_activations, lay.tp, 1).astype(np.float64)


def offloads_checkpoints(engine) -> bool:
    """Whether the engine can keep checkpointed inputs on the host (--cpu-checkpointing):
    deepspeed.checkpointing's cpu_checkpointing (checkpointing.py partition_activations /
    get_cpu_activations_for_backward, buffer_device 'cpu'); on Hugging Face modules transformers 5.25
    activation_checkpointing_enable(offload=True): torch.autograd.graph.save_on_cpu(pin_memory=True)
    around each checkpoint, whose non-reentrant frame saves the layer's inputs through
    _NoopSaveInputs in the outer graph, where those hooks move them."""
    return engine.deepspeed_checkpointing or engine.modules is Modules.HUGGING_FACE


def checkpoints_on_host(training: Training) -> bool:
    """--cpu-checkpointing: the checkpointed inputs are copied to the host in forward and back in
    backward (offloads_checkpoints)."""
    return offloads_checkpoints(training.engine) and training.zero_config.cpu_checkpointing


def checkpoint_copies_block(training: Training, lay: Layouts) -> np.ndarray:
    """Whether the host copies of checkpointed inputs hold up the compute stream: deepspeed.checkpointing
    copies partitioned inputs synchronously (over t > 1 ranks, as the planner exports it; unpartitioned
    ones go through an asynchronous side-stream engine, _get_cpu_offload_engine); save_on_cpu copies on
    the current stream (torch/autograd/graph.py pack_to_cpu copy_ and unpack_from_cpu .to, non_blocking
    to and from pinned memory, ordered with the kernels around them). Hugging Face modules on one stage
    take transformers' save_on_cpu; DeepSpeed's pipeline of them checkpoints through deepspeed.checkpointing
    (pipe/module.py PipelineModule activation_checkpoint_func=checkpointing.checkpoint)."""
    transformers_offload = (training.engine.modules is Modules.HUGGING_FACE) & (lay.pp == 1)
    return checkpoints_on_host(training) & ((checkpoint_partitions(training, lay) > 1) | transformers_offload)


def op_sac_matmuls(model: ModelSpec) -> list[tuple]:
    """(name, input width, output width, output split over TP, kept) of a torchtitan block's matmuls
    in the order they run, widths per token: torchtitan 0.3.0 models/llama3 fuses wq, wk and wv
    (fuse_qkv=True), then wo, w1, w3, w2; SelectiveAC (distributed/activation_checkpoint.py) counts
    the aten.mm calls and recomputes every second one (mm_count % 2 == 0), so wqkv, w1 and w2 keep
    their outputs. A row-parallel output (wo, w2) is a partial sum, whole on every TP rank.
    MoE blocks (models/common/moe.py MoE): the router gate's mm is forced to recompute
    (force_recompute_mm_shapes_by_fqns ['moe.router.gate']) without counting; the routed experts'
    torch._grouped_mm is neither an mm nor on the save list (the partitioner's
    compute_intensive_ops), so all three recompute, uncounted, each a token's k rows; the shared
    experts' w1, w3, w2 count on from wo: w1 and w2 keep.
    MLA (models/deepseek_v3/model.py Attention.forward, DeepSeek-V3's dense-first and MoE blocks):
    wq, or wq_a and wq_b, then wkv_a, wkv_b, wo, each an mm that counts, so the MLP's parity follows
    the query path: with wq, wq, wkv_b, w1, w2 (or shared w1, w2) keep; with wq_a, wq_a, wkv_a, wo,
    w3 (or shared w3) keep. The down projections are replicated over TP (deepseek_v3/sharding.py):
    wq_a's and wkv_a's outputs are whole on every rank."""
    h, q, kv, f, k = model.hidden, model.q_width, model.kv_width, model.ffn, model.experts_per_token
    if model.kv_lora_rank:
        r, c, dr = model.q_lora_rank, model.kv_lora_rank, model.qk_rope_head_dim
        dn, dv = model.dim_per_head - dr, model.v_head_dim or model.dim_per_head
        run = [("wq_a", h, r, False, True), ("wq_b", r, q, True, True)] if r else [("wq", h, q, True, True)]
        run += [("wkv_a", h, c + dr, False, True), ("wkv_b", c, model.heads * (dn + dv), True, True),
                ("wo", model.attention_out_width, h, False, True)]
    else:
        run = [("wqkv", h, q + 2 * kv, True, True), ("wo", q, h, False, True)]
    if model.experts == 1:
        w = model.mlp_width_per_token
        run += [("w1", h, w, True, True), ("w3", h, w, True, True), ("w2", w, h, False, True)]
    else:
        fs = model.shared_expert_ffn
        run += [("router gate", h, model.experts, False, False), ("experts w1 (grouped_mm)", h, k * f, True, False),
                ("experts w3 (grouped_mm)", h, k * f, True, False), ("experts w2 (grouped_mm)", k * f, h, False, False)]
        if fs:
            run += [("shared w1", h, fs, True, True), ("shared w3", h, fs, True, True),
                    ("shared w2", fs, h, False, True)]
    out, counted = [], 0
    for name, n_in, n_out, split, counts in run:
        counted += counts
        out.append((name, n_in, n_out, split, counts and counted % 2 == 1))
    return out


def op_sac_bytes(model: ModelSpec, training: Training, lay: Layouts) -> np.ndarray:
    """What torchtitan's op-level selective checkpointing keeps of one block per micro-batch: the
    checkpointed block's input, the kept matmul outputs (op_sac_matmuls), FlexAttention's outputs
    (the flex_attention op is on the save list: out, and the fp32 logsumexp and max_scores per
    head), in an MoE block torch.topk's values and indices (on the save list: torchtitan_topk_saved)
    and, with SP, the two reduce-scatters' outputs. Equals the bytes torchtitan 0.3.0's own
    Llama3Model, Qwen3 MoE model and DeepSeekV3Model (MLA) leave allocated per block (python -m
    calibrate.torchtitan_sac, calibrate.torchtitan_moe, calibrate.torchtitan_mla;
    tests/test_activations_real.py, tests/test_activations_torchtitan_moe.py,
    tests/test_activations_torchtitan_mla.py)."""
    e, t = training.precision.element_bytes, lay.tp.astype(np.float64)
    sp = np.where(lay.sequence_parallel > 0, t, 1.0)
    tokens = training.seq_len / lay.cp * lay.mbs
    h, o, a = model.hidden, model.attention_out_width, model.heads  # o: the flex output's width (MLA: a dv)
    per_token = e * h / sp + e * o / t + 8.0 * a / t + (sp > 1) * 2 * e * h / t
    for _, _, width, split, kept in op_sac_matmuls(model):
        per_token = per_token + kept * e * width / (t if split else 1.0)
    if model.experts > 1:
        per_token = per_token + sum(x.bytes_per_token for x in torchtitan_topk_saved(model))
    return tokens * per_token


def kept_per_layer(model: ModelSpec, training: Training, lay: Layouts, recompute=None) -> np.ndarray:
    """Bytes one block keeps for backward per micro-batch under the layout's recompute policy
    (what 'selective' keeps is the engine's policy)."""
    recompute = lay.recompute if recompute is None else recompute
    whole, stored, layer_input = layer_bytes(model, training, lay)
    if training.engine.selective_policy is SelectivePolicy.OP_SAC:
        stored = op_sac_bytes(model, training, lay)
    return np.select([recompute == Recompute.NONE, recompute == Recompute.SELECTIVE], [whole, stored], layer_input)


def recomputed_layers(lay: Layouts, n_layers, chunks) -> np.ndarray:
    """Of `n_layers` in `chunks` model chunks, those run under full recompute: every one, or with
    the block method the first recompute_layers of each chunk (megatron-core 0.16.1
    transformer/transformer_block.py TransformerBlock._checkpointed_forward: each TransformerBlock
    is one pipeline stage's chunk); none under the other policies."""
    block = (lay.recompute_layers > 0) & (lay.recompute_method == RecomputeMethod.BLOCK)
    some = np.minimum(lay.recompute_layers * chunks, n_layers)
    return np.where(lay.recompute == Recompute.FULL, np.where(block, some, n_layers), 0)


def checkpoints(lay: Layouts, n_layers, chunks) -> np.ndarray:
    """Checkpointed inputs `n_layers` blocks in `chunks` model chunks keep under full recompute:
    one per recomputed layer, or with the uniform method one per group of recompute_layers layers
    of a chunk (_checkpointed_forward 'uniform': checkpoint_handler(custom(l, l + N)) from l = 0
    in steps of N, the last group possibly shorter)."""
    uniform = (lay.recompute_layers > 0) & (lay.recompute_method == RecomputeMethod.UNIFORM)
    per_chunk = np.ceil(n_layers / np.maximum(chunks, 1))
    groups = chunks * np.ceil(per_chunk / np.maximum(lay.recompute_layers, 1))
    return np.where(uniform & (lay.recompute == Recompute.FULL), groups, recomputed_layers(lay, n_layers, chunks))


def kept_bytes(model: ModelSpec, training: Training, lay: Layouts, n_layers) -> np.ndarray:
    """What `n_layers` blocks of a stage keep for backward per micro-batch: each what the policy
    keeps, except the layers that full recompute skips under --recompute-layers, which keep all."""
    whole = layer_bytes(model, training, lay)[0]
    full = lay.recompute == Recompute.FULL
    policy_layers = np.where(full, recomputed_layers(lay, n_layers, lay.vpp), n_layers)
    kept = np.where(full, checkpoints(lay, n_layers, lay.vpp), policy_layers)  # one input per checkpoint
    return kept * kept_per_layer(model, training, lay) + (n_layers - policy_layers) * whole \
        - host_checkpoint_bytes(model, training, lay, n_layers)


def host_checkpoint_bytes(model: ModelSpec, training: Training, lay: Layouts, n_layers) -> np.ndarray:
    """The checkpointed layer inputs of `n_layers` blocks that wait in host memory instead
    (checkpoints_on_host), per micro-batch."""
    if not checkpoints_on_host(training):
        return 0.0 * lay.tp
    return checkpoints(lay, n_layers, lay.vpp) * layer_bytes(model, training, lay)[2]


def recompute_working_bytes(model: ModelSpec, training: Training, lay: Layouts) -> np.ndarray:
    """Recomputation in backward materialises, for one checkpoint and micro-batch at a time, what it
    dropped: the whole block under full recompute (recompute_layers blocks at once with the uniform
    method: the group's forward reruns before its backward), what selective recompute did not keep."""
    whole = layer_bytes(model, training, lay)[0]
    selective = whole - kept_per_layer(model, training, lay, Recompute.SELECTIVE + 0 * lay.recompute)
    uniform = (lay.recompute_layers > 0) & (lay.recompute_method == RecomputeMethod.UNIFORM)
    group = np.where(uniform, lay.recompute_layers, 1)
    return np.select([lay.recompute == Recompute.FULL, lay.recompute == Recompute.SELECTIVE],
                     [group * whole, np.maximum(selective, 0.0)], 0.0)


def embedding_dropout_bytes(model: ModelSpec, training: Training, lay: Layouts, stage) -> np.ndarray:
    """First stage: the embedding dropout's 1-byte mask per in-flight micro-batch (Korthikanti
    section 4.3)."""
    if not model.dropout:
        return 0.0 * lay.tp
    tokens = training.seq_len / lay.cp * lay.mbs
    sp = np.where(lay.sequence_parallel > 0, lay.tp, 1.0)
    in_flight = microbatches_in_flight(lay.pp, lay.vpp, lay.gas, lay.schedule, stage)
    return (stage == 0) * tokens * model.hidden / sp * np.ceil(in_flight)


def head_input_bytes(model: ModelSpec, training: Training, lay: Layouts, stage) -> np.ndarray:
    """Last stage: the final norm's saved tensors and the output layer's input, one micro-batch
    (Korthikanti section 4.3: the output layer's activations are kept for the micro-batch in its
    backward; a Hugging Face model's final LlamaRMSNorm keeps what its blocks' norms keep)."""
    tokens = training.seq_len / lay.cp * lay.mbs
    sp = np.where(lay.sequence_parallel > 0, lay.tp, 1.0)
    e, h = training.precision.element_bytes, model.hidden
    if training.engine.modules is Modules.HUGGING_FACE and model.architecture in ("llama", "deepseek_v3", "llama4"):
        # LlamaRMSNorm, DeepseekV3RMSNorm, Llama4TextRMSNorm: the same eager norm
        per_token = sum(x.bytes_per_token for x in hf_rms_norm_saved(e, h, "final")) + e * h
    elif training.engine.modules is Modules.HUGGING_FACE and model.architecture in ("gpt2", "gpt_neox"):
        # GPT2Model ln_f / GPTNeoXModel final_layer_norm (nn.LayerNorm) and lm_head's input (transformers 5)
        per_token = sum(x.bytes_per_token for x in hf_layer_norm_saved(e, h, "final norm")) + e * h
    else:
        per_token = 2 * e * h
    return (stage == lay.pp - 1) * tokens * per_token / sp


def logits_bytes(model: ModelSpec, training: Training, lay: Layouts, stage, bytes_per_element: float) -> np.ndarray:
    """Last stage: the vocab-parallel logits of one micro-batch, split by t, at `bytes_per_element`
    per logit (Megatron-core tensor_parallel/cross_entropy.py: 16-bit logits, their fp32 copy and
    the fp32 softmax it saves for backward: 2 + 4 + 4). An engine computing the loss over sequence
    chunks holds one chunk's logits and an fp32 gradient buffer of the hidden states (torchtitan
    components/loss.py ChunkedLossWrapper: GradAccumulator(dtype=torch.float32) of [B, L, D])."""
    tokens = training.seq_len / lay.cp * lay.mbs
    chunks = training.loss_chunks
    held = bytes_per_element * tokens / chunks * model.vocab / lay.tp
    if chunks > 1:
        held = held + 4.0 * tokens * model.hidden
    return (stage == lay.pp - 1) * held


def stage_host_activation_bytes(model: ModelSpec, training: Training, lay: Layouts, stage) -> np.ndarray:
    """Host bytes of one rank of `stage`: its checkpointed inputs in flight under cpu_checkpointing."""
    in_flight = microbatches_in_flight(lay.pp, lay.vpp, lay.gas, lay.schedule, stage)
    blocks = blocks_on_stage(model, lay, stage, training.pipeline_edge_layers)
    return sum(host_checkpoint_bytes(block, training, lay, n) for block, n in blocks) * in_flight


def stage_activation_bytes(model: ModelSpec, training: Training, lay: Layouts, stage) -> np.ndarray:
    """Activation bytes on one rank of `stage` at its backward peak: what each block keeps, times
    its blocks and the micro-batches in flight, the engine's pipeline receive buffers, plus the
    recompute working set of its largest block and the first/last-stage extras. Dense-first and
    routed blocks are each counted as what they are (--recompute-layers then applies to each kind
    apart, an approximation where a stage holds both)."""
    in_flight = microbatches_in_flight(lay.pp, lay.vpp, lay.gas, lay.schedule, stage)
    blocks = blocks_on_stage(model, lay, stage, training.pipeline_edge_layers)
    kept = sum(kept_bytes(block, training, lay, n) for block, n in blocks) * in_flight
    if training.engine.pipeline_p2p_buffers:
        kept = kept + p2p_buffers(lay.pp, lay.vpp, lay.gas, lay.schedule, stage) * boundary_bytes(model, training, lay)
    pipe = deepspeed_pipe_buffer_bytes(model, training, lay, stage)
    working = np.max([np.where(n > 0, recompute_working_bytes(block, training, lay), 0.0) for block, n in blocks], axis=0)
    return (kept + pipe["held"] + working + pipe["backward"] + embedding_dropout_bytes(model, training, lay, stage)
            + head_input_bytes(model, training, lay, stage))


def deepspeed_pipe_buffer_bytes(model: ModelSpec, training: Training, lay: Layouts, stage) -> dict:
    """What DeepSpeed's PipelineEngine (0.19.8 runtime/pipe/engine.py; the pp > 1 engine of deepspeed and
    megatron-deepspeed) keeps of the stage boundary beyond the blocks' saved tensors, one rank of
    `stage`, bytes of boundary_bytes b, m micro-batches in flight (microbatches_in_flight: TrainSchedule,
    num_pipe_buffers = min(stages - stage_id, micro_batches)). Its p2p is partitioned over the TP ranks
    where t > 1 (__init__: is_pipe_partitioned / is_grad_partitioned = is_model_parallel and the ds_config
    pipeline's pipe_partitioned / grad_partitioned, both True by default: runtime/config.py).
    'outputs': _exec_forward_pass stores each stage output with its graph in pipe_buffers['outputs']
    until _exec_backward_pass frees it, every stage but the last (whose output, the logits, logits_bytes
    counts): m b, or with t > 1 the PartitionedTensor's part, m b / t (first_output.data = torch.zeros(1)).
    'inputs': a later stage without partitioning keeps each received tensor (_exec_recv_activations:
    pipe_recv_buf.clone()) in pipe_buffers['inputs'] while the stage runs on a .clone() of it (the
    first block's input, counted with it): m b more; partitioned, part_input.full() replaces it (none).
    'persistent': pipe_recv_buf (later stages) and grad_layer (stages before the last), one b each,
    or each a b / t part. 'backward': with t > 1, a micro-batch's backward restores its output whole
    (output_tensors[buffer_id].data = part_output.full()) and its gradient (part_grad.full()): 2 b.
    'model_outputs': the last stage's _exec_backward_pass returns after backward(loss) without freeing
    pipe_buffers['outputs'][buffer_id], so the model outputs of the last 2 micro-batches (its
    num_pipe_buffers, max(2, min(1, m)); kept across steps: _reserve_pipe_buffers only extends) stay
    beside the next one's loss: min(m, 2) x the logits, vocab-parallel, fp32 under Megatron's modules
    (Megatron-DeepSpeed gpt_model.py GPTModelPipe: the float16_to_fp32 layer ends the pipe; its
    vocab_parallel_cross_entropy works in place, so the tensor held is that fp32 buffer), else 16-bit.
    'held' = outputs + inputs + persistent + model_outputs, beside the blocks; 'backward' beside the
    recompute."""
    zero = 0.0 * lay.tp
    if training.engine.buffers is not Buffers.DEEPSPEED:
        return {"outputs": zero, "inputs": zero, "persistent": zero, "model_outputs": zero, "held": zero,
                "backward": zero}
    b = boundary_bytes(model, training, lay)
    on = lay.pp > 1
    split = lay.tp > 1  # engine.py __init__: is_pipe_partitioned = is_model_parallel and pipe_partitioned (default True)
    part = np.where(split, lay.tp, 1.0)  # utils.py PartitionedTensor: numel / slice-parallel (TP) group size
    in_flight = microbatches_in_flight(lay.pp, lay.vpp, lay.gas, lay.schedule, stage)
    later, before_last = on & (stage > 0), on & (stage < lay.pp - 1)
    # engine.py _exec_forward_pass: pipe_buffers['outputs'][buffer_id] = outputs (the part where partitioned)
    outputs = np.where(before_last, in_flight * b / part, 0.0)
    # engine.py _exec_recv_activations: recvd = pipe_recv_buf.clone() kept; _exec_forward_pass runs on its .clone()
    inputs = np.where(later & ~split, in_flight * b, 0.0)
    # engine.py: pipe_recv_buf (_exec_recv_activations) and grad_layer (_exec_recv_grads), kept for the run
    persistent = (later * 1.0 + before_last * 1.0) * b / part
    # engine.py _exec_backward_pass: part_output.full() and part_grad.full() of the micro-batch in its backward
    backward = np.where(before_last & split, 2.0 * b, 0.0)
    # Megatron-DeepSpeed gpt_model.py GPTModelPipe: float16_to_fp32 last; else the 16-bit lm_head output
    logit_bytes = 4.0 if training.engine.modules is Modules.MEGATRON else training.precision.element_bytes
    logits = training.seq_len / lay.cp * lay.mbs * model.vocab / lay.tp * logit_bytes
    # engine.py _exec_backward_pass returns early on the last stage: its 2 pipe buffers keep their outputs
    model_outputs = np.where(on & (stage == lay.pp - 1), np.minimum(lay.gas, 2) * logits, 0.0)
    return {"outputs": outputs, "inputs": inputs, "persistent": persistent, "model_outputs": model_outputs,
            "held": outputs + inputs + persistent + model_outputs, "backward": backward}
