"""Megatron's room: Megatron-LM / Megatron-Core's record (TP/SP/CP/PP with interleaving, the
distributed optimizer; Megatron-Core 0.16.1, Megatron-LM d98e8a6), Megatron-DeepSpeed's (Megatron's
model code over DeepSpeed's ZeRO and pipeline, DeepSpeed 0.19.8) and its 2021 release's."""

from __future__ import annotations

from dataclasses import replace

from planner.engines.base import (Buffers, Engine, ExpertTP, GradBuckets, Launcher, Modules, MoeCapacity, MoeCounts,
                                  SelectivePolicy)
from planner.engines.deepspeed import DS_COMMON
from planner.options import Fp8Recipe, Offload, Schedule

MEGATRON_DEEPSPEED = Engine(
    name="megatron-deepspeed", summary="Megatron TP/SP/CP and fused kernels + DeepSpeed ZeRO, offload and pipeline",
    search_ms=43,  # Engine.search_ms: a scheduling weight, measured
    tensor_parallel=True, fused_gemms=True, eager_elementwise=False, p2p_split_over_tp=False, p2p_overlaps_interleaved=False,
    modules=Modules.MEGATRON, launcher=Launcher.MEGATRON_DEEPSPEED,
    # Megatron-DeepSpeed --deepspeed-activation-checkpointing: deepspeed.checkpointing.configure(mpu, ...)
    # makes its checkpoint DeepSpeed's (runtime/activation_checkpointing/checkpointing.py CheckpointFunction)
    deepspeed_checkpointing=True, moe_capacity=MoeCapacity.DEEPSPEED_MOE,
    # DeepSpeed 0.19 moe/layer.py MoE(enable_expert_tensor_parallelism=False): experts stay whole on
    # every TP rank, which runs them on its 1/t of the tokens (sharded_moe.py MOELayer.forward drop_tokens)
    expert_tp=ExpertTP.WHOLE, cp_with_sp=False, **DS_COMMON)

MEGATRON = Engine(
    name="megatron", summary="Megatron-LM: TP/SP/CP/PP with interleaving; --zero 1 = distributed optimizer",
    search_ms=70,  # Engine.search_ms: a scheduling weight, measured
    # megatron/core/optimizer/distrib_optimizer.py shards fp32 main params and Adam states only
    zero_stages=(0, 1),
    tensor_parallel=True,
    pipeline_zero_stages=(0, 1),
    # core/pipeline_parallel/schedules.py: 1F1B and interleaved 1F1B (no GPipe schedule of its own)
    pipeline_schedules=(Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED, Schedule.GPIPE),
    pipeline_edge_layers=0,  # account_for_embedding_in_pipeline_split is off by default
    pipeline_edge_choice=True,
    pipeline_defers_grad_reduction=False,  # Megatron's grad buffer is full-size anyway
    pipeline_p2p_buffers=False,  # p2p_communication.py allocates each received tensor when it arrives
    # megatron-core 0.16.1 model_parallel_config.py: expert_tensor_parallel_size defaults to the TP size
    expert_tp=ExpertTP.CHOICE,
    # megatron-core 0.16.1 optimizer/__init__.py _get_megatron_optimizer_based_on_param_groups:
    # --optimizer-cpu-offload wraps the optimizer in HybridDeviceOptimizer (CPU only, no NVMe;
    # offload_hybrid_optimizer below)
    offload_devices=(Offload.CPU,),
    offload_together=False,
    offload_hybrid_optimizer=True,
    precision_aware_optimizer=True,
    multi_token_prediction=True,  # core/transformer/multi_token_prediction.py, --mtp-num-layers
    buffers=Buffers.NONE,
    # training/arguments.py validate_args: bf16 accumulates and all-reduces grads in fp32 unless
    # --grad-reduce-in-bf16 (main_grad in param_and_grad_buffer.py)
    fp32_grads=True,
    # docs dist_optimizer.md: fp16 params + fp16 grads 20 vs 4 + 16/d bytes/param
    fp16_grad_copy=True,
    fp32_full_weights=False,
    sharded_param_is_master=False,
    # param_and_grad_buffer.py: grad_data is the full padded buffer on every rank, even with the
    # distributed optimizer, which reduce-scatters into this rank's slice of it
    grads_sharded_backward=(),
    grads_sharded_step=(),
    accumulation_copy=(),
    reduction_copy=(),
    # distributed/param_and_grad_buffer.py: main_grad views of the contiguous grad buffer, zeroed
    # (zero_grad_buffer) and kept; apex/Transformer Engine FusedAdam
    grads_freed_after_step=(), optimizer_step_copy=False,
    modules=Modules.MEGATRON,
    fused_gemms=True,
    eager_elementwise=False,
    grad_buckets=GradBuckets.MEGATRON_DDP,
    # param_and_grad_buffer.py start_grad_sync: reduce-scatter with the distributed optimizer, else all-reduce
    all_reduce_stages=(0,),
    # distributed_data_parallel.py no_sync: reduction only in the last micro-batch
    reduce_every_micro_step=(),
    # distributed_data_parallel_config.py overlap_grad_reduce (and overlap_param_gather) default to
    # False; the planner launches Megatron with --overlap-grad-reduce --overlap-param-gather (export.py
    # megatron_args), as Megatron-core's own recipes do; --no-overlap-comm plans without them
    overlap_default=(0, 1),
    overlap_flag=True,
    param_gather_per_bucket=True,  # param_and_grad_buffer.py start_param_sync per bucket group
    param_gather_overlaps_forward=True,  # param_and_grad_buffer.py finish_param_sync: next bucket's gather
    zero3_fetch_per_block=False,
    reshards_after_backward=False,
    tp_comm_overlap=True,  # training/arguments.py --tp-comm-overlap (needs --sequence-parallel and TE)
    # Narayanan et al. 2021 section 4.1: scatter/gather over the TP ranks' NICs
    p2p_split_over_tp=True,
    p2p_overlaps_interleaved=True,
    selective_policy=SelectivePolicy.CORE_ATTENTION,  # transformer_config.py recompute_modules ['core_attn']
    loss_chunks=1,
    launcher=Launcher.MEGATRON,
    # transformer_block.py _checkpointed_forward, --recompute-method block --recompute-num-layers N
    partial_recompute=True,
    rank_order_choice=True,  # megatron-core parallel_state.py initialize_model_parallel(order=...)
    pipeline_layout=True,  # --pipeline-model-parallel-layout: interleaved chunks of unequal block counts
    moe_capacity=MoeCapacity.MEGATRON,
    moe_counts=MoeCounts.TP_EP_ALL_GATHER,  # --moe-expert-capacity-factor, --moe-pad-expert-input-to-capacity
    sequence_parallel_with_tp=True,
    grad_reduce_bf16_choice=True,
    recompute_modules_choice=True,  # training/arguments.py --recompute-modules (TransformerConfig's field)
    # --moe-grouped-gemm (TransformerConfig.moe_grouped_gemm, False unless set): what its MoE users run
    # (megatron-core 0.16.1 moe/README.md "Enable kernel fusions: --moe-router-fusion --moe-grouped-gemm
    # --moe-permute-fusion"; NeMo 2's DeepSeek, Qwen3, Llama 4 and GPT-OSS configs and Megatron-Bridge's MoE
    # recipes set it); --no-moe-grouped-gemm runs SequentialMLP
    grouped_experts=True, grouped_experts_choice=True,
    dp_sync_per_chunk=True,  # with --overlap-grad-reduce / --overlap-param-gather, as export.py launches it
    # Megatron-LM d98e8a6 core/transformer/transformer_config.py fp8_recipe: 'delayed' by default,
    # 'tensorwise' (current scaling), 'mxfp8' (Blackwell), all through Transformer Engine
    fp8_recipes=(Fp8Recipe.DELAYED, Fp8Recipe.TENSORWISE, Fp8Recipe.MXFP8), fp8_library="transformer_engine",
    fp8_weight_cache=True, fp8_param_gather=True,
)

# DeepSpeed of spring 2021 (0.3.13 of 2021-03-16, or 0.3.14 of 2021-04-08, is what Narayanan et al. 2021,
# arXiv 2104.04473 of 2021-04-09, could run): 0.3.13 partition_parameters.py _allgather_param calls torch.cuda.synchronize()
# and all_gathers one parameter into world_size narrowed partitions; _reduce_scatter_gradients makes one
# reduce_scatter of world_size narrowed inputs per parameter. 0.5.10 moved the gathers to _all_gather_base.
# Not an --engine choice: planner/validate.py reads the runs of that time with it.
MEGATRON_DEEPSPEED_0_3 = replace(
    MEGATRON_DEEPSPEED, name="megatron-deepspeed-0.3",
    summary="Megatron + DeepSpeed 0.3 (2021): ZeRO-3 one tensor-list collective per parameter",
    zero3_per_tensor_collectives=True)
