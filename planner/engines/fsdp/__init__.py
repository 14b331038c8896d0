"""FSDP's room: PyTorch FSDP2 fully_shard on Hugging Face modules, launched by Accelerate (torch 2.13,
Accelerate 1.16)."""

from __future__ import annotations

from planner.engines.base import Buffers, Engine, ExpertTP, GradBuckets, Launcher, Modules, SelectivePolicy
from planner.options import Fp8Recipe, Offload

FSDP = Engine(
    name="fsdp", summary="PyTorch FSDP2 fully_shard on Hugging Face modules (--zero 3 full shard, 2 shard-grad-op, 0 no shard)",
    search_ms=15,  # Engine.search_ms: a scheduling weight, measured
    zero_stages=(0, 2, 3),
    # DTensor parallelize_module on the TP dimension of a 2-D mesh composes with fully_shard
    tensor_parallel=True,
    pipeline_zero_stages=(),
    pipeline_schedules=(),
    pipeline_edge_layers=0, pipeline_edge_choice=False,
    pipeline_defers_grad_reduction=False,
    pipeline_p2p_buffers=False,
    # torch/distributed/fsdp/_fully_shard/_fsdp_api.py CPUOffloadPolicy: params, grads and the
    # optimizer step on the CPU together; no NVMe
    offload_devices=(Offload.CPU,),
    offload_together=True,
    buffers=Buffers.FSDP,
    fp32_grads=True,  # MixedPrecisionPolicy(reduce_dtype=torch.float32) as torchtitan sets it
    fp16_grad_copy=False,
    fp32_full_weights=False,
    # _fully_shard/_fsdp_param.py FSDPParam: the sharded parameter keeps the module's fp32 dtype,
    # all-gathers are cast to MixedPrecisionPolicy.param_dtype (measured: 4/D B/param, fp32 shards)
    sharded_param_is_master=True,
    # FSDP2 reduce-scatters each unit's gradient in its backward and keeps the sharded gradient
    grads_sharded_backward=(2, 3),
    grads_sharded_step=(2, 3),
    accumulation_copy=(),
    reduction_copy=(),
    # torch 2.13 optim/optimizer.py zero_grad(set_to_none=True), which torchtitan's and Hugging Face's
    # loops call: FSDP2's sharded gradients are param.grad and go with it
    grads_freed_after_step=(0, 2, 3),
    optimizer_step_copy=True,  # torch.optim.AdamW(...) as the FSDP recipes build it: foreach on CUDA
    modules=Modules.HUGGING_FACE,
    fused_gemms=False,
    eager_elementwise=True,
    grad_buckets=GradBuckets.PER_BLOCK,
    all_reduce_stages=(0,),  # NO_SHARD all-reduces (_fsdp_collectives.py foreach_reduce)
    # _fully_shard.py: reduce-scatter on every backward unless set_requires_gradient_sync(False)
    reduce_every_micro_step=(2, 3),
    overlap_default=(0, 1, 2, 3),  # FSDP2 issues each unit's reduce-scatter during backward
    overlap_flag=False,
    param_gather_overlaps_forward=False,  # ZeRO-1/2 gathers are DeepSpeed/Megatron's; FSDP2 gathers per unit (zero3 path)
    param_gather_per_bucket=True,
    zero3_fetch_per_block=True,
    reshards_after_backward=True,  # measured: tests/test_fsdp_real.py test_fsdp2_gathers_every_micro_batch
    expert_tp=ExpertTP.SPLIT,  # FSDP2 on Hugging Face modules has no TP
    grouped_experts=True,  # transformers' grouped_mm experts; torchtitan's GroupedExperts too
    # nor expert parallelism: accelerate's FSDP plugin shards every unit over the data-parallel ranks
    # (fully_shard has no expert-placement of its own)
    expert_parallel=False,
    tp_comm_overlap=False,
    p2p_split_over_tp=False, p2p_overlaps_interleaved=False,
    selective_policy=SelectivePolicy.CORE_ATTENTION,
    selective_recompute=False,  # Hugging Face modules: whole-layer checkpointing only
    partial_recompute=True, recompute_every_n=True,  # model.activation_checkpointing_enable(every_n_layers=k)
    loss_chunks=1,
    launcher=Launcher.FSDP,
    # Accelerate 1.16 mixed_precision fp8 with its default TE backend (utils/transformer_engine.py
    # convert_model: nn.Linear -> te.Linear; te.recipe.DelayedScaling), as Composer's amp_fp8 runs
    # (composer/core/precision.py get_precision_context: te.fp8_autocast with DelayedScaling)
    fp8_recipes=(Fp8Recipe.DELAYED,), fp8_library="transformer_engine",
)
