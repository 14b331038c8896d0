"""`estimate` one layout and `recommend` the fastest that fits: the answers planner.api serves.
Inputs are given by value (planner/inputs.py); every default applied is reported back in the
answer's `defaults`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from planner import fp8, results, rules, search, variants
from planner.engines import ENGINES, NAMES as ENGINE_NAMES
from planner.errors import InputError
from planner.hardware import Cluster, lookup_gpu
from planner.inputs import DEFAULTS, ClusterInput, LayoutInput, ModelInput, TrainingInput, coerce, model_input, resolve_model
from planner.layout import DEFAULT_RECOMPUTE_MODULES, Training, ZeroConfig, single
from planner.model import ModelSpec
from planner.modules import block_modules, word_of
from planner.records import band_of, cluster_dict, layout_record, stage_records
from planner.comparison import OtherEngines, free_settings, other_engines
from planner.refine import (batch_proposals, fastest_clear_fit, pin_codes, raise_contradiction,
                            search_edges, search_offload_share, search_overlap_comm, search_recompute_modules,
                            search_tp_overlap,
                            search_zero3_knobs)
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
    _check_recompute_modules(lin.recompute, train)
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
    train = variants.edges_the_layout_needs(spec, clus, train, lay, tin.pipeline_edge_layers is None)
    if train.pipeline_edge_layers != train.engine.pipeline_edge_layers:
        defaults["pp_edge_layers"] = train.pipeline_edge_layers
    rules.check_single(spec, clus, train, lay)
    ev = search.evaluate(spec, clus, train, lay)
    record = layout_record(clus, lay, ev, 0)
    record["memory"]["per_stage"] = stage_records(spec, clus, train, lay)
    tt = None
    if tin.tokens:
        tt = _time_to_train(record["time"]["step_s"], gbs * train.seq_len, tin, clus)
    dse = deepspeed_estimator_rows(spec, clus) if ds_estimator else None
    return Estimate(spec, clus, train, record, defaults, tt, dse)


def _check_recompute_modules(recompute, train: Training) -> None:
    """--recompute-modules beside --recompute selective only: Megatron reads recompute_modules under
    --recompute-granularity selective alone (megatron-core 0.16.1 transformer_config.py)."""
    if train.recompute_modules != DEFAULT_RECOMPUTE_MODULES and str(recompute) != "selective":
        raise InputError(f"--recompute-modules: Megatron recomputes them under --recompute selective, not "
                         f"{recompute} (add --recompute selective)")


def recommend(model, cluster=None, training=None, *, top: int | None = None, memory_headroom: float | None = None,
              max_mbs: int | None = None, pinned: dict | None = None, landscape: int = 0,
              compare_engines: bool = True, workers: int = 1, _engines: dict | None = None) -> Recommendation:
    """The `top` fastest layouts that fit (with `memory_headroom` of GPU memory kept free), searched
    over every TP/PP/VPP/CP/DP/EP degree, ZeRO stage, offload, micro-batch up to `max_mbs`,
    recompute and sequence parallelism the engine allows.

    pinned: {field: value} of LayoutInput fields (words as the flags take them) that every layout
    keeps, e.g. {"tp": 8, "zero": 1}. landscape: also return up to this many fitting layouts as
    (memory, speed) points with the Pareto front (Recommendation.landscape), for plots.
    compare_engines: False skips the other engines' searches (most of the time a recommend takes):
    Recommendation.engines is then empty, and no other engine answers when this one has no layout.
    workers: processes the other engines' searches run in besides this one (forked: planner/forked.py,
    for single-threaded callers such as the CLI); the answer is the same for any number.

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
                                                                 max_mbs=max_mbs, pinned=pinned, landscape=landscape,
                                                                 workers=workers))
    given = {"top": top, "memory_headroom": memory_headroom, "max_mbs": max_mbs}
    defaults = {k: DEFAULTS[k] for k, v in given.items() if v is None}
    top, headroom, max_mbs = (check(k, DEFAULTS[k] if v is None else v) for k, v in given.items())
    spec = resolve_model(model)
    defaults.update(_model_defaults(model))
    gbs = _recommend_batch(tin, defaults)
    if cin.gpus is None:
        raise InputError("--gpus: required for recommend (total GPUs, e.g. --gpus 16)")
    clus = cin.resolve(tin.precision or ("fp8" if tin.fp8_recipe else DEFAULTS["precision"]), cin.gpus)
    pins = pin_codes(pinned or {}, clus.num_gpus)
    train = _recommend_training(spec, clus, tin, gbs, pins, defaults)
    defaults.update(_training_defaults(tin, cin, train, spec))
    # the other engines start from the user's settings, as their own recommend would, searched while
    # this one's search runs where there are workers for them
    unsearched = replace(train, zero_config=replace(train.zero_config, overlap_comm=tin.overlap_comm))
    frees = free_settings(tin)
    names = [name for name in ENGINE_NAMES if name != train.engine.name] if compare_engines and _engines is None else []
    others_search = OtherEngines(spec, clus, unsearched, headroom, max_mbs, pins, frees, names, workers)
    try:
        train, result, assumptions, records, clear = _this_engine(spec, clus, train, tin, gbs, headroom, max_mbs, pins,
                                                                  pinned, defaults, top)
        points = results.landscape(result, landscape) if landscape else None
        best = records[0]["throughput"]["tokens_per_s"] if records else None
        if names:
            _engines = others_search.result()
    finally:
        others_search.close()
    others = other_engines(spec, clus, unsearched, headroom, max_mbs, pins, best, frees, compare_engines, _engines)
    proposals, batch_note = ([], None) if records else batch_proposals(spec, clus, unsearched, headroom, max_mbs, pins,
                                                                         result, frees)
    fitting = [e for e in others if e["layout"] is not None]
    if not records and tin.engine is None and fitting:
        # the user named no engine and the default one cannot train this: answer with the fastest
        # engine that can, as `--engine` would, and say so
        why = batch_note or results.leanest_text(clus, headroom, result) or "its rules reject every layout"
        answer = _other_engines_answer(model, cin, tin, train, others, fitting, why,
                                       dict(top=top, memory_headroom=memory_headroom, max_mbs=max_mbs, pinned=pinned,
                                            landscape=landscape))
        answer.batch_proposals[:0] = proposals
        return replace(answer, batch_note=batch_note)
    hints = [] if records else results.what_would_fit(spec, clus, train, headroom, max_mbs, result)
    if proposals:
        hints.insert(0, f"--gbs {proposals[0]['gbs']} fits ({results.short(proposals[0]['layout'])}, "
                        f"{proposals[0]['tokens_per_s']:,.0f} tokens/s)")
    return Recommendation(spec, clus, train, assumptions, defaults, result.candidates, result.rejected,
                          records, hints, result.elapsed_s, points, clear, others, [], proposals, batch_note)


def _recommend_batch(tin: TrainingInput, defaults: dict) -> int:
    """The global batch in sequences: --gbs, else recommend's tokens a step (defaults noted)."""
    tokens = tin.tokens_per_step or DEFAULTS["tokens_per_step"]
    gbs = tin.gbs or default_gbs(tin)
    if tin.gbs is None:
        defaults["gbs"] = gbs
        if tin.tokens_per_step is None:
            defaults["tokens_per_step"] = tokens
    return gbs


def _recommend_training(spec, clus, tin: TrainingInput, gbs: int, pins: dict, defaults: dict) -> Training:
    """The settings of the search: the engine named, else the default for the pinned axes (noted);
    a named engine that refuses the whole job answers with its rule's line."""
    train = tin.resolve(gbs, tin.engine or default_engine(pins.get("tp", 1), pins.get("cp", 1), pins.get("vpp", 1),
                                                          bool(pins.get("sequence_parallel", 0)), _wants_fp8(tin),
                                                          pins.get("ep", 1)))
    if tin.engine is None:
        defaults["engine"] = train.engine.name
    elif (why := rules.refused(spec, clus, train)) is not None:
        raise InputError(why)  # the engine asked for cannot take these settings or this model at all
    return train


def _this_engine(spec, clus, train: Training, tin: TrainingInput, gbs: int, headroom: float, max_mbs: int, pins: dict,
                 pinned: dict | None, defaults: dict, top: int) -> tuple:
    """(training, search result, assumptions, the top records, the clear fit under a borderline #1 or
    None) of recommend's own engine: its searches (_searched), then the records of their layouts."""
    train, result, knobbed, _ = _searched(spec, clus, train, tin, headroom, max_mbs, pins, defaults)
    if pins and result.valid.size == 0:
        raise_contradiction(spec, clus, train, max_mbs, pins, pinned)
    assumptions = _assumptions(spec, clus, train, gbs, headroom, defaults, pinned if pins else None, result)
    # with other ZeRO-3 knobs, the ZeRO-3 rows are that search's, the others the first search's
    sources = [(result, result.valid.zero != 3 if knobbed else None)] + ([(knobbed, None)] if knobbed else [])
    records = _records(clus, train, tin, gbs, sources, top)
    clear = fastest_clear_fit(clus, sources, records) if records and records[0]["memory"]["verdict"] != "fits" else None
    return train, result, assumptions, records, clear


def _searched(spec, clus, train: Training, tin: TrainingInput, headroom: float, max_mbs: int, pins: dict,
              defaults: dict) -> tuple:
    """(training, search result, ZeRO-3 search under other knobs or None, which settings were free):
    the first search and recommend's searches of the settings no layout field holds (planner/refine.py),
    each where the user left it alone; `defaults` gets what they chose."""
    edges_free, knobs_free, share_free, overlap_free, modules_free = frees = free_settings(tin)
    train, result = search_edges(spec, clus, train, headroom, max_mbs, pins, edges_free)
    if edges_free and train.pipeline_edge_layers != train.engine.pipeline_edge_layers:
        defaults["pp_edge_layers"] = train.pipeline_edge_layers  # chosen: variants.edge_layers_choice
    train, result, knobbed = search_zero3_knobs(spec, clus, train, headroom, max_mbs, pins, result, knobs_free)
    if knobs_free and train.zero_config.stage3_max_live_parameters != ZeroConfig().stage3_max_live_parameters:
        defaults["stage3_max_live_parameters"] = train.zero_config.stage3_max_live_parameters  # searched
        defaults["stage3_max_reuse_distance"] = train.zero_config.stage3_max_reuse_distance
    train, result = search_tp_overlap(spec, clus, train, headroom, max_mbs, pins, result, overlap_free)
    if train.tp_comm_overlap and overlap_free:
        defaults["tp_comm_overlap"] = True  # searched
    train, result = search_recompute_modules(spec, clus, train, headroom, max_mbs, pins, result, modules_free)
    if modules_free and train.recompute_modules != DEFAULT_RECOMPUTE_MODULES:
        defaults["recompute_modules"] = list(train.recompute_modules)  # searched
    train, result = search_offload_share(spec, clus, train, headroom, result, share_free)
    if train.optimizer_offload_fraction != 1.0:
        defaults["optimizer_offload_fraction"] = train.optimizer_offload_fraction  # searched
    train, result = search_overlap_comm(spec, clus, train, headroom, result)
    if train.zero_config.overlap_comm and tin.overlap_comm is None:
        defaults["overlap_comm"] = True  # searched: ZeRO-1/2 with DeepSpeed's overlap_comm
    return train, result, knobbed, frees


def _assumptions(spec, clus, train: Training, gbs: int, headroom: float, defaults: dict, pinned: dict | None,
                 result: dict) -> dict:
    """The inputs every recommended layout shares, given or defaulted (Recommendation.assumptions)."""
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
                 "tp_comm_overlap", "overlap_comm", "recompute_modules"):
        if knob in defaults:  # chosen by search_zero3_knobs, search_offload_share, search_tp_overlap: estimate
            # needs them to agree
            assumptions[knob] = defaults[knob]
    if pinned is not None:
        assumptions["pinned"] = {k: pinned[k] for k in search.PINNABLE if k in pinned}
    if result.coarsened:  # the space was larger than one search materializes
        assumptions["search_coarsened"] = list(result.coarsened)
    return assumptions


def _records(clus, train: Training, tin: TrainingInput, gbs: int, sources: list, top: int) -> list:
    """The `top` fastest fitting layouts of the searches `sources` ([(result, rows kept or None)]) as
    layout records with their binding constraint, fastest first."""
    ranked = []
    for res, keep in sources:
        for i in results.distinct_top(res, top if keep is None else top + int(np.count_nonzero(~keep))):
            if keep is None or keep[i]:
                ranked.append((-float(res.eval.tokens_per_s[i]), len(ranked), res, i))
    records = []
    for _, _, res, i in sorted(ranked, key=lambda r: r[:2])[:top]:
        rec = layout_record(clus, res.valid, res.eval, i)
        rec["binding_constraint"] = results.binding_constraint(res, i, rec["time"]["breakdown"], rec["time"]["step_s"])
        if tin.tokens:
            rec["time_to_train"] = _time_to_train(rec["time"]["step_s"], gbs * train.seq_len, tin, clus)
        records.append(rec)
    return records


def _other_engines_answer(model, cin: ClusterInput, tin: TrainingInput, train: Training, others: list, fitting: list,
                          why: str, options: dict) -> Recommendation:
    """recommend under the fastest other engine that fits, its notes saying why the default had none."""
    chosen = max(fitting, key=lambda e: e["tokens_per_s"])
    known = {e["engine"]: e for e in others}
    known[train.engine.name] = {"engine": train.engine.name, "layout": None, "tokens_per_s": None,
                                "relative_speed": None, "note": why, "settings": {}}
    answer = recommend(model, cin, replace(tin, engine=chosen["engine"]), _engines=known, **options)
    answer.defaults["engine"] = chosen["engine"]
    lead = answer.layouts[0] if answer.layouts else None
    answer.notes.insert(0, f"no {train.engine.name} layout fits ({why}); {chosen['engine']}'s fastest fits"
                        + (f": {results.short(lead['layout'])} at {lead['throughput']['tokens_per_s']:,.0f} tokens/s"
                           if lead else "") + f" (the engine without --engine is {train.engine.name})")
    return answer


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
    if tin.expandable_segments is None and train.expandable_segments:  # the engine's launcher's (torchtitan's)
        out["expandable_segments"] = True
    factor = capacity_settings(train)[0]
    if spec.experts > 1 and tin.moe_capacity_factor is None and factor is not None:  # the engine's own capacity
        out["moe_capacity_factor"] = factor
    return out


def _time_to_train(step_s: float, tokens_per_step: int, tin: TrainingInput, clus: Cluster) -> dict:
    tt = time_to_train(step_s, tokens_per_step, tin.tokens, clus.num_gpus, tin.price_per_gpu_hour)
    return {k: (None if v is None else float(v)) for k, v in tt.items()}


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
