"""`planner check`: a user's own DeepSpeed config (or Accelerate YAML), predicted and diagnosed.

The config becomes the planning API's inputs the way DeepSpeed and Accelerate read it
(planner/ds_config.py); `check` predicts that exact run and lists findings, each with the number
that triggered it and what a fix frees or gains.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner import planning
from planner.ds_config import (FLAG, OFFLOAD_KEYS, AccelerateConfig, Finding, accelerate_num_processes, batch,
                               config_findings, enabled, load_config, resolve_auto_buckets, whole_number)
from planner.engines import lookup as engine_lookup
from planner.errors import InputError
from planner.inputs import ClusterInput, coerce, model_input
from planner.layout import FIELDS, ZeroConfig


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


def zero3_load_findings(est, source: str, init_flag: bool | None) -> list[Finding]:
    """ZeRO-3 without deepspeed.zero.Init: the whole model on every rank at load, before DeepSpeed
    partitions it. transformers 5.25 modeling_utils.py get_init_context enters zero.Init only where
    is_deepspeed_zero3_enabled() (a live HfDeepSpeedConfig: Accelerate's DeepSpeedPlugin makes one only
    with zero3_init_flag, set_deepspeed_weakref); otherwise from_pretrained builds on the meta device
    and loads every weight into host memory, and DeepSpeed 0.19.8 engine.py _configure_distributed_model
    casts it to the bf16/fp16 of the config and moves the whole module to the GPU (module.to(device):
    not a zero.Init model) before stage3.py partitions it. With zero.Init (partition_parameters.py
    Init) each parameter is partitioned as it is made. Accelerate 1.16 utils/dataclasses.py
    DeepSpeedPlugin.__post_init__: an unset flag is is_zero3(), on; `accelerate config` writes false."""
    if est.layout["zero"] != 3 or init_flag is True:
        return []
    element_bytes = 4.0 if str(est.training.precision) == "fp32" else 2.0  # engine.py __check_params: fp32 without bf16/fp16
    gpu_bytes = est.model.params * element_bytes
    per_node = est.cluster.gpus_per_host  # the ranks sharing one host's memory (an NVL72 tray: 4)
    host_bytes = per_node * gpu_bytes  # every rank's copy in the load dtype (transformers' dtype "auto": the checkpoint's)
    capacity, host = est.memory["capacity_bytes"], cluster_host_bytes(est)
    if gpu_bytes <= capacity and host_bytes <= host:
        return []
    where = []
    if gpu_bytes > capacity:
        where.append(f"{gpu_bytes / 2**30:.1f} GiB a GPU of {capacity / 2**30:.1f} GiB")
    if host_bytes > host:
        where.append(f"{host_bytes / 2**30:.0f} GiB of host memory a host ({per_node} ranks) of {host / 2**30:.0f} GiB")
    load = (f"ZeRO-3 without deepspeed.zero.Init: every rank loads the whole model ({est.model.params:,} parameters, "
            f"{element_bytes:.0f} B each) before DeepSpeed partitions it: {' and '.join(where)}")
    if source == "accelerate" and init_flag is False:
        return [Finding("memory", "error", f"out of memory at load: zero3_init_flag false. {load}; fix: "
                        "zero3_init_flag: true in the YAML's deepspeed_config", value=float(gpu_bytes))]
    if source == "accelerate":
        return []  # unset: Accelerate turns it on under ZeRO-3
    return [Finding("memory", "warning", f"{load}, unless the script makes the model under zero.Init: with "
                    "transformers, an HfDeepSpeedConfig(ds_config) kept alive (or Trainer's TrainingArguments("
                    "deepspeed=...)) before from_pretrained; with Accelerate, zero3_init_flag: true",
                    value=float(gpu_bytes))]


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


def _variant(model, cluster, train, lay, **change):
    """The estimate of `lay` with `change` (training fields prefixed 't_'), or None if the rules refuse it."""

    t = {**train, **{k[2:]: v for k, v in change.items() if k.startswith("t_")}}
    l = {**lay, **{k: v for k, v in change.items() if not k.startswith("t_")}}
    try:
        return planning.estimate(model, cluster, t, l)
    except InputError:
        return None


def diagnose(est, model, cluster: dict, train: dict, lay: dict) -> list[Finding]:
    """Memory, communication, host memory and compute findings for the predicted run."""
    mem, time, found = est.memory, est.time, []
    total, capacity = mem["required_bytes"], mem["capacity_bytes"]  # what must fit (memory.rank_memory)
    if not mem["fits"]:
        found.append(Finding("memory", "error", f"out of memory at the {mem['peak_phase']} peak: {total / 2**30:.1f} GiB per GPU of "
                             f"{capacity / 2**30:.1f} GiB", value=float(total)))
    elif mem["verdict"] == "borderline":
        found.append(Finding("memory", "warning", f"borderline: {mem['fit_margin_bytes'] / 2**30:.1f} GiB left, inside "
                             f"the +-{mem['error_band']:.0%} error band", value=float(mem["fit_margin_bytes"])))
    if mem["verdict"] != "fits":
        fixes = []
        if lay.get("recompute", "none") != "full":
            fixes.append(("recompute full (activation checkpointing every layer)", {"recompute": "full"}))
        if lay["mbs"] > 1:
            half = lay["mbs"] // 2
            fixes.append((f"micro-batch {half} with accumulation x2", {"mbs": half}))
        if lay["zero"] < 3 and lay.get("pp", 1) == 1:
            fixes.append((f"ZeRO stage {lay['zero'] + 1}", {"zero": lay["zero"] + 1}))
        if lay["offload_optimizer"] == "none" and lay["zero"] >= 1:
            fixes.append(("offload_optimizer to cpu", {"offload_optimizer": "cpu"}))
        if lay["zero"] == 3:
            # both: the reuse distance keeps gathered what max_live alone would not (engines/deepspeed/memory.py zero3_ahead_params)
            live = min(train.get("stage3_max_live_parameters", 10**9), train.get("stage3_max_reuse_distance", 10**9))
            fixes.append((f"stage3_max_live_parameters and stage3_max_reuse_distance {live // 10:,}",
                          {"t_stage3_max_live_parameters": live // 10, "t_stage3_max_reuse_distance": live // 10}))
            if lay["offload_params"] == "none":  # stage3.py offload_param: the partition waits in host memory
                fixes.append(("offload_param to cpu", {"offload_params": "cpu", "offload_optimizer": "cpu"}))
            prefetch = train.get("stage3_prefetch_bucket_size", ZeroConfig().stage3_prefetch_bucket_size)
            fixes.append((f"stage3_prefetch_bucket_size {prefetch // 10:,}", {"t_stage3_prefetch_bucket_size": prefetch // 10}))
        if lay["zero"] >= 1:  # the gradient buckets ZeRO fills before each reduction (engines/deepspeed/memory.py deepspeed_reduce_buckets)
            bucket = train.get("reduce_bucket_size", ZeroConfig().reduce_bucket_size)
            fixes.append((f"reduce_bucket_size {bucket // 10:,}", {"t_reduce_bucket_size": bucket // 10}))
        for text, change in fixes:
            v = _variant(model, cluster, train, lay, **change)
            if v is not None and v.memory["required_bytes"] < total:
                frees = total - v.memory["required_bytes"]
                found.append(Finding("memory", "info", f"fix: {text} frees {frees / 2**30:.1f} "
                                     f"GiB per GPU ({'fits' if v.memory['fits'] else 'still does not fit'})",
                                     frees_bytes=int(frees),
                                     gain=v.throughput["tokens_per_s"] / est.throughput["tokens_per_s"]))
        # near the limit the caching allocator can fail with memory stranded in split blocks of segments
        # still in use; expandable segments grow in place instead (c10/cuda/CUDACachingAllocator.cpp
        # ExpandableSegment; the advice PyTorch's own OOM message gives)
        if not est.training.expandable_segments:
            found.append(Finding("memory", "info", "fix: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the launch "
                                 "environment (--expandable-segments): memory the allocator would strand in split blocks "
                                 "near the limit stays usable (frees no allocated byte)"))
    b, step = time["breakdown"], time["step_s"]
    comm = b["tp_comm"] + b["dp_comm"] + b["pp_comm"]
    if comm > 0.3 * step:
        text = f"communication is {comm / step:.0%} of the step (tp {b['tp_comm']:.2f} s, dp {b['dp_comm']:.2f} s)"
        if train.get("overlap_comm") is not True and lay["zero"] < 3:
            v = _variant(model, cluster, train, lay, t_overlap_comm=True)
            if v is not None:
                text += f"; overlap_comm true: {v.throughput['tokens_per_s'] / est.throughput['tokens_per_s']:.2f}x"
        found.append(Finding("communication", "warning", text, value=comm / step))
    found += _large_buckets(est, model, cluster, train, lay)
    found += _recompute_regathers(est, model, cluster, train, lay)
    found += _nvme_reuse_buffer(est, model, cluster, train, lay)
    host = cluster_host_bytes(est)
    if mem["cpu_bytes_per_node"] > 0.8 * host and (lay["offload_optimizer"] != "none" or lay["offload_params"] != "none"):
        found.append(Finding("cpu_memory", "warning", f"offload uses {mem['cpu_bytes_per_node'] / host:.0%} of the "
                             f"node's {host / 2**30:.0f} GiB host memory", value=mem["cpu_bytes_per_node"] / host))
    if b["compute"] < 0.5 * step:
        worst = max((k for k in b if k != "compute"), key=lambda k: b[k])
        found.append(Finding("compute", "warning", f"compute is {b['compute'] / step:.0%} of the step; the largest "
                             f"overhead is {worst} ({b[worst] / step:.0%})", value=b["compute"] / step))
    return found


BUCKET_STAGES = {  # bucket key -> the ZeRO stages that read it (engine.py _configure_zero_optimizer)
    "reduce_bucket_size": (1, 2, 3), "allgather_bucket_size": (1, 2), "stage3_prefetch_bucket_size": (3,),
    "stage3_max_live_parameters": (3,), "stage3_max_reuse_distance": (3,)}


def _large_buckets(est, model, cluster: dict, train: dict, lay: dict) -> list[Finding]:
    """Buckets set well above DeepSpeed's defaults (DeepSpeed 0.19.8 runtime/zero/config.py
    DeepSpeedZeroConfig, layout.ZeroConfig): what they cost of the predicted peak, by the estimate
    again with the defaults. They are allocated (reduce buckets, engines/deepspeed/memory.py deepspeed_reduce_buckets) or
    bound what stays gathered (ZeRO-3 prefetch and live parameters), so larger ones raise the peak."""
    default = ZeroConfig()
    large = {k: train[k] for k, stages in BUCKET_STAGES.items()
             if lay["zero"] in stages and train.get(k, 0) > 2 * getattr(default, k)}
    if not large:
        return []
    v = _variant(model, cluster, train, lay, **{f"t_{k}": getattr(default, k) for k in large})
    cost = None if v is None else est.memory["required_bytes"] - v.memory["required_bytes"]
    if cost is None or cost <= 0:
        return []
    what = ", ".join(f"{k} {n:,} (default {getattr(default, k):,})" for k, n in large.items())
    severity = "info" if est.memory["verdict"] == "fits" else "warning"
    return [Finding("memory", severity, f"buckets above DeepSpeed's defaults cost {cost / 2**30:.1f} GiB of the "
                    f"{est.memory['required_bytes'] / 2**30:.1f} GiB peak per GPU: {what}; larger buckets raise the "
                    "peak, they do not lower it (the defaults free it)", value=float(cost), frees_bytes=int(cost),
                    gain=v.throughput["tokens_per_s"] / est.throughput["tokens_per_s"])]


def _recompute_regathers(est, model, cluster: dict, train: dict, lay: dict) -> list[Finding]:
    """ZeRO-3 with every block recomputed, where the live-parameter knobs let DeepSpeed release what
    the recompute gathered before the backward uses it (sharding.recompute_fetches): the share of a
    block gathered twice, and what knobs raised to the block (variants.roomy_zero3_training) buy."""
    from planner import sharding, variants
    from planner.layout import single

    if lay["zero"] != 3 or lay.get("recompute", "none") != "full":
        return []
    one = single(**{k: est.layout[k] for k in ("tp", "pp", "dp", "ep")}, zero=3, recompute="full")
    again = float(sharding.recompute_fetches(est.model, est.training, one)["regather"][0])
    roomy = variants.roomy_zero3_training(est.model, est.training)
    if again <= 0 or roomy is None:
        return []
    knobs = roomy.zero_config.stage3_max_live_parameters
    share = again / float(sharding.block_params(est.model, est.training, one)[0] * est.model.layers)
    text = (f"the recompute gathers {share:.0%} of each block again in the backward (released in between: "
            f"stage3_max_live_parameters / stage3_max_reuse_distance under the block)")
    v = _variant(model, cluster, train, lay, t_stage3_max_live_parameters=knobs, t_stage3_max_reuse_distance=knobs)
    if v is None:
        return [Finding("communication", "info", text, value=share)]
    more = v.memory["required_bytes"] - est.memory["required_bytes"]
    text += (f"; both {knobs:,} keep it: {v.throughput['tokens_per_s'] / est.throughput['tokens_per_s']:.2f}x, "
             f"{more / 2**30:+.1f} GiB per GPU ({'fits' if v.memory['fits'] else 'does not fit'})")
    return [Finding("communication", "info", text, value=share,
                    gain=v.throughput["tokens_per_s"] / est.throughput["tokens_per_s"])]


def _nvme_reuse_buffer(est, model, cluster: dict, train: dict, lay: dict) -> list[Finding]:
    """ZeRO-3 with the parameters on NVMe, where the partition spills past offload_param.max_in_cpu:
    DeepSpeed pins a buffer of the largest sub-group's full (unpartitioned) parameters on every rank
    (sharding.zero3_swap_elements 'reuse'), and a smaller sub_group_size shrinks it."""
    from planner import sharding
    from planner.layout import single

    if lay["zero"] != 3 or lay["offload_params"] != "nvme":
        return []
    one = single(**{k: est.layout[k] for k in ("tp", "pp", "dp", "ep")}, zero=3, offload_params="nvme")
    reuse = float(sharding.zero3_swap_elements(est.model, est.training, one, 0)["reuse"][0])
    if reuse <= 0:
        return []
    w = est.training.precision.element_bytes
    text = (f"ZeRO-Infinity pins {reuse * w / 2**30:.1f} GiB a rank for the largest sub-group's full parameters "
            f"(the partition spills past offload_param.max_in_cpu)")
    smaller = est.training.zero_config.sub_group_size // 10
    v = _variant(model, cluster, train, lay, t_sub_group_size=smaller)
    if v is not None:
        saved = est.memory["cpu_bytes_per_node"] - v.memory["cpu_bytes_per_node"]
        text += (f"; sub_group_size {smaller:,} frees {saved / 2**30:.1f} GiB of host memory a node, "
                 f"{v.throughput['tokens_per_s'] / est.throughput['tokens_per_s']:.2f}x")
    return [Finding("cpu_memory", "info", text, value=reuse * w)]


def _setting_changes(mine, my_zero: int, theirs, their_zero: int) -> list:
    """The ds_config settings recommend's searches chose (refine.searched_settings) that differ from the
    config's: overlap_comm as DeepSpeed resolves it per stage (Training.overlaps_grad_reduce), and
    ZeRO-3's live-parameter knobs where the layout is ZeRO-3."""
    out = []
    a, b = bool(mine.overlaps_grad_reduce(my_zero)), bool(theirs.overlaps_grad_reduce(their_zero))
    if their_zero >= 1 and a != b:
        out.append(f"overlap_comm {str(a).lower()} -> {str(b).lower()}")
    if their_zero == 3:
        for knob in ("stage3_max_live_parameters", "stage3_max_reuse_distance"):
            x, y = getattr(mine.zero_config, knob), getattr(theirs.zero_config, knob)
            if x != y:
                out.append(f"{knob} {x:,} -> {y:,}")
    return out


def cluster_host_bytes(est) -> float:
    return float(est.cluster.host_ram_bytes_per_host)


def closest_better(est, model, cluster: dict, train: dict, lay: dict) -> dict | None:
    """Among the search's fitting layouts for the same model, batch and engine, the one changing the
    fewest layout fields that is faster (or, when the config does not fit, that fits), fastest first."""
    from planner.results import short

    rec = planning.recommend(model, cluster, train, top=50)
    fits = est.memory["fits"]
    now = est.throughput["tokens_per_s"] if fits else 0.0
    best = None
    for r in rec.layouts:
        speed = r["throughput"]["tokens_per_s"]
        if speed <= now * 1.01:
            continue
        # every field a layout record holds (layout.FIELDS: cp, dp, gas, sequence parallelism ... too)
        changes = [f"{k} {est.layout.get(k)} -> {r['layout'][k]}" for k in FIELDS if r["layout"][k] != est.layout.get(k)]
        changes += _setting_changes(est.training, est.layout["zero"], rec.training, r["layout"]["zero"])
        rank = (len(changes), -speed)
        if best is None or rank < best[0]:
            best = (rank, r, changes)
    if best is None:
        return None
    _, r, changes = best
    return {"layout": r["layout"], "label": short(r["layout"]), "tokens_per_s": r["throughput"]["tokens_per_s"],
            "gain": r["throughput"]["tokens_per_s"] / now if fits else None, "changes": changes}
