"""`planner check`'s findings on a predicted run: memory, communication, host memory and compute, each
with what a fix frees or gains, and the search's closest better layout."""

from __future__ import annotations

from planner import planning
from planner.ds_rules import Finding
from planner.errors import InputError
from planner.layout import FIELDS, ZeroConfig
from planner.stage import Stage


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
    reuse = float(sharding.zero3_swap_elements(Stage(est.model, est.training, one, 0))["reuse"][0])
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
