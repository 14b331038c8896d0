"""Bytes a rank holds of a per-parameter state: whole, or sharded over the ZeRO ranks (expert states
over the expert-data-parallel ones); what a sharded parameter's all-gather moves; and where a
pipeline keeps parameters gathered and gradients unsharded across its micro-batches. The engine-
agnostic pieces planner/memory.py and the engines' buffer models (planner/engines/*/memory.py) share."""

from __future__ import annotations

import numpy as np

from planner import fp8
from planner.layout import Layouts, Training
from planner.model import ModelSpec

from planner.modules import autocasts_fp32_params
from planner.sharding import expert_dp, state_bytes


def sharded_bytes(bytes_per_param, on, dense, expert, training: Training, lay: Layouts):
    """Bytes of a state held whole, or sharded over the ZeRO ranks where `on` (expert states over
    the expert-data-parallel ranks, planner/sharding.py expert_dp)."""
    shard_expert = expert_dp(training, lay)
    return bytes_per_param * (np.where(on, dense / lay.zero_ranks, dense) + np.where(on, expert / shard_expert, expert))


def deferred_reduction(training: Training, lay: Layouts) -> np.ndarray:
    """Pipelines that keep parameters gathered and gradients unsharded across the micro-batches
    (planner/engines/base.py pipeline_defers_grad_reduction)."""
    return (lay.pp > 1) & training.engine.pipeline_defers_grad_reduction


def gathered_param_bytes(model: ModelSpec, training: Training, fp8_gather: bool = True) -> float:
    """Bytes per element a sharded parameter's all-gather moves: its 16-bit copy, except llm-foundry's
    MPT under Composer's FSDP with mixed precision, which gathers the fp32 parameters themselves and
    lets autocast cast them for each GEMM (composer/distributed/mosaic_parallelism.py
    get_mixed_precision 'DEFAULT': MixedPrecision(param_dtype=torch.float32, reduce_dtype=<16-bit>,
    buffer_dtype=torch.float32), the benchmarks' MP mode; the same reading as activations.
    llm_foundry_block_input_scale); the unsharded units hold them (fsdp_unsharded_unit_bytes). With
    `fp8_gather`, torchao's float8 all-gather moves the converted linears at 1 B (fp8.gathered_share)."""
    b = state_bytes(training)
    if autocasts_fp32_params(model, training):
        return 4.0
    share = fp8.gathered_share(model, training) if fp8_gather else 0.0
    return b.weights * (1.0 - share) + 1.0 * share
