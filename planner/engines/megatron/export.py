"""Megatron's export: the Megatron-LM (or Megatron-DeepSpeed) arguments of a layout and the
environment its launch needs, parsed by both engines' own parsers in data/references/megatron_cli.json
(python -m calibrate.engines.megatron_cli). planner/export.py writes them into launch.sh."""

from __future__ import annotations

from planner.engines import Launcher
from planner.hardware import Cluster
from planner.layout import DEFAULT_RECOMPUTE_MODULES, Training
from planner.model import ModelSpec
from planner.pipeline import chunk_slots, interleaved_layers

from planner.engines.deepspeed.export import DS_CONFIG


def megatron_args(model: ModelSpec, training: Training, row: dict, ds_config_path: str = DS_CONFIG) -> list[str]:
    """Megatron arguments, one "--flag [value]" string each, in the order both engines' parsers were
    handed them (data/references/megatron_cli.json).

    Names are Megatron-LM's (megatron/training/arguments.py); with engine megatron-deepspeed the
    few that Megatron-DeepSpeed names differently use its names (megatron/arguments.py there).
    """
    mds = training.engine.launcher is Launcher.MEGATRON_DEEPSPEED
    return (_parallel_args(model, training, row, mds) + _size_args(model, training, row, mds)
            + _optimizer_args(model, training, row, mds, ds_config_path) + _recompute_and_precision_args(training, row, mds))


def pipeline_layout(model: ModelSpec, training: Training, p: int, v: int) -> str | None:
    """Megatron-LM's --pipeline-model-parallel-layout for blocks that do not split evenly over the
    p x v virtual stages (Engine.pipeline_layout; None where they do): one entry per virtual stage in
    order, split by "|", the embedding (E) first and the loss (L) last, t a block, m an MTP depth, after
    every block and in the last stage (megatron-core transformer/pipeline_parallel_layer_layout.py
    PipelineParallelLayerLayout, validate_layer_layout: as many m as --mtp-num-layers). Each stage takes
    pipeline.chunk_slots' share of the slots, the embedding and the loss a slot each where
    Training.pipeline_edge_layers counts them."""
    e, chunks = training.pipeline_edge_layers, p * v
    slots = model.layers + 2 * e
    if p < 2 or slots % chunks == 0 or not training.engine.pipeline_layout:
        return None
    stages = []
    for i in range(chunks):
        size = int(chunk_slots(slots, chunks, i)[1]) - e * ((i == 0) + (i == chunks - 1))
        stages.append("E" * (i == 0) + "t" * size + ("m" * model.mtp_layers + "L") * (i == chunks - 1))
    return "|".join(stages)


def _parallel_args(model: ModelSpec, training: Training, row: dict, mds: bool) -> list[str]:
    """TP, PP (with interleaving), CP, the experts and their parallelism, sequence parallelism."""
    t, p, c, e, v = row["tp"], row["pp"], row["cp"], row["ep"], row["vpp"]
    a = [f"--tensor-model-parallel-size {t}", f"--pipeline-model-parallel-size {p}"]
    layout = pipeline_layout(model, training, p, v) if not mds else None
    if layout:
        a.append(f"--pipeline-model-parallel-layout {layout}")
    elif v > 1:
        # the edge slots count as layers before the division (Megatron-LM d98e8a6 training/
        # arguments.py validate_args: num_layers += 1 per --account-for-*-in-pipeline-split)
        a.append(f"--num-layers-per-virtual-pipeline-stage {interleaved_layers(model, training) // (p * v)}")
    if c > 1:
        # Megatron-LM context parallelism; Megatron-DeepSpeed's sequence split is DeepSpeed-Ulysses
        a.append(f"--ds-sequence-parallel-size {c}" if mds else f"--context-parallel-size {c}")
    if model.experts > 1:
        a.append(f"--num-experts {model.experts}")
        a.append(f"--topk {model.experts_per_token}" if mds else f"--moe-router-topk {model.experts_per_token}")
        if model.shared_expert_ffn and not mds:  # Megatron-LM training/arguments.py (Qwen-MoE style)
            a.append(f"--moe-shared-expert-intermediate-size {model.shared_expert_ffn}")
        if not mds:
            # megatron-core 0.16.1 TransformerConfig moe_token_dispatcher_type defaults to "allgather"; the
            # planner times MoEAlltoAllTokenDispatcher (mp_comm.ep_all_to_all_s, mp_comm.moe_count_sync_s),
            # which NVIDIA's own MoE recipes set (megatron-bridge 0.3.1 recipes/qwen/qwen3_moe.py, deepseek_v3.py)
            a.append("--moe-token-dispatcher-type alltoall")
            if training.moe_grouped_gemm:  # TransformerConfig.moe_grouped_gemm: TEGroupedMLP experts
                a.append("--moe-grouped-gemm")
        if model.moe_layers != model.layers and not mds:
            # megatron-core 0.16.1 TransformerConfig moe_layer_freq (a per-layer 0/1 pattern, which
            # Megatron-LM's --moe-layer-freq evaluates); --ffn-hidden-size is then the dense blocks'
            # width (--moe-ffn-hidden-size the experts', megatron_shape_args)
            pattern = f"([0]*{model.dense_layers}+[1]*{model.moe_layers})" if model.moe_layer_step == 1 else \
                "[" + ",".join(str(int(model.is_routed(i))) for i in range(model.layers)) + "]"
            a.append(f"--moe-layer-freq {pattern}")
        # Megatron-LM training/arguments.py, megatron-core 0.16.1 TransformerConfig moe_expert_capacity_factor and
        # moe_pad_expert_input_to_capacity; Megatron-DeepSpeed's own capacity argument is not written (unread)
        if training.moe_capacity_factor is not None and not mds:
            a.append(f"--moe-expert-capacity-factor {training.moe_capacity_factor!r}")
            if training.moe_pad_to_capacity:
                a.append("--moe-pad-expert-input-to-capacity")
    if e > 1:
        a.append(f"--moe-expert-parallel-size {e}" if mds else f"--expert-model-parallel-size {e}")
    if row.get("etp") and row["etp"] != t and not mds:  # megatron-core model_parallel_config.py
        a.append(f"--expert-tensor-parallel-size {row['etp']}")
    if row["sequence_parallel"]:
        a.append("--sequence-parallel")
    return a


def _size_args(model: ModelSpec, training: Training, row: dict, mds: bool) -> list[str]:
    """The batch, the sequence and the model's shape."""
    a = [f"--micro-batch-size {row['mbs']}",
          f"--global-batch-size {row['mbs'] * row['gas'] * row['dp']}",  # Megatron derives gas from it
          f"--seq-length {training.seq_len}",
          f"--max-position-embeddings {max(training.seq_len, model.max_positions)}",
          f"--num-layers {model.layers}",
          f"--hidden-size {model.hidden}",
          f"--num-attention-heads {model.heads}"]
    # Megatron-DeepSpeed f4157be megatron/arguments.py _add_network_size_args has no --group-query-attention
    if model.kv_heads < model.heads and mds:
        a.append(f"--num-key-value-heads {model.kv_heads}")
    elif model.kv_heads < model.heads:
        a += ["--group-query-attention", f"--num-query-groups {model.kv_heads}"]
    if model.head_dim and model.head_dim != model.hidden // model.heads and not model.kv_lora_rank:
        a.append(f"--kv-channels {model.head_dim}")
    a.append(f"--ffn-hidden-size {model.dense_ffn if model.moe_layers != model.layers and not mds else model.ffn}")
    if model.kv_lora_rank and not mds:  # megatron-core 0.16.1 MLATransformerConfig fields
        a += ["--multi-latent-attention", f"--kv-lora-rank {model.kv_lora_rank}",
              f"--qk-head-dim {model.dim_per_head - model.qk_rope_head_dim}",
              f"--qk-pos-emb-head-dim {model.qk_rope_head_dim}", f"--v-head-dim {model.v_head_dim or model.dim_per_head}"]
        a += [f"--q-lora-rank {model.q_lora_rank}"] if model.q_lora_rank else []
    if model.mtp_layers:  # Megatron-LM d98e8a6 --mtp-num-layers (core/transformer/transformer_config.py mtp_num_layers)
        a.append(f"--mtp-num-layers {model.mtp_layers}")
    if model.ffn_kind == "swiglu":
        a.append("--swiglu")
    a += megatron_shape_args(model, mds)
    return a


def _optimizer_args(model: ModelSpec, training: Training, row: dict, mds: bool, ds_config_path: str) -> list[str]:
    """The optimizer, who shards it (DeepSpeed's ZeRO under Megatron-DeepSpeed, else Megatron's
    distributed optimizer) with its offload, and the overlaps the planner's step time assumes."""
    a = []
    if training.optimizer == "sgd":
        a.append("--optimizer sgd")
    if mds:
        # DeepSpeed owns ZeRO here (deepspeed.add_config_arguments + Megatron-DeepSpeed --zero-stage)
        a += ["--deepspeed", f"--deepspeed_config {ds_config_path}", f"--zero-stage {row['zero']}"]
        if row["pp"] == 1:
            a.append("--no-pipeline-parallel")  # plain DeepSpeed engine instead of PipelineModule
        if row["recompute"] != "none":
            a.append("--deepspeed-activation-checkpointing")  # uses ds_config activation_checkpointing
            # megatron/initialize.py _set_deepspeed_activation_checkpointing passes args.partition_activations
            # to deepspeed.checkpointing.configure, which sets it over the config's key: the flag decides
            if training.zero_config.partition_activations and row["tp"] > 1:
                a.append("--partition-activations")
            if training.zero_config.cpu_checkpointing:
                # passed as checkpoint_in_cpu to the same configure call, over the config's cpu_checkpointing
                # (store_true: without it DeepSpeed keeps the checkpointed inputs on the GPU)
                a.append("--checkpoint-in-cpu")
    else:
        if row["zero"] >= 1:
            a.append("--use-distributed-optimizer")  # Megatron's ZeRO-1-like optimizer-state sharding
        if row["offload_optimizer"] != "none":
            # megatron-core 0.16.1 OptimizerConfig optimizer_cpu_offload, optimizer_offload_fraction
            # (Training.optimizer_offload_fraction) and use_precision_aware_optimizer, under which the
            # HybridDeviceOptimizer steps the 16-bit shards and the GPU keeps no fp32 main parameter
            # (distrib_optimizer.py _build_model_and_main_param_groups); Megatron-LM d98e8a6's parser takes
            # them (data/references/megatron_cli.json)
            a += ["--optimizer-cpu-offload", f"--optimizer-offload-fraction {training.optimizer_offload_fraction!r}"]
        if row["offload_optimizer"] != "none" or training.precision == "bf16-pure":
            a.append("--use-precision-aware-optimizer")
        if training.precision == "bf16-pure":  # Engine.precision_aware_optimizer: bf16 grads and moments
            a += ["--main-grads-dtype bf16", "--exp-avg-dtype bf16", "--exp-avg-sq-dtype bf16"]
        # the overlaps the planner's step time assumes (timing.py overlapped_dp_s); Megatron-LM
        # training/arguments.py: --overlap-param-gather needs --use-distributed-optimizer
        if row["rank_order"] == "tp-cp-pp-dp":  # training/initialize.py: order 'tp-cp-ep-pp-dp'
            a.append("--use-tp-pp-dp-mapping")
        # the embedding and the loss count as a block each (a layout places them itself)
        if training.pipeline_edge_layers and row["pp"] > 1 and not pipeline_layout(model, training, row["pp"],
                                                                                    row["vpp"]):
            a += ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
        if not training.overlap_p2p and row["pp"] > 1 and row["vpp"] > 1:
            a.append("--no-overlap-p2p-communication")  # on by default with interleaving
        if training.grad_reduce_in_bf16:
            a.append("--grad-reduce-in-bf16")  # training/arguments.py: main grads and their reduction in bf16
        if training.tp_comm_overlap and row["sequence_parallel"]:
            a.append("--tp-comm-overlap")  # needs --sequence-parallel and TransformerEngine
        if bool(training.overlaps_grad_reduce(row["zero"])):
            a.append("--overlap-grad-reduce")
            if row["zero"] >= 1:
                a.append("--overlap-param-gather")
    return a


def _recompute_and_precision_args(training: Training, row: dict, mds: bool) -> list[str]:
    """Recompute, the 16-bit format and FP8, FlashAttention, the fused loss."""
    a = []
    if row["recompute"] == "selective":
        a.append("--recompute-granularity selective")
        if training.recompute_modules != DEFAULT_RECOMPUTE_MODULES:  # TransformerConfig.recompute_modules
            a.append("--recompute-modules " + " ".join(training.recompute_modules))
    elif row["recompute"] == "full":
        method, layers = recompute_method_args(row)
        a += ["--recompute-granularity full", f"--recompute-method {method}", f"--recompute-num-layers {layers}"]
    if training.precision in ("bf16", "bf16-pure"):
        a.append("--bf16")
    elif training.precision == "fp16":
        a.append("--fp16")
    if training.fp8_recipe is not None:
        # Megatron-LM d98e8a6 transformer_config.py: fp8 (--fp8-format) has no default and switches FP8
        # on; 'hybrid' is e4m3 forward and e5m2 gradients, what NeMo's FP8 recipes run
        a += ["--fp8-format hybrid", f"--fp8-recipe {training.fp8_recipe}"]
        if training.fp8_param_gather and row["zero"] >= 1:  # arguments.py: only with the distributed optimizer
            a.append("--fp8-param-gather")
    if training.flash_attention:
        # Megatron-DeepSpeed f4157be megatron/arguments.py: --use-flash-attn is --use-flash-attn-v1, whose
        # ParallelAttention asserts flash_attn_unpadded_func (flash-attn 1.x); v2 is flash_attn_varlen_func
        a.append("--use-flash-attn-v2" if mds else "--use-flash-attn")
    if not mds:
        # the loss the plan books (data/coefficients.json logits_bytes_per_element, 10 B a logit, measured:
        # data/references/megatron_loss_cpu.json): megatron-core's fused vocab-parallel cross entropy, as
        # NeMo's GPTConfig (cross_entropy_loss_fusion True) and Megatron-Bridge's performance guide run it;
        # Megatron-LM's default, the unfused one, peaks at 6 B a logit
        a.append("--cross-entropy-loss-fusion")
    return a


def megatron_environment(cluster: Cluster, training: Training, row: dict) -> list[str]:
    """The environment Megatron's TP overlaps the plan assumes need: kernels issued in the order
    called, so each async all-gather or reduce-scatter starts before the GEMM it hides behind
    (megatron-core 0.16.1 tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication:
    "requires that the environment variable CUDA_DEVICE_MAX_CONNECTIONS=1"); and, for
    --tp-comm-overlap below compute capability 9.0, Userbuffers over CUDA IPC (TransformerEngine
    2.20.2 pytorch/module/base.py initialize_ub raises without CUDA multicast unless UB_SKIPMC=1)."""
    lines = []
    # Megatron-LM d98e8a6 training/arguments.py validate_args asserts it for TP or CP before compute capability 10
    if row["tp"] > 1 or row["cp"] > 1:
        lines.append("export CUDA_DEVICE_MAX_CONNECTIONS=1  # TP/CP collectives ordered before the GEMMs they hide")
        if training.tp_comm_overlap and row["sequence_parallel"] and cluster.gpu.compute_capability < 9.0:
            lines.append("export UB_SKIPMC=1  # --tp-comm-overlap: no CUDA multicast before compute capability 9.0")
    return lines


def megatron_shape_args(model: ModelSpec, mds: bool = False) -> list[str]:
    """The model's shape where Megatron-LM's defaults differ (its arguments map one to one onto
    megatron-core 0.16.1 transformer/transformer_config.py TransformerConfig: normalization
    'LayerNorm', add_bias_linear True, add_qkv_bias False, qk_layernorm False, hidden_dropout and
    attention_dropout 0.1, moe_ffn_hidden_size; models/gpt/gpt_model.py GPTModel
    share_embeddings_and_output_weights, position_embedding_type 'learned_absolute'). `mds`:
    Megatron-DeepSpeed f4157be megatron/arguments.py's spellings (_add_network_size_args: normalization
    'layernorm', --use-rotary-position-embeddings, which validate_args makes drop the learned
    positions; it has no q/k/v-only bias, QK norm or MoE width of its own)."""
    a = []
    if model.norm == "rmsnorm":
        a.append("--normalization rmsnorm" if mds else "--normalization RMSNorm")
    if model.positions == "rotary":
        a.append("--use-rotary-position-embeddings" if mds else "--position-embedding-type rope")
    if not model.bias:
        a.append("--disable-bias-linear")
        if model.qkv_bias and not mds:
            a.append("--add-qkv-bias")
    if model.qk_norm and not mds:
        a.append("--qk-layernorm")
    if not model.tied_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    if not model.dropout:
        a += ["--attention-dropout 0.0", "--hidden-dropout 0.0"]
    if model.experts > 1 and not mds:
        a.append(f"--moe-ffn-hidden-size {model.ffn}")
    return a


def recompute_method_args(row: dict) -> tuple:
    """Megatron's full recompute: the first N layers of each chunk ('block', --recompute-layers) or
    every layer in checkpoints of N ('uniform'), else every layer on its own ('uniform' chunks of 1)."""
    if not row.get("recompute_layers"):
        return ("uniform", 1)
    return (row.get("recompute_method") or "block", row["recompute_layers"])
