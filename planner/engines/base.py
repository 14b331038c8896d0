"""The engine record: what an engine holds, communicates and launches, as fields its formulas read,
and the words (enums) those fields take. Each engine's own record is in its room
(planner/engines/<engine>/); planner/engines/__init__.py registers them."""

from __future__ import annotations

from dataclasses import dataclass

from planner.options import Word


class GradBuckets(Word):
    """How gradient reduction is split into collective calls."""

    REDUCE_BUCKET = "reduce_bucket_size"
    """DeepSpeed: one call per `reduce_bucket_size` elements (stage_1_and_2.py reduce_ipg_grads)."""
    PER_BLOCK = "per_block"
    """FSDP2: one reduce-scatter per fully_shard unit, i.e. per transformer block."""
    MEGATRON_DDP = "megatron_ddp"
    """Megatron-core DDP: buckets of max(40M, 1M x dp) parameters (distributed_data_parallel.py)."""


class Buffers(Word):
    """Which engine's communication and sharding buffers a rank holds beyond model states."""

    DEEPSPEED = "deepspeed"
    """ZeRO reduce buckets, step-time gradient copies, ZeRO-3 live parameters (memory.py)."""
    FSDP = "fsdp"
    """FSDP2's unsharded units, all-gather outputs, unsharded gradients and reduce-scatter inputs
    (memory.fsdp_unsharded_unit_bytes, measured on 2 gloo ranks)."""
    NONE = "none"
    """Megatron: gradients live in the contiguous grad buffer (counted as gradients)."""


class SelectivePolicy(Word):
    """What --recompute selective keeps (planner/activations.py)."""

    CORE_ATTENTION = "core_attention"
    """Megatron recompute_granularity='selective' (recompute_modules ['core_attn']): everything but
    the attention core's internals (Korthikanti et al. 2022 section 5)."""
    OP_SAC = "op_sac"
    """torchtitan's op-level selective activation checkpointing: the block's input and the outputs
    of the ops on its save list, every other matmul (activation_checkpoint.py SelectiveAC)."""


class Modules(Word):
    """Whose transformer block the engine trains: it decides what the block saves for backward
    (planner/activations.py)."""

    MEGATRON = "megatron"
    """Megatron-core's TransformerLayer with fused kernels (Korthikanti et al. 2022's list)."""
    HUGGING_FACE = "hugging_face"
    """transformers' decoder layers (eager RMSNorm in fp32, separate projections, SDPA)."""
    TORCHTITAN = "torchtitan"
    """torchtitan's own models/llama3 block."""
    HF_LIGER = "hf_liger"
    """transformers' Llama-layout blocks patched by Liger Kernel (liger_kernel 0.8.5
    transformers/monkey_patch.py apply_liger_kernel_to_llama defaults: LigerRMSNorm, LigerSwiGLUMLP,
    Liger RoPE, fused linear cross-entropy)."""
    LLM_FOUNDRY = "llm_foundry"
    """llm-foundry's MPT block (llmfoundry/models/layers/blocks.py MPTBlock: low-precision LayerNorm,
    fused Wqkv, flash-attn varlen attention, GELU MLP) under Composer's FSDP with autocast and its
    fused cross-entropy: what MosaicML's benchmarks and the Hub's MPT checkpoints
    (trust_remote_code) train. Chosen with --modules llm-foundry under --engine deepspeed or fsdp."""


class ExpertTP(Word):
    """Over how many TP ranks the engine splits a routed expert's matrices (the layout's `etp`, 0:
    the engine's default) and whether expert parallelism folds over the TP ranks that leaves."""

    SPLIT = "split"
    """Experts split over all TP ranks like the dense layers; EP from the data-parallel ranks."""
    CHOICE = "choice"
    """megatron-core 0.16.1: --expert-tensor-parallel-size 1..t (model_parallel_config.py
    expert_tensor_parallel_size, default the TP size); the expert ranks etp x ep x edp cover the
    dense tp x cp x dp ones (parallel_state.py initialize_model_parallel, "MoE parallel folding",
    Liu et al. 2025 arXiv 2504.14960), so EP spans the TP ranks etp leaves."""
    BY_EP = "by_ep"
    """torchtitan 0.3.0: TP splits the experts when EP is off; with EP the experts shard over EP
    alone, which borrows ranks from FSDP and TP (config/configs.py expert_parallel_degree:
    efsdp = dp_shard x cp x tp / ep; models/common/moe_sharding.py)."""
    WHOLE = "whole"
    """DeepSpeed-MoE (0.19 moe/layer.py enable_expert_tensor_parallelism=False): experts whole on
    every TP rank, which runs them on its 1/t of the tokens; EP from the data-parallel ranks."""


class MoeCapacity(Word):
    """How the engine's MoE layer sizes each expert's input (planner/moe.py routed_per_token)."""

    DROPLESS = "dropless"
    """Every routed (token, expert) pair reaches its expert, no capacity: transformers 5 sparse MoE
    blocks (integrations/moe.py grouped_mm_experts_forward), torchtitan."""
    DEEPSPEED_MOE = "deepspeed_moe"
    """deepspeed.moe (DeepSpeed 0.19.8 moe/sharded_moe.py MOELayer, as Megatron-DeepSpeed's MoE layers
    use it): a capacity always (MoE.__init__ capacity_factor 1.0, min_capacity 4), every expert's
    input padded to it ([E, capacity, M] dispatch tensor)."""
    MEGATRON = "megatron"
    """megatron-core 0.16.1 (transformer_config.py): dropless unless moe_expert_capacity_factor;
    tokens past capacity dropped, padded to it with moe_pad_expert_input_to_capacity."""


class MoeCounts(Word):
    """How the engine's MoE dispatcher learns how many routed rows each expert gets before it moves
    them (planner/timing.py moe_count_sync_s)."""

    NONE = "none"
    """No count exchange or host wait: DeepSpeed-MoE's capacity comes from the shapes (DeepSpeed
    0.19.8 moe/sharded_moe.py _capacity on host tensors, one_hot(num_classes=capacity)) with its
    default drop_tokens; transformers 5.25's grouped_mm experts (integrations/moe.py
    grouped_mm_experts_forward) keep their offsets on the device (histc, cumsum)."""
    TP_EP_ALL_GATHER = "tp_ep_all_gather"
    """megatron-core 0.16.1 moe/token_dispatcher.py MoEAlltoAllTokenDispatcher.preprocess: each
    forward all-gathers every rank's per-expert counts over the expert-TP x EP group
    (gather_from_sequence_parallel_region, tp_ep_group; none with both 1) and the host waits for
    their copy to the CPU (_maybe_dtoh_and_synchronize at cuda_sync_point, before_finish without
    EP or TP), unless moe_pad_expert_input_to_capacity (drop_and_pad: static shapes, neither)."""
    EP_ALL_TO_ALL = "ep_all_to_all"
    """torchtitan 0.3.0 models/common/token_dispatcher.py: with EP, _token_count_exchange
    all-to-alls the counts over the EP mesh and _sync_token_count_exchange copies them to the CPU
    with non_blocking=False (a device-to-host sync) before the dispatch all-to-all."""


class Launcher(Word):
    """Which configs planner/export.py writes and how its launch script starts the job."""

    DEEPSPEED = "deepspeed"
    """ds_config.json; `deepspeed` or `accelerate launch` with a DeepSpeed plugin."""
    MEGATRON_DEEPSPEED = "megatron-deepspeed"
    """ds_config.json and Megatron-DeepSpeed's arguments (its own names for a few)."""
    MEGATRON = "megatron"
    """Megatron-LM arguments, torchrun."""
    FSDP = "fsdp"
    """An Accelerate FSDP config."""
    TORCHTITAN = "torchtitan"
    """torchtitan's own trainer (no export yet)."""


@dataclass(frozen=True)
class Engine:
    """What one training engine allows, holds and does."""

    name: str
    """The --engine word."""
    summary: str
    """One line for --help and the README."""
    # ---- which layouts it runs -----------------------------------------------------------
    zero_stages: tuple
    """--zero values it has (Megatron's distributed optimizer is 1; FSDP shards 0/2/3)."""
    tensor_parallel: bool
    """Megatron-style tensor, sequence and context parallelism of its own."""
    pipeline_zero_stages: tuple
    """ZeRO stages allowed with pp > 1; () means no pipeline engine."""
    pipeline_schedules: tuple
    """Schedules its pipeline engine runs."""
    pipeline_edge_layers: int
    """Blocks' worth the first and last stages give up for the embedding and the output layer
    (the default; Training.pipeline_edge_layers)."""
    pipeline_edge_choice: bool
    """Whether a user may set it to 0 or 1: Megatron-LM 0.19.2 --account-for-embedding-in-pipeline-split
    and --account-for-loss-in-pipeline-split (training/arguments.py: num_layers + 1 each must divide
    by the stages), torchtitan pipeline_parallel_first/last_stage_less_layers."""
    pipeline_defers_grad_reduction: bool
    """With pp > 1, gradients stay unsharded (in the reduce dtype) and parameters gathered across
    the micro-batches, reduced once after the schedule (torch.distributed.pipelining stage.py
    backward_maybe_with_nosync: set_requires_gradient_sync(False), set_reshard_after_backward(False);
    perform_reduce_grad after the last backward)."""
    pipeline_p2p_buffers: bool
    """Its pipeline stages keep a receive buffer per micro-batch for activations and one for their
    gradients, made once and kept (torch 2.13 torch/distributed/pipelining/stage.py
    PipelineStage._setup_forward_recv_info, _create_grad_recv_info; pipeline.p2p_buffers)."""
    offload_devices: tuple
    """Devices optimizer states (and ZeRO-3 parameters) can be offloaded to."""
    offload_together: bool
    """Parameters and optimizer offload together (FSDP2 CPUOffloadPolicy moves both)."""
    # ---- what a rank holds -----------------------------------------------------------------
    buffers: Buffers
    """Engine buffers beyond weights, gradients and optimizer states."""
    fp32_grads: bool
    """Gradients kept and reduced in fp32 under mixed precision (Megatron-LM main_grad for bf16,
    FSDP2 MixedPrecisionPolicy reduce_dtype=float32 as torchtitan sets it)."""
    fp16_grad_copy: bool
    """fp16 training keeps an fp32 copy of the gradients, sharded with the optimizer."""
    fp32_full_weights: bool
    """fp32 training keeps full fp32 weights and a separate fp32 master partition (ZeRO-1/2)."""
    sharded_param_is_master: bool
    """Under mixed precision the sharded parameter stays fp32 and is the optimizer's master copy;
    16-bit parameters exist only all-gathered (FSDP2: MixedPrecisionPolicy casts at all-gather)."""
    grads_sharded_backward: tuple
    """ZeRO stages whose gradients are sharded while backward runs (the others hold the full
    gradient until the reduction at the accumulation boundary)."""
    grads_sharded_step: tuple
    """ZeRO stages whose gradients are sharded at the optimizer step."""
    accumulation_copy: tuple
    """ZeRO stages that, from the second micro-batch of a step on, hold a fresh gradient partition
    beside the accumulated one during each backward."""
    grads_freed_after_step: tuple
    """ZeRO stages whose gradients the step frees (zero_grad(set_to_none=True)) rather than zeroes in
    a persistent buffer: a step of one micro-batch then starts its backward with no gradient, and
    they grow as its activations are freed, so the two peak apart (at backward's start or end)."""
    optimizer_step_copy: bool
    """The engine's usual optimizer is torch's AdamW with its CUDA default, foreach (torch 2.13
    optim/adam.py _multi_tensor_adam: exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)),
    whose step allocates one second-moment-sized temporary over all the rank's states; fused AdamW
    (DeepSpeed's FusedAdam, Megatron's, torchtitan's default) allocates none."""
    reduction_copy: tuple
    """ZeRO stages whose reduction at the accumulation boundary copies the reduced gradients into a
    new partition buffer while the full gradients not yet reduced are still held."""
    # ---- how it runs -------------------------------------------------------------------------
    modules: Modules
    """Whose transformer block runs, which decides the saved-tensor list."""
    fused_gemms: bool
    """q|k|v and gate|up run as one GEMM each (Megatron linear_qkv, linear_fc1)."""
    eager_elementwise: bool
    """Norms, rotary, activations and residual adds run as eager PyTorch kernels (Hugging Face
    modules) instead of fused kernels."""
    grad_buckets: GradBuckets
    """How the gradient reduction is split into calls."""
    all_reduce_stages: tuple
    """ZeRO stages whose gradient reduction is an all-reduce (the others reduce-scatter)."""
    reduce_every_micro_step: tuple
    """ZeRO stages that reduce gradients after every micro-batch's backward (the others reduce
    once per step, at the accumulation boundary)."""
    overlap_default: tuple
    """ZeRO stages whose gradient reduction overlaps backward by default."""
    overlap_flag: bool
    """--overlap-comm / --no-overlap-comm (DeepSpeed's overlap_comm) applies."""
    param_gather_per_bucket: bool
    """ZeRO-1/2 parameter all-gather after the step: one call per bucket (else one per group)."""
    param_gather_overlaps_forward: bool
    """With overlap on, that all-gather runs bucket by bucket under the next forward (Megatron-core
    --overlap-param-gather) instead of before it (DeepSpeed all_gather_dp_groups)."""
    zero3_fetch_per_block: bool
    """ZeRO-3 gathers one unit per block (FSDP) rather than one per submodule (DeepSpeed)."""
    expert_tp: ExpertTP
    """How routed experts split over TP and whether EP folds over TP ranks (ExpertTP)."""
    reshards_after_backward: bool
    """--zero 2 parameters are resharded after every backward and all-gathered again, unit by unit,
    in the next micro-batch's forward (torch 2.13 _fully_shard.py: reshard_after_backward True
    unless set_reshard_after_backward(False)), rather than gathered once after the step."""
    tp_comm_overlap: bool
    """--tp-comm-overlap exists: TransformerEngine userbuffers split each sequence-parallel all-gather
    and reduce-scatter into tp chunks pipelined with their GEMM (Megatron-LM with TE)."""
    p2p_split_over_tp: bool
    """Pipeline sends split over the TP ranks' links (Megatron scatter/gather) even without SP."""
    p2p_overlaps_interleaved: bool
    """Under the interleaved schedule each chunk's send and receive run beside the next chunk's
    compute (Megatron-LM 0.19.2 training/arguments.py: --no-overlap-p2p-communication, so
    overlap_p2p_comm is on by default and forced off without interleaving; core/pipeline_parallel/
    schedules.py forward_backward_pipelining_with_interleaving waits on the handles only when the
    tensor is needed); otherwise every send blocks the stage."""
    selective_policy: SelectivePolicy
    """What --recompute selective keeps."""
    loss_chunks: int
    """The loss is computed over this many sequence chunks, each chunk's logits freed before the next
    (1: the whole micro-batch's logits at once)."""
    launcher: Launcher
    """Launch script style of planner/export.py."""
    expandable_segments: bool = False
    """The engine's launcher sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: the caching
    allocator grows one segment in place instead of splitting cached blocks across segments
    (c10/cuda/CUDACachingAllocator.cpp ExpandableSegment), so its reserve over the allocated peak
    is memory.allocator_fragmentation_expandable, not memory.allocator_fragmentation."""
    pipeline_layout: bool = False
    """Interleaved chunks may hold unequal block counts: Megatron-LM's --pipeline-model-parallel-layout
    (d98e8a6 training/arguments.py; megatron-core transformer/pipeline_parallel_layer_layout.py
    PipelineParallelLayerLayout: one entry per virtual stage, embedding first, loss last), which
    NVIDIA's DeepSeek-V3 recipes use for 61 blocks on 4 x 4 or 8 x 4 virtual stages (megatron-bridge
    recipes/deepseek/h100/deepseek_v3.py _get_deepseek_v3_pipeline_layout). The planner takes the
    most even layout: layers_on_stage's split, the first chunks one block longer (pipeline.chunk_slots)."""
    rank_order_choice: bool = False
    """Ranks can be placed with the pipeline inside data parallelism as well as outside it (options.py
    RankOrder; Megatron-LM --use-tp-pp-dp-mapping). DeepSpeed's PipeModelDataParallelTopology (axes
    pipe, data, model) and torchtitan's device mesh (pp, dp_replicate, dp_shard, cp, tp) put the
    pipeline outermost only."""
    selective_recompute: bool = True
    """--recompute selective can be launched: Megatron's --recompute-granularity selective, torchtitan's
    op-level SAC. Hugging Face modules have no such switch (transformers 5.25 modeling_utils.py
    _activation_checkpointing_enable wraps whole decoder layers in torch.utils.checkpoint; accelerate's
    fsdp_activation_checkpointing likewise), so a selective plan there is not one a user can run."""
    partial_recompute: bool = False
    """Full recompute can cover only the first N layers of each model chunk (--recompute-layers)."""
    recompute_every_n: bool = False
    """Its partial recompute checkpoints every k-th decoder layer from the first (transformers 5.25
    modeling_utils.py _set_gradient_checkpointing: layer_index % every_n_layers == 0), so N layers
    recomputed means N = ceil(L / k), on one pipeline stage; the bytes and seconds depend only on N."""
    expert_parallel: bool = True
    """Launches expert parallelism (--ep > 1) from the exported configuration: megatron-core
    --expert-model-parallel-size, Megatron-DeepSpeed's deepspeed.moe ep_size, torchtitan
    expert_parallel_degree."""
    deepspeed_checkpointing: bool = False
    """Full recompute runs through deepspeed.checkpointing, so the ds_config's activation_checkpointing
    partition_activations and cpu_checkpointing decide where the layer inputs wait."""
    moe_capacity: MoeCapacity = MoeCapacity.DROPLESS
    """Whether its MoE layer has an expert capacity, and whether it pads to it."""
    grouped_experts: bool = False
    """Its MoE layer runs each expert matrix of all local experts as one grouped GEMM (a kernel over
    every expert's rows: torch._grouped_mm): transformers 5.25 integrations/moe.py
    grouped_mm_experts_forward, the default experts_implementation (modeling_utils.py
    get_correct_experts_implementation; SM80 and later with torch >= 2.9), and torchtitan 0.3.0
    models/common/moe.py GroupedExperts._grouped_mm. Else a GEMM per local expert: megatron-core's
    SequentialMLP without --moe-grouped-gemm, as exported, and DeepSpeed-MoE's Experts ModuleList
    (planner/compute.py gemm_fwd_s)."""
    grouped_experts_choice: bool = False
    """The user can switch grouped expert GEMMs on: Megatron-LM --moe-grouped-gemm (off by default;
    megatron-core 0.16.1 TEGroupedMLP, which NVIDIA's MoE recipes and Megatron-LM's MoE README run)."""
    moe_counts: MoeCounts = MoeCounts.NONE
    """How its MoE dispatcher exchanges the routed rows' counts and waits for them on the host."""
    cp_gathers_kv: bool = False
    """Context parallelism all-gathers K and V over the CP ranks before attention, blocking, and the
    attention keeps them whole for backward, which reduce-scatters their gradients (torchtitan 0.3.0
    distributed/context_parallel/api.py apply_cp_to_forward for FlexAttention: torch 2.13
    _context_parallel/_cp_custom_ops.py flex_cp_allgather, flex_cp_allgather_backward); else
    Megatron's ring passes K/V chunks under the attention core (planner/timing.py cp_ring_exposed_s)."""
    offload_hybrid_optimizer: bool = False
    """Its optimizer offload is megatron-core's HybridDeviceOptimizer (0.16.1
    optimizer/cpu_offloading/hybrid_optimizer.py, under the distributed optimizer with
    --use-precision-aware-optimizer): step() copies each fp32 main-gradient shard to a pinned fp32
    host buffer after backward (_set_sub_optimizer_grads), torch's fused AdamW steps the fp32 master
    and moments on the host, and the fp32 master goes back up into the 16-bit shard
    (param_copy_back_gpu_hook), all in turn on the current stream (overlap_cpu_optimizer_d2h_h2d
    off, OptimizerConfig's default); rather than DeepSpeed's ZeRO-Offload, which copies gradients
    down during backward and 16-bit parameters up."""
    multi_token_prediction: bool = False
    """The engine's model builds multi-token-prediction depths (ModelSpec.mtp_layers): megatron-core
    0.16.1 GPTModel(mtp_block_spec), Megatron-LM --mtp-num-layers. (torchtitan 0.3.0's DeepSeek-V3
    has one too, models/deepseek_v3/mtp.py, not modelled here.)"""
    precision_aware_optimizer: bool = False
    """--precision bf16-pure is megatron-core's precision-aware optimizer (Megatron-LM training/
    arguments.py --use-precision-aware-optimizer --main-grads-dtype bf16 --exp-avg-dtype bf16
    --exp-avg-sq-dtype bf16, as export.py megatron_args writes it): bf16 main gradients and Adam
    moments, and fp32 main parameters kept as the 16 bits a bf16 weight lacks (0.16.1
    optimizer_config.py store_param_remainders, on by default with TransformerEngine >= 2.1), 2 B in
    the optimizer's shard; only under the distributed optimizer (its __post_init__ asserts it)."""
    cp_with_sp: bool = True
    """Context parallelism runs beside Megatron's sequence parallelism. Not under Megatron-DeepSpeed, whose
    --cp is DeepSpeed's sequence parallelism (--ds-sequence-parallel-size): megatron/initialize.py
    _initialize_distributed raises where both are set (microsoft/Megatron-DeepSpeed f4157bea)."""
    recompute_modules_choice: bool = False
    """--recompute selective recomputes the modules the user lists (Megatron-LM --recompute-modules,
    megatron-core 0.16.1 transformer_config.py recompute_modules): Training.recompute_modules."""
    grad_reduce_bf16_choice: bool = False
    """The user can keep and reduce the gradients in bf16 instead of fp32 main grads: Megatron-LM
    --grad-reduce-in-bf16 (training/arguments.py; megatron-core DistributedDataParallelConfig
    grad_reduce_in_fp32 False), as NeMo 2's performance recipes set it (nemo/collections/llm/recipes/
    llama3_8b.py pretrain_performance_optimizations: recipe.trainer.plugins.grad_reduce_in_fp32 = False)."""
    fused_qkv: bool = False
    """q, k and v run as one GEMM though the other groups stay apart (torchtitan 0.3.0
    models/common/attention.py FusedQKVLinear, fuse_qkv=True in models/llama3 and models/qwen3
    __init__.py; FeedForward keeps w1 and w3 apart). fused_gemms fuses every group."""
    sequence_parallel_with_tp: bool = False
    """Sequence parallelism on wherever TP > 1 unless the user turns it off: what the engine's users run
    (NeMo 2 recipes, e.g. nemo/collections/llm/recipes/llama3_70b.py and gpt3_175b.py pretrain_recipe:
    MegatronStrategy(sequence_parallel=True) with their TP; --tp-comm-overlap needs it)."""
    dp_sync_per_chunk: bool = False
    """Under the interleaved schedule each model chunk syncs on its own (megatron-core 0.16.1
    pipeline_parallel/schedules.py forward_backward_pipelining_with_interleaving): its gradient
    reduction starts once the chunk's last micro-batch has gone backward (grad_sync_func per chunk,
    or enable_grad_sync at that backward), and its parameter all-gather in the next step one chunk
    ahead (param_sync_func: chunks 0 and 1 before the first forward, chunk j at chunk j - 1's first
    forward); rather than the whole stage's buckets under one micro-batch's pass
    (engines/megatron/timing.py chunked_sync_exposed_s)."""
    zero3_per_tensor_collectives: bool = False
    """ZeRO-3 all-gathers each parameter and reduce-scatters each gradient in a call of its own,
    through torch.distributed's tensor-list all_gather/reduce_scatter: the host narrows one slice
    per rank and torch copies each through a flat buffer, right after a device sync (DeepSpeed
    0.3.13 to 0.5.0 as read; engines/deepspeed/timing.py zero3_rank_copies_s), rather than one flat call per submodule
    and bucket."""
    fp8_recipes: tuple = ()
    """FP8 GEMM recipes its users run (planner/options.py Fp8Recipe), the default first; () has no
    FP8 path (--precision fp8 is refused and names the engines that have one)."""
    fp8_library: str = ""
    """Whose FP8 linear layers it runs: 'transformer_engine' (te.Linear and its fused LayerNorm/MLP
    modules) or 'torchao' (Float8Linear); planner/fp8.py reads what each saves and caches."""
    fp8_weight_cache: bool = False
    """Its FP8 layers keep each weight's FP8 copies across the micro-batches of a step (Megatron
    passes TE's is_first_microbatch: planner/fp8.py weight_cache_bytes) rather than casting it in
    every pass."""
    fp8_param_gather: bool = False
    """Its users keep FP8 parameters where the optimizer is distributed (Megatron --fp8-param-gather:
    NeMo 2.4 recipes/precision/mixed_precision.py bf16_with_fp8_mixed and Megatron-Bridge's FP8
    recipes set fp8_param_gather=True); the default of Training.fp8_param_gather."""
    search_ms: float = 20.0
    """The planner's own recommend searches for this engine, warm, for a 70B model on 16 H100s on a
    2-core CPU (measured): a weight that only splits the engines evenly over recommend's workers
    (planner/comparison.py engine_groups); no answer reads it."""

    @property
    def pipeline(self) -> bool:
        return bool(self.pipeline_zero_stages)

    @property
    def deepspeed(self) -> bool:
        """Runs on the DeepSpeed engine (writes a ds_config.json)."""
        return self.launcher in (Launcher.DEEPSPEED, Launcher.MEGATRON_DEEPSPEED)

    @property
    def megatron(self) -> bool:
        """Runs Megatron's model code (takes Megatron arguments)."""
        return self.launcher in (Launcher.MEGATRON, Launcher.MEGATRON_DEEPSPEED)
