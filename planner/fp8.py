"""FP8 GEMMs: what a job's FP8 linear layers change against the same job in bf16.

Only the transformer blocks' linear layers run FP8: Megatron keeps its output layer a bf16
ColumnParallelLinear (megatron-core d98e8a6 models/gpt/gpt_model.py, unless --fp8-output-proj with
mxfp8), torchtitan's configs filter it (`filter_fqns` 'output' / 'lm_head'), and FP8 attention is
off by default everywhere (TE 2.18 common/recipe/__init__.py fp8_dpa False; transformer_config.py
fp8_dot_product_attention False). Weights, gradients, optimizer states and the non-GEMM kernels stay
in the training precision. What changes, by library (Engine.fp8_library):
- the GEMMs run at the FP8 peak with an efficiency of their own (compute.block_gemm_rate);
- each GEMM operand is quantized first, memory-bound kernels (cast_s);
- Transformer Engine saves its GEMM inputs for backward as FP8, not bf16 (saved_input_scale);
  under Megatron it keeps each weight's FP8 copies across micro-batches (weight_cache_bytes) unless
  the parameters themselves are FP8 (--fp8-param-gather, whose all-gather moves 1 B a parameter);
- torchao's Float8Linear saves the bf16 input and weight and casts them again in backward (ao
  v0.18.0 torchao/float8/float8_linear.py matmul_with_hp_or_float8_args.forward:
  ctx.save_for_backward(input_hp, weight_hp_t)): its activations and weights stay as in bf16.
Amax histories and scales are a few KiB per GEMM and left out.
"""

from __future__ import annotations

import numpy as np

from planner.errors import InputError
from planner.layout import Layouts, Training
from planner.model import ModelSpec
from planner.options import Fp8Recipe
from planner.pipeline import blocks_on_stage
from planner.sharding import _block_params
from planner.stage import Stage

TE, TORCHAO = "transformer_engine", "torchao"

MXFP8_SCALE_BYTES = 1.0 / 32.0
"""An E8M0 scale byte per 32 elements (TE 2.18 pytorch/tensor/mxfp8_tensor.py get_scale_shape)."""

# HBM bytes a quantize kernel moves per element it casts: read bf16 (2), write each FP8 copy (1).
# Transformer Engine on Hopper writes the row-wise copy and its transpose in one kernel (TE 2.18
# tensor/storage/float8_tensor_storage.py: `_transpose`); current scaling (tensorwise) reads the
# input once more for its amax first (module/linear.py: amax kernel, then cast); delayed scaling takes
# the amax in the cast itself. torchao's dynamic casts read for the amax and again for the cast.
TE_CAST_BYTES = 2.0 + 2.0
AMAX_PASS_BYTES = 2.0
TORCHAO_CAST_BYTES = 2.0 + 2.0 + 1.0


def check_gpu(gpu, recipe: Fp8Recipe) -> None:
    """FP8 needs FP8 tensor cores (a catalog fp8 peak: Ada, Hopper, Blackwell, MI300); MXFP8's
    block scales need Blackwell's (compute capability 10.0 on: Megatron-LM's fp8_recipe 'mxfp8' is
    'for Blackwell architecture only', transformer_config.py)."""
    if not gpu.peak_flops_per_s.get("fp8"):
        raise InputError(f"--precision fp8: {gpu.name} has no FP8 tensor cores (bf16 or fp16 on it)")
    if recipe is Fp8Recipe.MXFP8 and gpu.compute_capability < 10.0:
        raise InputError(f"--fp8-recipe mxfp8: needs Blackwell (b200, gb200, gb300); {gpu.name} takes "
                         "delayed, tensorwise or rowwise")


def library(training: Training) -> str:
    """Whose FP8 layers run ('' without an FP8 recipe)."""
    return training.engine.fp8_library if training.fp8_recipe is not None else ""


def copy_bytes(training: Training) -> float:
    """Bytes of one FP8 copy per element: 1, and MXFP8's block scales."""
    return 1.0 + (MXFP8_SCALE_BYTES if training.fp8_recipe is Fp8Recipe.MXFP8 else 0.0)


def tp_gather_scale(training: Training) -> float:
    """What a sequence-parallel TP all-gather of a block linear layer's input (forward, and again for
    the wgrad in backward) or output gradient (backward) moves per 16-bit byte. Transformer Engine
    quantizes before it gathers (TE d0067d0 pytorch/distributed.py gather_along_first_dim:
    _all_gather_fp8 for delayed and current scaling, _all_gather_mxfp8 with its block scales, given
    the input or grad_output quantizer by module/layernorm_linear.py and linear.py; its userbuffers
    gather into FP8 buffers likewise): 1 B an element. The reduce-scatters of outputs and input
    gradients stay 16-bit. torchtitan 0.3.0's TP plans gather bf16 (no Float8ColwiseParallel)."""
    if library(training) != TE:
        return 1.0
    return copy_bytes(training) / training.precision.element_bytes


def saved_input_scale(training: Training, shared: bool) -> float:
    """What a block linear layer's saved input costs over its 16-bit bytes. Transformer Engine keeps
    the FP8 copy backward's wgrad reads, its row-wise data dropped after the forward GEMM (TE 2.18
    pytorch/module/linear.py _linear_forward_impl: update_usage(rowwise_usage=False), saved_inputmat;
    layernorm_linear.py _LayerNormLinear.forward likewise for ln_out), not the bf16 input: 1 B an
    element. `shared`: another op keeps the same 16-bit tensor (attention's output, which FlashAttention
    saves and the output projection reads): the FP8 copy comes on top of it. torchao: unchanged."""
    if library(training) != TE:
        return 1.0
    fp8 = copy_bytes(training) / training.precision.element_bytes
    return 1.0 + fp8 if shared else fp8


def param_gather(training: Training, lay: Layouts) -> np.ndarray:
    """Whether the parameters are FP8 themselves, all-gathered as such (1 B a parameter) after the
    step: Megatron's --fp8-param-gather (Training.fp8_param_gather), which needs the distributed
    optimizer (Megatron-LM d98e8a6 training/arguments.py: 'only supported with distributed
    optimizer'); the DDP buffer of such parameters is uint8 (core/distributed/param_and_grad_buffer.py
    group_params_for_buffers). torchao's FSDP2 gathers are gathered_share's."""
    return np.asarray(bool(training.fp8_param_gather) & (library(training) == TE) & (lay.zero >= 1))


def gathered_share(model: ModelSpec, training: Training) -> float:
    """Share of the parameters FSDP2 all-gathers in FP8 under torchao's float8 all-gather
    (torchtitan 0.2.2 [float8] enable_fsdp_float8_all_gather, tensorwise only: torchao v0.18
    torchao/float8/fsdp_utils.py WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather casts the
    shard to e4m3, 1 B an element, and the unsharded weight stays FP8): the block linears torchao
    converts; the embedding, norms, lm_head (filtered), router and grouped experts gather 16-bit."""
    if not (training.fp8_param_gather and library(training) == TORCHAO):
        return 0.0
    converted = 0.0
    for block, n in ((model, model.moe_layers), (model.dense_block, model.layers - model.moe_layers)):
        converted += n * sum(g.flops_per_token / 2.0 for g in block.gemms(fused=False)
                             if g.tp_split and not g.expert)
    return converted / model.params


def weight_cache_bytes(s: Stage) -> np.ndarray:
    """The FP8 weight and its transpose Transformer Engine keeps for each block linear across the
    micro-batches and steps where the engine passes is_first_microbatch (megatron-core d98e8a6
    extensions/transformer_engine.py TELinear.forward; TE 2.18 module/linear.py Linear.forward:
    cache_name 'weight', self._fp8_workspaces), beside the bf16 parameter: 2 B a parameter on Hopper.
    None where the parameters are FP8 themselves (param_gather: TE's quantize_weight returns the
    parameter, no workspace), nor under FSDP2 (linear.py: no workspace cached with is_fsdp2) or torchao."""
    model, training, lay, stage = s
    if library(training) != TE or not training.engine.fp8_weight_cache:
        return 0.0 * lay.tp
    params = 0.0
    for block, n in blocks_on_stage(model, lay, stage, training.pipeline_edge_layers):
        params = params + n * sum(_block_params(block, training, lay))
    return np.where(param_gather(training, lay), 0.0, 2.0 * copy_bytes(training) * params)


def cast_s(model: ModelSpec, training: Training, lay: Layouts, routed, hbm_bytes_per_s: float) -> tuple:
    """(forward, backward) seconds of one block's FP8 quantize kernels for one micro-batch on one
    rank, at HBM rate. Per linear layer: its input in the forward (none where Transformer Engine's
    LayerNormLinear writes FP8 from the norm kernel itself under delayed scaling, TE 2.18
    csrc/extensions/normalization.cpp FULLY_FUSED; an amax pass and a cast under current scaling) and
    its output gradient in the backward. torchao casts the input and the weight in the forward, both
    again and the output gradient in the backward (rowwise: the gradient along both axes), every
    micro-batch; Transformer Engine's weights are cast once a step where cached (Megatron) and in
    each pass under FSDP2 (no workspace kept)."""
    lib = library(training)
    if not lib:
        return 0.0, 0.0
    T, t = lay.mbs * training.seq_len / lay.cp, lay.tp.astype(np.float64)
    h, w = model.hidden, model.mlp_width(routed)
    rows = routed if model.experts > 1 else 1.0  # tokens' rows through the routed experts
    gated = 2.0 if model.ffn_kind == "swiglu" else 1.0
    # (input width, output width, whether a norm feeds it) of qkv, proj, fc1, fc2 per token, TP-split
    gemms = ((h, (model.q_width + 2 * model.kv_width) / t, True), (model.attention_out_width / t, h, False),
             (h * rows, gated * w / t, True), (w / t, h * rows, False))
    params = sum(_block_params(model, training, lay))  # this block kind's TP shard and local experts
    if lib == TE:
        amax = AMAX_PASS_BYTES if training.fp8_recipe is not Fp8Recipe.DELAYED else 0.0
        fused = training.engine.fused_gemms  # Megatron's TE LayerNormLinear; te.Linear elsewhere
        fwd = sum((0.0 if norm and fused and not amax else TE_CAST_BYTES + amax) * n_in for n_in, _, norm in gemms)
        bwd = sum((TE_CAST_BYTES + amax) * n_out for _, n_out, _ in gemms)
        weights = 0.0 if training.engine.fp8_weight_cache else TE_CAST_BYTES * params
        return (T * fwd + weights) / hbm_bytes_per_s, (T * bwd + weights) / hbm_bytes_per_s
    grad_axes = 2.0 if training.fp8_recipe is Fp8Recipe.ROWWISE else 1.0
    fwd = sum(TORCHAO_CAST_BYTES * n_in for n_in, _, _ in gemms)
    bwd = sum(TORCHAO_CAST_BYTES * (n_in + grad_axes * n_out) for n_in, n_out, _ in gemms)
    weights = TORCHAO_CAST_BYTES * params
    return (T * fwd + weights) / hbm_bytes_per_s, (T * bwd + weights) / hbm_bytes_per_s
