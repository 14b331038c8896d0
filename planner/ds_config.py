"""A user's DeepSpeed config read the way DeepSpeed 0.19.8 and Accelerate read it: from a
ds_config.json, an Accelerate YAML or an `accelerate launch` command line; what DeepSpeed refuses
or ignores in it (sources beside each); its batch keys and "auto" values resolved. The check that
predicts and diagnoses the run is planner/doctor.py.
"""

from __future__ import annotations

import difflib
import math
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
    n = _yaml_doc(Path(path)).get("num_processes")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def _yaml_doc(path: Path) -> dict:
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml is a dependency
        raise InputError(f"{FLAG}: reading an Accelerate YAML needs pyyaml (pip install pyyaml)") from None
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{FLAG}: cannot read {str(path)!r} ({exc.strerror or exc})") from None
    if len(raw) > 2**20:
        raise InputError(f"{FLAG}: {str(path)!r} is larger than 1 MiB; not an Accelerate config")
    try:
        doc = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise InputError(f"{FLAG}: {str(path)!r} is not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("deepspeed_config"), dict):
        raise InputError(f"{FLAG}: {str(path)!r} has no deepspeed_config section (an Accelerate config for DeepSpeed)")
    return doc


def _from_accelerate(path: Path) -> dict:
    doc = _yaml_doc(path)
    return plugin_config(doc["deepspeed_config"], doc.get("mixed_precision"), path.parent)


def plugin_config(plugin: dict, mixed_precision, base: Path) -> dict:
    """The ds_config Accelerate builds from its DeepSpeed plugin fields (accelerate/utils/dataclasses.py
    DeepSpeedPlugin.__post_init__), or the deepspeed_config_file they name."""
    if plugin.get("deepspeed_config_file"):
        name = Path(str(plugin["deepspeed_config_file"]))
        return load_config(name if name.is_absolute() else base / name)[0]
    zero = {"stage": plugin.get("zero_stage") if plugin.get("zero_stage") is not None else 2}
    for part, key in (("offload_optimizer", "offload_optimizer_device"), ("offload_param", "offload_param_device")):
        if plugin.get(key) not in (None, "none"):
            zero[part] = {"device": plugin[key]}
    accumulation = plugin.get("gradient_accumulation_steps")
    ds = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
          "gradient_accumulation_steps": 1 if accumulation is None else accumulation, "zero_optimization": zero}
    if str(mixed_precision) in ("bf16", "fp16"):
        ds[str(mixed_precision)] = {"enabled": True}
    return ds


def from_accelerate_launch(command: str) -> tuple[dict, int | None]:
    """(ds_config, --num_processes) of an `accelerate launch --use_deepspeed ...` command line, read
    with the flags accelerate/commands/launch.py declares for DeepSpeed; the script and its own
    arguments are ignored."""
    import argparse
    import shlex

    flag = "--accelerate-launch"
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise InputError(f"{flag}: cannot split the command line ({exc})") from None
    if "--use_deepspeed" not in words and not any(w.startswith("--deepspeed_config_file") for w in words):
        raise InputError(f"{flag}: no --use_deepspeed in the command: not a DeepSpeed launch")

    class Quiet(argparse.ArgumentParser):
        def error(self, message):
            raise InputError(f"{flag}: {message}")

    p = Quiet(add_help=False)
    p.add_argument("--use_deepspeed", action="store_true")
    for name in ("--deepspeed_config_file", "--offload_optimizer_device", "--offload_param_device", "--mixed_precision"):
        p.add_argument(name, type=str)
    for name in ("--zero_stage", "--gradient_accumulation_steps", "--num_processes", "--num_machines"):
        p.add_argument(name, type=int)
    args, _ = p.parse_known_args(words)
    plugin = {k: getattr(args, k) for k in ("deepspeed_config_file", "zero_stage", "offload_optimizer_device",
                                             "offload_param_device", "gradient_accumulation_steps")}
    return plugin_config(plugin, args.mixed_precision, Path.cwd()), args.num_processes


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
    out = []
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
                               f"config (DeepSpeedZeroConfig forbids extra fields){_closest(key, ZERO_KEYS)}"))
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
