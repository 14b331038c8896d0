"""DeepSpeed's buffer model (DeepSpeed 0.19.8): what its ZeRO optimizers, BF16_Optimizer and ZeRO-3's
parameter coordinator hold beside the model states at each moment of a step, each read from its
code and measured on gloo ranks where the tests say. planner/memory.py assembles them."""

from __future__ import annotations

import numpy as np

from planner.engines import Buffers
from planner.layout import Layouts, Training, among
from planner.options import Offload, Precision, Recompute

from planner.sharding import (deepspeed_grad_partition_excess, largest_module_params, largest_tensor_params,
                              oversized_tensor_params, persistent_params, rank_params, recompute_fetches)
from planner.stage import Stage



def deepspeed_bf16_optimizer(training: Training, lay: Layouts) -> np.ndarray:
    """Where DeepSpeed wraps the optimizer in BF16_Optimizer instead of ZeRO's (DeepSpeed 0.19.8
    engine.py _do_optimizer_sanity_check): bf16 with ZeRO-1, fp32 gradient accumulation and no
    offload; bf16 with ZeRO disabled under the pipeline engine (accumulating in bf16)."""
    if training.engine.buffers is not Buffers.DEEPSPEED or training.precision is not Precision.BF16:
        return np.zeros(lay.zero.shape, dtype=bool)
    fp32_acc = training.zero_config.fp32_grad_accum
    return (((lay.zero == 1) & fp32_acc & (lay.offload_optimizer == Offload.NONE))
            | ((lay.zero == 0) & (lay.pp > 1) & (not fp32_acc)))


def bf16_optimizer_grad_bytes(s: Stage) -> np.ndarray:
    """BF16_Optimizer's gradients, whole on every rank (bf16_optimizer.py __init__: fp32_groups_gradients_flat
    = zeros_like(bf16_groups_flat, dtype=grad_acc_dtype); the bf16 param.grad stays until step()'s
    clear_lp_grads). Measured on 2 gloo ranks (calibrate/engines/deepspeed_worker.py): 2 + 4 B/param with
    fp32 accumulation before step()."""
    model, training, lay, stage = s
    dense, expert = rank_params(s)
    accumulate = 4.0 if training.zero_config.fp32_grad_accum else 2.0
    return (2.0 + accumulate) * (dense + expert)


def deepspeed_fp32_accumulation(training: Training) -> bool:
    """DeepSpeed accumulating the gradients of 16-bit weights in fp32 (data_types.grad_accum_dtype
    "fp32"; engine.py get_data_types)."""
    return ((training.engine.buffers is Buffers.DEEPSPEED) & training.zero_config.fp32_grad_accum
            & (training.precision in (Precision.BF16, Precision.FP16)))


def deepspeed_compact_fp32_grads(training: Training, lay: Layouts) -> np.ndarray:
    """DeepSpeed ZeRO-1/2 accumulating in fp32 through ZeRO's own optimizer (not BF16_Optimizer: with
    the optimizer offloaded, or fp16 weights, or ZeRO-2): one fp32 buffer of exactly the partition
    that the reductions add into and step() takes as the fp32 gradient, and no grads_in_partition
    (DeepSpeed 0.19.8 stage_1_and_2.py _use_compact_grad_partition_buffer, _build_compact_grad_partition_buffer
    on the accelerator; copy_grads_in_partition returns early)."""
    return deepspeed_fp32_accumulation(training) & among(lay.zero, (1, 2)) & ~deepspeed_bf16_optimizer(training, lay)


def deepspeed_fp32_accum_offload(training: Training, lay: Layouts) -> np.ndarray:
    """deepspeed_compact_fp32_grads with the optimizer on the CPU."""
    return deepspeed_compact_fp32_grads(training, lay) & (lay.offload_optimizer == Offload.CPU)


def deepspeed_offload_staging_bytes(s: Stage) -> np.ndarray:
    """ZeRO-1/2 with the optimizer offloaded to the CPU keep a staging buffer of the largest parameter's
    elements in the 16-bit dtype, once on the GPU and once on the host, for the whole run (DeepSpeed
    0.19.8 stage_1_and_2.py __init__: temp_grad_buffer_for_gpu_offload on the accelerator and
    temp_grad_buffer_for_cpu_offload on self.device, 'cpu' under cpu_offload; measured on 2 gloo ranks,
    tests/test_deepspeed_offload_real.py). Llama 3's embedding makes it 2.1 GB a GPU at 70B."""
    model, training, lay, stage = s
    on = ((training.engine.buffers is Buffers.DEEPSPEED) & among(lay.zero, (1, 2))
          & (lay.offload_optimizer == Offload.CPU))
    largest = largest_tensor_params(s)
    return np.where(on, largest * training.precision.element_bytes, 0.0)


def deepspeed_reduce_buckets(training: Training, lay: Layouts) -> np.ndarray:
    """Reduce buckets: ZeRO-1/2 setup_buckets allocate reduce_bucket_size elements (a second one
    with overlap_comm), with contiguous_gradients or CPU offload; ZeRO-3 one, at init."""
    zc, w = training.zero_config, training.precision.element_bytes
    # stage_1_and_2.py setup_buckets: _gradient_reduction_buffer_dtype, the accumulation dtype where
    # use_grad_accum_attribute (ZeRO-1; measured fp32), else the weights' (ZeRO-2; measured bf16)
    w = np.where(deepspeed_compact_fp32_grads(training, lay) & (lay.zero == 1), 4.0, w)
    contiguous = zc.contiguous_gradients | (lay.offload_optimizer > Offload.NONE)
    stage12 = np.where(contiguous, zc.reduce_bucket_size * w * (1 + training.overlaps_grad_reduce(lay.zero)), 0.0)
    stage3 = zc.reduce_bucket_size * w * zc.contiguous_gradients
    return np.select([lay.zero == 3, lay.zero >= 1], [stage3, stage12], 0.0)


def deepspeed_straddle_bytes(s: Stage, at_step: bool) -> np.ndarray:
    """ZeRO-1/2: the parameters straddling the gradient partition's edges counted whole
    (copy_grads_in_partition sizes grads_in_partition by whole parameters), wherever the gradient
    is held as that partition: in backward for the stages sharding it there (twice where a later
    micro-step holds a second partition), at the step for the stages whose hooks copy into it."""
    model, training, lay, stage = s
    engine = training.engine
    hooks = (lay.zero == 2) | ((lay.zero == 1) & training.zero_config.contiguous_gradients)
    phase = engine.grads_sharded_step if at_step else engine.grads_sharded_backward
    held = hooks & among(lay.zero, phase) & (lay.offload_optimizer == Offload.NONE) \
        & ~deepspeed_compact_fp32_grads(training, lay)
    excess = deepspeed_grad_partition_excess(s, held) * training.precision.element_bytes
    if not at_step:  # each partition copy of a later micro-step carries its own (measured)
        excess = excess * (1 + (among(lay.zero, engine.accumulation_copy) & (lay.gas > 1)))
    return excess


def deepspeed_step_grad_copies(s: Stage) -> np.ndarray:
    """Optimizer step, ZeRO disabled: FP16_Optimizer's fp32 gradients (below); ZeRO-1/2: a flattened 16-bit copy of the gradient partition and its fp32
    copy (step(): flatten(averaged_gradients) then .to(fp32)), 2 + 20/D B/param at the peak with
    the 2/D partition (measured); ZeRO-3 the same per optimizer sub-group of min(sub_group_size,
    partition) elements: DeepSpeed 0.19.8 stage3.py _prepare_fp32_grad_for_sub_group,
    self.flatten(self.averaged_gradients[i]).to(fp32), the 16-bit flat copy alive beside its fp32
    conversion (measured on 2 gloo ranks: 6 B x the sub-group above what was live before step(),
    tests/test_deepspeed_transients_real.py; an fp32 chunk alone before)."""
    model, training, lay, stage = s
    dense, expert = rank_params(s)
    partition = (dense + expert) / lay.zero_ranks
    w = training.precision.element_bytes
    # the flat copy is in the accumulation dtype, and .to(fp32) copies only what is not fp32 already; ZeRO-1/2's
    # compact fp32 partition is taken as it is (step(): _get_preflattened_grad_partition; measured 0 B)
    accum = np.where(deepspeed_fp32_accumulation(training), 4.0, w)
    copies = accum + 4.0 * (accum != 4.0)
    stage12 = np.where(deepspeed_compact_fp32_grads(training, lay), 0.0, partition * copies)
    stage3 = np.minimum(training.zero_config.sub_group_size, partition) * copies
    # ZeRO disabled, mixed precision: FP16_Optimizer (the ds_config's AdamW is FusedAdam; DeepSpeed
    # 0.19.8 runtime/fp16/fused_optimizer.py step) builds the list of every gradient cast to fp32,
    # then _flatten_dense_tensors of it: 4 + 4 B/param at the flatten, beside the 16-bit gradients
    # (a client torch optimizer gets FP16_UnfusedOptimizer, whose fp32 copies are 4 B/param:
    # measured, tests/test_deepspeed_transients_real.py)
    mixed = training.precision in (Precision.BF16, Precision.FP16)
    stage0 = (dense + expert) * 8.0 * mixed
    held = np.select([lay.zero == 3, lay.zero >= 1], [stage3, stage12], stage0)
    return np.where(lay.offload_optimizer > Offload.NONE, 0.0, held)


def deepspeed_reduction_transient_bytes(s: Stage, flat) -> np.ndarray:
    """What a DeepSpeed gradient reduction makes beside its bucket, the bucket's `flat` copy included,
    at its largest (DeepSpeed 0.19.8; measured on 2 gloo ranks: tests/test_deepspeed_transients_real.py).
    Per element of a reduced parameter's share of the partition: ZeRO-2 accumulating in the compact
    fp32 partition casts it to fp32 to add it (stage_1_and_2.py _add_to_grad_partition_buffer:
    output.add_(source.to(output.dtype))), 4 B; ZeRO-1/2 offloading take its norm from an fp64 copy
    (set_norm_for_param_grad_in_gpu: .to(get_norm_dtype()).norm(2), zero/utils.py get_norm_dtype: double
    where the accelerator has fp64), 8 B: 8.4 GB a GPU for Llama-3-70B's embedding. A parameter larger
    than the bucket is reduced alone, without the flat copy (reduce_ipg_grads: extra_large_param_to_reduce),
    under ZeRO-2 offload from a clone of its gradient (reduce_independent_p_g_buckets_and_remove_grads,
    _offload_gradient_safety_enabled), and the partition's clones stay to the end of the backward
    (copy_grads_in_partition's offload path leaves param.grad; the epilogue's _clear_param_grad_only
    frees them): sharding.oversized_tensor_params. ZeRO-1's clones replace the whole gradient it holds. ZeRO-3
    offloading takes the norm of each gradient partition in fp64 chunks of at most 2.5e8 elements
    (stage3.py _offload_grad_partition_at_boundary -> _constant_buffered_norm2)."""
    model, training, lay, stage = s
    dense, expert = rank_params(s)
    largest = largest_tensor_params(s)
    share = np.minimum(largest, (dense + expert) / lay.zero_ranks)
    bucket = training.zero_config.reduce_bucket_size
    offloading = (lay.offload_optimizer > Offload.NONE) & (training.engine.buffers is Buffers.DEEPSPEED)
    per_element = np.maximum(np.where(deepspeed_compact_fp32_grads(training, lay) & (lay.zero == 2), 4.0, 0.0),
                             np.where(offloading, 8.0, 0.0))
    clones = np.where(offloading & (lay.zero == 2),
                      training.precision.element_bytes * oversized_tensor_params(s, bucket), 0.0)
    stage12 = clones + np.where(largest > bucket, np.maximum(flat + per_element * np.minimum(share, bucket), per_element * share),
                                flat + per_element * share)
    stage3 = np.where(offloading, 8.0 * np.minimum(2.5e8, np.ceil(largest / lay.zero_ranks)), 0.0)
    return np.select([lay.zero == 3, lay.zero >= 1], [stage3, stage12], 0.0)


def zero3_ahead_params(training: Training) -> float:
    """Gathered elements DeepSpeed holds beyond the module computing (0.19.8 partitioned_param_coordinator.py;
    counted on the real engine, tests/test_deepspeed_zero3_live.py): with prefetching
    (stage3_prefetch_bucket_size and stage3_max_live_parameters > 0) up to max_live, since the
    prefetcher gathers ahead while fewer are available and what it passed stays for its later use
    (__params_to_release: most_recent_step_id_param_fetched_for > step_id), even with
    max_reuse_distance 0; without, at the forward's end those whose backward use comes within
    stage3_max_reuse_distance after the modules run later twice (forward, then backward in
    reverse): the last distance / 2."""
    zc = training.zero_config
    prefetching = zc.stage3_prefetch_bucket_size > 0 and zc.stage3_max_live_parameters > 0
    return max(zc.stage3_max_live_parameters * prefetching, zc.stage3_max_reuse_distance / 2)


def zero3_kept_params(s: Stage) -> tuple:
    """(kept, rank): of the `rank` elements a rank of `stage` gathers under ZeRO-3, those DeepSpeed
    keeps gathered from the forward into the backward (zero3_ahead_params; the whole local model with
    the 1e9 defaults, measured: backward gathers nothing)."""
    model, training, lay, stage = s
    dense, expert = rank_params(s)
    rank = dense + expert
    return np.minimum(rank, zero3_ahead_params(training)), rank


def zero3_live_param_bytes(s: Stage) -> np.ndarray:
    """ZeRO-3 gathered 16-bit parameters alive at once (DeepSpeed 0.19.8 partitioned_param_coordinator.py;
    counted after every fetch on 2 gloo ranks: calibrate/engines/deepspeed_zero3_worker.py,
    tests/test_deepspeed_zero3_live.py), capped at the rank's whole model, plus the persistent
    small parameters (parameter_offload.py): the submodule computing (fetch_sub_module gathers one
    module's own tensors; the largest module's, an embedding or output layer maybe) and what is
    held ahead of it (zero3_ahead_params); or, while a checkpoint recomputes a block in its backward,
    the block's modules the reuse distance keeps beside its last one and the one recomputing
    (sharding.recompute_fetches; with a prefetcher the recomputed module is within what it holds:
    measured)."""
    model, training, lay, stage = s
    zc, w = training.zero_config, training.precision.element_bytes
    dense, expert = rank_params(s)
    single = largest_module_params(model, training, lay)
    recomputing = recompute_fetches(model, training, lay)["working"] * (lay.recompute == Recompute.FULL)
    working = np.minimum(dense + expert, np.maximum(recomputing, single + zero3_ahead_params(training)))
    persistent = persistent_params(model, training, lay, zc.stage3_param_persistence_threshold, stage)
    return np.where(lay.zero == 3, (working + persistent) * w, 0.0)
