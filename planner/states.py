"""Model states per GPU rank: the weights, gradients and optimizer states each engine keeps on the
GPU at a stage, and what offloading keeps in host memory. planner/memory.py assembles them."""

from __future__ import annotations

import numpy as np

from planner.engines import Buffers
from planner.layout import Layouts, Training, among
from planner.options import Offload, Optimizer, Precision
from planner.sharding import (deepspeed_grad_partition_excess, optimizer_bytes_per_param, rank_params, state_bytes,
                              aio_aligned, zero3_swap_elements)
from planner.engines.deepspeed.memory import (bf16_optimizer_grad_bytes, deepspeed_bf16_optimizer,
                                              deepspeed_compact_fp32_grads, deepspeed_fp32_accum_offload,
                                              deepspeed_fp32_accumulation, deepspeed_offload_staging_bytes)
from planner.held import deferred_reduction, sharded_bytes
from planner.stage import Stage


def weight_bytes(s: Stage) -> np.ndarray:
    """16/32-bit weights on the GPU: sharded by ZeRO-3 (unless a pipeline keeps them gathered),
    none when ZeRO-3 offloads them."""
    model, training, lay, stage = s
    dense, expert = rank_params(s)
    sharded = (lay.zero >= 3) & ~deferred_reduction(training, lay)
    held = sharded_bytes(state_bytes(training).weights, sharded, dense, expert, training, lay)
    # FSDP2 (_fsdp_param.py FSDPParam): the fp32 shard is the master, counted with the optimizer
    master_only = sharded & training.engine.sharded_param_is_master & training.precision.has_master_copy
    return np.where((lay.offload_params > Offload.NONE) | master_only, 0.0, held)


def grad_bytes(s: Stage, at_step: bool = False) -> np.ndarray:
    """Gradients on the GPU while backward runs (or, `at_step`, at the optimizer step): sharded
    over the ZeRO ranks for the stages the engine shards them in that phase, whole otherwise
    (DeepSpeed ZeRO-1 holds the full 16-bit gradient until the accumulation boundary); a second
    partition where the engine keeps one per micro-batch beside the accumulated one. ZeRO-Offload
    moves sharded gradients to the host as fp32."""
    model, training, lay, stage = s
    engine = training.engine
    dense, expert = rank_params(s)
    sharded = among(lay.zero, engine.grads_sharded_step if at_step else engine.grads_sharded_backward)
    if not at_step:
        sharded = sharded & ~deferred_reduction(training, lay)
    # DeepSpeed ZeRO-3 keeps its gradient partitions in the accumulation dtype (0.19.8 stage3.py
    # grad_partitions_flat_buffer, dtype=gradient_accumulation_dtype; measured fp32: tests/test_deepspeed_offload_real.py)
    grad_w = np.where(deepspeed_fp32_accumulation(training) & (lay.zero == 3), 4.0, state_bytes(training).grads)
    held = sharded_bytes(grad_w, sharded, dense, expert, training, lay)
    if not at_step:
        held = held * (1 + (among(lay.zero, engine.accumulation_copy) & (lay.gas > 1)))
    held = np.where((lay.offload_optimizer > Offload.NONE) & sharded, 0.0, held)
    # ZeRO-1/2 accumulating in fp32 keep fp32 gradients on the GPU, offloading or not (DeepSpeed 0.19.8
    # stage_1_and_2.py): ZeRO-1 each parameter's whole grad_accum (use_grad_accum_attribute) across the
    # micro-batches, ZeRO-2 the partition (deepspeed_compact_fp32_grads) until the step (measured:
    # tests/test_deepspeed_offload_real.py)
    whole = (lay.zero == 1) & ~np.asarray(at_step)
    held = np.where(deepspeed_compact_fp32_grads(training, lay), sharded_bytes(4.0, ~whole, dense, expert, training, lay), held)
    return np.where(deepspeed_bf16_optimizer(training, lay), bf16_optimizer_grad_bytes(s), held)


def grads_freed(training: Training, lay: Layouts) -> np.ndarray:
    """Whether a step's backward starts with no gradient: one micro-batch a step, under an engine
    whose step frees them (Engine.grads_freed_after_step; DeepSpeed's BF16_Optimizer keeps its fp32
    accumulation buffers). From the second micro-batch on, the accumulated gradients are held."""
    freed = among(lay.zero, training.engine.grads_freed_after_step) & ~deepspeed_bf16_optimizer(training, lay)
    return freed & (lay.gas == 1)


def optimizer_step_copy_bytes(s: Stage) -> np.ndarray:
    """The temporary torch's foreach AdamW allocates in its step: sqrt of every second moment the rank
    holds, at once (torch 2.13 optim/adam.py _multi_tensor_adam: torch._foreach_sqrt(device_exp_avg_sqs);
    the moment is half of Adam's two states). None where the step runs on the host or is fused."""
    model, training, lay, stage = s
    if not (training.engine.optimizer_step_copy and training.optimizer is Optimizer.ADAMW):
        return 0.0 * lay.tp
    dense, expert = rank_params(s)
    held = sharded_bytes(state_bytes(training).moment, lay.zero >= 1, dense, expert, training, lay)
    return np.where(lay.offload_optimizer > Offload.NONE, 0.0, held)


def _optimizer_partition_bytes(s: Stage):
    model, training, lay, stage = s
    dense, expert = rank_params(s)
    per_param = optimizer_bytes_per_param(model, training)
    if training.precision is Precision.FP32 and training.engine.fp32_full_weights:
        per_param = per_param + np.where(lay.zero >= 1, 4.0, 0.0)  # ZeRO-1/2 keep a separate fp32 master partition
    # BF16_Optimizer partitions its fp32 master and states over the data-parallel ranks, ZeRO or not
    return sharded_bytes(per_param, (lay.zero >= 1) | deepspeed_bf16_optimizer(training, lay), dense, expert, training, lay)


def optimizer_bytes(s: Stage) -> np.ndarray:
    """Optimizer states and fp32 master weights on the GPU, sharded by ZeRO-1 and above; with them
    offloaded, what the offloading optimizer keeps on the GPU (deepspeed_offload_staging_bytes), and
    the share megatron-core's HybridDeviceOptimizer leaves there (Training.optimizer_offload_fraction:
    hybrid_optimizer.py _get_sub_optimizer_param_groups steps the rest on the GPU, from an fp32 clone
    of each 16-bit shard with the GPU optimizer's states, as the distributed optimizer would)."""
    model, training, lay, stage = s
    partition = _optimizer_partition_bytes(s)
    kept = (1.0 - training.optimizer_offload_fraction) * partition
    return np.where(lay.offload_optimizer > Offload.NONE,
                    deepspeed_offload_staging_bytes(s) + kept, partition)


def host_bytes(s: Stage) -> np.ndarray:
    """Host memory of one rank: ZeRO-Offload (Ren et al. 2021 section 4) keeps fp32 master, states
    and fp32 gradients on the CPU, ZeRO-3 parameter offload the 16-bit partition; NVMe
    (ZeRO-Infinity) keeps its swap buffers in host memory (below). DeepSpeed 0.19.8 keeps more there
    (measured on 2 gloo ranks, tests/test_deepspeed_offload_real.py): ZeRO-1/2 a 16-bit copy of the
    partition (stage_1_and_2.py param_buffer_of_bit16_for_cpu_offload_groups), the host staging
    buffer (deepspeed_offload_staging_bytes) and, ZeRO-2 accumulating, every parameter overlapping
    the partition whole in 16 bits (async_accumulate_grad_in_cpu_via_gpu: accumulated_grads_in_cpu,
    never freed; not with fp32 accumulation, deepspeed_fp32_accum_offload); ZeRO-3 its gradient
    partitions in the accumulation dtype (stage3.py grad_partitions_flat_buffer on self.device,
    'cpu' under offload_optimizer)."""
    model, training, lay, stage = s
    dense, expert = rank_params(s)
    w = training.precision.element_bytes
    optimizer = _optimizer_partition_bytes(s) + sharded_bytes(4.0, True, dense, expert, training, lay)
    deepspeed = training.engine.buffers is Buffers.DEEPSPEED
    zero12 = deepspeed & among(lay.zero, (1, 2))
    accumulated = (lay.zero == 2) & (lay.gas > 1) & zero12 & ~deepspeed_fp32_accum_offload(training, lay)
    excess = deepspeed_grad_partition_excess(s, accumulated)
    optimizer = optimizer + np.where(zero12, sharded_bytes(w, True, dense, expert, training, lay), 0.0) \
        + deepspeed_offload_staging_bytes(s) \
        + np.where(accumulated, sharded_bytes(w, True, dense, expert, training, lay) + w * excess, 0.0)
    grad_accum = 4.0 if training.zero_config.fp32_grad_accum else w
    optimizer = optimizer + np.where(deepspeed & (lay.zero == 3), sharded_bytes(grad_accum, True, dense, expert, training, lay), 0.0)
    # ZeRO-3 offloading to NVMe (DeepSpeed 0.19.8, measured on 2 gloo ranks through its aio op:
    # calibrate/engines/deepspeed_nvme.py) keeps on the host its gradient partitions (self.device is the CPU
    # for either device), page-locked swap buffers and what is too small to swap
    # (sharding.zero3_swap_elements): swap_tensor/optimizer_utils.py OptimizerSwapper.__init__'s
    # offload_optimizer.buffer_count (4) fp32 buffers of the largest sub-group's partition, and the
    # fp32 master, states and gradient of sub-groups under 1 MiB; partitioned_param_swapper.py
    # AsyncPartitionedParameterSwapper.buffers, offload_param.buffer_count (5) x buffer_size (1e8)
    # 16-bit elements, stage3.py _create_param_groups_fp16_flat_cpu_memory's first
    # offload_param.max_in_cpu (1e9) elements of the partition, used or not, and where the partition
    # spills past them, the reuse buffer of the largest sub-group's full parameters (layout.ZeroConfig)
    zc = training.zero_config
    partition = (dense + expert) / lay.zero_ranks
    zero3 = deepspeed & (lay.zero == 3)
    on_nvme = zero3 & ((lay.offload_optimizer == Offload.NVME) | (lay.offload_params == Offload.NVME))
    swap = zero3_swap_elements(s, on_nvme)
    nvme_optimizer = sharded_bytes(grad_accum, True, dense, expert, training, lay) \
        + zc.nvme_optimizer_buffer_count * aio_aligned(swap["largest"], 4) * 4.0 \
        + swap["unswapped"] * (state_bytes(training).optimizer + 4.0)
    nvme_params = (zc.nvme_param_buffer_count * aio_aligned(zc.nvme_param_buffer_size, w)
                   + np.minimum(zc.nvme_params_in_cpu, partition) + swap["reuse"]) * w
    nvme = np.where(zero3 & (lay.offload_optimizer == Offload.NVME), nvme_optimizer, 0.0) \
        + np.where(zero3 & (lay.offload_params == Offload.NVME), nvme_params, 0.0)
    params = sharded_bytes(state_bytes(training).weights, lay.zero >= 3, dense, expert, training, lay)
    # FSDP2 keeps no 16-bit shard: the fp32 shard, with the optimizer, is the parameter (torch 2.13
    # _fsdp_param.py _init_sharded_param moves it to the CPU under CPUOffloadPolicy; measured 16 B a
    # parameter of the shard there, calibrate/engines/fsdp_worker.py)
    master_only = training.engine.sharded_param_is_master & training.precision.has_master_copy
    params = np.where(master_only, 0.0, params)
    # megatron-core's HybridDeviceOptimizer keeps its offloaded share's fp32 master, states and pinned
    # fp32 gradient there (Training.optimizer_offload_fraction; 1.0 for the others)
    optimizer = training.optimizer_offload_fraction * optimizer
    return (np.where(lay.offload_optimizer == Offload.CPU, optimizer, 0.0)
            + np.where(lay.offload_params == Offload.CPU, params, 0.0) + nvme)


