"""Per-step seconds of the optimizer: its step on the GPU or the host (CPU Adam) and ZeRO-Offload's
copies between them. planner/timing.py adds them to the step."""

from __future__ import annotations

import numpy as np

from planner import compute as C
from planner.engines import Buffers
from planner.engines.deepspeed.memory import deepspeed_bf16_optimizer, deepspeed_fp32_accum_offload
from planner.options import Offload, Optimizer
from planner.sharding import state_bytes
from planner.dp_comm import partition_params, rank_tensors
from planner.engines.deepspeed.timing import deepspeed_step_s
from planner.stage import Step


def gpu_optimizer_step_s(ctx: Step) -> np.ndarray:
    """Optimizer step on the GPU, memory-bound (Megatron-LM MixedPrecisionOptimizer.step; DeepSpeed's
    other optimizer wrappers alike, its ZeRO-1/2 step is deepspeed_step_s): unscale + inf check (r+w
    grads), grad norm (r), FusedAdam (r grads, r+w master and states), copy to 16-bit params (w),
    zero the grad buffer (w): 5g + 2o + w bytes per partition parameter. torch's foreach AdamW
    (Engine.optimizer_step_copy; torch 2.13 optim/adam.py _multi_tensor_adam, decoupled weight
    decay): mul_ params, lerp_ exp_avg with the gradient, mul_ and addcmul_ exp_avg_sq (the gradient
    read twice), sqrt into a temporary, div_, add_ eps, addcdiv_ params: 18 state-element and 3
    gradient reads or writes per parameter (84 B in fp32), where a fused Adam moves 28. Over DTensor
    parameters (Buffers.FSDP: fully_shard makes every parameter one) the host spends
    dtensor_step_host_s_per_tensor a tensor in DTensor's dispatch, foreach or fused alike (measured,
    calibrate's dtensor_step bench), and the step takes the longer of that and its kernels."""
    model, cluster, training, lay, c = ctx
    b = state_bytes(training)
    foreach = training.engine.optimizer_step_copy and training.optimizer is Optimizer.ADAMW
    per_param = 18 * b.moment + 3 * b.grads if foreach else 5 * b.grads + 2 * b.optimizer + b.weights
    kernels = partition_params(model, training, lay) * per_param / C.hbm_bytes_per_s(cluster, c)
    if training.engine.buffers is not Buffers.FSDP:
        return kernels
    return np.maximum(kernels, rank_tensors(model, training, lay, per_expert=False)[1]
                      * c["dtensor_step_host_s_per_tensor"])


def cpu_adam_s(ctx: Step) -> np.ndarray:
    """The offloaded optimizer step on the node's cores, shared by the node's GPUs: ZeRO-Offload's
    DeepSpeedCPUAdam (Ren et al. 2021 sections 4-5), or torch's fused AdamW (torchtitan), one pass
    over the states; an engine whose optimizer is torch's AdamW with its defaults
    (Engine.optimizer_step_copy: foreach on CUDA; FSDP2's CPUOffloadPolicy steps it on CPU
    DTensors) runs the single-tensor loop there (torch 2.13 optim/optimizer.py
    _default_to_fused_or_foreach: foreach only on cuda/xpu/mtia), a pass per operator."""
    # the cores are one host's: a DGX node's, or an NVL72 compute tray's (Cluster.gpus_per_host)
    model, cluster, training, lay, c = ctx
    rate = c["cpu_adam_unfused_params_per_s" if training.engine.optimizer_step_copy else "cpu_adam_params_per_s"]
    return partition_params(model, training, lay) * cluster.gpus_per_host / rate


def optimizer_s(ctx: Step) -> np.ndarray:
    """The update: CPU Adam under optimizer offload, else DeepSpeed's ZeRO or BF16_Optimizer step
    (deepspeed_step_s) where it runs, else the GPU step. megatron-core's HybridDeviceOptimizer with
    part of the optimizer offloaded (Training.optimizer_offload_fraction) launches the GPU share's
    step before the host steps its own (hybrid_optimizer.py step), so the two run side by side."""
    model, cluster, training, lay, c = ctx
    gpu = gpu_optimizer_step_s(ctx)
    if training.engine.deepspeed:
        counted = (lay.zero >= 1) | deepspeed_bf16_optimizer(training, lay)
        gpu = np.where(counted, deepspeed_step_s(ctx), gpu)
    share = training.optimizer_offload_fraction
    offloaded = np.maximum(share * cpu_adam_s(ctx), (1.0 - share) * gpu)
    return np.where(lay.offload_optimizer > Offload.NONE, offloaded, gpu)


def offload_s(ctx: Step) -> np.ndarray:
    """Host traffic of ZeRO-Offload and ZeRO-Infinity over PCIe (and NVMe).

    Gradients go down as fp32 (stage_1_and_2.py async_inplace_copy_grad_to_fp32_buffer_from_gpu
    upcasts before the copy), overlapped with backward like the bucketed reduce (Ren et al. 2021
    section 5.1) where the reduction overlaps (overlap_comm: reduce_ipg_grads copies on the
    reduction stream; without it on the current stream, "copy_grad_stream is disabled", so the
    copies wait in the compute stream: all exposed); with accumulation ZeRO-2 round-trips 16-bit
    grads through the CPU each micro-step (async_accumulate_grad_in_cpu_via_gpu; ZeRO-1 keeps them
    on the GPU until the boundary, and fp32 accumulation keeps ZeRO-2's partition there: measured,
    states.host_bytes); ZeRO-3 offloads each micro-step's partition; updated 16-bit params come back up, not overlapped. NVMe (Rajbhandari et al. 2021
    section 6): states and the fp32 gradient read and written per step, in turn with the CPU step
    (DeepSpeed's default swapper; its pipelined one is not modelled). ZeRO-3 parameter
    offload: the partition goes up before each gather (forward, backward), prefetched like the
    gathers; a GPU optimizer's updated partition goes back down once. megatron-core's optimizer
    offload (Engine.offload_hybrid_optimizer) moves 4 B down and 4 B up a parameter of the
    partition, none of it under backward."""
    model, cluster, training, lay, c = ctx
    gpu = cluster.gpu
    b = state_bytes(training)
    partition, m = partition_params(model, training, lay), lay.gas.astype(np.float64)
    pcie = gpu.pcie_bytes_per_s
    offload_opt = lay.offload_optimizer > Offload.NONE
    round_trip = (lay.zero == 2) & (m > 1) & ~deepspeed_fp32_accum_offload(training, lay)
    grads_down = np.where(lay.zero == 3, m * partition * 4.0,
                          partition * 4.0 + round_trip * (2 * m - 1) * partition * b.weights)
    hidden = np.where(training.overlaps_grad_reduce(lay.zero), c["dp_overlap_fraction_with_overlap"], 0.0)
    up_bytes = b.weights
    if training.engine.offload_hybrid_optimizer:
        # megatron-core's HybridDeviceOptimizer: the fp32 gradient shard goes down inside step(), after
        # backward, and the fp32 master comes back up, cast to 16 bits on the GPU (copy_(non_blocking=True)),
        # for the offloaded share of the partition
        hidden, up_bytes = 0.0, 4.0
    traffic = np.where(offload_opt, training.optimizer_offload_fraction
                       * ((1 - hidden) * grads_down / pcie + partition * up_bytes / pcie), 0.0)
    nvme_bw = cluster.nvme_bytes_per_s_per_host / cluster.gpus_per_host
    # ZeRO-Infinity (DeepSpeed 0.19.8 stage3.py step, _swap_out_offload_fp32_gradients): the fp32
    # gradient partition is written at the accumulation boundary; each sub-group then reads its fp32
    # master, states and gradient, steps and writes master and states back. The default
    # PartitionedOptimizerSwapper (offload_optimizer.pipeline_read/pipeline_write false; the exported
    # config) waits on each transfer (aio_handle.wait()), so none of it overlaps the CPU step
    nvme_io = partition * (2.0 * b.optimizer + 2.0 * 4.0) / nvme_bw
    traffic = traffic + np.where(lay.offload_optimizer == Offload.NVME, nvme_io, 0.0)
    param_up = partition * b.weights / pcie + np.where(lay.offload_params == Offload.NVME,
                                                       partition * b.weights / nvme_bw, 0.0)
    return traffic + np.where(lay.offload_params > Offload.NONE,
                              2.0 * m * param_up * (1 - c["zero3_gather_overlap_fraction"])
                              + (~offload_opt) * partition * b.weights / pcie, 0.0)


