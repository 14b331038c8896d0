"""recommend's searches beyond the first: the settings no layout field holds (the pipeline split,
DeepSpeed's ZeRO-3 live-parameter knobs and overlap_comm, TP communication overlap, the offloaded
optimizer share), each searched where the user left it alone and kept where its fastest layout is
faster; the other engines' fastest layouts; the nearest batches that fit; and the pins."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from planner import rules, search, variants
from planner.calibration import clears_band
from planner.errors import InputError
from planner.hardware import Cluster
from planner.layout import Training
from planner.options import Recompute
from planner.records import band_of, layout_record
from planner.search import SearchResult


BATCH_WINDOW = 0.125
"""How far from the asked batch recommend looks for one that fits (a share of it, either side)."""


BATCH_TRIES = 3
"""Batches searched on each side of the asked one, at most: the nearest that allow the most data parallelism."""


def batch_proposals(spec, clus, train: Training, headroom: float, max_mbs: int, pins: dict, result: SearchResult,
                     frees: tuple) -> tuple:
    """([proposal], note) where nothing fits `train` and the batch is the cause: most candidates were
    rejected for divisibility (the batch splits over mbs*dp ranks; dp divides the GPU count, so
    gcd(batch, GPUs) bounds data parallelism) and a batch within BATCH_WINDOW that allows more data
    parallelism has a fitting layout. Each side searches the BATCH_TRIES batches allowing the most
    data parallelism (a handful of searches, and only on this failing path); a proposal is kept where
    it is faster than every nearer one on its side. ([], None) elsewhere."""
    gbs, gpus = train.gbs, clus.num_gpus
    rejected = result.rejected
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
            found = engine_best(spec, clus, replace(train, gbs=g), train.engine.name, headroom, max_mbs, pins, None,
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


def fastest_clear_fit(clus: Cluster, sources: list, records: list) -> dict | None:
    """The fastest fitting candidate of the searches whose peak clears its error band (verdict
    fits), as a layout record with its rank in `records` and its speed against records[0]."""
    capacity, best, band = clus.gpu.memory_bytes, None, band_of(clus, "peak_memory")
    for res, keep in sources:
        required = np.asarray(res.eval.memory["required"], dtype=np.float64)
        clear = clears_band(capacity - required, np.ceil(required * band)) & (True if keep is None else keep)
        order = res.order[clear[res.order]]
        if order.size:
            i = int(order[0])
            speed = float(res.eval.tokens_per_s[i])
            if best is None or speed > best[0]:
                best = (speed, res, i)
    if best is None:
        return None
    speed, res, i = best
    rec = layout_record(clus, res.valid, res.eval, i)
    rec["rank"] = next((k for k, r in enumerate(records, 1) if r["layout"] == rec["layout"]), None)
    rec["relative_speed"] = speed / records[0]["throughput"]["tokens_per_s"]
    return rec


def search_edges(spec, clus, train: Training, headroom: float, max_mbs: int, pins: dict, free: bool) -> tuple:
    """(training, search result) with the pipeline split variants.edge_layers_choice picks where the
    engine has the choice and the user left it `free`."""
    if free:
        train = variants.edge_layers_choice(spec, clus, train)
    return train, search.search(spec, clus, train, headroom, max_mbs, pinned=pins)


def search_zero3_knobs(spec, clus, train: Training, headroom: float, max_mbs: int, pins: dict, result: SearchResult,
                        free: bool) -> tuple:
    """(training, search result, ZeRO-3 search result under other knobs or None): where the user left
    DeepSpeed's live-parameter knobs alone, the ZeRO-3 layouts are searched again with them lowered
    where a faster layout than the best did not fit (variants.lean_zero3_training), and raised where
    fitting ones recompute whole blocks that the defaults make the backward gather twice
    (variants.roomy_zero3_training; no other layout reads the knobs); the knobs whose best layout
    beats the first search's are kept."""
    if not free or pins.get("zero", 3) != 3:
        return train, result, None
    ev, valid = result.eval, result.valid
    speed = np.asarray(ev.tokens_per_s)
    fits, zero3 = np.asarray(ev.fits), valid.zero == 3
    best = _fastest_tokens_per_s(result)
    tries = []
    blocked = speed[~fits & zero3]
    if blocked.size and blocked.max() > best:
        tries.append(variants.lean_zero3_training(spec, train))
    if np.any(fits & zero3 & (valid.recompute == int(Recompute.FULL))):
        tries.append(variants.roomy_zero3_training(spec, train))
    chosen, other = train, None
    for knobs in (t for t in tries if t is not None):
        found = search.search(spec, clus, knobs, headroom, max_mbs, pinned={**pins, "zero": 3})
        fastest = _fastest_tokens_per_s(found)
        if fastest > best:
            result.candidates += found.candidates
            result.elapsed_s += found.elapsed_s
            best, chosen, other = fastest, knobs, found
    return chosen, result, other


def search_tp_overlap(spec, clus, train: Training, headroom: float, max_mbs: int, pins: dict, result: SearchResult,
                       free: bool) -> tuple:
    """(training, search result): where the user left --tp-comm-overlap alone and the engine runs it
    (variants.tp_overlap_training), the sequence-parallel layouts searched again with it on, and kept
    with the first search's other layouts where the fastest is faster. A search, not the first one's
    layouts evaluated again: the flag changes no rule, but TransformerEngine's buffers
    (memory.userbuffers_bytes) move which --recompute-layers variant of a layout fits."""
    overlapped = variants.tp_overlap_training(spec, train, result) if free else None
    if overlapped is None:
        return train, result
    found = search.search(spec, clus, overlapped, headroom, max_mbs, pinned={**pins, "sequence_parallel": 1})
    if not _faster(found, result):
        return train, result
    return overlapped, search.merged(result, found, result.valid.sequence_parallel == 0)


def search_recompute_modules(spec, clus, train: Training, headroom: float, max_mbs: int, pins: dict,
                             result: SearchResult, free: bool) -> tuple:
    """(training, search result): where the user left --recompute-modules alone, the selective layouts
    searched again under each wider list (variants.recompute_module_trainings), the fastest list kept
    with the first search's other layouts where its fastest layout beats the first search's."""
    if not free or pins.get("recompute", Recompute.SELECTIVE) != Recompute.SELECTIVE:
        return train, result
    # a wider list reruns more and keeps less: it can only win where a selective layout faster than the
    # best did not fit (none fits at all: full recompute, which keeps less than any list, fit nowhere)
    speed, fits = np.asarray(result.eval.tokens_per_s), np.asarray(result.eval.fits)
    blocked = ~fits & (result.valid.recompute == Recompute.SELECTIVE) & (speed > _fastest_tokens_per_s(result))
    if not blocked.any() or (not result.order.size and "recompute" not in pins):
        return train, result
    best_train, best = train, None
    for wider in variants.recompute_module_trainings(spec, train):
        found = search.search(spec, clus, wider, headroom, max_mbs, pinned={**pins, "recompute": Recompute.SELECTIVE})
        if _faster(found, best if best is not None else result):
            best_train, best = wider, found
    if best is None:
        return train, result
    return best_train, search.merged(result, best, result.valid.recompute != Recompute.SELECTIVE)


def _fastest_tokens_per_s(result: SearchResult) -> float:
    """Tokens/s of a search result's fastest fitting layout (-1 where none fits)."""
    order = result.order
    return float(result.eval.tokens_per_s[order[0]]) if order.size else -1.0


def _faster(new: dict, old: dict) -> bool:
    """Whether search result `new`'s fastest fitting layout beats `old`'s."""
    return _fastest_tokens_per_s(new) > max(_fastest_tokens_per_s(old), 0.0)


def search_offload_share(spec, clus, train: Training, headroom: float, result: SearchResult, free: bool) -> tuple:
    """(training, search result): where the user left --optimizer-offload-fraction alone and the
    fastest layout offloads an optimizer the engine can split (variants.lean_offload_training), the
    search's layouts again under the smallest share that keeps that one fitting, kept where the
    fastest is faster. The share changes no rule and nothing of the layouts that keep their optimizer."""
    lean = variants.lean_offload_training(spec, clus, train, result, headroom) if free else None
    if lean is None:
        return train, result
    again = search.reevaluate(spec, clus, lean, result, headroom, np.flatnonzero(result.valid.offload_optimizer > 0))
    return (lean, again) if _faster(again, result) else (train, result)


def engine_best(spec, clus, training: Training, engine: str, headroom: float, max_mbs: int, pins: dict,
                 best_tokens_per_s: float | None, free_edges: bool, free_knobs: bool, free_share: bool,
                 free_overlap: bool, free_modules: bool) -> dict:
    """The fastest fitting layout of the same model, cluster, batch and pins under another engine
    (the settings it does not take dropped: Training.for_engine; its pipeline split, ZeRO-3 knobs,
    --tp-comm-overlap, recompute modules and offloaded share chosen as its own recommend would, those
    that differ from the first search's in `settings`), with its speed relative to the recommended one
    (> 1: faster)."""
    first, result = search_edges(spec, clus, training.for_engine(engine), headroom, max_mbs, pins, free_edges)
    # a search under other ZeRO-3 knobs comes back only where its fastest beats the first's
    knobs, _, knobbed = search_zero3_knobs(spec, clus, first, headroom, max_mbs, pins, result, free_knobs)
    train, result = (knobs, knobbed) if knobbed else (first, result)
    train, result = search_tp_overlap(spec, clus, train, headroom, max_mbs, pins, result, free_overlap)
    train, result = search_recompute_modules(spec, clus, train, headroom, max_mbs, pins, result, free_modules)
    train, result = search_offload_share(spec, clus, train, headroom, result, free_share)
    train, result = search_overlap_comm(spec, clus, train, headroom, result)
    if not result.order.size:
        why = "nothing fits"
        if result.valid.size == 0:
            refusal = rules.refused(spec, clus, first)
            why = (f"it cannot train this model: {refusal}" if refusal else "the pinned axes break its rules" if pins
                   else "it cannot train this model (its rules reject every layout)")
        return {"engine": engine, "layout": None, "tokens_per_s": None, "relative_speed": None, "note": why,
                "settings": {}}
    i = int(result.order[0])
    speed = float(result.eval.tokens_per_s[i])
    searched, start = searched_settings(train), searched_settings(first)
    return {"engine": engine, "layout": result.valid.row(i), "tokens_per_s": speed,
            "relative_speed": None if best_tokens_per_s is None else speed / best_tokens_per_s, "note": None,
            "settings": {k: v for k, v in searched.items() if v != start[k]},
            # an engine without the FP8 path the question asked for answers in bf16 (Training.for_engine)
            "precision": "fp8" if train.fp8_recipe else str(train.precision)}


def search_overlap_comm(spec, clus, train: Training, headroom: float, result: SearchResult) -> tuple:
    """(training, search result): where the user left DeepSpeed's overlap_comm unset, the ZeRO-1/2
    candidates evaluated again with it on (variants.overlap_comm_rows: DeepSpeed defaults it off there),
    kept where their fastest is faster. It changes no rule, only their speed and second reduce bucket."""
    on, rows = variants.overlap_comm_rows(train, result)
    if on is None:
        return train, result
    again = search.reevaluate(spec, clus, on, result, headroom, rows)

    def fastest(res):  # of the ZeRO-1/2 candidates that fit
        speed = np.where(np.asarray(res.eval.fits)[rows], np.asarray(res.eval.tokens_per_s)[rows], -1.0)
        return float(speed.max())

    return (on, again) if fastest(again) > fastest(result) else (train, result)


def searched_settings(training: Training) -> dict:
    """The training settings recommend's searches may change, by their flag names."""
    zc = training.zero_config
    return {"tp_comm_overlap": training.tp_comm_overlap, "optimizer_offload_fraction": training.optimizer_offload_fraction,
            "recompute_modules": ",".join(training.recompute_modules),
            "stage3_max_live_parameters": zc.stage3_max_live_parameters,
            "stage3_max_reuse_distance": zc.stage3_max_reuse_distance, "overlap_comm": zc.overlap_comm}


def pin_codes(pinned: dict, gpus: int) -> dict:
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


def raise_contradiction(spec, clus, train, max_mbs, pins: dict, pinned: dict) -> None:
    """No layout with the pinned values passes the rules: name the pins and the rule that every
    one of them breaks (else the one most of them break)."""
    lay, _, _ = search.enumerate_layouts(spec, clus, train, max_mbs, pinned=pins, prune=False)
    given = " ".join(f"--{k.replace('_', '-')} {pinned[k]}" for k in search.PINNABLE if k in pinned)
    broken = [(int(m.sum()), r) for r, m in rules.violations(spec, clus, train, lay)] if lay.size else []
    if not broken or max(b[0] for b in broken) == 0:
        raise InputError(f"{given}: no layout of --gpus {clus.num_gpus} and --gbs {train.gbs} has these values (the batch must divide by --mbs*--dp)")
    count, rule = max(broken, key=lambda b: b[0])
    raise InputError(f"{given}: no layout with these passes the rules: {rule.message(spec, clus, train)}")
