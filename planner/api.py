"""The planning API: `estimate` one layout, `recommend` the fastest that fits, `validate` against
published runs. Plain typed functions: the CLI, the Streamlit app and calibrate/ all call these.

    from planner import api
    e = api.estimate("llama-3-70b", {"gpus": 16}, layout={"tp": 8, "pp": 2, "recompute": "selective"})
    e.memory["gpu_bytes"], e.time["step_s"], e.to_json()
    r = api.recommend(70e9, {"gpus": 16})
    r.layouts[0]["layout"], r.assumptions

Inputs are given by value (planner/inputs.py); every default applied is reported back in the
answer's `defaults`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from planner import fp8, memory, rules, search
from planner.calibration import clears_band, prior_band, verdict
from planner.engines import ENGINES, NAMES as ENGINE_NAMES
from planner.errors import InputError
from planner.hardware import Cluster, lookup_gpu
from planner.inputs import (DEFAULTS, ClusterInput, LayoutInput, ModelInput, TrainingInput, coerce, model_input,
                            resolve_model, with_gpus)
from planner.layout import Layouts, Training, ZeroConfig, single
from planner.model import ModelSpec
from planner.modules import block_modules, word_of
from planner.options import Recompute
from planner.timing import time_to_train


@dataclass(frozen=True)
class Estimate:
    """Memory and step time of one layout."""

    model: ModelSpec
    cluster: Cluster
    training: Training
    record: dict
    """{layout, memory (with per_stage), time, throughput} as in the JSON answer."""
    defaults: dict
    """Each input the planner filled in, with the value it used."""
    time_to_train: dict | None = None
    deepspeed_estimator: dict | None = None

    @property
    def layout(self) -> dict:
        return self.record["layout"]

    @property
    def memory(self) -> dict:
        return self.record["memory"]

    @property
    def time(self) -> dict:
        return self.record["time"]

    @property
    def throughput(self) -> dict:
        return self.record["throughput"]

    def to_json(self) -> dict:
        """The `planner estimate --json` object (schema frozen by tests/test_cli.py)."""
        out = {"model": self.model.shape_dict(), "cluster": cluster_dict(self.cluster),
               "training": self.training.as_dict(), **self.record, "defaults": self.defaults}
        if self.time_to_train is not None:
            out["time_to_train"] = self.time_to_train
        if self.deepspeed_estimator is not None:
            out["deepspeed_estimator"] = self.deepspeed_estimator
        return out


@dataclass(frozen=True)
class Recommendation:
    """The fastest layouts that fit, and what the search rejected."""

    model: ModelSpec
    cluster: Cluster
    training: Training
    assumptions: dict
    """The inputs every layout shares, given or defaulted."""
    defaults: dict
    candidates_evaluated: int
    rejected: dict
    """{reason: count} over the whole space."""
    layouts: list
    """Records as in Estimate.record (without per_stage), with binding_constraint, fastest first."""
    suggestions: list = field(default_factory=list)
    """When nothing fits: what would."""
    elapsed_s: float = 0.0
    landscape: dict | None = None
    """recommend(landscape=N): fitting layouts as {label, gpu_bytes, tokens_per_s, pareto} lists."""
    clear_fit: dict | None = None
    """Where layouts[0] is borderline (its peak's error band straddles capacity): the fastest layout
    whose peak clears the band, as a layout record with rank (its place in layouts, None when past
    `top`) and relative_speed (to layouts[0]); None where layouts[0] clears it or none does."""
    engines: list = field(default_factory=list)
    """The fastest fitting layout under each other engine: {engine, layout, tokens_per_s,
    relative_speed (to layouts[0]; > 1 is faster), note (why there is none), settings (the
    training settings its search chose: tp_comm_overlap, optimizer_offload_fraction, the ZeRO-3
    live-parameter knobs, where they differ from the engine's defaults)}."""
    notes: list = field(default_factory=list)
    """What the answer changed from the question: the engine chosen because the default one had no
    fitting layout (the user gave no --engine)."""
    batch_proposals: list = field(default_factory=list)
    """Where nothing fits the engine because of the batch (it splits over too few data-parallel
    ranks): the nearest batches that fit, as {gbs, tokens_per_step, engine, layout, tokens_per_s,
    settings}, nearest first, each faster than any nearer one on its side."""
    batch_note: str | None = None
    """Why the batch is the cause, where it is (the batch, the largest data-parallel degree it allows)."""

    def to_json(self) -> dict:
        """The `planner recommend --json` object."""
        return {"model": self.model.shape_dict(), "assumptions": self.assumptions, "defaults": self.defaults,
                "candidates_evaluated": self.candidates_evaluated, "rejected": self.rejected,
                "layouts": self.layouts, "suggestions": self.suggestions, "clear_fit": self.clear_fit,
                "engines": self.engines, "notes": self.notes, "batch_proposals": self.batch_proposals}


# ---------------------------------------------------------------------------------------------


def default_engine(tp: int = 1, cp: int = 1, vpp: int = 1, sequence_parallel: bool = False, fp8: bool = False,
                   ep: int = 1) -> str:
    """The engine without --engine, for the layout estimate takes or the axes recommend is pinned to:
    megatron when interleaving, with FP8 GEMMs (neither DeepSpeed engine has an FP8 path; NVIDIA's
    FP8 recipes are Megatron's) or with expert parallelism (DeepSpeed alone has none; NVIDIA's MoE
    recipes are Megatron-Core's), megatron-deepspeed with TP, CP or sequence parallelism (DeepSpeed
    alone has none), else deepspeed."""
    if vpp > 1 or fp8 or ep > 1:
        return "megatron"
    return "megatron-deepspeed" if max(tp, cp) > 1 or sequence_parallel else DEFAULTS["engine"]


def _wants_fp8(tin: TrainingInput) -> bool:
    return str(tin.precision).strip().lower() == "fp8" or tin.fp8_recipe is not None


def default_gbs(tin: TrainingInput, unit: int = 1) -> int:
    """The global batch in sequences without --gbs: --tokens-per-step (default 4Mi tokens, as
    published pretraining runs of this size take) over the sequence length, rounded to the nearest
    multiple of `unit` (estimate's --mbs*--dp: a batch it can split; at least one of it)."""
    seq_len = tin.seq_len or DEFAULTS["seq_len"]
    sequences = max(1, int(round((tin.tokens_per_step or DEFAULTS["tokens_per_step"]) / seq_len)))
    return max(1, (sequences + unit // 2) // unit) * unit


def estimate(model, cluster=None, training=None, layout=None, *, ds_estimator: bool = False) -> Estimate:
    """Memory (every pipeline stage) and step time of one layout.

    model: a ModelSpec, ModelInput, catalog name, config.json path or dict, or a parameter count;
    cluster, training, layout: ClusterInput/TrainingInput/LayoutInput or dicts of their fields."""
    cin = coerce(cluster, ClusterInput, "--gpus")
    tin = coerce(training, TrainingInput, "--engine")
    lin = coerce(layout, LayoutInput, "--tp")
    defaults = {}
    tp, pp, cp, mbs = lin.tp, lin.pp, lin.cp, lin.mbs
    if lin.dp is None:
        if cin.gpus and cin.gpus % (tp * pp * cp):
            raise InputError(f"--gpus: {cin.gpus} is not divisible by --tp*--pp*--cp = {tp * pp * cp}")
        dp = (cin.gpus or tp * pp * cp) // (tp * pp * cp)
        defaults["dp"] = dp
    else:
        dp = lin.dp
    world = tp * pp * cp * dp
    if cin.gpus and cin.gpus != world:
        raise InputError(f"--gpus: {cin.gpus} != --tp*--pp*--dp*--cp = {world}")
    if not cin.gpus:
        defaults["gpus"] = world
    gbs = tin.gbs or default_gbs(tin, mbs * dp)
    if gbs % (mbs * dp):
        raise InputError(f"--gbs: {gbs} is not divisible by --mbs*--dp = {mbs * dp}")
    if tin.gbs is None:
        defaults["gbs"] = gbs
        if tin.tokens_per_step is None:
            defaults["tokens_per_step"] = DEFAULTS["tokens_per_step"]
    spec = resolve_model(model)
    defaults.update(_model_defaults(model))
    engine = tin.engine or default_engine(lin.tp, lin.cp, lin.vpp, bool(lin.sequence_parallel), _wants_fp8(tin),
                                          lin.ep or 1)
    if tin.engine is None:
        defaults["engine"] = engine
    train = tin.resolve(gbs, engine)
    defaults.update(_training_defaults(tin, cin, train, spec))
    clus = cin.resolve(train.gemm_dtype if train.fp8_recipe else train.precision, world)
    lay = single(tp=tp, pp=pp, dp=dp, cp=cp, ep=lin.ep, etp=lin.etp, vpp=lin.vpp, zero=lin.zero,
                 offload_optimizer=lin.offload_optimizer, offload_params=lin.offload_params, mbs=mbs,
                 gas=gbs // (mbs * dp), recompute=lin.recompute, recompute_layers=lin.recompute_layers,
                 recompute_method=lin.recompute_method or "block",
                 sequence_parallel=lin.sequence_parallel if lin.sequence_parallel is not None
                 else train.engine.sequence_parallel_with_tp and tp > 1,
                 schedule=lin.schedule, rank_order=lin.rank_order)
    if lin.sequence_parallel is None and train.engine.sequence_parallel_with_tp and tp > 1:
        defaults["sequence_parallel"] = True
    if tin.tp_comm_overlap is None and train.engine.sequence_parallel_with_tp and bool(lay.sequence_parallel[0]) \
            and tp > 1:
        # TP communication overlap where the engine's users run it with sequence parallelism (NeMo 2
        # recipes, e.g. llama3_70b.py pretrain_performance_optimizations: MegatronCommOverlapCallback
        # tp_comm_overlap=True; the Megatron-LM README's runs): --no-tp-comm-overlap turns it off
        train = replace(train, tp_comm_overlap=True)
        defaults["tp_comm_overlap"] = True
    rules.check_single(spec, clus, train, lay)
    ev = search.evaluate(spec, clus, train, lay)
    record = layout_record(clus, lay, ev, 0)
    record["memory"]["per_stage"] = stage_records(spec, clus, train, lay)
    tt = None
    if tin.tokens:
        tt = _time_to_train(record["time"]["step_s"], gbs * train.seq_len, tin, clus)
    dse = deepspeed_estimator_rows(spec, clus) if ds_estimator else None
    return Estimate(spec, clus, train, record, defaults, tt, dse)


def recommend(model, cluster=None, training=None, *, top: int | None = None, memory_headroom: float | None = None,
              max_mbs: int | None = None, pinned: dict | None = None, landscape: int = 0,
              compare_engines: bool = True, _engines: dict | None = None) -> Recommendation:
    """The `top` fastest layouts that fit (with `memory_headroom` of GPU memory kept free), searched
    over every TP/PP/VPP/CP/DP/EP degree, ZeRO stage, offload, micro-batch up to `max_mbs`,
    recompute and sequence parallelism the engine allows.

    pinned: {field: value} of LayoutInput fields (words as the flags take them) that every layout
    keeps, e.g. {"tp": 8, "zero": 1}. landscape: also return up to this many fitting layouts as
    (memory, speed) points with the Pareto front (Recommendation.landscape), for plots.
    compare_engines: False skips the other engines' searches (most of the time a recommend takes):
    Recommendation.engines is then empty, and no other engine answers when this one has no layout.

    Without an engine given, where the default engine has no fitting layout, the answer is the
    fastest engine's that has one (Recommendation.notes says so; defaults["engine"] names it).
    Where nothing fits because the batch splits over too few data-parallel ranks, the nearest
    batches that fit are in Recommendation.batch_proposals. _engines: internal, the other engines'
    best layouts already searched ({engine: entry as in Recommendation.engines})."""
    from planner.bounds import check

    cin = coerce(cluster, ClusterInput, "--gpus")
    tin = coerce(training, TrainingInput, "--engine")
    if str(tin.precision).strip().lower() == "auto":
        return _recommend_either_precision(model, cin, tin, dict(top=top, memory_headroom=memory_headroom,
                                                                 max_mbs=max_mbs, pinned=pinned, landscape=landscape))
    given = {"top": top, "memory_headroom": memory_headroom, "max_mbs": max_mbs}
    defaults = {k: DEFAULTS[k] for k, v in given.items() if v is None}
    top, headroom, max_mbs = (check(k, DEFAULTS[k] if v is None else v) for k, v in given.items())
    spec = resolve_model(model)
    defaults.update(_model_defaults(model))
    tokens = tin.tokens_per_step or DEFAULTS["tokens_per_step"]
    gbs = tin.gbs or default_gbs(tin)
    if tin.gbs is None:
        defaults["gbs"] = gbs
        if tin.tokens_per_step is None:
            defaults["tokens_per_step"] = tokens
    if cin.gpus is None:
        raise InputError("--gpus: required for recommend (total GPUs, e.g. --gpus 16)")
    clus = cin.resolve(tin.precision or ("fp8" if tin.fp8_recipe else DEFAULTS["precision"]), cin.gpus)
    pins = _pin_codes(pinned or {}, clus.num_gpus)
    train = tin.resolve(gbs, tin.engine or default_engine(pins.get("tp", 1), pins.get("cp", 1), pins.get("vpp", 1),
                                                          bool(pins.get("sequence_parallel", 0)), _wants_fp8(tin),
                                                          pins.get("ep", 1)))
    if tin.engine is None:
        defaults["engine"] = train.engine.name
    defaults.update(_training_defaults(tin, cin, train, spec))
    train, result = _search_edges(spec, clus, train, headroom, max_mbs, pins, tin.pipeline_edge_layers is None)
    if tin.pipeline_edge_layers is None and train.pipeline_edge_layers != train.engine.pipeline_edge_layers:
        defaults["pp_edge_layers"] = train.pipeline_edge_layers  # chosen: search.edge_layers_choice
    knobs_free = tin.stage3_max_live_parameters is None and tin.stage3_max_reuse_distance is None
    train, result, knobbed = _search_zero3_knobs(spec, clus, train, headroom, max_mbs, pins, result, knobs_free)
    if knobs_free and train.zero_config.stage3_max_live_parameters != ZeroConfig().stage3_max_live_parameters:
        defaults["stage3_max_live_parameters"] = train.zero_config.stage3_max_live_parameters  # searched
        defaults["stage3_max_reuse_distance"] = train.zero_config.stage3_max_reuse_distance
    overlap_free = tin.tp_comm_overlap is None
    train, result = _search_tp_overlap(spec, clus, train, headroom, max_mbs, pins, result, overlap_free)
    if train.tp_comm_overlap and overlap_free:
        defaults["tp_comm_overlap"] = True  # searched
    share_free = tin.optimizer_offload_fraction is None
    train, result = _search_offload_share(spec, clus, train, headroom, result, share_free)
    if train.optimizer_offload_fraction != 1.0:
        defaults["optimizer_offload_fraction"] = train.optimizer_offload_fraction  # searched
    train, result = _search_overlap_comm(spec, clus, train, headroom, result)
    if train.zero_config.overlap_comm and tin.overlap_comm is None:
        defaults["overlap_comm"] = True  # searched: ZeRO-1/2 with DeepSpeed's overlap_comm
    if pins and result["valid"].size == 0:
        _raise_contradiction(spec, clus, train, max_mbs, pins, pinned)
    assumptions = {
        "gpu": clus.gpu.name, "gpus_per_node": clus.gpus_per_node, "pod_gpus": clus.pod_gpus,
        "oversubscription": clus.oversubscription, "seq_len": train.seq_len, "gbs": gbs,
        "tokens_per_step": gbs * train.seq_len, "engine": train.engine.name,
        "precision": "fp8" if train.fp8_recipe else str(train.precision),
        **({"fp8_recipe": str(train.fp8_recipe)} if train.fp8_recipe else {}),
        "optimizer": str(train.optimizer), "flash_attention": train.flash_attention, "compile": train.compile,
        "modules": word_of(block_modules(spec, train)), "memory_headroom": headroom, "pp_edge_layers": train.pipeline_edge_layers,
        "calibration": clus.calibration.name if clus.calibration else None,
        "peak_memory_band": band_of(clus, "peak_memory"),
    }
    for knob in ("stage3_max_live_parameters", "stage3_max_reuse_distance", "optimizer_offload_fraction",
                 "tp_comm_overlap", "overlap_comm"):
        if knob in defaults:  # chosen by _search_zero3_knobs, _search_offload_share, _search_tp_overlap: estimate
            # needs them to agree
            assumptions[knob] = defaults[knob]
    if pins:
        assumptions["pinned"] = {k: pinned[k] for k in search.PINNABLE if k in pinned}
    if result["coarsened"]:  # the space was larger than one search materializes
        assumptions["search_coarsened"] = list(result["coarsened"])
    # with other ZeRO-3 knobs, the ZeRO-3 rows are that search's, the others the first search's
    sources = [(result, result["valid"].zero != 3 if knobbed else None)] + ([(knobbed, None)] if knobbed else [])
    ranked = []
    for res, keep in sources:
        for i in search.distinct_top(res, top if keep is None else top + int(np.count_nonzero(~keep))):
            if keep is None or keep[i]:
                ranked.append((-float(res["eval"]["time"]["throughput"]["tokens_per_s"][i]), len(ranked), res, i))
    records = []
    for _, _, res, i in sorted(ranked, key=lambda r: r[:2])[:top]:
        rec = layout_record(clus, res["valid"], res["eval"], i)
        rec["binding_constraint"] = search.binding_constraint(res, i, rec["time"]["breakdown"], rec["time"]["step_s"])
        if tin.tokens:
            rec["time_to_train"] = _time_to_train(rec["time"]["step_s"], gbs * train.seq_len, tin, clus)
        records.append(rec)
    clear = _fastest_clear_fit(clus, sources, records) if records and records[0]["memory"]["verdict"] != "fits" else None
    points = search.landscape(result, landscape) if landscape else None
    best = records[0]["throughput"]["tokens_per_s"] if records else None
    # each engine searches overlap_comm itself from the user's value, as its own recommend would
    unsearched = replace(train, zero_config=replace(train.zero_config, overlap_comm=tin.overlap_comm))
    frees = (tin.pipeline_edge_layers is None, knobs_free, share_free, overlap_free)
    if not compare_engines:
        others = []
    elif _engines is None:
        others = [_engine_best(spec, clus, unsearched, name, headroom, max_mbs, pins, best, *frees)
                  for name in ENGINE_NAMES if name != train.engine.name]
    else:  # the first answer's searches of the other engines, against this one's best
        others = [{**_engines[name], "relative_speed": None if best is None or _engines[name]["tokens_per_s"] is None
                   else _engines[name]["tokens_per_s"] / best} for name in ENGINE_NAMES if name != train.engine.name]
    proposals, batch_note = ([], None) if records else _batch_proposals(spec, clus, unsearched, headroom, max_mbs, pins,
                                                                         result, frees)
    fitting = [e for e in others if e["layout"] is not None]
    if not records and tin.engine is None and fitting:
        # the user named no engine and the default one cannot train this: answer with the fastest
        # engine that can, as `--engine` would, and say so
        chosen = max(fitting, key=lambda e: e["tokens_per_s"])
        why = batch_note or search.leanest_text(clus, headroom, result) or "its rules reject every layout"
        known = {e["engine"]: e for e in others}
        known[train.engine.name] = {"engine": train.engine.name, "layout": None, "tokens_per_s": None,
                                    "relative_speed": None, "note": why, "settings": {}}
        answer = recommend(model, cin, replace(tin, engine=chosen["engine"]), top=top,
                           memory_headroom=memory_headroom, max_mbs=max_mbs, pinned=pinned, landscape=landscape,
                           _engines=known)
        answer.defaults["engine"] = chosen["engine"]
        lead = answer.layouts[0] if answer.layouts else None
        answer.notes.insert(0, f"no {train.engine.name} layout fits ({why}); {chosen['engine']}'s fastest fits"
                            + (f": {search.short(lead['layout'])} at {lead['throughput']['tokens_per_s']:,.0f} tokens/s"
                               if lead else "") + f" (the engine without --engine is {train.engine.name})")
        answer.batch_proposals[:0] = proposals
        return replace(answer, batch_note=batch_note)
    hints = [] if records else search.what_would_fit(spec, clus, train, headroom, max_mbs, result)
    if proposals:
        hints.insert(0, f"--gbs {proposals[0]['gbs']} fits ({search.short(proposals[0]['layout'])}, "
                        f"{proposals[0]['tokens_per_s']:,.0f} tokens/s)")
    return Recommendation(spec, clus, train, assumptions, defaults, result["candidates"], result["rejected"],
                          records, hints, result["elapsed_s"], points, clear, others, [], proposals, batch_note)


BATCH_WINDOW = 0.125
"""How far from the asked batch recommend looks for one that fits (a share of it, either side)."""
BATCH_TRIES = 3
"""Batches searched on each side of the asked one, at most: the nearest that allow the most data parallelism."""


def _batch_proposals(spec, clus, train: Training, headroom: float, max_mbs: int, pins: dict, result: dict,
                     frees: tuple) -> tuple:
    """([proposal], note) where nothing fits `train` and the batch is the cause: most candidates were
    rejected for divisibility (the batch splits over mbs*dp ranks; dp divides the GPU count, so
    gcd(batch, GPUs) bounds data parallelism) and a batch within BATCH_WINDOW that allows more data
    parallelism has a fitting layout. Each side searches the BATCH_TRIES batches allowing the most
    data parallelism (a handful of searches, and only on this failing path); a proposal is kept where
    it is faster than every nearer one on its side. ([], None) elsewhere."""
    gbs, gpus = train.gbs, clus.num_gpus
    rejected = result["rejected"]
    if "dp" in pins or rejected.get("divisibility", 0) * 2 < sum(rejected.values()):
        return [], None
    usable = math.gcd(gbs, gpus)
    step = pins.get("mbs", 1)
    sides = {-1: {}, 1: {}}  # side -> {batch: largest data parallelism it allows}
    for d in (d for d in _divisors(gpus) if d > usable):
        unit = d * step
        for g in ((gbs // unit) * unit, (gbs // unit + 1) * unit):
            if g > 0 and g != gbs and abs(g - gbs) <= gbs * BATCH_WINDOW:
                sides[1 if g > gbs else -1][g] = math.gcd(g // step, gpus)
    proposals = []
    for side in sides.values():
        tries = sorted(sorted(side, key=lambda g: -side[g])[:BATCH_TRIES], key=lambda g: abs(g - gbs))
        fastest = 0.0
        for g in tries:
            found = _engine_best(spec, clus, replace(train, gbs=g), train.engine.name, headroom, max_mbs, pins, None,
                                 *frees)
            if found["layout"] is not None and found["tokens_per_s"] > fastest:
                fastest = found["tokens_per_s"]
                proposals.append({"gbs": g, "tokens_per_step": g * train.seq_len, "engine": train.engine.name,
                                  "layout": found["layout"], "tokens_per_s": found["tokens_per_s"],
                                  "settings": found["settings"]})
    if not proposals:
        return [], None
    proposals.sort(key=lambda p: (abs(p["gbs"] - gbs), p["gbs"]))
    note = (f"the batch, {gbs:,} sequences ({gbs * train.seq_len:,} tokens), splits over no data-parallel degree "
            f"above {usable} of {gpus} GPUs" + (f" ({gbs} is prime)" if _prime(gbs) else ""))
    return proposals, note


def _divisors(n: int) -> list:
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return sorted(set(small + [n // k for k in small]))


def _prime(n: int) -> bool:
    return n > 1 and all(n % k for k in range(2, math.isqrt(n) + 1))


def _fastest_clear_fit(clus: Cluster, sources: list, records: list) -> dict | None:
    """The fastest fitting candidate of the searches whose peak clears its error band (verdict
    fits), as a layout record with its rank in `records` and its speed against records[0]."""
    capacity, best, band = clus.gpu.memory_bytes, None, band_of(clus, "peak_memory")
    for res, keep in sources:
        required = np.asarray(res["eval"]["memory"]["required"], dtype=np.float64)
        clear = clears_band(capacity - required, np.ceil(required * band)) & (True if keep is None else keep)
        order = res["order"][clear[res["order"]]]
        if order.size:
            i = int(order[0])
            speed = float(res["eval"]["time"]["throughput"]["tokens_per_s"][i])
            if best is None or speed > best[0]:
                best = (speed, res, i)
    if best is None:
        return None
    speed, res, i = best
    rec = layout_record(clus, res["valid"], res["eval"], i)
    rec["rank"] = next((k for k, r in enumerate(records, 1) if r["layout"] == rec["layout"]), None)
    rec["relative_speed"] = speed / records[0]["throughput"]["tokens_per_s"]
    return rec


def _search_edges(spec, clus, train: Training, headroom: float, max_mbs: int, pins: dict, free: bool) -> tuple:
    """(training, search result) with the pipeline split search.edge_layers_choice picks where the
    engine has the choice and the user left it `free`."""
    if free:
        train = search.edge_layers_choice(spec, clus, train)
    return train, search.search(spec, clus, train, headroom, max_mbs, pinned=pins)


def _search_zero3_knobs(spec, clus, train: Training, headroom: float, max_mbs: int, pins: dict, result: dict,
                        free: bool) -> tuple:
    """(training, search result, ZeRO-3 search result under other knobs or None): where the user left
    DeepSpeed's live-parameter knobs alone, the ZeRO-3 layouts are searched again with them lowered
    where a faster layout than the best did not fit (search.lean_zero3_training), and raised where
    fitting ones recompute whole blocks that the defaults make the backward gather twice
    (search.roomy_zero3_training; no other layout reads the knobs); the knobs whose best layout
    beats the first search's are kept."""
    if not free or pins.get("zero", 3) != 3:
        return train, result, None
    ev, valid = result["eval"], result["valid"]
    speed = np.asarray(ev["time"]["throughput"]["tokens_per_s"])
    fits, zero3 = np.asarray(ev["fits"]), valid.zero == 3
    best = _fastest_tokens_per_s(result)
    tries = []
    blocked = speed[~fits & zero3]
    if blocked.size and blocked.max() > best:
        tries.append(search.lean_zero3_training(spec, train))
    if np.any(fits & zero3 & (valid.recompute == int(Recompute.FULL))):
        tries.append(search.roomy_zero3_training(spec, train))
    chosen, other = train, None
    for knobs in (t for t in tries if t is not None):
        found = search.search(spec, clus, knobs, headroom, max_mbs, pinned={**pins, "zero": 3})
        fastest = _fastest_tokens_per_s(found)
        if fastest > best:
            result["candidates"] += found["candidates"]
            result["elapsed_s"] += found["elapsed_s"]
            best, chosen, other = fastest, knobs, found
    return chosen, result, other


def _search_tp_overlap(spec, clus, train: Training, headroom: float, max_mbs: int, pins: dict, result: dict,
                       free: bool) -> tuple:
    """(training, search result): where the user left --tp-comm-overlap alone and the engine runs it
    (search.tp_overlap_training), the sequence-parallel layouts searched again with it on, and kept
    with the first search's other layouts where the fastest is faster. A search, not the first one's
    layouts evaluated again: the flag changes no rule, but TransformerEngine's buffers
    (memory.userbuffers_bytes) move which --recompute-layers variant of a layout fits."""
    overlapped = search.tp_overlap_training(spec, train, result) if free else None
    if overlapped is None:
        return train, result
    found = search.search(spec, clus, overlapped, headroom, max_mbs, pinned={**pins, "sequence_parallel": 1})
    if not _faster(found, result):
        return train, result
    return overlapped, search.merged(result, found, result["valid"].sequence_parallel == 0)


def _fastest_tokens_per_s(result: dict) -> float:
    """Tokens/s of a search result's fastest fitting layout (-1 where none fits)."""
    order = result["order"]
    return float(result["eval"]["time"]["throughput"]["tokens_per_s"][order[0]]) if order.size else -1.0


def _faster(new: dict, old: dict) -> bool:
    """Whether search result `new`'s fastest fitting layout beats `old`'s."""
    return _fastest_tokens_per_s(new) > max(_fastest_tokens_per_s(old), 0.0)


def _search_offload_share(spec, clus, train: Training, headroom: float, result: dict, free: bool) -> tuple:
    """(training, search result): where the user left --optimizer-offload-fraction alone and the
    fastest layout offloads an optimizer the engine can split (search.lean_offload_training), the
    search's layouts again under the smallest share that keeps that one fitting, kept where the
    fastest is faster. The share changes no rule and nothing of the layouts that keep their optimizer."""
    lean = search.lean_offload_training(spec, clus, train, result, headroom) if free else None
    if lean is None:
        return train, result
    again = search.reevaluate(spec, clus, lean, result, headroom, np.flatnonzero(result["valid"].offload_optimizer > 0))
    return (lean, again) if _faster(again, result) else (train, result)


def _recommend_either_precision(model, cin: ClusterInput, tin: TrainingInput, options: dict) -> Recommendation:
    """recommend --precision auto: bf16 mixed precision, and FP8 GEMMs where the GPU has FP8 tensor
    cores and the engine (without --engine: Megatron, for both) an FP8 path; the faster answer, its
    note naming how much faster than the other's fastest layout."""
    gpu = lookup_gpu(cin.gpu or DEFAULTS["gpu"])
    engine = ENGINES.get(tin.engine or "megatron")
    fp8_too = bool(gpu.peak_flops_per_s.get("fp8")) and engine is not None and bool(engine.fp8_recipes)
    chosen_engine = fp8_too and tin.engine is None
    if chosen_engine:  # one engine for both: the one FP8 takes without --engine (default_engine)
        tin = replace(tin, engine=engine.name)
    answers = {"bf16": recommend(model, cin, replace(tin, precision="bf16"), **options)}
    if fp8_too:
        answers["fp8"] = recommend(model, cin, replace(tin, precision="fp8"), **options)

    def speed(rec):
        return rec.layouts[0]["throughput"]["tokens_per_s"] if rec.layouts else 0.0

    chosen = max(answers, key=lambda k: speed(answers[k]))
    best = answers[chosen]
    if fp8_too:
        other = answers["bf16" if chosen == "fp8" else "fp8"]
        ratio = f"{speed(best) / speed(other):.2f}x" if speed(other) else "where nothing fits"
        note = f"--precision auto: {chosen}, {ratio} the fastest {'bf16' if chosen == 'fp8' else 'fp8'} layout"
    else:
        note = f"--precision auto: bf16 ({gpu.name} has no FP8 tensor cores)" if not gpu.peak_flops_per_s.get("fp8") \
            else f"--precision auto: bf16 (--engine {tin.engine} has no FP8 path)"
    defaults = {**best.defaults, "precision": chosen, **({"engine": engine.name} if chosen_engine else {})}
    return replace(best, notes=[*best.notes, note], defaults=defaults)


def _engine_best(spec, clus, training: Training, engine: str, headroom: float, max_mbs: int, pins: dict,
                 best_tokens_per_s: float | None, free_edges: bool, free_knobs: bool, free_share: bool,
                 free_overlap: bool) -> dict:
    """The fastest fitting layout of the same model, cluster, batch and pins under another engine
    (the settings it does not take dropped: Training.for_engine; its pipeline split, ZeRO-3 knobs,
    --tp-comm-overlap and offloaded share chosen as its own recommend would, those that differ from
    the first search's in `settings`), with its speed relative to the recommended one (> 1: faster)."""
    first, result = _search_edges(spec, clus, training.for_engine(engine), headroom, max_mbs, pins, free_edges)
    # a search under other ZeRO-3 knobs comes back only where its fastest beats the first's
    knobs, _, knobbed = _search_zero3_knobs(spec, clus, first, headroom, max_mbs, pins, result, free_knobs)
    train, result = (knobs, knobbed) if knobbed else (first, result)
    train, result = _search_tp_overlap(spec, clus, train, headroom, max_mbs, pins, result, free_overlap)
    train, result = _search_offload_share(spec, clus, train, headroom, result, free_share)
    train, result = _search_overlap_comm(spec, clus, train, headroom, result)
    if not result["order"].size:
        why = "nothing fits"
        if result["valid"].size == 0:
            why = "the pinned axes break its rules" if pins else "it cannot train this model (its rules reject every layout)"
        return {"engine": engine, "layout": None, "tokens_per_s": None, "relative_speed": None, "note": why,
                "settings": {}}
    i = int(result["order"][0])
    speed = float(result["eval"]["time"]["throughput"]["tokens_per_s"][i])
    searched, start = _searched_settings(train), _searched_settings(first)
    return {"engine": engine, "layout": result["valid"].row(i), "tokens_per_s": speed,
            "relative_speed": None if best_tokens_per_s is None else speed / best_tokens_per_s, "note": None,
            "settings": {k: v for k, v in searched.items() if v != start[k]},
            # an engine without the FP8 path the question asked for answers in bf16 (Training.for_engine)
            "precision": "fp8" if train.fp8_recipe else str(train.precision)}


def _search_overlap_comm(spec, clus, train: Training, headroom: float, result: dict) -> tuple:
    """(training, search result): where the user left DeepSpeed's overlap_comm unset, the ZeRO-1/2
    candidates evaluated again with it on (search.overlap_comm_rows: DeepSpeed defaults it off there),
    kept where their fastest is faster. It changes no rule, only their speed and second reduce bucket."""
    on, rows = search.overlap_comm_rows(train, result)
    if on is None:
        return train, result
    again = search.reevaluate(spec, clus, on, result, headroom, rows)

    def fastest(res):  # of the ZeRO-1/2 candidates that fit
        speed = np.where(np.asarray(res["eval"]["fits"])[rows], np.asarray(res["eval"]["time"]["throughput"]["tokens_per_s"])[rows], -1.0)
        return float(speed.max())

    return (on, again) if fastest(again) > fastest(result) else (train, result)


def _searched_settings(training: Training) -> dict:
    """The training settings recommend's searches may change, by their flag names."""
    zc = training.zero_config
    return {"tp_comm_overlap": training.tp_comm_overlap, "optimizer_offload_fraction": training.optimizer_offload_fraction,
            "stage3_max_live_parameters": zc.stage3_max_live_parameters,
            "stage3_max_reuse_distance": zc.stage3_max_reuse_distance, "overlap_comm": zc.overlap_comm}


def _pin_codes(pinned: dict, gpus: int) -> dict:
    """{field: int code} of the pinned layout values, each checked; InputError naming the flags when
    they cannot multiply to the GPU count."""
    from planner.bounds import check
    from planner.options import Offload, RankOrder, Recompute, RecomputeMethod

    unknown = sorted(set(pinned) - set(search.PINNABLE))
    if unknown:
        raise InputError(f"--{unknown[0].replace('_', '-')}: not a layout field recommend can pin; "
                         f"pinnable: {', '.join(search.PINNABLE)}")
    codes = {}
    for key, value in pinned.items():
        flag = "--" + key.replace("_", "-")
        if key in ("offload_optimizer", "offload_params"):
            codes[key] = int(Offload.parse(value, flag))
        elif key == "recompute":
            codes[key] = int(Recompute.parse(value, flag))
        elif key == "recompute_method":
            codes[key] = int(RecomputeMethod.parse(value, flag))
        elif key == "rank_order":
            codes[key] = int(RankOrder.parse(value, flag))
        elif key == "sequence_parallel":
            _boolean_pin(value, flag)
            codes[key] = int(value)
        elif key == "zero":
            if value not in (0, 1, 2, 3) or isinstance(value, bool):
                raise InputError(f"--zero: must be one of 0, 1, 2, 3, got {value!r}")
            codes[key] = int(value)
        else:
            codes[key] = check(key, value, flag)
    if "recompute_layers" in codes and codes.get("recompute", Recompute.FULL) != Recompute.FULL:
        raise InputError("--recompute-layers: needs --recompute full")
    if codes.get("recompute_method", RecomputeMethod.BLOCK) != RecomputeMethod.BLOCK and "recompute_layers" not in codes:
        raise InputError("--recompute-method: uniform needs --recompute-layers N (the layers per checkpoint)")
    axes = [k for k in ("tp", "pp", "cp", "dp") if k in codes]
    product = math.prod(codes[k] for k in axes)
    if axes and (gpus % product or ("dp" in codes and len(axes) == 4 and product != gpus)):
        flags = "*".join(f"--{k}" for k in axes)
        raise InputError(f"{flags}: {product} does not {'equal' if len(axes) == 4 else 'divide'} --gpus {gpus}")
    return codes


def _boolean_pin(value, flag: str) -> None:
    if not isinstance(value, bool):
        raise InputError(f"{flag}: must be true or false, got {value!r}")


def _raise_contradiction(spec, clus, train, max_mbs, pins: dict, pinned: dict) -> None:
    """No layout with the pinned values passes the rules: name the pins and the rule that every
    one of them breaks (else the one most of them break)."""
    lay, _, _ = search.enumerate_layouts(spec, clus, train, max_mbs, pinned=pins, prune=False)
    given = " ".join(f"--{k.replace('_', '-')} {pinned[k]}" for k in search.PINNABLE if k in pinned)
    broken = [(int(m.sum()), r) for r, m in rules.violations(spec, clus, train, lay)] if lay.size else []
    if not broken or max(b[0] for b in broken) == 0:
        raise InputError(f"{given}: no layout of --gpus {clus.num_gpus} and --gbs {train.gbs} has these values (the batch must divide by --mbs*--dp)")
    count, rule = max(broken, key=lambda b: b[0])
    raise InputError(f"{given}: no layout with these passes the rules: {rule.message(spec, clus, train)}")


def _model_defaults(model) -> dict:
    """What the planner chose for a model given as a bare shape (ModelInput.assumed)."""
    given = model_input(model)
    return given.assumed() if isinstance(given, ModelInput) else {}


def _training_defaults(tin: TrainingInput, cin: ClusterInput, train: Training, spec: ModelSpec) -> dict:
    from planner.moe import capacity_settings
    from planner.engines import Buffers, Modules

    out = {}
    for key, value in (("gpu", cin.gpu), ("seq_len", tin.seq_len), ("precision", tin.precision or tin.fp8_recipe),
                       ("optimizer", tin.optimizer)):
        if value is None:
            out[key] = DEFAULTS[key]
    if train.fp8_recipe is not None:
        fp8.check_gpu(lookup_gpu(cin.gpu or DEFAULTS["gpu"]), train.fp8_recipe)
        if tin.fp8_recipe is None:
            out["fp8_recipe"] = str(train.fp8_recipe)
    modules = block_modules(spec, train)
    if tin.modules is None:  # the engine's users' modules for this model (planner/modules.py)
        out["modules"] = word_of(modules)
    if tin.fsdp_mixed_precision is not None and (modules is not Modules.LLM_FOUNDRY
                                                 or train.engine.buffers is not Buffers.FSDP):
        raise InputError(f"--fsdp-mixed-precision: Composer's FSDP setting, for --engine fsdp with --modules "
                         f"llm-foundry; these are {train.engine.name} with {word_of(modules)}")
    if tin.loss_chunks is None and train.loss_chunks > 1:
        out["loss_chunks"] = train.loss_chunks
    factor = capacity_settings(train)[0]
    if spec.experts > 1 and tin.moe_capacity_factor is None and factor is not None:  # the engine's own capacity
        out["moe_capacity_factor"] = factor
    return out


def _time_to_train(step_s: float, tokens_per_step: int, tin: TrainingInput, clus: Cluster) -> dict:
    tt = time_to_train(step_s, tokens_per_step, tin.tokens, clus.num_gpus, tin.price_per_gpu_hour)
    return {k: (None if v is None else float(v)) for k, v in tt.items()}


# ---------------------------------------------------------------------------------------------
# answers as JSON records


def _at(parts, i: int) -> dict:
    """Candidate i's value of each of a Lazy mapping's parts, without gathering the others'."""
    return {k: float(parts.at(k, i)) for k in parts}


def band_of(cluster: Cluster, quantity: str) -> float:
    """The relative error band of a quantity: the cluster's profile's, else the prior."""
    return cluster.calibration.band(quantity) if cluster.calibration else prior_band(quantity)


def layout_record(cluster: Cluster, lay: Layouts, ev: dict, i: int) -> dict:
    """Candidate i as {layout, memory, time, throughput} (the `planner estimate --json` keys)."""
    mem = ev["memory"]
    parts = {k: int(mem.at(k, i)) for k in memory.BREAKDOWN_KEYS}
    total = sum(parts.values())  # = the float total below 2**53 bytes; past it the parts still add up exactly
    capacity = int(cluster.gpu.memory_bytes)
    required = int(mem.at("required", i))  # what must fit: the allocator gives back its cache first
    band = band_of(cluster, "peak_memory")
    band_bytes = int(math.ceil(required * band))
    return {
        "layout": lay.row(i),
        "memory": {
            "gpu_bytes": total,
            "allocated_bytes": int(mem.at("allocated", i)),
            "reserved_bytes": int(mem.at("reserved", i)),
            "required_bytes": required,
            "cpu_bytes_per_node": int(mem.at("cpu_per_node", i)),
            "capacity_bytes": capacity,
            "headroom_bytes": capacity - required,
            "fit_margin_bytes": capacity - required,
            "error_band": band,
            "error_band_bytes": band_bytes,
            "verdict": verdict(capacity - required, band_bytes),
            "fits": bool(ev["fits"].flat[i]),
            "peak_phase": memory.PHASES[int(mem.at("phase", i))],
            "breakdown": parts,
            "phases": phase_records(lambda k: mem.at(k, i)),
        },
        "time": {"step_s": float(ev["time"]["step_s"].flat[i]), "error_band": band_of(cluster, "step_time"),
                 "breakdown": _at(ev["time"]["breakdown"], i)},
        "throughput": _at(ev["time"]["throughput"], i),
    }


def phase_records(value) -> dict:
    """One candidate's memory at every moment of the step the planner models (memory.PHASES), of the
    rank the record describes, each as the record's own keys would read were it the peak: a ZeRO-0
    layout whose peak is the optimizer step still shows its forward/backward activations.
    value(key) reads the candidate's memory.PHASE_COLUMNS, per record, so the search pays nothing.
    A moment with nothing allocated is not modelled for this layout (the gradient reduction, where
    the engine makes no copy)."""
    out = {}
    for name in memory.PHASES:
        allocated = int(value(f"{name}:allocated"))
        if allocated <= 0:
            continue
        parts = {k: int(value(f"{name}:{k}")) for k in memory.BREAKDOWN_KEYS}
        out[name] = {"gpu_bytes": sum(parts.values()), "allocated_bytes": allocated,
                     "reserved_bytes": int(value(f"{name}:reserved")),
                     "required_bytes": int(value(f"{name}:required")), "breakdown": parts}
    return out


def stage_records(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts) -> list:
    """Memory of every pipeline stage of a one-layout `lay`."""
    out = []
    for s, row in enumerate(memory.per_stage(model, cluster, training, lay)):
        parts = {k: int(row[k]) for k in memory.BREAKDOWN_KEYS}
        out.append({"stage": s, "gpu_bytes": sum(parts.values()), "required_bytes": int(row["required"]),
                    "cpu_bytes_per_node": int(row["cpu_per_node"]),
                    "breakdown": parts, "peak_phase": memory.PHASES[int(row["phase"])],
                    "phases": phase_records(row.__getitem__)})
    return out


def cluster_dict(cluster: Cluster) -> dict:
    cal = cluster.calibration
    return {"gpu": cluster.gpu.name, "num_gpus": cluster.num_gpus, "gpus_per_node": cluster.gpus_per_node,
            "num_nodes": cluster.num_nodes, "memory_bytes": cluster.gpu.memory_bytes, "pod_gpus": cluster.pod_gpus,
            "oversubscription": cluster.oversubscription,
            "calibration": None if cal is None else {"profile": cal.name, "path": cal.path,
                                                     "coefficients": {f"{s}.{n}": v for s, n, v in cal.overrides},
                                                     "bands": dict(cal.bands)}}


def deepspeed_estimator_rows(model: ModelSpec, cluster: Cluster) -> dict:
    """DeepSpeed's own estimate_zero2/3_model_states_mem_needs figures (planner/deepspeed_estimator.py)."""
    from planner import deepspeed_estimator as D

    rows = {}
    kw = dict(num_gpus_per_node=cluster.gpus_per_host, num_nodes=cluster.num_hosts)  # DeepSpeed's node is a host
    for off in (False, True):
        g, c = D.zero2_model_states_bytes(model.params, cpu_offload=off, **kw)
        rows[f"zero2_offload_{str(off).lower()}"] = {"gpu_bytes": int(g), "cpu_bytes_per_node": int(c)}
    for off, offp in ((False, False), (True, False), (True, True)):
        g, c = D.zero3_model_states_bytes(model.params, model.largest_layer_params, cpu_offload=off,
                                          cpu_offload_params=offp, **kw)
        rows[f"zero3_offload_{str(off).lower()}_params_{str(offp).lower()}"] = {"gpu_bytes": int(g),
                                                                                 "cpu_bytes_per_node": int(c)}
    return rows


def check(config, model, cluster=None, training=None, layout=None, *, mbs: int | None = None, deepspeed: bool = True):
    """`planner check`: a user's DeepSpeed config (path or dict, or an Accelerate YAML path) run as
    DeepSpeed would run it, with findings (planner/doctor.py CheckReport)."""
    from planner import doctor

    cin = coerce(cluster, ClusterInput, "--gpus")
    cluster = {f: getattr(cin, f) for f in ClusterInput.__dataclass_fields__ if getattr(cin, f) is not None}
    return doctor.check(config, model_input(model), cluster, training, layout, mbs, deepspeed)


def validate(source: str | None = None) -> dict:
    """Predicted vs published runs: the paper figures of data/references/published_runs.json
    (planner/validate.py: 'cases', 'mape', 'by_group', 'mape_by_metric') and the published-run
    corpus of data/references/corpus_runs.json ('corpus': planner/corpus.py). `source`: only the
    rows whose id starts with it (InputError naming --source where none does)."""
    from planner import corpus
    from planner import validate as V

    if source is not None and not source.strip():
        raise InputError("--source: give an id prefix such as dgxc or mpt")
    runs = [r for r in corpus.load_rows() if source is None or r["id"].startswith(source)]
    rows = [r for r in V.compare() if source is None or r["id"].startswith(source)]
    if not runs and not rows:
        known = sorted({corpus.prefix(r) for r in corpus.load_rows()} | {r["id"].split("-")[0] for r in V.load_runs()})
        raise InputError(f"--source: no published run's id starts with {source!r} (sources: {', '.join(known)})")

    def finite(x: float) -> float | None:  # no figure of that kind among the chosen rows: null, not NaN
        return x if math.isfinite(x) else None

    return {"cases": rows, "mape": finite(V.mape(rows)), "by_group": V.by_group(rows),
            "mape_by_metric": {m: V.mape(rows, m) for m in sorted({r["metric"] for r in rows})},
            "corpus": corpus.validate(runs)}


__all__ = ["estimate", "recommend", "validate", "Estimate", "Recommendation", "ModelInput", "ClusterInput",
           "TrainingInput", "LayoutInput", "DEFAULTS", "with_gpus"]
