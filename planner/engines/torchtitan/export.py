"""torchtitan launch for a planned layout.

torchtitan 0.3.0 takes a model from its own registry (--module, --config: models/*/config_registry.py)
and the layout as overrides of its trainer's config (config/manager.py ConfigManager: tyro over
Trainer.Config, `--section.key value`; the activation-checkpoint policy is a trailing subcommand).
What this writes is parsed by torchtitan's own ConfigManager in calibrate/engines/torchtitan_cli.py, whose
recording tests/test_export.py checks against.
"""

from __future__ import annotations

import math
import shlex

from planner.errors import InputError
from planner.hardware import Cluster
from planner.layout import Training
from planner.model import ModelSpec
from planner.options import Fp8Recipe, Precision

CONFIGS = {  # catalog name -> torchtitan 0.3.0 (--module, --config) of the same shape
    "llama-3-8b": ("llama3", "llama3_8b"), "llama-3.1-8b": ("llama3", "llama3_8b"),
    "llama-3-70b": ("llama3", "llama3_70b"), "llama-3.1-70b": ("llama3", "llama3_70b"),
    "llama-3.1-405b": ("llama3", "llama3_405b"), "qwen3-30b-a3b": ("qwen3", "qwen3_30b_a3b"),
    "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b"),
}
SCHEDULES = {  # planner schedule -> ParallelismConfig.pipeline_parallel_schedule (torch.distributed.pipelining)
    "1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B", "zb-h1": "InterleavedZeroBubble"}
EDGE_WEIGHTS = 2  # pipeline_parallel_first/last_stage_less_layers: the embedding and the output count as a layer each
FLAVORS = {"llama3_8b": "8B", "llama3_70b": "70B", "llama3_405b": "405B"}  # registry config -> model_registry flavor
FP8_MODULE, FP8_CONFIG = "torchtitan_fp8", "planned_fp8"
"""The config module --emit writes beside launch.sh for FP8 linears (torchtitan 0.3.0 turns them on in
a config_registry function, not by an override; config/manager.py imports a fully qualified --module)."""


def torchtitan_args(model: ModelSpec, training: Training, row: dict) -> list[str]:
    """The trainer overrides for `row` (a normalised layout row), one "--section.key [value]" string
    each, the activation-checkpoint subcommand last. Batch: without PP, local_batch_size is the
    micro-batch and global_batch_size / (local x dp) the accumulation steps; with PP,
    local_batch_size is the rank's batch per step, split into micro-batches of
    pipeline_parallel_microbatch_size (distributed/pipeline_parallel.py)."""
    t, p, c, e, v, d, mbs = (row[k] for k in ("tp", "pp", "cp", "ep", "vpp", "dp", "mbs"))
    if row["zero"] == 0:  # DDP: replicate, no shard
        a = [f"--parallelism.data_parallel_replicate_degree {d}", "--parallelism.data_parallel_shard_degree 1"]
    else:  # FSDP2 over the data-parallel ranks; --zero 2 keeps parameters gathered from forward to backward
        a = [f"--parallelism.data_parallel_shard_degree {d}",
             f"--parallelism.fsdp_reshard_after_forward {'always' if row['zero'] == 3 else 'never'}"]
    a.append(f"--parallelism.tensor_parallel_degree {t}")
    if t > 1 and not row["sequence_parallel"]:
        a.append("--parallelism.no_enable_sequence_parallel")  # enable_sequence_parallel defaults to True
    if p > 1:
        a += [f"--parallelism.pipeline_parallel_degree {p}",
              f"--parallelism.pipeline_parallel_schedule {SCHEDULES[row['schedule'] or '1f1b']}",
              f"--parallelism.pipeline_parallel_microbatch_size {mbs}"]
        if v > 2:  # two stages per rank is the multi-stage default (pipeline_parallel.py)
            a.append(f"--parallelism.pipeline_parallel_layers_per_stage {_layers_per_stage(model.layers, p, v)}")
    if c > 1:
        a.append(f"--parallelism.context_parallel_degree {c}")
    if e > 1:
        a.append(f"--parallelism.expert_parallel_degree {e}")
    a += [f"--training.local_batch_size {mbs * row['gas'] if p > 1 else mbs}",
          f"--training.global_batch_size {mbs * row['gas'] * d}", f"--training.seq_len {training.seq_len}"]
    if p > 1 or e > 1:
        # trainer.py _validate_cuda_graphs: the default CUDA-graph capture of forward and backward takes
        # no pipeline, and no EP token dispatcher that synchronizes with the host (the default one does)
        a.append("--training.disable_cuda_graphs")
    if row["offload_optimizer"] != "none" or row["offload_params"] != "none":
        a.append("--training.enable_cpu_offload")  # FSDP2 CPUOffloadPolicy: parameters, gradients, optimizer
    a += _precision_args(training.precision)
    return a + [f"activation-checkpoint:{row['recompute']}"]


def _precision_args(precision: Precision) -> list[str]:
    """TrainingConfig: fp32 parameters (dtype) with bf16 compute (mixed_precision_param) by default."""
    if precision == Precision.BF16:
        return []
    if precision == Precision.FP32:
        return ["--training.mixed_precision_param float32"]
    if precision == Precision.BF16_PURE:
        return ["--training.dtype bfloat16"]
    raise InputError(f"--precision: torchtitan trains in bf16, bf16-pure or fp32, not {precision}")


def fp8_module(model: ModelSpec, training: Training) -> str | None:
    """torchtitan_fp8.py: the registry config of `model` with torchao's Float8Linear on every block
    linear, lm_head left in bf16, as torchtitan 0.3.0's own llama3_405b config does
    (models/llama3/config_registry.py: model_registry(flavor, converters=[Float8LinearConverter.Config(
    filter_fqns=['lm_head'], model_compile_enabled=...)])); None without FP8."""
    if training.fp8_recipe is None:
        return None
    if training.fp8_recipe is not Fp8Recipe.ROWWISE:
        raise InputError(f"--fp8-recipe {training.fp8_recipe}: the torchtitan export writes torchtitan 0.3.0, whose "
                         "float8 converter is rowwise (tensorwise is 0.2.2's; mxfp8 is its llama3_8b_mxfp8 config)")
    module, config = CONFIGS.get(model.name.lower(), (None, None))
    if config not in FLAVORS:
        raise InputError(f"--precision fp8: the torchtitan export turns FP8 on for Llama 3 8B, 70B and 405B; add "
                         f"Float8LinearConverter.Config(filter_fqns=['lm_head']) to the converters of your "
                         f"model's registry config")
    return "\n".join([
        f'"""torchtitan 0.3.0 config {config} with FP8 linears (torchao rowwise), written by planner.export."""',
        "from torchtitan.components.quantization import Float8LinearConverter",
        f"from torchtitan.models.{module} import model_registry",
        f"from torchtitan.models.{module}.config_registry import {config}",
        "", "",
        f"def {FP8_CONFIG}():",
        f"    config = {config}()",
        '    compiled = config.compile.enable and "model" in config.compile.components',
        f'    config.model_spec = model_registry("{FLAVORS[config]}", converters=[',
        '        Float8LinearConverter.Config(filter_fqns=["lm_head"], model_compile_enabled=compiled)])',
        "    return config", ""])


def _layers_per_stage(layers: int, pp: int, vpp: int) -> int:
    """pipeline_parallel_layers_per_stage giving vpp stages per rank: num_virtual_stages =
    ceil((layers + first and last weights) / layers_per_stage) must be pp x vpp; the smallest such
    size (planner/rules.py stages_by_weight_exist refuses layouts with none)."""
    return math.ceil((layers + EDGE_WEIGHTS) / (pp * vpp))


def launch_script(model: ModelSpec, cluster: Cluster, training: Training, row: dict, master_port: int,
                  environment: list[str] = ()) -> str:
    """launch.sh: torchrun -m torchtitan.train with the model's registry entry (or the user's, through
    TORCHTITAN_MODULE / TORCHTITAN_CONFIG where the catalog has none) and the layout's overrides;
    `environment`: export lines the plan assumes (export.allocator_environment)."""
    per_node, nodes = cluster.gpus_per_host, cluster.num_hosts  # torchrun runs per host
    module, config = CONFIGS.get(model.name.lower(), (None, None))
    if fp8_module(model, training) is not None:
        module, config = FP8_MODULE, FP8_CONFIG
    lines = ["#!/usr/bin/env bash",
             "# torchtitan launch written by planner.export (torchtitan 0.3.0 trainer overrides).",
             # torchtitan 0.3.0 distributed/utils.py set_pg_timeouts calls dist.set_timeout, and
             # full_dtensor.py resolve_fsdp_mesh hands FSDP spmd_types parameters: both torch 2.14's
             "# torchtitan 0.3.0 needs torch >= 2.14 (dist.set_timeout; FSDP over spmd_types parameters).",
             f"# model: {' '.join(model.name.split())} (L={model.layers} h={model.hidden} heads={model.heads})",
             f"# cluster: {cluster.num_gpus} x {' '.join(cluster.gpu.name.split())}, {nodes} node(s) of {per_node}",
             "# Multi-node: run on every node with NODE_RANK=<0..N-1> and MASTER_ADDR=<node 0>.",
             "set -euo pipefail",
             'NODE_RANK="${NODE_RANK:-0}"', 'MASTER_ADDR="${MASTER_ADDR:-localhost}"',
             f'MASTER_PORT="${{MASTER_PORT:-{int(master_port)}}}"']
    lines += environment  # run_train.sh sets expandable segments too
    if module == FP8_MODULE:  # the config module written beside this script
        lines.append('export PYTHONPATH="$(cd "$(dirname "$0")" && pwd)${PYTHONPATH:+:$PYTHONPATH}"')
    if module:
        lines += [f'TORCHTITAN_MODULE="${{TORCHTITAN_MODULE:-{module}}}"', f'TORCHTITAN_CONFIG="${{TORCHTITAN_CONFIG:-{config}}}"']
    else:
        lines += ['# no torchtitan registry entry of this shape: name the one you built (models/*/config_registry.py)',
                  ': "${TORCHTITAN_MODULE:?set TORCHTITAN_MODULE and TORCHTITAN_CONFIG}"',
                  ': "${TORCHTITAN_CONFIG:?set TORCHTITAN_MODULE and TORCHTITAN_CONFIG}"']
    lines.append("TORCHTITAN_ARGS=(")
    lines += ["  " + " ".join(shlex.quote(w) for w in arg.split(" ")) for arg in torchtitan_args(model, training, row)]
    lines += [")",
              f'exec torchrun --nproc_per_node {per_node} --nnodes {nodes} --node_rank "$NODE_RANK"'
              ' --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" -m torchtitan.train'
              ' --module "$TORCHTITAN_MODULE" --config "$TORCHTITAN_CONFIG" "${TORCHTITAN_ARGS[@]}" "$@"', ""]
    return "\n".join(lines)
