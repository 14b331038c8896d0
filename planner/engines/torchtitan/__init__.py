"""torchtitan's room: FSDP2 composed with TP/SP, CP and PP on torchtitan's own models (torchtitan
0.3.0): FSDP's record with what differs."""

from __future__ import annotations

from dataclasses import replace

from planner.engines.base import ExpertTP, Launcher, Modules, MoeCounts, SelectivePolicy
from planner.engines.fsdp import FSDP
from planner.options import Fp8Recipe, Schedule

# torchtitan runs the same FSDP2 (fully_shard over dp_shard x cp, MixedPrecisionPolicy bf16/fp32 in
# TrainingConfig.mixed_precision_param/_reduce, one unit per block, CPUOffloadPolicy with
# enable_cpu_offload); what differs is below
TORCHTITAN = replace(
    FSDP,
    name="torchtitan", summary="torchtitan: FSDP2 composed with TP/SP, CP and PP; op-level selective AC; chunked loss",
    search_ms=14,  # Engine.search_ms: a scheduling weight, measured
    # distributed/pipeline_parallel.py pipeline_llm applies the same parallelize_fn (FSDP included)
    # to each stage; ParallelismConfig.pipeline_parallel_schedule "1F1B" (also Interleaved1F1B, GPipe,
    # and InterleavedZeroBubble: torch.distributed.pipelining ScheduleInterleavedZeroBubble, the paper's
    # ZB1P, which with one stage per rank is ZB-H1)
    pipeline_zero_stages=(0, 2, 3),
    pipeline_schedules=(Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED, Schedule.GPIPE, Schedule.ZB_H1),
    pipeline_edge_layers=1, pipeline_edge_choice=True,
    pipeline_defers_grad_reduction=True,
    pipeline_p2p_buffers=True,
    # torch 2.13 pipelining/schedules.py: ScheduleInterleaved1F1B and ScheduleInterleavedZeroBubble are
    # _PipelineScheduleRuntime schedules: SEND_F/SEND_B actions issued and waited at the step's end,
    # RECV_F/RECV_B posted as early as the order allows (_add_send_recv) and waited when consumed
    p2p_overlaps_interleaved=True,
    # models/llama3 and qwen3: one wqkv GEMM (fused_qkv), w1, w3 and w2 apart; no torch.compile by
    # default (CompileConfig.enable = False), so elementwise kernels run eagerly
    modules=Modules.TORCHTITAN, fused_qkv=True,
    # torchtitan 0.3 components/optimizer/optimizer.py OptimizersContainer.Config implementation "fused"
    optimizer_step_copy=False,
    expert_tp=ExpertTP.BY_EP,
    expert_parallel=True,  # its MoE models' expert_parallel_degree (models/common/moe_sharding.py)
    selective_policy=SelectivePolicy.OP_SAC,  # Trainer.Config.activation_checkpoint = SelectiveAC.Config
    selective_recompute=True, partial_recompute=False, recompute_every_n=False,
    loss_chunks=8,  # components/loss.py ChunkedLossWrapper.Config.num_chunks, set by every llama3 config
    launcher=Launcher.TORCHTITAN,
    # run_train.sh: PYTORCH_ALLOC_CONF="expandable_segments:True" (since a5e57e4a9 "Use expandable
    # segments in run_llama_train.sh"; torchao's float8 benchmarks launch through it, bench.sh)
    expandable_segments=True,
    cp_gathers_kv=True,  # its models' FlexAttention under CP (models/*/parallelize.py apply_cp_to_forward)
    moe_counts=MoeCounts.EP_ALL_TO_ALL,
    # torchtitan 0.3.0 components/quantization/float8.py Float8LinearConverter.Config: torchao
    # Float8Linear with recipe_name 'rowwise' (the default and only per-tensor-free choice); tensorwise
    # is 0.2.2 and earlier (config/job_config.py Float8Linear.recipe_name None: Float8LinearConfig());
    # mx.py's MX converter (mxfp8) on Blackwell
    fp8_recipes=(Fp8Recipe.ROWWISE, Fp8Recipe.TENSORWISE, Fp8Recipe.MXFP8), fp8_library="torchao",
)
