"""What llm-foundry's MPT blocks save for backward (LayerNorm without bias, GELU, FlashAttention),
and how Composer's FSDP mixed precision scales the block input."""

from __future__ import annotations

from planner.layout import Training
from planner.model import ModelSpec
from planner.modules import autocasts_fp32_params
from planner.saved.base import SP, TP, Saved
from planner.saved.hf_gpt import LAYER_NORM_STATS_BYTES_PER_TOKEN


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
