"""Write ready-to-run launch configs for one planned layout.

`emit(out_dir, model, cluster, training, layout_row)` writes, atomically:

* ``ds_config.json``        DeepSpeed config (engines deepspeed and megatron-deepspeed)
* ``accelerate_config.yaml`` Accelerate config (DEEPSPEED, FSDP or MEGATRON_LM)
* ``launch.sh``             the launch commands (accelerate / deepspeed / torchrun), executable
* ``megatron_args.txt``     Megatron arguments, one per line (Megatron engines, or tp/pp/cp > 1)
* ``plan.json``             what the planner assumed (planner/plan_file.py), read back by `planner check DIR`

Pure stdlib: no torch, deepspeed, yaml or accelerate import (the YAML is written by hand). The
files are checked against DeepSpeed 0.19 and Accelerate 1.16 by tests/test_export.py, which load
them with those libraries' own loaders.

Sources of the keys (paths relative to the installed packages):

* DeepSpeed: deepspeed/runtime/config.py (batch keys, optimizer, gradient_clipping, ...),
  deepspeed/runtime/zero/config.py and zero/offload_config.py (``zero_optimization``: pydantic
  models with ``extra='forbid'``, so every key below is one DeepSpeed declares),
  deepspeed/runtime/precision_config.py (``bf16``/``fp16``, also ``extra='forbid'``),
  deepspeed/runtime/activation_checkpointing/config.py (``activation_checkpointing``).
* Accelerate: accelerate/commands/config/config_args.py (ClusterConfig fields),
  accelerate/commands/launch.py (how ``deepspeed_config``/``fsdp_config``/``megatron_lm_config``
  keys become launch arguments), accelerate/utils/dataclasses.py (DeepSpeedPlugin,
  FullyShardedDataParallelPlugin).
* Megatron-LM: megatron/training/arguments.py; Megatron-DeepSpeed: megatron/arguments.py.

Each engine's own files are written in its room: ds_config.json by planner/engines/deepspeed/export.py,
the Megatron arguments by planner/engines/megatron/export.py, the FSDP plugin block by
planner/engines/fsdp/export.py, torchtitan's launch.sh by planner/engines/torchtitan/export.py.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from planner import plan_file
from planner.data import atomic_write
from planner.engines import Launcher
from planner.errors import InputError
from planner.hardware import Cluster
from planner.layout import Training, single
from planner.model import ModelSpec
from planner.rules import check_single
from planner.engines.deepspeed.export import DS_CONFIG, DS_DEFAULTS, deepspeed_config
from planner.engines.fsdp.export import fsdp_plugin_config
from planner.engines.megatron.export import megatron_args, megatron_environment, recompute_method_args

ACCELERATE_CONFIG = "accelerate_config.yaml"
LAUNCH = "launch.sh"
MEGATRON_ARGS = "megatron_args.txt"

_ROW_KEYS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "zero", "offload_optimizer", "offload_params",
             "mbs", "gas", "recompute", "recompute_layers", "recompute_method", "sequence_parallel", "rank_order")

# keys of `extra` that change the files; any other key is copied into launch.sh as a comment line
EXTRA_DEFAULTS = {
    "train_script": "train.py",          # the user's training script (accelerate / deepspeed lines)
    "megatron_script": "pretrain_gpt.py",  # Megatron-LM / Megatron-DeepSpeed entry point
    "master_port": 29500,
    **DS_DEFAULTS,                       # ds_config.json's (engines/deepspeed/export.py)
}


# ---------------------------------------------------------------------------------------------
# public entry point

def emit(out_dir, model: ModelSpec, cluster: Cluster, training: Training, layout_row: dict,
         extra: dict | None = None) -> list[Path]:
    """Write the launch configs for `layout_row` (a `Layouts.row(i)` dict) into `out_dir`.

    Returns the written paths in writing order. Existing files of the same names are replaced
    atomically (temp file in `out_dir`, then os.replace); other files are left alone. Raises
    InputError if the layout breaks a planner rule, or "--emit: ..." if `out_dir` cannot be
    created or written.
    """
    files = render(model, cluster, training, layout_row, extra, check_only=True)  # bad input fails before mkdir
    out = Path(out_dir).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise InputError(f"--emit: {str(out)!r} exists and is not a directory") from None
    except OSError as exc:
        raise InputError(f"--emit: cannot create directory {str(out)!r}: {exc.strerror or exc}") from None
    if not out.is_dir():
        raise InputError(f"--emit: {str(out)!r} exists and is not a directory")
    out = out.resolve()
    files = render(model, cluster, training, layout_row, extra, directory=out)
    # the plan last: `planner check DIR` reads the model, sequence and recompute no config file states
    row = normalise_row(layout_row)
    files.append((plan_file.PLAN, plan_file.render(model, cluster, training, row, recompute_where(model, training, row)),
                  0o644))
    written = []
    for name, text, mode in files:
        path = out / name
        atomic_write(path, text, mode, flag="--emit")
        written.append(path)
    return written


def render(model: ModelSpec, cluster: Cluster, training: Training, layout_row: dict, extra: dict | None = None,
           directory: Path | None = None, check_only: bool = False) -> list[tuple[str, str, int]]:
    """The launch configs of `layout_row` as (file name, text, mode), in writing order, without
    writing anything (the app's downloads). Paths inside the files point into `directory`, or are
    bare file names when it is None. check_only: raise on bad input, return []."""
    row = normalise_row(layout_row)
    opts = dict(EXTRA_DEFAULTS)
    opts.update(extra or {})
    check_row(model, cluster, training, row)
    if training.engine.launcher is Launcher.TORCHTITAN:  # its trainer's own overrides (planner/engines/torchtitan/export.py)
        from planner.engines.torchtitan import export as export_torchtitan

        script = export_torchtitan.launch_script(model, cluster, training, row, opts["master_port"],
                                                 allocator_environment(training))
        fp8_config = export_torchtitan.fp8_module(model, training)
        extra_files = [] if fp8_config is None else [(export_torchtitan.FP8_MODULE + ".py", fp8_config, 0o644)]
        return [] if check_only else [(LAUNCH, script, 0o755), *extra_files]
    if check_only:
        return []
    ds_path = Path(DS_CONFIG) if directory is None else directory / DS_CONFIG
    files: list[tuple[str, str, int]] = []
    if training.engine.deepspeed:
        ds = deepspeed_config(model, cluster, training, row, opts)
        files.append((DS_CONFIG, json.dumps(ds, indent=2) + "\n", 0o644))
    if accelerate_drives(training, row):
        files.append((ACCELERATE_CONFIG, accelerate_yaml(model, cluster, training, row, ds_path), 0o644))
    files.append((LAUNCH, launch_script(model, cluster, training, row, opts), 0o755))
    if _wants_megatron(training, row):
        args = megatron_args(model, training, row, ds_config_path=str(ds_path))
        files.append((MEGATRON_ARGS, "".join(a + "\n" for a in args), 0o644))
    return files


# ---------------------------------------------------------------------------------------------
# DeepSpeed


# ---------------------------------------------------------------------------------------------
# Accelerate

def accelerate_config(model: ModelSpec, cluster: Cluster, training: Training, row: dict,
                      ds_config_path) -> dict:
    """The accelerate_config.yaml content as a dict (ClusterConfig fields)."""
    nodes = cluster.num_hosts  # Accelerate's machines are hosts (an NVL72 rack: 18 of 4 GPUs)
    mixed = "fp8" if training.fp8_recipe else {"bf16": "bf16", "bf16-pure": "bf16", "fp16": "fp16", "fp32": "no"}[training.precision]
    cfg: dict = {"compute_environment": "LOCAL_MACHINE", "debug": False}
    if training.engine.deepspeed:
        cfg["distributed_type"] = "DEEPSPEED"
        ds: dict = {
            # accelerate/utils/launch.py exports it as ACCELERATE_DEEPSPEED_CONFIG_FILE; DeepSpeedPlugin
            # opens it from the training process's working directory, so write it absolute.
            "deepspeed_config_file": str(ds_config_path),
            # DeepSpeedPlugin.zero3_init_flag: build the model under deepspeed.zero.Init (stage 3 only;
            # Accelerate warns and ignores it for other stages)
            "zero3_init_flag": row["zero"] == 3,
        }
        if nodes > 1:
            # accelerate launch: DEEPSPEED_MULTINODE_LAUNCHERS[1] = "standard" runs torchrun on every
            # node (the default "pdsh" needs passwordless ssh and a hostfile)
            ds["deepspeed_multinode_launcher"] = "standard"
        cfg["deepspeed_config"] = ds
        # No mixed_precision key: with deepspeed_config_file, accelerate launch adds a config-file
        # mixed_precision to ACCELERATE_CONFIG_DS_FIELDS and DeepSpeedPlugin._deepspeed_config_checks
        # then raises ValueError. AcceleratorState.mixed_precision reads bf16/fp16 from ds_config.json.
    elif training.engine.launcher is Launcher.FSDP:
        cfg["distributed_type"] = "FSDP"
        cfg["fsdp_config"] = fsdp_plugin_config(cluster, training, row)
        if (row["tp"] > 1 or row["cp"] > 1) and cfg["fsdp_config"]["fsdp_version"] == 2:
            # accelerate/utils/launch.py prepare_extend_env_parallelism_config (FSDP2 only); keys are
            # copied verbatim to launch args, so they carry the parallelism_config_ prefix
            shard = row["dp"] if row["zero"] > 0 else 1
            cfg["parallelism_config"] = {
                "parallelism_config_dp_replicate_size": row["dp"] // shard,
                "parallelism_config_dp_shard_size": shard,
                "parallelism_config_tp_size": row["tp"],
                "parallelism_config_cp_size": row["cp"],
            }
        cfg["mixed_precision"] = mixed
        if training.fp8_recipe is not None:
            # accelerate 1.16 commands/launch.py --fp8_backend te (fp8_config keys gain the fp8_ prefix):
            # utils/transformer_engine.py convert_model swaps nn.Linear for te.Linear, TERecipeKwargs
            # builds DelayedScaling (fp8_format HYBRID by default)
            cfg["fp8_config"] = {"backend": "TE", "fp8_format": "HYBRID"}
    else:  # megatron
        cfg["distributed_type"] = "MEGATRON_LM"
        # accelerate/commands/launch.py "Megatron-LM Arguments" (megatron_lm_* names)
        mlm = {
            "megatron_lm_tp_degree": row["tp"],
            "megatron_lm_pp_degree": row["pp"],
            "megatron_lm_num_micro_batches": row["gas"],
            "megatron_lm_sequence_parallelism": bool(row["sequence_parallel"]),
            "megatron_lm_recompute_activations": row["recompute"] != "none",
            "megatron_lm_use_distributed_optimizer": row["zero"] >= 1,
            "megatron_lm_gradient_clipping": 1.0,
        }
        if row["recompute"] != "none":
            mlm["megatron_lm_recompute_granularity"] = row["recompute"]
        if row["recompute"] == "full":  # accelerate utils/dataclasses.py MegatronLMPlugin recompute_method
            mlm["megatron_lm_recompute_method"], mlm["megatron_lm_recompute_num_layers"] = recompute_method_args(row)
        if row["cp"] > 1:
            mlm["megatron_lm_context_parallel_size"] = row["cp"]
        if row["ep"] > 1:
            mlm["megatron_lm_expert_model_parallel_size"] = row["ep"]
        cfg["megatron_lm_config"] = mlm
        cfg["mixed_precision"] = mixed
    if training.compile:
        # accelerate/commands/config/config_args.py ClusterConfig.dynamo_config: accelerate launch sets
        # ACCELERATE_DYNAMO_BACKEND and Accelerator.prepare torch.compiles the model with Inductor
        cfg["dynamo_config"] = {"dynamo_backend": "INDUCTOR"}
    cfg.update({
        "machine_rank": 0,
        "main_training_function": "main",
        "num_machines": nodes,
        "num_processes": cluster.num_gpus,  # total processes over all machines (ClusterConfig)
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
    })
    return cfg


def accelerate_yaml(model, cluster, training, row, ds_config_path) -> str:
    cfg = accelerate_config(model, cluster, training, row, ds_config_path)
    head = ("# Accelerate config written by planner.export; load with\n"
            "#   accelerate launch --config_file accelerate_config.yaml <script>\n")
    if cfg.get("distributed_type") == "MEGATRON_LM" and row["offload_optimizer"] != "none":
        # accelerate utils/dataclasses.py MegatronLMPlugin has no megatron_lm_* key for it
        head += ("# the optimizer offload (--optimizer-cpu-offload --optimizer-offload-fraction\n"
                 "# --use-precision-aware-optimizer, megatron_args.txt) has no key here: pass it in\n"
                 "# MegatronLMPlugin(other_megatron_args=...)\n")
    return head + _to_yaml(cfg)


_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./-]*$")
_YAML_SPECIAL = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "none", "~"}


def _yaml_scalar(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    s = str(v)
    if _PLAIN.match(s) and s.lower() not in _YAML_SPECIAL:
        return s
    # a JSON string is a valid YAML double-quoted scalar (e.g. 'no' would otherwise load as False)
    return json.dumps(s)


def _to_yaml(d: dict, indent: int = 0) -> str:
    lines = []
    pad = "  " * indent
    for k, v in d.items():
        if isinstance(v, dict):
            lines.append(f"{pad}{k}:\n" + _to_yaml(v, indent + 1) if v else f"{pad}{k}: {{}}\n")
        elif isinstance(v, (list, tuple)):
            lines.append(f"{pad}{k}: [" + ", ".join(_yaml_scalar(x) for x in v) + "]\n")
        else:
            lines.append(f"{pad}{k}: {_yaml_scalar(v)}\n")
    return "".join(lines)


# ---------------------------------------------------------------------------------------------
# Megatron

def _wants_megatron(training: Training, row: dict) -> bool:
    return training.engine.megatron or max(row["tp"], row["pp"], row["cp"]) > 1


# ---------------------------------------------------------------------------------------------
# launch.sh


def allocator_environment(training: Training) -> list[str]:
    """The allocator setting the plan assumed (Training.expandable_segments; memory.reserved_bytes)."""
    if not training.expandable_segments:
        return []
    return ["export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # the allocator's reserve the plan assumed"]


def accelerate_drives(training: Training, row: dict) -> bool:
    """Whether `accelerate launch` can run the layout. Not a DeepSpeed layout with TP, PP or CP:
    Accelerate's DeepSpeed integration is data-parallel only (accelerate 1.x DeepSpeedPlugin sets
    train_batch_size = micro-batch x accumulation x num_processes, which DeepSpeed's _batch_assertion
    refuses where the data-parallel world is smaller), and a pipeline's PipelineEngine allows train_batch()
    alone (DeepSpeed 0.19.8 runtime/pipe/engine.py PipelineEngine.forward/backward/step raise
    PipelineError), which Accelerate's backward and step call."""
    return not (training.engine.deepspeed and row["tp"] * row["pp"] * row["cp"] > 1)


def launch_script(model: ModelSpec, cluster: Cluster, training: Training, row: dict,
                  opts: dict | None = None) -> str:
    opts = {**EXTRA_DEFAULTS, **(opts or {})}
    # launcher nodes are hosts: an NVL72 rack is 18 hosts of 4 GPUs (Cluster.gpus_per_host)
    nodes, per_node = cluster.num_hosts, cluster.gpus_per_host
    # the Megatron launch lines need a Megatron engine; for an FSDP layout with tp/cp > 1
    # megatron_args.txt only records the equivalent Megatron arguments
    megatron = training.engine.megatron
    ds = training.engine.deepspeed
    default = "torchrun" if megatron else ("deepspeed" if ds else "accelerate")
    q = shlex.quote

    lines = _launch_header(model, cluster, training, row, opts)
    lines += [
        "#",
        f"# Usage: [LAUNCHER={'accelerate|' if accelerate_drives(training, row) else ''}"
        f"{'deepspeed|' if ds else ''}{'torchrun' if megatron else ''}] "
        "./launch.sh [script args]",
        "# Multi-node: run on every node with NODE_RANK=<0..N-1> and MASTER_ADDR=<node 0>"
        + (" (deepspeed: a hostfile of '<host> slots=<gpus>' lines instead)" if ds else "") + ".",
        "set -euo pipefail",
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        f'TRAIN_SCRIPT="${{TRAIN_SCRIPT:-{opts["train_script"]}}}"',
        f'LAUNCHER="${{LAUNCHER:-{default}}}"',
        'NODE_RANK="${NODE_RANK:-0}"',
        'MASTER_ADDR="${MASTER_ADDR:-localhost}"',
        f'MASTER_PORT="${{MASTER_PORT:-{int(opts["master_port"])}}}"',
    ]
    env = (megatron_environment(cluster, training, row) if megatron else []) + allocator_environment(training)
    if env and ds and nodes > 1:
        # deepspeed/launcher/runner.py: remote ranks get only EXPORT_ENVS' prefixes (MLFLOW, PYTHON, MV2,
        # UCX) and the lines of .deepspeed_env (in ~ or the working directory)
        lines.append("# deepspeed on several nodes: put the exports below as NAME=VALUE lines in ./.deepspeed_env")
    lines += env
    if megatron:
        lines.append(f'MEGATRON_SCRIPT="${{MEGATRON_SCRIPT:-{opts["megatron_script"]}}}"')
        margs = megatron_args(model, training, row, ds_config_path="$HERE/" + DS_CONFIG)
        lines.append("MEGATRON_ARGS=(")
        for arg in margs:
            flag, _, value = arg.partition(" ")
            value = f'"{value}"' if value.startswith("$HERE") else (q(value) if value else "")
            lines.append(f"  {flag} {value}".rstrip())
        lines.append(")")
    lines += ["", 'case "$LAUNCHER" in', "  accelerate)"]
    multi = (' --machine_rank "$NODE_RANK" --main_process_ip "$MASTER_ADDR" --main_process_port "$MASTER_PORT"'
             if nodes > 1 else "")
    if accelerate_drives(training, row):
        lines.append(f'    exec accelerate launch --config_file "$HERE/{ACCELERATE_CONFIG}"{multi} "$TRAIN_SCRIPT" "$@"')
    else:
        lines.append('    echo "launch.sh: accelerate runs DeepSpeed data parallel only, not this TP/PP/CP layout;'
                     ' use LAUNCHER=deepspeed" >&2; exit 2')
    lines.append("    ;;")
    if ds:
        hostfile = '"${HOSTFILE:-$HERE/hostfile}"'
        target = '"$MEGATRON_SCRIPT" "${MEGATRON_ARGS[@]}"' if megatron else \
            f'"$TRAIN_SCRIPT" --deepspeed --deepspeed_config "$HERE/{DS_CONFIG}"'
        lines += ["  deepspeed)",
                  "    # --num_gpus is per node (deepspeed/launcher/runner.py)",
                  f"    exec deepspeed --num_gpus {per_node} --num_nodes {nodes} --hostfile {hostfile}"
                  f' --master_port "$MASTER_PORT" {target} "$@"',
                  "    ;;"]
    if megatron:
        lines += ["  torchrun)",
                  f"    exec torchrun --nproc_per_node {per_node} --nnodes {nodes} --node_rank \"$NODE_RANK\""
                  ' --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT"'
                  ' "$MEGATRON_SCRIPT" "${MEGATRON_ARGS[@]}" "$@"',
                  "    ;;"]
    lines += ['  *) echo "launch.sh: unknown LAUNCHER=$LAUNCHER" >&2; exit 2 ;;', "esac", ""]
    return "\n".join(lines)


def _launch_header(model: ModelSpec, cluster: Cluster, training: Training, row: dict, opts: dict) -> list[str]:
    """launch.sh's opening comments: what was planned, and what the train script must do for it."""
    nodes, per_node = cluster.num_hosts, cluster.gpus_per_host
    lines = [
        "#!/usr/bin/env bash",
        "# Launch commands written by planner.export.",
        f"# model: {_one_line(model.name)} (L={model.layers} h={model.hidden} heads={model.heads}"
        f" kv_heads={model.kv_heads} ffn={model.ffn})",
        f"# cluster: {cluster.num_gpus} x {_one_line(cluster.gpu.name)}, {nodes} node(s) of {per_node}",
        "# layout: " + " ".join(f"{k}={row[k]}" for k in _ROW_KEYS)
        + f" gbs={row['mbs'] * row['gas'] * row['dp']}",
        f"# training: engine={training.engine.name} precision={training.precision} optimizer={training.optimizer}"
        f" seq_len={training.seq_len} flash_attention={training.flash_attention}",
    ]
    lines += hf_checkpointing_line(model, training, row)
    if training.engine.launcher is Launcher.DEEPSPEED and row["pp"] > 1:
        # deepspeed/runtime/pipe/module.py PipelineModule._partition_layers: the default 'parameters'
        # balances parameter counts, so the embedding's stage takes fewer blocks than the plan's even split
        lines.append("# pipeline: the train script builds PipelineModule(..., partition_method='type:<decoder layer "
                     "class>') so the blocks split evenly over the stages, as planned")
    for k, v in (opts or {}).items():
        if k not in EXTRA_DEFAULTS:
            lines.append(f"# {_one_line(k)}: {_one_line(v)}")
    return lines


def hf_checkpointing_line(model: ModelSpec, training: Training, row: dict) -> list[str]:
    """What the train script must call for the plan's recompute on Hugging Face modules, where no
    config file switches it: transformers 5.25 PreTrainedModel.activation_checkpointing_enable
    (every_n_layers=k checkpoints layers 0, k, 2k, ...: ceil(L / k) of them; offload=True keeps their
    inputs in pinned host memory, --cpu-checkpointing). Under accelerate's FSDP recompute of every
    layer on the device is fsdp_activation_checkpointing instead."""
    if not training.engine.recompute_every_n or row["recompute"] != "full":
        return []
    if row["pp"] > 1:
        # DeepSpeed's pipeline: deepspeed/runtime/pipe/module.py PipelineModule checkpoints its layers; by
        # default every one with parameters (_is_checkpointable), the embedding too, whose reentrant
        # checkpoint of token ids gets no gradient (DeepSpeed's own comment there): the decoder layers only
        return ["# recompute: the train script builds PipelineModule(..., activation_checkpoint_interval=1,"
                " checkpointable_layers=['<decoder layer class>']) (deepspeed.checkpointing: ds_config"
                " activation_checkpointing applies once it calls deepspeed.checkpointing.configure(None,"
                " deepspeed_config=...); the embedding and head stay unchecked, as planned)"]
    n = row["recompute_layers"] or model.layers
    offload = training.zero_config.cpu_checkpointing
    if training.engine.launcher is Launcher.FSDP and n == model.layers and not offload:
        return ["# recompute: accelerate's fsdp_activation_checkpointing checkpoints every decoder layer"]
    k = -(-model.layers // n)  # rules.every_n_layers_broken: ceil(L / ceil(L / N)) == N
    return [f"# recompute: the train script calls model.activation_checkpointing_enable(every_n_layers={k}"
            f"{', offload=True' if offload else ''}) (transformers >= 5.25): {n} of {model.layers} decoder layers"
            f" checkpointed{', their inputs in pinned host memory' if offload else ''}"]


def recompute_where(model: ModelSpec, training: Training, row: dict) -> str | None:
    """Where the plan's recompute is switched on, for plan.json (no DeepSpeed config key does it)."""
    if row["recompute"] == "none":
        return None
    launcher = training.engine.launcher
    if launcher is Launcher.TORCHTITAN:
        return f"launch.sh TORCHTITAN_ARGS: the trainer's activation-checkpoint:{row['recompute']} subcommand"
    if training.engine.megatron:
        text = "launch.sh MEGATRON_ARGS (megatron_args.txt): --recompute-granularity " + row["recompute"]
        if launcher is Launcher.MEGATRON_DEEPSPEED:
            text += (" with --deepspeed-activation-checkpointing, whose flags override ds_config.json's "
                     "activation_checkpointing keys")
        return text
    line = hf_checkpointing_line(model, training, row)
    where = line[0].removeprefix("# recompute: ") if line else f"the train script ({row['recompute']} recompute)"
    return where + "; ds_config.json has no switch for it (DeepSpeedEngine does not read activation_checkpointing)" \
        if training.engine.deepspeed and row["pp"] == 1 else where


def _one_line(v) -> str:
    return " ".join(str(v).split())


# ---------------------------------------------------------------------------------------------
# helpers


def normalise_row(layout_row: dict) -> dict:
    """A layout as Layouts.row(i) gives it (or a dict with at least tp, pp, dp, zero, mbs, gas), every
    other field at its default and each value of the type the exports write."""
    if not isinstance(layout_row, dict):
        raise InputError(f"--emit: layout must be a dict like Layouts.row(i), got {type(layout_row).__name__}")
    missing = [k for k in ("tp", "pp", "dp", "zero", "mbs", "gas") if k not in layout_row]
    if missing:
        raise InputError(f"--emit: layout is missing {', '.join(missing)}")
    row = {"cp": 1, "ep": 1, "etp": None, "vpp": 1, "offload_optimizer": "none", "offload_params": "none",
           "recompute": "none", "recompute_layers": None, "recompute_method": None, "sequence_parallel": False,
           "schedule": None, "rank_order": "tp-cp-dp-pp", **layout_row}
    for k in ("tp", "pp", "dp", "cp", "ep", "vpp", "zero", "mbs", "gas"):
        row[k] = int(row[k])
    row["sequence_parallel"] = bool(row["sequence_parallel"])
    for k in ("offload_optimizer", "offload_params", "recompute"):
        row[k] = str(row[k]).lower()
    return row


def check_row(model, cluster, training, row) -> None:
    """The planner's own validity rules (InputError naming the flag), so no file describes an
    impossible job."""
    lay = single(tp=row["tp"], pp=row["pp"], dp=row["dp"], cp=row["cp"], ep=row["ep"], etp=row["etp"], vpp=row["vpp"],
                 zero=row["zero"], offload_optimizer=row["offload_optimizer"],
                 offload_params=row["offload_params"], mbs=row["mbs"], gas=row["gas"],
                 recompute=row["recompute"], recompute_layers=row["recompute_layers"],
                 recompute_method=row["recompute_method"] or "block",
                 sequence_parallel=row["sequence_parallel"], schedule=row.get("schedule"), rank_order=row["rank_order"])
    check_single(model, cluster, training, lay)
