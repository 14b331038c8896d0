"""recommend's engine comparison: the fastest fitting layout of every other engine for the same
question (refine.engine_best), searched beside this engine's search in forked processes
(planner/forked.py), and which settings each searches because the user left them alone."""

from __future__ import annotations

import contextlib

from planner import forked
from planner.engines import ENGINES, NAMES as ENGINE_NAMES
from planner.inputs import TrainingInput
from planner.layout import Training
from planner.refine import engine_best


def engine_groups(own_engine: str, names: list, workers: int) -> list[list]:
    """`names` in `workers` groups, the last one this process's, which also runs `own_engine`'s
    search: longest first to the least loaded (Engine.search_ms)."""
    workers = max(1, min(int(workers), len(names) + 1))
    groups, loads = [[] for _ in range(workers)], [0.0] * (workers - 1) + [ENGINES[own_engine].search_ms]
    for name in sorted(names, key=lambda n: -ENGINES[n].search_ms):
        i = loads.index(min(loads))
        groups[i].append(name)
        loads[i] += ENGINES[name].search_ms
    return [g for g in groups[:-1] if g] + [[n for n in names if n in groups[-1]]]


def engines_best(spec, clus, train: Training, headroom: float, max_mbs: int, pins: dict, frees: tuple,
                 names: list) -> dict:
    """{engine: refine.engine_best} of `names`, each without a speed to compare with yet."""
    return {name: engine_best(spec, clus, train, name, headroom, max_mbs, pins, None, *frees) for name in names}


class OtherEngines:
    """The other engines' searches (engines_best) in groups: forked children started on creation
    (planner/forked.py), this process's group run by result(), which then gathers the children's."""

    def __init__(self, spec, clus, train: Training, headroom: float, max_mbs: int, pins: dict, frees: tuple,
                 names: list, workers: int):
        self.args = (spec, clus, train, headroom, max_mbs, pins, frees)
        *children, self.own = engine_groups(train.engine.name, names, workers)
        self.pending = [forked.start(engines_best, *self.args, group) for group in children]

    def result(self) -> dict:
        found = engines_best(*self.args, self.own)
        while self.pending:
            found.update(self.pending.pop(0)())
        order = {name: i for i, name in enumerate(ENGINE_NAMES)}
        return dict(sorted(found.items(), key=lambda kv: order[kv[0]]))

    def close(self) -> None:
        """Reap the children not gathered (an error before result())."""
        while self.pending:
            with contextlib.suppress(Exception):
                self.pending.pop(0)()


def free_settings(tin: TrainingInput) -> tuple:
    """Which settings recommend searches because the user left them alone: the pipeline split, the
    ZeRO-3 live-parameter knobs, the offloaded optimizer share, --tp-comm-overlap, Megatron's
    --recompute-modules."""
    knobs_free = tin.stage3_max_live_parameters is None and tin.stage3_max_reuse_distance is None
    return (tin.pipeline_edge_layers is None, knobs_free, tin.optimizer_offload_fraction is None,
            tin.tp_comm_overlap is None, tin.recompute_modules is None)


def other_engines(spec, clus, train: Training, headroom: float, max_mbs: int, pins: dict, best: float | None,
                  frees: tuple, compare: bool, searched: dict | None) -> list[dict]:
    """The other engines' fastest fitting layouts against `best` (refine.engine_best), none where not
    `compare`; `searched`: a first answer's searches of them, re-read against this one's best."""
    names = [name for name in ENGINE_NAMES if name != train.engine.name]
    if not compare:
        return []
    if searched is None:
        return [engine_best(spec, clus, train, name, headroom, max_mbs, pins, best, *frees) for name in names]
    return [{**searched[name], "relative_speed": None if best is None or searched[name]["tokens_per_s"] is None
             else searched[name]["tokens_per_s"] / best} for name in names]
