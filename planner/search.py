"""The search: enumerate every layout, evaluate all in one vectorized pass, rank by speed.

Pure functions of resolved inputs (no argparse, no printing): planner/planning.py calls them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from planner import memory, timing
from planner.engines import ExpertTP
from planner.errors import InputError
from planner.grouping import picked
from planner.hardware import Cluster
from planner.layout import Layouts, Training
from planner.model import ModelSpec
from planner.options import Offload, RankOrder, Recompute, Schedule
from planner.pipeline import interleaved_layers, max_layers_on_stage
from planner.rules import DIVISIBILITY, ENGINE_RULE, every_n_layers_broken, first_violation

@dataclass(frozen=True)
class Evaluation:
    """Memory and step time of every candidate of a Layouts, each an array (or lazily gathered
    mapping of arrays) over the candidates."""

    memory: Mapping
    """memory.rank_memory: the peak rank's total, required, allocated and reserved bytes, its phase,
    host bytes per node (cpu_per_node) and the breakdown parts."""
    time: Mapping
    """timing.step_time: step_s, the breakdown parts, and throughput (tokens_per_s, mfu, ...)."""
    fits: np.ndarray
    """Whether each fits the GPU, less the headroom asked, and its host's memory."""
    cpu_fits: np.ndarray
    """Whether each fits its host's memory."""

    @property
    def tokens_per_s(self) -> np.ndarray:
        """Tokens per second of the whole job, each candidate."""
        return self.time["throughput"]["tokens_per_s"]


@dataclass
class SearchResult:
    """One search of the layout space: its valid candidates, their evaluation, the fitting ones'
    order, and what it counted on the way."""

    valid: Layouts
    """The candidates that pass every rule."""
    eval: Evaluation
    """evaluate() over `valid`."""
    order: np.ndarray
    """Indices into `valid` of the fitting candidates, fastest first."""
    candidates: int
    """Layouts enumerated, the rules' rejects and the recompute variants tried included."""
    rejected: dict
    """{reason: count} over the whole space."""
    coarsened: list
    """The axes coarsened to keep the space within SEARCH_BUDGET (empty where none was)."""
    elapsed_s: float
    """Wall seconds the search took."""


VPP_CHOICES = (1, 2, 3, 4, 6, 8)
CP_CHOICES = (1, 2, 4, 8)


def divisors(n: int) -> list[int]:
    """Divisors of n in increasing order, by trial division up to sqrt(n) (O(sqrt n) work)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def evaluate(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts, headroom: float = 0.0) -> Evaluation:
    """Memory (peak rank) and step time of every candidate, and whether each fits the GPU (less
    `headroom`) and its node's host memory."""
    mem = memory.rank_memory(model, cluster, training, lay)
    capacity = cluster.gpu.memory_bytes * (1.0 - headroom)
    cpu_ok = mem["cpu_per_node"] <= cluster.host_ram_bytes_per_host
    fits = (mem["required"] <= capacity) & cpu_ok
    return Evaluation(mem, timing.step_time(model, cluster, training, lay), fits, cpu_ok)


SEARCH_BUDGET = 4_000_000
"""Candidates one search materializes at most (~0.5 GB of arrays, ~1 s on 2 cores); a larger
space is coarsened, each step said in the answer."""


@dataclass(frozen=True)
class Space:
    """The choices a search enumerates, and how they were coarsened to fit SEARCH_BUDGET."""

    tp: tuple
    pp_powers_of_two: bool
    cp: tuple
    vpp: tuple
    mbs: tuple
    """Micro-batch sizes dividing the global batch, up to max_mbs."""
    mbs_considered: int
    """How many micro-batch sizes count as considered (1..max_mbs, or the coarsened ones)."""
    ep: tuple
    offload: tuple
    etp: tuple = (0,)
    """Expert TP codes: 0 the engine's default (t), 1 experts whole with EP folded over TP
    (searched where the engine lets the user choose, ExpertTP.CHOICE)."""
    """Offload codes searched for the optimizer states (and the parameters, unless pinned)."""
    param_offload: tuple = ()
    """Offload codes searched for the parameters where the optimizer's is pinned and theirs is not
    (empty: `offload`)."""
    zero: tuple = (0, 1, 2, 3)
    recompute: tuple = tuple(Recompute)
    sequence_parallel: tuple = (0, 1)
    pinned: tuple = ()
    """(field, code) pairs the user fixed: every candidate has these values."""
    coarsened: tuple = ()

    def pinned_value(self, name: str):
        return dict(self.pinned).get(name)


def _pow2(values) -> tuple:
    return tuple(v for v in values if v & (v - 1) == 0)


COARSENINGS = (  # applied in order until the space fits SEARCH_BUDGET
    ("micro-batch sizes: powers of two", lambda sp: replace(sp, mbs=_pow2(sp.mbs), mbs_considered=len(_pow2(sp.mbs)))),
    ("virtual stages: 1, 2, 4", lambda sp: replace(sp, vpp=tuple(v for v in sp.vpp if v in (1, 2, 4)))),
    ("context parallel: 1, 2", lambda sp: replace(sp, cp=tuple(c for c in sp.cp if c <= 2))),
    ("pipeline stages: powers of two", lambda sp: replace(sp, pp_powers_of_two=True)),
    ("tensor parallel: powers of two", lambda sp: replace(sp, tp=_pow2(sp.tp))),
    ("expert parallel: powers of two", lambda sp: replace(sp, ep=_pow2(sp.ep))),
    ("offload: none or cpu", lambda sp: replace(sp, offload=(Offload.NONE, Offload.CPU),
                                                param_offload=tuple(o for o in sp.param_offload if o <= Offload.CPU))),
)


def _structures(model: ModelSpec, cluster: Cluster, training: Training, space: Space) -> tuple:
    """(all (tp, pp, cp, dp) combinations, the ones whose layers and batch can divide)."""
    g = cluster.num_gpus
    pin_pp, pin_dp = space.pinned_value("pp"), space.pinned_value("dp")
    rows = [(tp, pp, cp, g // (tp * pp * cp)) for tp in space.tp if g % tp == 0 for pp in divisors(g // tp)
            if (not space.pp_powers_of_two or pp & (pp - 1) == 0) and pin_pp in (None, pp)
            for cp in space.cp if (g // tp // pp) % cp == 0 and pin_dp in (None, g // (tp * pp * cp))]
    struct = np.array(rows, dtype=np.int64).reshape(-1, 4)
    # a structure whose pp exceeds the layers or whose dp does not divide the batch keeps no row
    possible = (struct[:, 1] <= model.layers) & (training.gbs % np.maximum(struct[:, 3], 1) == 0)
    return struct, struct[possible]


def _divisible(model: ModelSpec, training: Training, struct: np.ndarray, space: Space) -> tuple:
    """(structures x vpp: the layers divide, distinct dp x mbs: the batch divides, each structure's
    distinct-dp index). Unequal chunks (Engine.pipeline_layout) only where the user pinned --vpp:
    the search itself interleaves evenly."""
    pp, dp = struct[:, 1], struct[:, 3]
    vpp = np.array(space.vpp, dtype=np.int64)
    slots, chunks = interleaved_layers(model, training), pp[:, None] * vpp
    uneven = training.engine.pipeline_layout and any(name == "vpp" for name, _ in space.pinned)
    vpp_ok = (vpp == 1) | ((pp[:, None] > 1) & ((slots % chunks == 0) | (uneven & (chunks <= slots))))
    dps, dp_index = np.unique(dp, return_inverse=True)
    mbs_ok = (training.gbs // dps[:, None]) % np.array(space.mbs, dtype=np.int64) == 0  # mbs * dp divides the batch
    return vpp_ok, mbs_ok, dp_index.ravel()


def _base_rows(vpp_ok: np.ndarray, mbs_ok: np.ndarray, dp_index: np.ndarray, space: Space) -> tuple:
    """(structure index, mbs, vpp) of every combination whose batch and layers divide, in the order
    structure, mbs, vpp."""
    s_idx, m_idx, v_idx = [], [], []
    for k in range(mbs_ok.shape[0]):  # every distinct dp (dp_index is np.unique's inverse)
        structs = np.flatnonzero(dp_index == k)
        ms = np.flatnonzero(mbs_ok[k])
        for j in range(vpp_ok.shape[1]):
            sv = structs[vpp_ok[structs, j]]
            s_idx.append(np.repeat(sv, len(ms)))
            m_idx.append(np.tile(ms, len(sv)))
            v_idx.append(np.full(len(sv) * len(ms), j))
    s_idx, m_idx, v_idx = (np.concatenate(x) if x else np.zeros(0, dtype=np.int64) for x in (s_idx, m_idx, v_idx))
    order = np.lexsort((v_idx, m_idx, s_idx))
    return (s_idx[order], np.array(space.mbs, dtype=np.int64)[m_idx[order]],
            np.array(space.vpp, dtype=np.int64)[v_idx[order]])


def _rest(space: Space) -> tuple:
    """Choices multiplied onto every base row: zero, offloads, recompute, sp, ep."""
    return (np.array(space.zero), np.array(space.offload), np.array(_offload_params(space)),
            np.array(space.recompute), np.array(space.sequence_parallel), np.array(space.ep), np.array(space.etp))


def _offload_params(space: Space) -> tuple:
    pin = space.pinned_value("offload_params")
    return (space.param_offload or space.offload) if pin is None else (pin,)


PINNABLE = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "zero", "offload_optimizer", "offload_params", "mbs", "recompute",
            "recompute_layers", "recompute_method", "sequence_parallel", "rank_order")
"""Layout fields a search can be told to keep fixed (recommend --tp 8 --zero 1 ...)."""


def pin(space: Space, pinned: dict) -> Space:
    """`space` restricted to the pinned values ({field: int code}); the pinned value is searched even
    where the free search would not try it (tp across nodes, an mbs above max_mbs): the rules judge it."""
    assert set(pinned) <= set(PINNABLE), pinned
    narrowed = {k: (int(v),) for k, v in pinned.items()
                if k in ("tp", "cp", "vpp", "mbs", "ep", "etp", "zero", "recompute", "sequence_parallel")}
    if "offload_optimizer" in pinned:
        narrowed["offload"] = (int(pinned["offload_optimizer"]),)
        if "offload_params" not in pinned:  # the parameters' offload stays searched
            narrowed["param_offload"] = space.param_offload or space.offload
    if "mbs" in pinned:
        narrowed["mbs_considered"] = 1
    if "recompute_layers" in pinned:  # layers recomputed: full recompute, the rules judge the engine
        narrowed["recompute"] = (int(Recompute.FULL),)
    return replace(space, **narrowed, pinned=tuple(sorted((k, int(v)) for k, v in pinned.items())))


def enumerate_layouts(model: ModelSpec, cluster: Cluster, training: Training, max_mbs: int = 16,
                      budget: int = SEARCH_BUDGET, pinned: dict | None = None, prune: bool = True) -> tuple:
    """Every combination of the searched dimensions, how many were dropped ({rule group: count}), and
    the coarsening steps taken to stay within `budget` materialized candidates.

    tp: divisors of the node size; pp: divisors of gpus/tp; cp: 1-8; dp = gpus/(tp pp cp);
    vpp: a few values; mbs 1..max_mbs; ZeRO 0-3; offload none/cpu/nvme for optimizer and params;
    recompute none/selective/full; sequence parallel off/on; ep: divisors of the expert count.
    (tp, pp, cp, dp, mbs, vpp) combinations whose batch or layers do not divide are counted, not
    built (the work grows with the combinations that divide, never with the GPU count); every other
    rule is applied afterwards, vectorized; with `prune`, the offload combinations the rules refuse
    whatever the rest (offload_params_zero3, offload_optimizer_zero) are counted, not built either (as
    engine-rule rejections, also where an earlier rule of another group would have named them).
    `pinned` fields ({field: int code}) take only their value."""
    g = cluster.num_gpus
    space = Space(tp=tuple(divisors(min(cluster.gpus_per_node, g))), pp_powers_of_two=False, cp=CP_CHOICES,
                  vpp=VPP_CHOICES, mbs=tuple(m for m in divisors(training.gbs) if m <= max_mbs) or (1,),
                  mbs_considered=max_mbs, ep=tuple(divisors(model.experts)), offload=tuple(Offload),
                  etp=(0, 1) if model.experts > 1 and training.engine.expert_tp is ExpertTP.CHOICE else (0,))
    space = pin(space, pinned or {})
    steps = iter(COARSENINGS)
    while True:
        struct_all, struct = _structures(model, cluster, training, space)
        vpp_ok, mbs_ok, dp_index = _divisible(model, training, struct, space)
        rows = int((vpp_ok.sum(axis=1) * mbs_ok.sum(axis=1)[dp_index]).sum())
        size = rows * int(np.prod([len(c) for c in _rest(space)]))
        if size <= budget:
            break
        step = next(steps, None)
        if step is None:
            raise InputError(f"--gpus: {g} GPUs with --gbs {training.gbs} give {size:,} layouts to search even "
                             f"coarsened (at most {budget:,}); pick a GPU count or a global batch with fewer divisors")
        space = pin(replace(step[1](space), coarsened=space.coarsened + (step[0],)), dict(space.pinned))
    b, mbs, vpp = _base_rows(vpp_ok, mbs_ok, dp_index, space)
    considered = len(struct_all) * space.mbs_considered * len(space.vpp)
    rest = _rest(space)
    dropped = (considered - len(b)) * int(np.prod([len(c) for c in rest]))
    tp, pp, cp, dp = (struct[b, j] for j in range(4))
    # (zero, offload optimizer, offload params) as one axis of the combinations built; with prune, 20
    # of the 36 are counted instead
    combos = [(z, o, q) for z in rest[0] for o in rest[1] for q in rest[2]
              if not (prune and ((q > Offload.NONE and z != 3) or (o > Offload.NONE and z == 0)))]
    others = rest[3:]
    ruled_out = (len(rest[0]) * len(rest[1]) * len(rest[2]) - len(combos)) * len(b) * int(np.prod([len(c) for c in others]))
    # the Cartesian product base rows x combos x others, the last axis fastest (meshgrid's "ij" order),
    # built by repeating and tiling each axis' values rather than gathering through index grids
    sizes = [len(b), len(combos)] + [len(c) for c in others]

    def axis(values, i):  # axis i's values spread over the product
        inner, outer = int(np.prod(sizes[i + 1:])), int(np.prod(sizes[:i]))
        return np.tile(np.repeat(np.asarray(values, dtype=np.int64), inner), outer)

    zero, oo, op = (axis(column, 1) for column in np.array(combos, dtype=np.int64).reshape(-1, 3).T)
    rc, sp, e, etp = (axis(c, 2 + j) for j, c in enumerate(others))
    tp, pp, cp, dp, mbs, vpp = (axis(a, 0) for a in (tp, pp, cp, dp, mbs, vpp))
    if len(space.etp) > 1:  # etp 1 with tp 1 is the default layout again
        keep = (etp == 0) | (tp > 1)
        dropped += int((~keep).sum())
        tp, pp, cp, dp, mbs, vpp, zero, oo, op, rc, sp, e, etp = (
            a[keep] for a in (tp, pp, cp, dp, mbs, vpp, zero, oo, op, rc, sp, e, etp))
    lay = Layouts(tp=tp, pp=pp, dp=dp, cp=cp, ep=e, vpp=vpp, zero=zero, offload_optimizer=oo,
                  offload_params=op, mbs=mbs, gas=training.gbs // (mbs * dp), recompute=rc,
                  recompute_layers=space.pinned_value("recompute_layers") or 0,
                  recompute_method=space.pinned_value("recompute_method") or 0,
                  sequence_parallel=sp, schedule=np.where(vpp > 1, Schedule.INTERLEAVED, flat_schedule(training)),
                  etp=etp, rank_order=space.pinned_value("rank_order") or 0)
    return lay, {DIVISIBILITY: dropped, ENGINE_RULE: ruled_out}, space.coarsened


def flat_schedule(training: Training) -> Schedule:
    """The schedule searched without interleaving: ZB-H1 where the engine runs it (same activation
    memory as 1F1B, a smaller bubble: planner/pipeline.py), else 1F1B. GPipe is never searched: the
    same bubble as 1F1B with all m micro-batches in flight."""
    return Schedule.ZB_H1 if Schedule.ZB_H1 in training.engine.pipeline_schedules else Schedule.ONE_F_ONE_B


def search(model: ModelSpec, cluster: Cluster, training: Training, headroom: float = 0.05, max_mbs: int = 16,
           budget: int = SEARCH_BUDGET, pinned: dict | None = None) -> SearchResult:
    """All candidates (those with the `pinned` values), the ones that fit ranked by tokens/s, and
    rejection counts per reason."""
    start = time.perf_counter()
    lay, dropped, coarsened = enumerate_layouts(model, cluster, training, max_mbs, budget, pinned)
    reason, groups = first_violation(model, cluster, training, lay)
    rejected = {g: int(np.count_nonzero(reason == i)) for i, g in enumerate(groups)}
    for group, count in dropped.items():
        rejected[group] = rejected.get(group, 0) + count
    valid = lay.take(reason < 0)
    ev = evaluate(model, cluster, training, valid, headroom)
    rejected["out of memory"] = int(np.count_nonzero(~ev.fits))
    tried = 0
    lighter = partial_recompute_variants(model, training, valid, ev) if "recompute_layers" not in (pinned or {}) else None
    if lighter is not None and lighter.size:
        lev = evaluate(model, cluster, training, lighter, headroom)
        best = _fastest_per_parent(lighter, lev)
        rejected["out of memory"] += int(np.count_nonzero(~lev.fits))
        rejected[MORE_RECOMPUTE] = int(np.count_nonzero(lev.fits)) - best.size
        tried = lighter.size
        if best.size:
            n = valid.size
            valid = valid.concat(lighter.take(best))
            ev = picked([ev, lev], [n, lighter.size], np.repeat([0, 1], [n, best.size]), np.concatenate([np.arange(n), best]))
    if "rank_order" not in (pinned or {}):
        valid, ev = faster_rank_order(model, cluster, training, valid, ev, headroom)
    return SearchResult(valid, ev, _ranked(valid, ev), lay.size + sum(dropped.values()) + tried,
                        {k: v for k, v in rejected.items() if v}, coarsened, time.perf_counter() - start)


def _ranked(valid: Layouts, ev: Evaluation) -> np.ndarray:
    """Indices of the fitting candidates, fastest first; among equals, the simpler layout (less
    offload, less recompute), then less memory."""
    tokens_per_s = np.where(ev.fits, ev.tokens_per_s, -np.inf)
    simpler = valid.offload_optimizer + valid.offload_params
    order = np.lexsort((ev.memory["required"], valid.recompute, simpler, -np.round(tokens_per_s, 6)))
    return order[np.isfinite(tokens_per_s[order])]


def merged(result: SearchResult, found: SearchResult, keep: np.ndarray) -> SearchResult:
    """`result`'s candidates where `keep`, and every one of `found` (a search of the same space under
    other settings, pinned to what `keep` leaves out), ranked together without evaluating again;
    candidates and rejections are both searches' together."""
    rows, n = np.flatnonzero(keep), found.valid.size
    valid = result.valid.take(rows).concat(found.valid)
    ev = picked([result.eval, found.eval], [result.valid.size, n], np.repeat([0, 1], [rows.size, n]),
                np.concatenate([rows, np.arange(n)]))
    rejected = {k: result.rejected.get(k, 0) + found.rejected.get(k, 0)
                for k in {**result.rejected, **found.rejected}}
    return replace(result, valid=valid, eval=ev, order=_ranked(valid, ev), rejected=rejected,
                   candidates=result.candidates + found.candidates, elapsed_s=result.elapsed_s + found.elapsed_s)


def reevaluate(model: ModelSpec, cluster: Cluster, training: Training, result: SearchResult, headroom: float,
               rows: np.ndarray) -> SearchResult:
    """A search result ranked again under `training`, which changes no rule and only the candidates
    `rows` (variants.lean_offload_training's share: the offloading ones), those evaluated again; the
    out-of-memory count updated."""
    start = time.perf_counter()
    valid, n = result.valid, result.valid.size
    which, index = np.zeros(n, dtype=np.int64), np.arange(n)
    which[rows], index[rows] = 1, np.arange(rows.size)
    again = evaluate(model, cluster, training, valid.take(rows), headroom)
    ev = picked([result.eval, again], [n, rows.size], which, index)
    rejected = dict(result.rejected)
    rejected["out of memory"] = rejected.get("out of memory", 0) \
        + int(np.count_nonzero(~ev.fits)) - int(np.count_nonzero(~result.eval.fits))
    return replace(result, eval=ev, order=_ranked(result.valid, ev), rejected={k: v for k, v in rejected.items() if v},
                   elapsed_s=result.elapsed_s + time.perf_counter() - start)


MORE_RECOMPUTE = "more recompute than a variant that fits"
"""Rejection group: --recompute-layers variants slower than a lighter one of the same layout."""
REFINED_PARENTS = 256
"""Full-recompute layouts whose lighter --recompute-layers variants one search tries at most."""


def partial_recompute_variants(model: ModelSpec, training: Training, valid: Layouts, ev: Evaluation) -> Layouts:
    """Where the engine can recompute only N layers of each chunk (Megatron --recompute-method block:
    the first N; transformers every_n_layers: every k-th, N = ceil(L / k)), the variants N = 1 ..
    layers per chunk - 1 of the fitting full-recompute layouts that could beat the fastest fitting
    layout without their recompute seconds (an upper bound on every variant's speed), the most promising REFINED_PARENTS of them: partial recompute trades
    the memory a layout leaves free for speed, so it is tried where memory is left."""
    empty = valid.take(np.zeros(0, dtype=np.int64))
    if not training.engine.partial_recompute or not valid.size:
        return empty
    tokens_per_s, step_s = ev.tokens_per_s, ev.time["step_s"]
    full = ev.fits & (valid.recompute == Recompute.FULL) & (valid.recompute_layers == 0)
    if not full.any():
        return empty
    bound = tokens_per_s * step_s / np.maximum(step_s - ev.time["breakdown"]["recompute"], 1e-12)
    best = np.max(np.where(ev.fits, tokens_per_s, -np.inf))
    parents = np.flatnonzero(full & (bound > best))
    parents = parents[np.argsort(-bound[parents], kind="stable")[:REFINED_PARENTS]]
    chunk = max_layers_on_stage(model.layers, valid.pp[parents], training.pipeline_edge_layers) // valid.vpp[parents]
    counts = np.maximum(chunk - 1, 0)
    out = valid.take(np.repeat(parents, counts))
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    out.recompute_layers = np.arange(out.size, dtype=np.int64) - starts + 1  # 1 .. chunk-1 per parent
    # engines that checkpoint every k-th layer reach only N = ceil(L / k); N = 1 always (k = L)
    return out.take(~every_n_layers_broken(model, training, out))


def faster_rank_order(model: ModelSpec, cluster: Cluster, training: Training, valid: Layouts, ev: Evaluation,
                      headroom: float) -> tuple:
    """(valid, ev) with each fitting layout in the faster rank placement where the engine offers both
    (Engine.rank_order_choice) and they differ: a pipeline and a data-parallel group both, over more
    than one node. The bytes are the same; which groups share a node or a pod is not."""
    if not training.engine.rank_order_choice or not valid.size:
        return valid, ev
    differ = np.flatnonzero(ev.fits & (valid.pp > 1) & (valid.zero_ranks > 1) & (valid.world > cluster.gpus_per_node))
    if not differ.size:
        return valid, ev
    other = replace(valid.take(differ), rank_order=np.full(differ.size, int(RankOrder.PP_INNER)))
    # where the ranks sit moves no byte (memory.STATE_FIELDS): the step time alone is evaluated again
    rows = np.zeros(differ.size, dtype=np.int64)
    same = picked([ev], [valid.size], rows, differ)
    other_ev = replace(same, time=timing.step_time(model, cluster, training, other))
    faster = other_ev.tokens_per_s > ev.tokens_per_s[differ]
    faster &= first_violation(model, cluster, training, other)[0] < 0  # megatron-core's MoE condition
    if not faster.any():
        return valid, ev
    order = valid.rank_order.copy()
    order[differ[faster]] = RankOrder.PP_INNER
    which, index = np.zeros(valid.size, dtype=np.int64), np.arange(valid.size)
    which[differ[faster]], index[differ[faster]] = 1, np.flatnonzero(faster)
    return replace(valid, rank_order=order), picked([ev, other_ev], [valid.size, other.size], which, index)


def _fastest_per_parent(lighter: Layouts, lev: Evaluation) -> np.ndarray:
    """Index of the fastest fitting variant of each parent layout (variants of one parent are
    consecutive, numbered from recompute_layers 1)."""
    speed = np.where(lev.fits, lev.tokens_per_s, -np.inf)
    parent = np.cumsum(lighter.recompute_layers == 1) - 1
    order = np.lexsort((-speed, parent))
    first = order[np.r_[True, parent[order][1:] != parent[order][:-1]]]
    return np.sort(first[np.isfinite(speed[first])])


