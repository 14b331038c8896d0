"""A user's DeepSpeed config read the way DeepSpeed 0.19.8 and Accelerate read it: from a
ds_config.json, an Accelerate YAML or an `accelerate launch` command line; what DeepSpeed refuses
or ignores in it (sources beside each); its batch keys and "auto" values resolved. The check that
predicts and diagnoses the run is planner/doctor.py.
"""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass
from pathlib import Path

from planner.errors import InputError

FLAG = "--config"

# deepspeed 0.19.8 runtime/zero/config.py DeepSpeedZeroConfig (pydantic, extra="forbid": any other
# key inside zero_optimization makes DeepSpeed refuse the config); aliases after the field names
ZERO_KEYS = (
    "stage", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size", "use_multi_rank_bucket_allreduce",
    "allgather_partitions", "allgather_bucket_size", "overlap_comm", "compute_grad_norm", "load_from_fp32_weights",
    "elastic_checkpoint", "offload_param", "offload_optimizer", "zenflow", "sub_group_size", "cpu_offload_param",
    "cpu_offload_use_pin_memory", "cpu_offload", "prefetch_bucket_size", "param_persistence_threshold",
    "model_persistence_threshold", "max_live_parameters", "max_reuse_distance", "gather_16bit_weights_on_model_save",
    "module_granularity_threshold", "use_all_reduce_for_fetch_params", "allgather_sequential",
    "stage3_gather_fp16_weights_on_model_save", "ignore_unused_parameters", "legacy_stage1", "round_robin_gradients",
    "parameter_alignment", "zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_nontrainable_weights",
    "zero_quantized_gradients", "memory_efficient_linear", "pipeline_loading_checkpoint", "override_module_apply",
    "log_trace_cache_warnings", "enable_sanity_checks", "save_muon_momentum_buffer_in_memory", "leaf_module",
    "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold", "stage3_model_persistence_threshold",
    "stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_gather_16bit_weights_on_model_save",
    "stage3_module_granularity_threshold", "stage3_use_all_reduce_for_fetch_params", "stage3_allgather_sequential")
# runtime/zero/offload_config.py (also extra="forbid")
OFFLOAD_KEYS = {
    "offload_optimizer": ("device", "nvme_path", "buffer_count", "pin_memory", "pipeline_read", "pipeline_write",
                          "fast_init", "ratio", "super_offload", "cpuadam_cores_perc"),
    "offload_param": ("device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pin_memory"),
}
# top-level keys DeepSpeed 0.19.8 reads (runtime/config.py DeepSpeedConfig._initialize_params and the
# config modules it calls); it ignores any other top-level key without a word
TOP_LEVEL_KEYS = (
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer", "scheduler",
    "fp16", "bf16", "bfloat16", "amp", "torch_autocast", "zero_optimization", "gradient_clipping", "steps_per_print",
    "wall_clock_breakdown", "dump_state", "memory_breakdown", "activation_checkpointing", "flops_profiler",
    "tensorboard", "wandb", "csv_monitor", "comet", "comms_logger", "communication_data_type",
    "seq_parallel_communication_data_type", "prescale_gradients", "gradient_predivide_factor", "sparse_gradients",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "data_types", "elasticity", "pipeline", "aio",
    "checkpoint", "data_efficiency", "compression_training", "autotuning", "nebula", "curriculum_learning",
    "progressive_layer_drop", "eigenvalue", "quantize_training", "sparse_attention", "disable_allgather",
    "use_node_local_storage", "dataloader_drop_last", "timers", "compile",
    "weight_quantization", "hybrid_engine", "tensor_parallel", "graph_harvesting", "use_data_before_expert_parallelism",
    "gradient_allreduce_op", "expert_parallel", "managed_gradient_accumulation", "disable_python_gc")


@dataclass(frozen=True)
class Finding:
    """One diagnosis: what, how bad, the number that triggered it, and what the fix frees or gains."""

    kind: str
    """'config' (DeepSpeed would refuse or ignore it), 'memory', 'communication', 'cpu_memory',
    'compute', 'auto' (a value resolved for the user) or 'better' (the search's closer config)."""
    severity: str
    """'error' (the run fails as configured), 'warning' or 'info'."""
    message: str
    value: float | None = None
    """The number that triggered it (bytes, fraction of the step, ...)."""
    frees_bytes: int | None = None
    """GPU bytes per rank the fix frees."""
    gain: float | None = None
    """Speed-up of the fix (new tokens/s over old)."""

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("kind", "severity", "message", "value", "frees_bytes", "gain")}


def _unknown_zero_hint(key: str) -> str:
    """What an unknown zero_optimization key most likely wanted. A process-group setting has no ZeRO
    field: DeepSpeed 0.19.8 reduces and gathers over the whole data-parallel group (stage_1_and_2.py,
    stage3.py dp_process_group); the one sub-grouping is ZeRO++'s hpZ (zero_hpz_partition_size, a
    secondary ZeRO-3 parameter partition within a node); MiCS, which sharded over groups, is removed
    (runtime/config.py). The nearest name of another kind (reduce_scatter is a boolean) would mislead."""
    if "group" in key and key != "sub_group_size":
        return (": DeepSpeed has no process-group setting for ZeRO; it reduces and gathers over the whole "
                "data-parallel group (reduce_scatter only chooses reduce-scatter over all-reduce). To keep "
                "ZeRO-3's parameter gathers within a node use zero_hpz_partition_size (ZeRO++ hpZ); to shrink "
                "the group, give the launch tensor or pipeline parallelism")
    return _closest(key, ZERO_KEYS)


def _closest(key: str, known) -> str:
    match = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def load_config(path) -> tuple[dict, str]:
    """(DeepSpeed config dict, where it came from) from a ds_config.json or an Accelerate YAML whose
    deepspeed_config names a file or gives the plugin fields (accelerate/commands/launch.py
    --zero_stage, --offload_optimizer_device, ...)."""
    from planner.data import read_json

    p = Path(str(path))
    if p.suffix.lower() in (".yaml", ".yml"):
        return _from_accelerate(p), "accelerate"
    doc = read_json(p, FLAG)
    if not isinstance(doc, dict):
        raise InputError(f"{FLAG}: {str(p)!r} holds a JSON {type(doc).__name__}, not a DeepSpeed config object")
    return doc, "deepspeed"


def accelerate_num_processes(path) -> int | None:
    """The Accelerate YAML's num_processes (accelerate/commands/config/config_args.py ClusterConfig: the
    total processes `accelerate launch` starts), or None where it gives none."""
    return yaml_num_processes(_yaml_doc(Path(path)))


def yaml_num_processes(doc: dict) -> int | None:
    """num_processes as the launch reads the YAML: a num_processes nested in deepspeed_config is
    copied onto the arguments after the top-level one (commands/launch.py _validate_launch_command
    walks ClusterConfig's fields in order, deepspeed_config after num_processes), so it wins."""
    nested = _processes((doc.get("deepspeed_config") or {}).get("num_processes"))
    return nested if nested is not None else _processes(doc.get("num_processes"))


def _processes(n) -> int | None:
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


# accelerate 1.16 commands/launch.py launch_command_parser, "DeepSpeed Arguments": the only keys of an
# Accelerate YAML's deepspeed_config that reach DeepSpeed. _validate_launch_command copies every key of the
# section onto the launch arguments, and utils/launch.py prepare_deepspeed_cmd_env passes on these only
PLUGIN_KEYS = (
    "deepspeed_config_file", "zero_stage", "offload_optimizer_device", "offload_param_device",
    "offload_optimizer_nvme_path", "offload_param_nvme_path", "gradient_accumulation_steps", "gradient_clipping",
    "zero3_init_flag", "zero3_save_16bit_model", "deepspeed_hostfile", "deepspeed_exclusion_filter",
    "deepspeed_inclusion_filter", "deepspeed_multinode_launcher", "deepspeed_moe_layer_cls_names")


# accelerate 1.16 commands/launch.py launch_command_parser: launch arguments other than the plugin
# fields that a key nested in deepspeed_config sets (_validate_launch_command copies every key of a
# dict section onto the arguments the command line left alone); the ones the planner reads
LAUNCH_ARGS = ("mixed_precision", "num_processes", "num_machines")


class AccelerateConfig(dict):
    """The ds_config `accelerate launch` hands DeepSpeed, with `notes`: findings on what Accelerate
    dropped or reinterpreted on the way (config_findings reports them first), and `zero3_init_flag`:
    DeepSpeedPlugin's flag as the launch passes it (None: unset, which DeepSpeedPlugin turns on
    under ZeRO-3)."""

    def __init__(self, ds: dict, notes: list, zero3_init_flag: bool | None = None):
        super().__init__(ds)
        self.notes = list(notes)
        self.zero3_init_flag = zero3_init_flag


def truth(value, flag: str) -> bool | None:
    """accelerate 1.16 utils/environment.py str_to_bool, the reading of ACCELERATE_DEEPSPEED_ZERO3_INIT
    (None stays None)."""
    if value is None:
        return None
    word = str(value).lower()
    if word in ("y", "yes", "t", "true", "on", "1"):
        return True
    if word in ("n", "no", "f", "false", "off", "0"):
        return False
    raise InputError(f"{flag}: {value!r} is not true or false (Accelerate's str_to_bool: true/false, yes/no, on/off, 1/0)")


def zero3_init_flag(line, section: dict) -> bool | None:
    """zero3_init_flag as DeepSpeedPlugin gets it: the launch line's, else the YAML's, else the
    ACCELERATE_DEEPSPEED_ZERO3_INIT of the environment the launch inherits (utils/launch.py
    prepare_deepspeed_cmd_env sets it only from a given flag; dataclasses.py DeepSpeedPlugin reads it)."""
    for value, where in ((line, "--zero3_init_flag"), (section.get("zero3_init_flag"), "deepspeed_config.zero3_init_flag"),
                         (os.environ.get("ACCELERATE_DEEPSPEED_ZERO3_INIT"), "ACCELERATE_DEEPSPEED_ZERO3_INIT")):
        if value is not None:
            return truth(value, where)
    return None


def default_accelerate_config() -> Path:
    """The config `accelerate launch` reads without --config_file (accelerate 1.16
    commands/config/config_args.py default_config_file): $HF_HOME (else $XDG_CACHE_HOME/huggingface,
    else ~/.cache/huggingface) /accelerate/default_config.yaml."""
    home = os.environ.get("HF_HOME", os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
    return Path(os.path.expanduser(home)) / "accelerate" / "default_config.yaml"


def _effective_precision(doc: dict, line):
    """mixed_precision as the launch runs it: the line's; else a mixed_precision nested in
    deepspeed_config, which _validate_launch_command copies onto the arguments before it falls back
    to the top-level key; else the YAML's (yaml_mixed_precision)."""
    if line:
        return line
    nested = (doc.get("deepspeed_config") or {}).get("mixed_precision")
    return nested if nested is not None else yaml_mixed_precision(doc)


def _read_yaml(path: Path, flag: str) -> dict:
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml is a dependency
        raise InputError(f"{flag}: reading an Accelerate YAML needs pyyaml (pip install pyyaml)") from None
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{flag}: cannot read {str(path)!r} ({exc.strerror or exc})") from None
    if len(raw) > 2**20:
        raise InputError(f"{flag}: {str(path)!r} is larger than 1 MiB; not an Accelerate config")
    try:
        doc = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise InputError(f"{flag}: {str(path)!r} is not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise InputError(f"{flag}: {str(path)!r} is not an Accelerate config (a YAML mapping)")
    if not isinstance(doc.get("deepspeed_config", {}) or {}, dict):
        raise InputError(f"{flag}: {str(path)!r}: deepspeed_config must be a mapping")
    return doc


def _yaml_doc(path: Path) -> dict:
    doc = _read_yaml(path, FLAG)
    if not isinstance(doc.get("deepspeed_config"), dict):
        raise InputError(f"{FLAG}: {str(path)!r} has no deepspeed_config section (an Accelerate config for DeepSpeed)")
    return doc


def yaml_mixed_precision(doc: dict):
    """mixed_precision as Accelerate reads the YAML: the legacy top-level `fp16: true` stands for 'fp16'
    where no mixed_precision key is given (accelerate 1.16 config_args.py BaseConfig.process_config)."""
    if "mixed_precision" in doc:
        return doc["mixed_precision"]
    return "fp16" if doc.get("fp16") else None


def _accelerate_notes(doc: dict, plugin: dict, mixed_precision, where: str, line_precision: bool) -> list:
    """Findings on what Accelerate drops or reinterprets in the YAML `doc`; `plugin`/`mixed_precision`
    are what the launch runs with (the YAML's, or the command line's where it gives them)."""
    out = []
    if "fp16" in doc and not line_precision:
        if "mixed_precision" not in doc and doc["fp16"]:
            out.append(Finding("config", "info", f"{where}: top-level fp16: {doc['fp16']!r} is Accelerate's legacy key: "
                               "it runs mixed_precision fp16 (config_args.py BaseConfig.process_config); predicted so"))
        elif doc["fp16"] and str(mixed_precision).lower() != "fp16":
            out.append(Finding("config", "warning", f"{where}: top-level fp16: {doc['fp16']!r} is ignored: Accelerate "
                               f"reads the legacy key only where no mixed_precision is given, and mixed_precision is "
                               f"{doc['mixed_precision']!r} (config_args.py BaseConfig.process_config)"))
    file = plugin.get("deepspeed_config_file")
    stage = plugin.get("zero_stage")
    # accelerate 1.16 utils/dataclasses.py DeepSpeedPlugin._deepspeed_config_checks: beside a deepspeed_config_file
    # these fields of the YAML (launch_command passes their names on) make the plugin raise
    clash = [k for k in ("gradient_accumulation_steps", "gradient_clipping", "zero_stage", "offload_optimizer_device",
                         "offload_param_device", "offload_param_nvme_path", "offload_optimizer_nvme_path",
                         "zero3_save_16bit_model") if k in (doc.get("deepspeed_config") or {})]
    if not line_precision and yaml_mixed_precision(doc) is not None:
        clash.append("mixed_precision")
    if file and clash:
        out.append(Finding("config", "error", f"{where}: deepspeed_config_file with {', '.join(clash)} in the Accelerate "
                           "config: Accelerate's DeepSpeedPlugin refuses it ('When using `deepspeed_config_file`, the "
                           "following accelerate config variables will be ignored'); set them in the ds_config.json "
                           "and remove them from the YAML"))
    for key, value in (doc.get("deepspeed_config") or {}).items():
        if key in PLUGIN_KEYS:
            continue
        if key in LAUNCH_ARGS:
            said = f"{key} {value!r}" if key != "mixed_precision" or not line_precision else \
                f"nothing (the command line's --mixed_precision wins)"
            out.append(Finding("config", "info", f"{where}: deepspeed_config.{key} is a launch argument, not a plugin "
                               f"field: `accelerate launch` copies it onto its arguments (commands/launch.py "
                               f"_validate_launch_command) and runs with {said}; the top-level key is the usual place"))
            continue
        severity = "warning"
        if key in ("fp16", "bf16") and isinstance(value, dict) and (value.get("enabled") is True) == (
                str(mixed_precision).lower() == key):
            severity = "info"  # dropped, but mixed_precision runs what it asks for
        if file:
            instead, fix = f"DeepSpeed reads {key} from deepspeed_config_file {str(file)!r} only", "move it into that file"
        elif key == "zero_optimization":
            instead = (f"ZeRO stage {stage} from zero_stage" if stage is not None else
                       "ZeRO stage 2 from zero_stage's default (DeepSpeedPlugin.__post_init__)")
            fields = [f"zero_stage: {value['stage']}"] if isinstance(value, dict) and "stage" in value else []
            for part in ("offload_optimizer", "offload_param"):
                device = (value.get(part) or {}).get("device") if isinstance(value, dict) else None
                if isinstance(device, str):
                    fields.append(f"{part}_device: {device}")
            fix = ("move the block into a ds_config.json named by deepspeed_config_file" +
                   (f", or use the plugin fields {', '.join(fields)}" if fields else ""))
        elif key in ("fp16", "bf16", "bfloat16"):
            instead = f"the precision of mixed_precision ({mixed_precision or 'no'})"
            fix = "set the top-level mixed_precision (bf16 or fp16) instead"
        elif key in ("train_batch_size", "train_micro_batch_size_per_gpu"):
            instead = f"{key} 'auto', filled from the script's batch size"
            fix = "set the batch size in the script, or move the key into a ds_config.json named by deepspeed_config_file"
        else:
            instead, fix = "DeepSpeed's default", "move it into a ds_config.json named by deepspeed_config_file"
        out.append(Finding("config", severity, f"{where}: deepspeed_config.{key} is not an Accelerate DeepSpeed plugin "
                           f"field{_closest(key, PLUGIN_KEYS)}: `accelerate launch` drops it and runs {instead}; {fix}"))
    return out


def _from_accelerate(path: Path) -> dict:
    doc = _yaml_doc(path)
    precision = _effective_precision(doc, None)
    section = doc["deepspeed_config"]
    ds, notes = plugin_config(section, precision, str(path))
    return AccelerateConfig(ds, notes + _accelerate_notes(doc, section, precision, str(path), False),
                            zero3_init_flag(None, section))


def plugin_config(plugin: dict, mixed_precision, yaml_path: str | None) -> tuple[dict, list]:
    """(ds_config, findings): the ds_config Accelerate builds from its DeepSpeed plugin fields
    (accelerate/utils/dataclasses.py DeepSpeedPlugin.__post_init__), or the deepspeed_config_file they
    name. DeepSpeedPlugin opens a relative file from the training processes' working directory, the
    launch's (HfDeepSpeedConfig), not the YAML's folder: found only beside the YAML, it is read from
    there with a warning."""
    if plugin.get("deepspeed_config_file"):
        name = Path(str(plugin["deepspeed_config_file"]))
        beside = Path(yaml_path).parent / name if yaml_path and not name.is_absolute() else None
        if not name.is_absolute() and not name.exists() and beside is not None and beside.exists():
            return load_config(beside)[0], [Finding(
                "config", "warning", f"{yaml_path}: deepspeed_config_file {str(name)!r} is relative: Accelerate opens "
                f"it from the launch's working directory ({Path.cwd()} here, where it is missing), not the YAML's "
                f"folder; read from {str(beside)!r}: launch from that folder, or write the path absolute")]
        return load_config(name)[0], []
    zero = {"stage": plugin.get("zero_stage") if plugin.get("zero_stage") is not None else 2}
    for part, key in (("offload_optimizer", "offload_optimizer_device"), ("offload_param", "offload_param_device")):
        if plugin.get(key) not in (None, "none"):
            zero[part] = {"device": plugin[key]}
    accumulation = plugin.get("gradient_accumulation_steps")
    ds = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
          "gradient_accumulation_steps": 1 if accumulation is None else accumulation, "zero_optimization": zero}
    # utils/launch.py prepare_deepspeed_cmd_env: PrecisionType(args.mixed_precision.lower())
    precision = str(mixed_precision).lower()
    if precision in ("bf16", "fp16"):
        ds[precision] = {"enabled": True}
    return ds, []


def from_accelerate_launch(command: str) -> tuple[dict, int | None]:
    """(ds_config, processes) of an `accelerate launch ...` command line that starts DeepSpeed, read as
    accelerate 1.16 commands/launch.py _validate_launch_command reads it: the --config_file YAML gives
    the defaults (distributed_type, deepspeed_config, mixed_precision, num_processes), the flags on the
    line win where given; the script and its own arguments are ignored. processes is None where
    neither gives num_processes."""
    import argparse
    import shlex

    flag = "--accelerate-launch"
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise InputError(f"{flag}: cannot split the command line ({exc})") from None

    class Quiet(argparse.ArgumentParser):
        def error(self, message):
            raise InputError(f"{flag}: {message}")

    p = Quiet(add_help=False)

    def add(name, **kw):  # commands/utils.py _StoreAction: each --a_b flag is also --a-b
        p.add_argument(name, *([name.replace("_", "-")] if "_" in name else []), **kw)

    paradigms = ("--use_deepspeed", "--use_fsdp", "--use_megatron_lm", "--multi_gpu", "--tpu", "--cpu")
    for name in paradigms:
        add(name, action="store_true")
    for name in ("--config_file", "--mixed_precision", "--deepspeed_config_file", "--offload_optimizer_device",
                 "--offload_param_device", "--zero3_init_flag"):
        add(name, type=str)
    for name in ("--zero_stage", "--gradient_accumulation_steps", "--num_processes", "--num_machines"):
        add(name, type=int)
    args, _ = p.parse_known_args(words)
    if sum(bool(getattr(args, k)) for k in ("multi_gpu", "cpu", "tpu", "use_deepspeed", "use_fsdp")) > 1:
        # _validate_launch_command's first sanity check
        raise InputError(f"{flag}: only one of --cpu, --multi_gpu, --tpu, --use_deepspeed, --use_fsdp at a time "
                         "(accelerate launch refuses the line)")
    # without --config_file Accelerate reads its default config where one exists (not with --cpu)
    default = default_accelerate_config()
    if args.config_file is None and not args.cpu and default.is_file():
        args.config_file = str(default)
    doc = _read_yaml(Path(args.config_file), flag) if args.config_file else {}  # relative to the cwd, as Accelerate
    kind = doc.get("distributed_type")
    if args.config_file and kind is None:  # config_args.py BaseConfig.process_config
        raise InputError(f"{flag}: --config_file {args.config_file!r} has no distributed_type (Accelerate refuses it)")
    chosen = any(getattr(args, name[2:]) for name in paradigms[:-1])
    # _validate_launch_command: without a paradigm flag on the line, the file's distributed_type decides;
    # launch_command starts DeepSpeed only without --cpu. A bare --deepspeed_config_file (no --config_file)
    # is taken as DeepSpeed, as Accelerate's default config file (not read here) would have to say
    deepspeed = (args.use_deepspeed or (not chosen and str(kind) == "DEEPSPEED")
                 or (not args.config_file and not chosen and args.deepspeed_config_file is not None))
    if args.cpu:  # launch_command: `args.use_deepspeed and not args.cpu`
        raise InputError(f"{flag}: --cpu runs the script on the CPU: not a DeepSpeed launch")
    if not deepspeed:
        other = [name for name in paradigms[1:-1] if getattr(args, name[2:])]
        said = (f" ({other[0]} on it overrides --config_file's distributed_type)" if other and args.config_file else
                f" and --config_file's distributed_type is {kind}" if args.config_file else "")
        raise InputError(f"{flag}: no --use_deepspeed in the command{said}: not a DeepSpeed launch")
    section = doc.get("deepspeed_config") or {}
    keys = ("deepspeed_config_file", "zero_stage", "offload_optimizer_device", "offload_param_device",
            "gradient_accumulation_steps")
    # a flag given on the line wins (args.nondefault); the YAML's section fills the rest
    plugin = {k: getattr(args, k) if getattr(args, k) is not None else section.get(k) for k in keys}
    line_precision = bool(args.mixed_precision)
    precision = _effective_precision(doc, args.mixed_precision)
    ds, notes = plugin_config(plugin, precision, None)
    notes += _accelerate_notes(doc, plugin, precision, f"--config_file {args.config_file}", line_precision) if doc else []
    processes = args.num_processes if args.num_processes is not None else yaml_num_processes(doc)
    return AccelerateConfig(ds, notes, zero3_init_flag(args.zero3_init_flag, section)), processes


def _section(parent: dict, key: str, where: str) -> dict:
    """parent[key] as an object ({} when absent); InputError when it is something else."""
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(f"{FLAG}: {where}{key} must be an object, got {type(value).__name__}")
    return value


ACTIVATION_CHECKPOINTING_KEYS = ("partition_activations", "number_checkpoints", "contiguous_memory_optimization",
                                 "synchronize_checkpoint_boundary", "profile", "cpu_checkpointing")
"""The keys DeepSpeed 0.19.8 reads from activation_checkpointing (runtime/activation_checkpointing/config.py
ACT_CHKPT_*, DeepSpeedActivationCheckpointingConfig._initialize); get_scalar_param ignores any other."""


def config_findings(ds: dict, pipeline_stages: int) -> list[Finding]:
    """What DeepSpeed 0.19.8 refuses or ignores in `ds`, before any prediction."""
    for key in ("optimizer", "data_types", "fp16", "bf16", "bfloat16"):
        _section(ds, key, "")
    out = list(getattr(ds, "notes", ()))  # what Accelerate dropped on the way (AccelerateConfig)
    for key in ds:
        if key not in TOP_LEVEL_KEYS:
            out.append(Finding("config", "warning", f"top-level key {key!r} is not one DeepSpeed reads: it is "
                               f"ignored{_closest(key, TOP_LEVEL_KEYS)}"))
    for key in _section(ds, "activation_checkpointing", ""):
        if key not in ACTIVATION_CHECKPOINTING_KEYS:
            out.append(Finding("config", "warning", f"activation_checkpointing.{key} is not a key DeepSpeed reads: it is "
                               f"ignored{_closest(key, ACTIVATION_CHECKPOINTING_KEYS)}"))
    zero = _section(ds, "zero_optimization", "")
    for key in zero:
        if key not in ZERO_KEYS:
            out.append(Finding("config", "error", f"zero_optimization.{key} is not a ZeRO field: DeepSpeed refuses the "
                               f"config (DeepSpeedZeroConfig forbids extra fields){_unknown_zero_hint(key)}"))
    for part, known in OFFLOAD_KEYS.items():
        for key in _section(zero, part, "zero_optimization."):
            if key not in known:
                out.append(Finding("config", "error", f"zero_optimization.{part}.{key} is not an offload field: "
                                   f"DeepSpeed refuses the config{_closest(key, known)}"))
    if enabled(ds, "fp16") and (enabled(ds, "bf16") or enabled(ds, "bfloat16")):
        # runtime/config.py DeepSpeedConfig._do_error_check
        out.append(Finding("config", "error", "fp16 and bf16 are both enabled: DeepSpeed asserts 'bfloat16 and fp16 "
                           "modes cannot be simultaneously enabled'"))
    if enabled(ds, "expert_parallel"):
        # runtime/config.py get_expert_parallel_config -> engine.py _configure_expert_parallel (AutoEP)
        out.append(Finding("config", "error", "expert_parallel is enabled: DeepSpeed 0.19.8's AutoEP fails in "
                           "deepspeed.initialize with transformers 5.25 (auto_ep_presets/base.py: "
                           "_CanRecordRegistry.get() takes 2 positional arguments); predicted without expert "
                           "parallelism"))
    stage = whole_number(zero.get("stage", 0), "zero_optimization.stage")
    if pipeline_stages > 1 and stage >= 2:
        # runtime/pipe/engine.py PipelineEngine.__init__
        out.append(Finding("config", "error", f"ZeRO stage {stage} with {pipeline_stages} pipeline stages: DeepSpeed's "
                           "pipeline engine asserts 'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism'"))
    if stage == 3:
        # runtime/engine.py _configure_zero_optimizer: only the stage 1/2 optimizer is given these
        for key in ("allgather_partitions", "allgather_bucket_size"):
            if key in zero:
                out.append(Finding("config", "warning", f"zero_optimization.{key} does nothing under stage 3: DeepSpeed "
                                   "passes it to the stage 1/2 optimizer only (engine.py _configure_zero_optimizer); "
                                   "stage 3 gathers per stage3_prefetch_bucket_size"))
    return out


def enabled(ds: dict, key: str) -> bool:
    part = ds.get(key)
    return isinstance(part, dict) and part.get("enabled") is True


def whole_number(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value != int(value):
        raise InputError(f"{FLAG}: {where} must be a whole number, got {value!r}")
    return int(value)


def batch(ds: dict, data_parallel: int, mbs_flag: int | None) -> tuple[int, int, int, list[Finding]]:
    """(train_batch_size, micro-batch, accumulation steps, findings) as DeepSpeed resolves them
    (runtime/config.py _set_batch_related_parameters and _batch_assertion), after resolving "auto"
    the way Hugging Face's Trainer does (transformers integrations/deepspeed.py
    trainer_config_process: the script's per-device batch, gradient accumulation 1)."""
    found = []
    values = {k: ds.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")}
    if values["train_micro_batch_size_per_gpu"] == "auto":
        values["train_micro_batch_size_per_gpu"] = mbs_flag or 1
        found.append(Finding("auto", "info", f"train_micro_batch_size_per_gpu 'auto' resolved as {mbs_flag or 1} "
                             "(the script's per_device_train_batch_size; --mbs sets it)"))
    elif mbs_flag is not None:
        raise InputError(f"--mbs: the config sets train_micro_batch_size_per_gpu "
                         f"{values['train_micro_batch_size_per_gpu']!r}; --mbs only fills an 'auto' one")
    if values["gradient_accumulation_steps"] == "auto":
        values["gradient_accumulation_steps"] = 1
        found.append(Finding("auto", "info", "gradient_accumulation_steps 'auto' resolved as 1 (Trainer's default)"))
    tbs, mbs, gas = (None if v in (None, "auto") else whole_number(v, k) for k, v in values.items())
    for key, value in zip(values, (tbs, mbs, gas)):
        if value is not None and value < 1:  # runtime/config.py _batch_assertion: "has to be greater than 0"
            raise InputError(f"{FLAG}: {key} must be at least 1 (DeepSpeed asserts it is greater than 0), got {value}")
    if mbs is not None and gas is not None and tbs is not None and tbs != mbs * gas * data_parallel:
        found.append(Finding("config", "error", f"train_batch_size {tbs} != train_micro_batch_size_per_gpu {mbs} x "
                             f"gradient_accumulation_steps {gas} x data-parallel size {data_parallel}: DeepSpeed "
                             "asserts it (_batch_assertion)", value=float(tbs)))
    elif tbs is not None and mbs is not None and gas is None:
        gas = tbs // (mbs * data_parallel)
    elif tbs is not None and gas is not None and mbs is None:
        mbs = tbs // (gas * data_parallel)
    elif tbs is not None and mbs is None:
        gas, mbs = 1, tbs // data_parallel
    elif tbs is None and mbs is None:
        raise InputError(f"{FLAG}: give train_batch_size or train_micro_batch_size_per_gpu "
                         "(DeepSpeed needs one of them)")
    gas = gas or 1
    if not mbs or mbs < 1:
        raise InputError(f"{FLAG}: train_batch_size {tbs} is smaller than the data-parallel size {data_parallel}")
    return mbs * gas * data_parallel, mbs, gas, found


def resolve_auto_buckets(zero: dict, hidden: int) -> tuple[dict, list[Finding]]:
    """ZeRO bucket sizes left "auto", as transformers fills them from the model's hidden size
    (integrations/deepspeed.py trainer_config_finalize): h^2, 0.9 h^2, 10 h."""
    rules = {"reduce_bucket_size": hidden * hidden, "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
             "stage3_param_persistence_threshold": 10 * hidden}
    out, found = dict(zero), []
    for key, value in rules.items():
        if out.get(key) == "auto":
            out[key] = value
            found.append(Finding("auto", "info", f"zero_optimization.{key} 'auto' resolved as {value:,} "
                                 f"(transformers: from hidden size {hidden})"))
    for key, value in out.items():
        if value == "auto":
            raise InputError(f"{FLAG}: zero_optimization.{key} is 'auto', which only Accelerate/Trainer resolve "
                             "and not from the model; give a number")
    return out, found
