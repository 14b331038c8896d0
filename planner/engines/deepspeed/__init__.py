"""DeepSpeed's room: its record (ZeRO 0-3, offload, the 1F1B PipelineModule on Hugging Face
modules; DeepSpeed 0.19.8) and the settings Megatron-DeepSpeed shares with it (DS_COMMON)."""

from __future__ import annotations

from planner.engines.base import (Buffers, Engine, ExpertTP, GradBuckets, Launcher, Modules, SelectivePolicy)
from planner.options import Offload, Schedule

DS_COMMON = dict(
    zero_stages=(0, 1, 2, 3),
    # deepspeed/runtime/pipe/engine.py PipelineEngine.__init__: "ZeRO-2 and ZeRO-3 are incompatible
    # with pipeline parallelism"; runtime/pipe/schedule.py TrainSchedule is 1F1B (no interleaving)
    pipeline_zero_stages=(0, 1),
    pipeline_schedules=(Schedule.ONE_F_ONE_B,),
    pipeline_edge_layers=0, pipeline_edge_choice=False,
    pipeline_defers_grad_reduction=False,  # pipe/engine.py reduces after the schedule, counted as ZeRO-0/1 grads
    pipeline_p2p_buffers=False,  # pipe/schedule.py TrainSchedule.num_pipe_buffers: min(p - i, m), the in-flight ones
    # runtime/zero/offload_config.py: offload_optimizer device cpu|nvme (stages 1-3), offload_param stage 3
    offload_devices=(Offload.CPU, Offload.NVME),
    offload_together=False,
    buffers=Buffers.DEEPSPEED,
    fp32_grads=False,  # engine.py communication_data_type: bf16/fp16 gradients reduced in 16 bits
    fp16_grad_copy=False,
    fp32_full_weights=True,  # stage_1_and_2.py keeps bit16_groups_flat (fp32 here) + fp32 master partition
    sharded_param_is_master=False,  # bit16 partitions beside single_partition_of_fp32_groups
    # stage_1_and_2.py process_gradients reduces in the hook only for partition_gradients (stage 2)
    # or overlap_comm, and reduce_ready_partitions_and_remove_grads reduces a stage-1 gradient only at
    # the accumulation boundary: ZeRO-1's param.grad holds the full 16-bit gradient until then
    # (measured: 2.0 B/param after a non-boundary backward, 2/D after the boundary)
    grads_sharded_backward=(2, 3),
    grads_sharded_step=(1, 2, 3),  # averaged_gradients: the 16-bit partition at step()
    # stage_1_and_2.py: later micro-steps allocate grads_in_partition afresh while all_grad_tensors
    # holds the accumulated partition, until the epilogue adds one into the other (measured 2 x 2/D)
    accumulation_copy=(2,),
    # engine.py allreduce_gradients -> stage_1_and_2.py reduce_gradients walks the parameters in
    # order; copy_grads_in_partition allocates grads_in_partition at the rank's first parameter
    # while the later parameters still hold their full p.grad (measured at the boundary)
    reduction_copy=(1,),
    # 0.19.8 stage_1_and_2.py zero_grad(set_to_none=True) "set model fp16 grad to None by default", and
    # _release_ipg_buffers drops grads_in_partition; fp16/unfused_optimizer.py zero_grad likewise.
    # BF16_Optimizer's fp32 accumulation buffers and stage3.py's flat gradient partitions persist
    grads_freed_after_step=(0, 1, 2),
    optimizer_step_copy=False,  # ds_config "optimizer": AdamW is ops/adam/fused_adam.py FusedAdam on CUDA
    grad_buckets=GradBuckets.REDUCE_BUCKET,
    # stage_1_and_2.py average_tensor: use_multi_rank_bucket_allreduce (default true) all-reduces each
    # bucket and every rank keeps its slice; stage3.py __avg_scatter_grads: reduce_scatter_coalesced
    all_reduce_stages=(0, 1, 2),
    # engine.py allreduce_gradients: "ZeRO stage >= 2 communicates during non gradient accumulation
    # boundaries as well"; stage3.py reduce_partition_and_remove_grads has no boundary check
    reduce_every_micro_step=(2, 3),
    # zero/config.py overlap_comm_valid: None resolves to stage == 3
    overlap_default=(3,),
    overlap_flag=True,
    # runtime/utils.py all_gather_dp_groups: all_gather_into_tensor, one call per parameter group
    param_gather_per_bucket=False,
    param_gather_overlaps_forward=False,  # runtime/utils.py all_gather_dp_groups: synchronous, after the step
    # partitioned_param_coordinator.py fetch_sub_module: one coalesced all-gather per submodule
    zero3_fetch_per_block=False,
    reshards_after_backward=False,
    tp_comm_overlap=False,
    selective_policy=SelectivePolicy.CORE_ATTENTION,  # Megatron-DeepSpeed's; deepspeed.checkpointing wraps any function
    loss_chunks=1,
)

DEEPSPEED = Engine(
    name="deepspeed", summary="DeepSpeed ZeRO 0-3 + offload on Hugging Face modules; 1F1B PipelineModule (ZeRO 0/1)",
    search_ms=52,  # Engine.search_ms: a scheduling weight, measured
    tensor_parallel=False, fused_gemms=False, eager_elementwise=True, p2p_split_over_tp=False, p2p_overlaps_interleaved=False,
    modules=Modules.HUGGING_FACE, launcher=Launcher.DEEPSPEED, expert_tp=ExpertTP.SPLIT, grouped_experts=True,
    selective_recompute=False,
    partial_recompute=True, recompute_every_n=True,
    # Hugging Face MoE blocks get experts split over ranks only through AutoEP (DeepSpeed 0.19.8
    # ds_config "expert_parallel", module_inject/auto_ep.py), whose deepspeed.initialize fails with
    # transformers 5.25 (auto_ep_presets/base.py _install_instance_transformers_output_recorders:
    # _CanRecordRegistry.get() takes 2 positional arguments; run on 2 gloo ranks, Mixtral, ZeRO-1 and 3)
    expert_parallel=False, **DS_COMMON)
