"""Megatron arguments, checked by the real parsers.

data/references/megatron_cli.json: planner.export.megatron_args (and megatron_environment's exports)
for the layouts in calibrate/engines/megatron_cli.py CASES, parsed and validated by Megatron-LM d98e8a6
(training/arguments.py parse_args, validate_args, then TransformerConfig) and Megatron-DeepSpeed
f4157be (megatron/arguments.py parse_args, validate_args), from their source trees
(python -m calibrate.engines.megatron_cli; neither is a test dependency). Each test rebuilds what planner
writes now, checks it is what was parsed, and that the parse says what the layout means.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate.engines.megatron_cli import BASE, CASES, ZERO_CONFIG
from planner.errors import InputError
from planner.export import normalise_row, megatron_args, megatron_environment
from planner.hardware import Cluster, lookup_gpu
from planner.layout import Training, ZeroConfig
from planner.model import lookup, with_overrides
from planner.pipeline import interleaved_layers

RECORD = json.loads((Path(__file__).resolve().parent.parent / "data/references/megatron_cli.json").read_text())
ROWS = RECORD["rows"]


def case_id(case):
    row = case["row"]
    return f"{case['engine']}-{case['model']}-{case['precision']}-" + "-".join(
        f"{k}{row[k]}" for k in ("tp", "pp", "vpp", "cp", "ep", "dp", "zero")) + f"-{row['recompute']}"


def model_of(case):
    """The case's catalog model with its overrides (multi-token prediction)."""
    return with_overrides(lookup(case["model"]), **case.get("model_overrides", {}))


def rebuild(case):
    """The Training, cluster and row the case was recorded with, as planner builds them now."""
    row = case["row"]
    gpus = row["tp"] * row["pp"] * row["cp"] * row["dp"]
    training = Training(engine=case["engine"], seq_len=4096, precision=case["precision"],
                        zero_config=ZeroConfig(**case["zero_config"]), **case["training"])
    return training, Cluster(lookup_gpu(case["gpu"]), gpus, min(gpus, 8)), row


def test_the_record_covers_every_case():
    # the record is the parse of calibrate/engines/megatron_cli.py's case list, one row each, in order
    assert len(ROWS) == len(CASES)
    for case, (engine, name, precision, changes, row_changes) in zip(ROWS, CASES):
        name, overrides = (name, {}) if isinstance(name, str) else name
        assert (case["engine"], case["model"], case["precision"]) == (engine, name, precision)
        assert case.get("model_overrides", {}) == overrides
        assert case["row"] == normalise_row({**BASE, **row_changes})
        assert case["training"] == {k: v for k, v in changes.items() if k not in ("gpu", *ZERO_CONFIG)}
    assert set(RECORD["commits"]) == {"NVIDIA/Megatron-LM", "microsoft/Megatron-DeepSpeed"}


@pytest.mark.parametrize("case", ROWS, ids=case_id)
def test_what_was_parsed_is_what_planner_writes(case):
    training, cluster, row = rebuild(case)
    model = model_of(case)
    assert megatron_args(model, training, row, ds_config_path="ds_config.json") == case["args"]
    exports = [line.split("#")[0].split()[1] for line in megatron_environment(cluster, training, row)]
    assert dict(kv.split("=", 1) for kv in exports) == case["environment"]
    assert "error" not in case["parsed"], case["parsed"]


def _recompute(row):
    """(granularity, method, layers) the row asks of Megatron: full recompute is every layer on its own
    ('uniform' chunks of 1) unless the row names a count (then its method, 'block' by default)."""
    if row["recompute"] == "none":
        return None, None
    if row["recompute"] == "selective":
        return "selective", None
    if not row["recompute_layers"]:
        return "full", ("uniform", 1)
    return "full", (row["recompute_method"] or "block", row["recompute_layers"])


@pytest.mark.parametrize("case", [c for c in ROWS if c["engine"] == "megatron"], ids=case_id)
def test_megatron_lm_parses_the_layout(case):
    training, cluster, row = rebuild(case)
    model, parsed = model_of(case), case["parsed"]
    a, config = parsed["args"], parsed["config"]
    tp, pp, cp, ep, dp, vpp = (row[k] for k in ("tp", "pp", "cp", "ep", "dp", "vpp"))
    assert [a[k] for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                           "expert_model_parallel_size")] == [tp, pp, cp, ep]
    # validate_args: data_parallel_size = world_size // (tp x pp x cp), the ranks torchrun starts
    assert a["world_size"] == tp * pp * cp * dp and a["data_parallel_size"] == a["world_size"] // (tp * pp * cp) == dp
    # interleaving: (80 layers / pp) / layers per virtual stage = vpp chunks a rank, or a layout's
    # entries / pp where the blocks do not split evenly (61 on 4 x 4); none without it
    layout = next((x.split()[1] for x in case["args"] if x.startswith("--pipeline-model-parallel-layout ")), None)
    if layout:  # megatron-core PipelineParallelLayerLayout: one entry a virtual stage, E first, L last
        stages = layout.split("|")
        assert len(stages) == pp * vpp and "".join(stages).count("t") == model.layers
        assert layout.startswith("E") and layout.endswith("L") and a["num_layers_per_virtual_pipeline_stage"] is None
        assert stages[-1].count("m") == layout.count("m") == model.mtp_layers  # MTP depths in the last stage
    if vpp > 1 and not layout:
        # the edge slots count as layers (--account-for-embedding/loss-in-pipeline-split): 405B's
        # (126 + 2) / 16 = 8 a stage, 4 a virtual stage
        assert (interleaved_layers(model, training) // pp) // a["num_layers_per_virtual_pipeline_stage"] == vpp
    if vpp > 1:
        assert a["virtual_pipeline_model_parallel_size"] == config["virtual_pipeline_model_parallel_size"] == vpp
        assert a["overlap_p2p_comm"] == training.overlap_p2p
    else:
        assert a["virtual_pipeline_model_parallel_size"] is None and not a["overlap_p2p_comm"]
    assert a["sequence_parallel"] == config["sequence_parallel"] == (row["sequence_parallel"] and tp > 1)
    assert a["use_distributed_optimizer"] == (row["zero"] >= 1)  # --zero 1: sharded fp32 main params and Adam
    # batch: global = mbs x gas x dp, so Megatron's micro-batches a step = global / (mbs x dp) = gas
    assert a["micro_batch_size"] == row["mbs"] and a["global_batch_size"] == row["mbs"] * row["gas"] * dp
    assert a["global_batch_size"] // (a["micro_batch_size"] * a["data_parallel_size"]) == row["gas"]
    assert a["seq_length"] == 4096 and a["num_layers"] == model.layers and a["hidden_size"] == model.hidden
    assert a["mtp_num_layers"] == config["mtp_num_layers"] == (model.mtp_layers or None)
    # the loss the plan books: megatron-core's fused native cross entropy (data/coefficients.json)
    assert (a["cross_entropy_loss_fusion"], a["cross_entropy_fusion_impl"]) == (True, "native")
    granularity, full = _recompute(row)
    assert a["recompute_granularity"] == config["recompute_granularity"] == granularity
    # selective reruns the modules the plan lists (TransformerConfig.recompute_modules, default core_attn)
    assert granularity != "selective" or config["recompute_modules"] == list(training.recompute_modules)
    # the experts' GEMMs as the plan times them: one grouped GEMM, or one per local expert
    assert model.experts == 1 or a["moe_grouped_gemm"] == training.moe_grouped_gemm
    if full:
        assert (a["recompute_method"], a["recompute_num_layers"]) == full
        assert (config["recompute_method"], config["recompute_num_layers"]) == full
    else:
        assert a["recompute_method"] is None
    precision = case["precision"]
    dtype = {"fp32": "torch.float32", "fp16": "torch.float16"}.get(precision, "torch.bfloat16")
    assert (a["bf16"], a["fp16"], a["params_dtype"]) == (dtype == "torch.bfloat16", precision == "fp16", dtype)
    pure = precision == "bf16-pure"  # bf16 main grads and Adam moments (the precision-aware optimizer)
    assert a["main_grads_dtype"] == a["exp_avg_dtype"] == a["exp_avg_sq_dtype"] == (
        "torch.bfloat16" if pure else "torch.float32")
    offload = row["offload_optimizer"] != "none"
    assert a["optimizer_cpu_offload"] == offload and a["use_precision_aware_optimizer"] == (offload or pure)
    if offload:
        assert a["optimizer_offload_fraction"] == training.optimizer_offload_fraction
    # FP8: TE's hybrid format (e4m3 forward, e5m2 gradients) under the planned recipe; the parameters FP8
    # themselves where the distributed optimizer gathers them (planner/fp8.py param_gather)
    fp8 = training.fp8_recipe is not None
    assert a["fp8"] == config["fp8"] == ("hybrid" if fp8 else None)
    if fp8:
        assert a["fp8_recipe"] == config["fp8_recipe"] == str(training.fp8_recipe)
    gather = bool(training.fp8_param_gather) and row["zero"] >= 1
    assert a["fp8_param_gather"] == config["fp8_param"] == gather
    experts = model.experts if model.experts > 1 else None
    assert a["num_experts"] == config["num_moe_experts"] == experts
    if experts:
        assert a["moe_router_topk"] == model.experts_per_token and a["moe_ffn_hidden_size"] == model.ffn
        assert a["moe_token_dispatcher_type"] == "alltoall"  # what the planner times
        # 1 for every block, else the 0/1 list: dense blocks first (DeepSeek-V3's 3 of 61)
        assert a["moe_layer_freq"] == (1 if model.moe_layers == model.layers else
                                       [int(model.is_routed(i)) for i in range(model.layers)])
    assert config["class"] == ("MLATransformerConfig" if model.kv_lora_rank else "TransformerConfig")
    if model.kv_heads < model.heads and not model.kv_lora_rank:
        assert a["group_query_attention"] and a["num_query_groups"] == model.kv_heads
    # the Llama shape, where Megatron-LM's defaults (LayerNorm, learned positions, biases) differ
    assert (a["normalization"], a["position_embedding_type"], a["add_bias_linear"]) == ("RMSNorm", "rope", False)
    # validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS=1 for TP or CP before compute capability 10
    if (tp > 1 or cp > 1) and cluster.gpu.compute_capability < 10:
        assert case["environment"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


@pytest.mark.parametrize("case", [c for c in ROWS if c["engine"] == "megatron-deepspeed"], ids=case_id)
def test_megatron_deepspeed_parses_the_layout(case):
    training, _, row = rebuild(case)
    model, a = model_of(case), case["parsed"]["args"]
    tp, pp, cp, ep, dp = (row[k] for k in ("tp", "pp", "cp", "ep", "dp"))
    # CP is DeepSpeed-Ulysses here: --ds-sequence-parallel-size, a model-parallel axis of its own
    assert [a[k] for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                           "ds_sequence_parallel_size")] == [tp, pp, cp]
    # validate_args: data_parallel_size = world_size // (pp x tp x sp)
    assert a["world_size"] == tp * pp * cp * dp and a["data_parallel_size"] == a["world_size"] // (tp * pp * cp) == dp
    assert a["ds_pipeline_enabled"] == (pp > 1)  # --no-pipeline-parallel: the plain engine, no PipelineModule
    assert a["virtual_pipeline_model_parallel_size"] is None  # DeepSpeed's pipeline is 1F1B only
    assert a["sequence_parallel"] == (row["sequence_parallel"] and tp > 1)
    # DeepSpeed owns ZeRO and the optimizer state (ds_config.json), not Megatron's distributed optimizer
    assert (a["deepspeed"], a["deepspeed_config"], a["zero_stage"]) == (True, "ds_config.json", row["zero"])
    assert not a["use_distributed_optimizer"]
    assert a["micro_batch_size"] == row["mbs"] and a["global_batch_size"] == row["mbs"] * row["gas"] * dp
    assert a["global_batch_size"] // (a["micro_batch_size"] * a["data_parallel_size"]) == row["gas"]
    granularity, full = _recompute(row)
    assert a["recompute_granularity"] == granularity
    if full:
        assert (a["recompute_method"], a["recompute_num_layers"]) == full
    # recompute runs through deepspeed.checkpointing, whose partitioning and host copy the flags decide
    assert a["deepspeed_activation_checkpointing"] == (granularity is not None)
    zero = training.zero_config
    assert a["partition_activations"] == (granularity is not None and zero.partition_activations and tp > 1)
    assert a["checkpoint_in_cpu"] == (granularity is not None and zero.cpu_checkpointing)
    precision = case["precision"]
    dtype = {"fp32": "torch.float32", "fp16": "torch.float16"}.get(precision, "torch.bfloat16")
    assert (a["bf16"], a["fp16"], a["params_dtype"]) == (dtype == "torch.bfloat16", precision == "fp16", dtype)
    assert a["num_layers"] == model.layers and a["seq_length"] == 4096
    # the model is the one planned (Llama: RMSNorm, rotary, no biases, untied), not its GPT defaults
    assert (a["normalization"], a["use_rotary_position_embeddings"], a["add_bias_linear"],
            a["untie_embeddings_and_output_weights"], a["swiglu"]) == (
        model.norm, model.positions == "rotary", model.bias, not model.tied_embeddings, model.ffn_kind == "swiglu")
    # FlashAttention 2 (flash_attn_varlen_func): its --use-flash-attn is v1, which flash-attn 2 cannot import
    assert (a["use_flash_attn_v1"], a["use_flash_attn_v2"]) == (False, training.flash_attention)
    assert a["num_key_value_heads"] == model.kv_heads  # its GQA argument (no --group-query-attention)
    if model.experts > 1:  # DeepSpeed-MoE: one expert count for every MoE layer, its top-k, its EP size
        assert (a["num_experts"], a["topk"], a["moe_expert_parallel_size"]) == ([model.experts],
                                                                               model.experts_per_token, ep)
    else:
        assert a["num_experts"] == [1] and a["moe_expert_parallel_size"] == 1


def test_fp8_parameters_beside_optimizer_offload_need_delayed_scaling():
    # Megatron-LM d98e8a6 training/arguments.py validate_args: with --fp8-param-gather, --optimizer-cpu-offload
    # needs --fp8-recipe delayed (the record's offload cases are delayed, or tensorwise without the gather):
    # a rule (planner/rules.py), so neither estimate nor recommend's search answers with that layout
    from planner import api

    layout = {"dp": 8, "zero": 1, "offload_optimizer": "cpu"}
    with pytest.raises(InputError, match="^--fp8-param-gather: .* --fp8-recipe delayed"):
        api.estimate("llama-3-8b", {"gpus": 8}, {"engine": "megatron", "fp8_recipe": "tensorwise"}, layout)
    assert api.estimate("llama-3-8b", {"gpus": 8}, {"engine": "megatron", "fp8_recipe": "tensorwise",
                                                    "fp8_param_gather": False}, layout).memory["gpu_bytes"] > 0
    row = normalise_row({**BASE, "offload_optimizer": "cpu"})
    delayed = Training(engine="megatron", seq_len=4096, precision="fp8", fp8_recipe="delayed")
    assert "--fp8-param-gather" in megatron_args(lookup("llama-3-8b"), delayed, row)


def test_layout_blocks_per_rank_are_the_planners_split():
    """Megatron-LM parsed these layouts (61 DeepSeek-V3 blocks on 4 x 4 virtual stages and on 16
    stages); the blocks each pipeline rank builds under them (its entries s, s + p, ...) are what
    pipeline.layers_on_stage books for the rank, so memory and step time read the split that runs."""
    from planner.pipeline import layers_on_stage

    cases = [c for c in ROWS if any(a.startswith("--pipeline-model-parallel-layout ") for a in c["args"])]
    assert len(cases) == 3  # DeepSeek-V3 on 4 x 4 virtual stages (with and without MTP) and on 16
    for case in cases:
        row, model = case["row"], model_of(case)
        edge = case["training"].get("pipeline_edge_layers", 0)
        stages = next(a.split()[1] for a in case["args"] if a.startswith("--pipeline-model-parallel-layout ")).split("|")
        p = row["pp"]
        built = [sum(stages[i].count("t") for i in range(s, len(stages), p)) for s in range(p)]
        assert built == [int(layers_on_stage(model.layers, p, s, edge)) for s in range(p)]
