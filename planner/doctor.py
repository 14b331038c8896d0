"""`planner check`: a user's own DeepSpeed config (or Accelerate YAML), predicted and diagnosed.

The config becomes the planning API's inputs the way DeepSpeed and Accelerate read it
(planner/ds_config.py); `check` predicts that exact run and lists findings (planner/diagnosis.py), each
with the number that triggered it and what a fix frees or gains.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner import planning
from planner.diagnosis import closest_better, diagnose, zero3_load_findings
from planner.ds_config import AccelerateConfig, accelerate_num_processes, load_config
from planner.ds_rules import (FLAG, OFFLOAD_KEYS, Finding, batch, config_findings, enabled, resolve_auto_buckets,
                              whole_number)
from planner.engines import lookup as engine_lookup
from planner.errors import InputError
from planner.inputs import ClusterInput, coerce, model_input


# ---------------------------------------------------------------------------------------------
# the check


@dataclass(frozen=True)
class CheckReport:
    """`planner check`: the prediction for exactly the user's config, and the findings."""

    source: str
    """'deepspeed' (a ds_config.json) or 'accelerate' (a YAML)."""
    estimate: object
    """planning.Estimate of the config as DeepSpeed would run it (None when DeepSpeed would refuse it
    before the prediction could be made)."""
    findings: list
    better: dict | None
    """The closest faster (or, when it does not fit, fitting) layout from the search: {layout, tokens_per_s,
    gain, changes}."""

    @property
    def ok(self) -> bool:
        fits = self.estimate is not None and self.estimate.memory["fits"]
        return fits and not any(f.severity == "error" for f in self.findings)

    def to_json(self) -> dict:
        return {"source": self.source, "ok": self.ok, "findings": [f.as_dict() for f in self.findings],
                "estimate": None if self.estimate is None else self.estimate.to_json(), "better": self.better}


ZERO_INPUTS = {  # TrainingInput field <- zero_optimization key(s), field name first, DeepSpeed alias after
    "reduce_bucket_size": ("reduce_bucket_size",), "allgather_bucket_size": ("allgather_bucket_size",),
    "stage3_prefetch_bucket_size": ("stage3_prefetch_bucket_size", "prefetch_bucket_size"),
    "stage3_max_live_parameters": ("stage3_max_live_parameters", "max_live_parameters"),
    "stage3_max_reuse_distance": ("stage3_max_reuse_distance", "max_reuse_distance"),
    "stage3_param_persistence_threshold": ("stage3_param_persistence_threshold", "param_persistence_threshold"),
    "sub_group_size": ("sub_group_size",),
}
NVME_INPUTS = {  # TrainingInput field <- (zero_optimization section, key): runtime/zero/offload_config.py
    "nvme_optimizer_buffer_count": ("offload_optimizer", "buffer_count"),
    "nvme_param_buffer_count": ("offload_param", "buffer_count"),
    "nvme_param_buffer_size": ("offload_param", "buffer_size"),
    "nvme_params_in_cpu": ("offload_param", "max_in_cpu"),
}


def _precision(ds: dict) -> tuple[str, list]:
    if enabled(ds, "bf16") or enabled(ds, "bfloat16"):
        return "bf16", []
    if enabled(ds, "fp16"):
        return "fp16", []
    auto = [k for k in ("bf16", "fp16") if isinstance(ds.get(k), dict) and ds[k].get("enabled") == "auto"]
    if auto:  # transformers trainer_config_process fills it from --bf16/--fp16 of the script
        return auto[0], [Finding("auto", "info", f"{auto[0]}.enabled 'auto' taken as on (the script's --{auto[0]}); "
                                 "the planner assumes the run is mixed precision")]
    return "fp32", []


def _optimizer(ds: dict) -> tuple[str, list]:
    kind = str((ds.get("optimizer") or {}).get("type", "")).lower()
    if not kind:
        return "adamw", [Finding("auto", "info", "no optimizer section: the script's own optimizer, taken as AdamW")]
    if "sgd" in kind:
        return "sgd", []
    if "adafactor" in kind:
        return "adafactor", []
    return "adamw", []


DEPRECATED_OFFLOAD = {"cpu_offload": "offload_optimizer", "cpu_offload_param": "offload_param"}
"""DeepSpeed 0.19.8 zero/config.py DeepSpeedZeroConfig: deprecated booleans whose new_param_fn makes
the section {device: cpu} when true (config_utils.py _process_deprecated_field, which asserts that
the deprecated key and its replacement are not given together)."""


def _deprecated_offload(zero: dict) -> tuple[dict, list]:
    """zero_optimization with cpu_offload / cpu_offload_param read as DeepSpeed reads them, and a
    finding for each."""
    found = []
    for old, new in DEPRECATED_OFFLOAD.items():
        if old not in zero:
            continue
        if new in zero:
            raise InputError(f"{FLAG}: zero_optimization.{old} and zero_optimization.{new} together: DeepSpeed refuses "
                             f"the deprecated key beside its replacement; keep {new}")
        if zero[old] is True:
            zero = {**zero, new: {"device": "cpu"}}
            found.append(Finding("config", "warning", f"zero_optimization.{old} is deprecated: DeepSpeed runs it as "
                                 f"{new}.device cpu (predicted so); write \"{new}\": {{\"device\": \"cpu\"}}"))
    return zero, found


def inputs(ds: dict, model, cluster: dict, layout: dict, mbs_flag: int | None) -> tuple:
    """(training dict, layout dict, findings) of the planning API for the config `ds` (with the
    model's hidden size for "auto" buckets, and TP/PP from the launch)."""
    from planner.inputs import resolve_model

    spec = resolve_model(model)
    gpus = cluster.get("gpus")
    tp, pp, cp = layout.get("tp", 1), layout.get("pp", 1), layout.get("cp", 1)
    if not gpus:
        raise InputError("--gpus: required (the run's total GPUs; an `accelerate launch` line gives it as "
                         "--num_processes)")
    if gpus % (tp * pp * cp):
        split = f"--tp*--pp = {tp * pp}" if cp == 1 else f"--tp*--pp*cp = {tp * pp * cp} (cp {cp} from the plan)"
        raise InputError(f"--gpus: {gpus} is not divisible by {split}")
    # Megatron-DeepSpeed's sequence-parallel (Ulysses) ranks are outside DeepSpeed's data-parallel group
    # (megatron/core/parallel_state.py get_data_parallel_world_size), whose size divides the batch
    dp = gpus // (tp * pp * cp)
    tbs, mbs, gas, found = batch(ds, dp, mbs_flag)
    zero, auto = resolve_auto_buckets(ds.get("zero_optimization") or {}, spec.hidden)
    found += auto
    stage = whole_number(zero.get("stage", 0), "zero_optimization.stage")
    if stage not in (0, 1, 2, 3):
        raise InputError(f"{FLAG}: zero_optimization.stage must be 0, 1, 2 or 3, got {stage}")
    zero, deprecated = _deprecated_offload(zero)
    found += deprecated
    offload = {part: str((zero.get(part) or {}).get("device", "none")) for part in OFFLOAD_KEYS}
    for part, device in offload.items():  # runtime/zero/offload_config.py OffloadDeviceEnum
        if device not in ("none", "cpu", "nvme"):
            raise InputError(f"{FLAG}: zero_optimization.{part}.device must be none, cpu or nvme, got {device!r}")
    if stage in (1, 2) and offload["offload_optimizer"] == "nvme":
        # DeepSpeed 0.19.8 stage_1_and_2.py __init__ sets cpu_offload for any device: it runs so
        offload["offload_optimizer"] = "cpu"
        found.append(Finding("config", "warning", f"zero_optimization.offload_optimizer.device nvme under stage {stage}: "
                             "DeepSpeed keeps the optimizer in host memory, as cpu (it swaps to NVMe under stage 3 "
                             "only); predicted as cpu"))
    optimizer, more = _optimizer(ds)
    precision, auto_precision = _precision(ds)
    found += more + auto_precision
    training = {"precision": precision, "optimizer": optimizer, "gbs": tbs,
                "engine": "megatron-deepspeed" if tp > 1 else "deepspeed",
                "fp32_grad_accum": str((ds.get("data_types") or {}).get("grad_accum_dtype", "")).lower() in ("fp32", "float32")}
    for field, keys in ZERO_INPUTS.items():
        for key in keys:
            if key in zero:
                training[field] = whole_number(zero[key], f"zero_optimization.{key}")
                break
    for field, (part, key) in NVME_INPUTS.items():
        if key in (zero.get(part) or {}):
            training[field] = whole_number(zero[part][key], f"zero_optimization.{part}.{key}")
    for flag in ("overlap_comm", "contiguous_gradients"):
        if isinstance(zero.get(flag), bool):
            training[flag] = zero[flag]
    swapper = zero.get("offload_optimizer") or {}
    if stage == 3 and offload["offload_optimizer"] == "nvme" and (swapper.get("pipeline_read") or swapper.get("pipeline_write")):
        # stage3.py _configure_tensor_swapping: PipelinedOptimizerSwapper overlaps a sub-group's I/O with the step
        found.append(Finding("config", "info", "offload_optimizer.pipeline_read/pipeline_write: DeepSpeed overlaps the "
                             "NVMe swaps with the CPU step; the step time here is DeepSpeed's default sequential "
                             "swapper's, an upper bound"))
    checkpointing = ds.get("activation_checkpointing") or {}  # runtime/activation_checkpointing/config.py
    for flag in ("partition_activations", "cpu_checkpointing"):
        training[flag] = bool(checkpointing.get(flag, False))  # DeepSpeed's defaults: both off
    if not engine_lookup(training["engine"]).deepspeed_checkpointing:
        # only deepspeed.checkpointing reads the section; Hugging Face modules checkpoint through
        # torch.utils.checkpoint, offloading only by the script's own call (transformers offload=True)
        training["cpu_checkpointing"] = False
        if checkpointing and pp == 1 and layout.get("recompute", "none") == "none":
            # DeepSpeed 0.19.8: DeepSpeedEngine never reads the section (runtime/config.py parses it for
            # deepspeed.checkpointing.configure); a Hugging Face model recomputes only where the script
            # calls gradient_checkpointing_enable() (transformers modeling_utils.py)
            found.append(Finding("config", "warning", "activation_checkpointing does not turn recomputation on: only "
                                 "deepspeed.checkpointing reads it, and a Hugging Face model checkpoints only where "
                                 "the script calls model.gradient_checkpointing_enable() (or TrainingArguments("
                                 "gradient_checkpointing=True)); predicted without recompute (--recompute full if "
                                 "the script does)"))
    lay = {**layout, "tp": tp, "pp": pp, "dp": dp, "zero": stage, "mbs": mbs,
           "offload_optimizer": offload["offload_optimizer"], "offload_params": offload["offload_param"]}
    return training, lay, found


def check(config, model, cluster: dict, training: dict | None = None, layout: dict | None = None,
          mbs: int | None = None, deepspeed: bool = True) -> CheckReport:
    """Predict and diagnose the run of DeepSpeed config `config` (path or dict) for `model` on
    `cluster`; `training` adds what the config does not say (seq_len), `layout` the launch's TP/PP
    and the script's recompute. `deepspeed`: also ask DeepSpeed's own config class, where it is
    installed (planner/deepspeed_native.py; a child process, seconds)."""
    cin = coerce(cluster, ClusterInput, "--gpus")
    cluster = {f: getattr(cin, f) for f in ClusterInput.__dataclass_fields__ if getattr(cin, f) is not None}
    model = model_input(model)
    ds, source = (config, "deepspeed") if isinstance(config, dict) else load_config(config)
    if isinstance(ds, AccelerateConfig):  # an Accelerate YAML, or an `accelerate launch` line already read
        source = "accelerate"
    if source == "accelerate" and not isinstance(config, dict) and not cluster.get("gpus") \
            and accelerate_num_processes(config):
        cluster = {**cluster, "gpus": accelerate_num_processes(config)}  # what `accelerate launch` starts
    layout = dict(layout or {})
    found = config_findings(ds, layout.get("pp", 1))
    train, lay, more = inputs(ds, model, cluster, layout, mbs)
    train.update(training or {})
    found += more
    if deepspeed:
        found.append(native_finding(ds, train, lay, any(f.kind == "config" and f.severity == "error" for f in found)))
    try:
        est = planning.estimate(model, cluster, train, lay)
    except InputError as exc:  # a layout the planner's rules refuse (DeepSpeed's own rules, engines.py)
        return CheckReport(source, None, found + [Finding("config", "error", str(exc))], None)
    found += diagnose(est, model, cluster, train, lay)
    found += zero3_load_findings(est, source, ds.zero3_init_flag if isinstance(ds, AccelerateConfig) else None)
    better = closest_better(est, model, cluster, train, lay)
    if better:
        speed = (f"{better['gain']:.2f}x the tokens/s" if better["gain"] is not None
                 else f"fits, {better['tokens_per_s']:,.0f} tokens/s")
        found.append(Finding("better", "info", f"the search's closest better config: {better['label']} "
                             f"({', '.join(better['changes']) or 'same layout fields'}), {speed}", gain=better["gain"]))
    return CheckReport(source, est, found, better)


def check_plan(plan, config: str | None, model: dict, cluster: dict, training: dict, layout: dict,
          deepspeed: bool = True):
    """`planner check` of a directory `--emit` wrote: the DeepSpeed config with the plan supplying what
    it cannot say (model, sequence, recompute, TP/PP/CP, sequence parallelism), or, for an engine
    without a DeepSpeed config (megatron, fsdp, torchtitan), the plan itself (doctor.CheckReport)."""
    from planner.engines import lookup
    from planner.plan_file import CONFIG_OWNED, inputs

    spec, clus, train, lay = inputs(plan, model, cluster, training, layout)
    note = Finding("auto", "info", f"model, cluster, training and layout from {str(plan.path)!r} "
                   "(flags given here win)")
    if config is not None and lookup(str(train.get("engine"))).deepspeed:
        ds, _ = load_config(config)
        drop = set(CONFIG_OWNED) - set(training)
        if not (train.get("precision") == "bf16-pure" and (ds.get("bf16") or {}).get("enabled") is True):
            drop.add("precision")  # bf16-pure is written as bf16 with master weights, which the doctor reads as bf16
        if isinstance(ds.get("optimizer"), dict):
            drop.add("optimizer")  # else the script's own (adafactor, adam8bit): the plan's
        train = {k: v for k, v in train.items() if k not in drop}
        r = check(config, spec, clus, train, lay, layout.get("mbs"), deepspeed)
        return CheckReport(r.source, r.estimate, [note, *r.findings], r.better)
    try:
        est = planning.estimate(spec, clus, train, lay)
    except InputError as exc:
        return CheckReport("plan", None, [note, Finding("config", "error", str(exc))], None)
    found = [note, *diagnose(est, spec, clus, train, lay)]
    better = closest_better(est, spec, clus, train, lay)
    if better:
        found.append(Finding("better", "info", f"the search's closest better layout: {better['label']} "
                             f"({', '.join(better['changes']) or 'same layout fields'})", gain=better["gain"]))
    return CheckReport("plan", est, found, better)


def native_finding(ds: dict, train: dict, lay: dict, planner_refuses: bool) -> Finding:
    """DeepSpeed's own DeepSpeedConfig on the resolved config, or why it could not be asked."""
    from planner import deepspeed_native

    word, detail = deepspeed_native.verdict(deepspeed_native.resolved(ds, train, lay, ZERO_INPUTS), lay["dp"])
    if word == "unavailable":
        return Finding("config", "info", f"{detail}: the config was checked against the planner's copy of "
                       "DeepSpeed's rules only")
    if word == "refused":
        return Finding("config", "error", f"{detail.split(':')[0]}'s own DeepSpeedConfig refuses it: "
                       f"{detail.split(': ', 1)[-1]}")
    note = " (though the planner's rules refuse it)" if planner_refuses else ""
    return Finding("config", "info", f"{detail}'s own DeepSpeedConfig accepts it{note}")
