"""What DeepSpeed 0.19.8 refuses or ignores in a ds_config (the keys it reads, what it asserts), its
batch keys and "auto" values resolved, and `Finding`, the record of every diagnosis `planner check` gives."""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

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
