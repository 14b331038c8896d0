"""Reading a search's result: a layout's short label, the fastest distinct layouts, what binds each,
the memory/speed landscape with its Pareto front, and what would fit where nothing does."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from planner.engines import ENGINES
from planner.errors import InputError
from planner.hardware import Cluster
from planner.layout import Training
from planner.model import ModelSpec
from planner.search import SearchResult, search


def short(row: dict) -> str:
    """Compact layout label, e.g. 'tp8 pp4 dp2 z1 mbs1x64 sel-rc sp'."""
    parts = [f"tp{row['tp']}", f"pp{row['pp']}"]
    parts += [f"vpp{row['vpp']}"] if row["vpp"] > 1 else []
    parts += [f"cp{row['cp']}"] if row["cp"] > 1 else []
    parts += [f"ep{row['ep']}"] if row["ep"] > 1 else []
    parts += [f"etp{row['etp']}"] if row.get("etp") and row["etp"] != row["tp"] else []
    parts += [f"dp{row['dp']}", f"z{row['zero']}", f"mbs{row['mbs']}x{row['gas']}"]
    parts += [] if row["recompute"] == "none" else [row["recompute"][:3] + "-rc"]
    if row.get("recompute_layers"):
        parts.append(f"rc-{'groups' if row.get('recompute_method') == 'uniform' else 'layers'}{row['recompute_layers']}")
    parts += ["sp"] if row["sequence_parallel"] else []
    parts += ["pp-inner"] if row.get("rank_order") == "tp-cp-pp-dp" else []
    parts += [row["schedule"]] if row["schedule"] in ("gpipe", "zb-h1") and row["pp"] > 1 else []
    parts += [f"off-opt:{row['offload_optimizer']}"] if row["offload_optimizer"] != "none" else []
    parts += [f"off-par:{row['offload_params']}"] if row["offload_params"] != "none" else []
    return " ".join(parts)


CORE_FIELDS = ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "zero", "sequence_parallel")


def binding_constraint(result: SearchResult, i: int, step_breakdown: dict, step_s: float) -> str:
    """What keeps candidate i from being faster: memory, when a faster variant of the same layout
    (less recompute, a larger micro-batch, less offload) does not fit; else its largest overhead."""
    valid, ev = result.valid, result.eval
    speed = ev.tokens_per_s
    same = np.ones(valid.size, dtype=bool)
    for f in CORE_FIELDS:
        same &= getattr(valid, f) == getattr(valid, f)[i]
    blocked = np.flatnonzero(same & ~ev.fits & (speed > speed[i] * 1.001))
    if blocked.size:
        j = int(blocked[np.argmin(ev.memory["required"][blocked])])  # the faster variant nearest to fitting
        row = valid.row(j)
        words = {"mbs": f"mbs {row['mbs']}", "recompute": f"recompute {row['recompute']}",
                 "recompute_layers": f"recompute layers {row['recompute_layers'] or 'all'}",
                 "offload_optimizer": f"optimizer offload {row['offload_optimizer']}",
                 "offload_params": f"param offload {row['offload_params']}"}
        changes = [words[f] for f in words if getattr(valid, f)[j] != getattr(valid, f)[i]]
        need = ev.memory["required"][j] / 2**30
        return f"memory: {', '.join(changes)} would be {speed[j] / speed[i] - 1:.0%} faster but needs {need:.1f} GiB"
    parts = {k: v for k, v in step_breakdown.items() if k != "compute"}
    worst = max(parts, key=parts.get)
    return f"{worst} ({parts[worst] / step_s:.0%} of step)"


def distinct_top(result: SearchResult, k: int) -> list[int]:
    """The k fastest fitting candidates, dropping variants that differ only in the offload device
    and are exactly as fast (e.g. NVMe vs CPU when the CPU Adam step hides the NVMe traffic)."""
    valid, speed = result.valid, result.eval.tokens_per_s
    seen, picked = set(), []
    for i in result.order:
        i = int(i)
        row = valid.row(i)
        key = tuple(row[f] for f in (*CORE_FIELDS, "mbs", "recompute", "recompute_layers")) + (round(float(speed[i]), 3),)
        if key in seen:
            continue
        seen.add(key)
        picked.append(i)
        if len(picked) == k:
            break
    return picked


HINT_BUDGET = 500_000
"""Candidates each what-would-fit search materializes (the hints name a layout that fits)."""


def what_would_fit(model: ModelSpec, cluster: Cluster, training: Training, headroom: float, max_mbs: int,
                   result: SearchResult) -> list[str]:
    """When nothing fits (`result` is that search): the least memory any valid layout needs, and
    what changes would fit: another engine, or more GPUs."""
    hints = [lean] if (lean := leanest_text(cluster, headroom, result)) else []

    def attempt(c: Cluster, t: Training):
        try:
            res = search(model, c, t, headroom, max_mbs, HINT_BUDGET)
        except InputError:  # even coarsened, too many layouts to try here
            return None
        return res if len(res.order) else None

    for engine in ENGINES.values():
        if engine is not training.engine and (other := attempt(cluster, training.for_engine(engine))):
            hints.append(f"--engine {engine.name} fits ({best_text(other)})")
    for factor in (2, 4, 8, 16):
        if cluster.num_gpus * factor > 2**20:
            break
        bigger = replace(cluster, num_gpus=cluster.num_gpus * factor)
        if res := attempt(bigger, training):
            hints.append(f"--gpus {bigger.num_gpus} fits ({best_text(res)})")
            break
    return hints


def leanest_text(cluster: Cluster, headroom: float, result: SearchResult) -> str | None:
    """The least memory any valid layout of a search needs, against what is usable (None where no
    layout passed the rules)."""
    valid, ev = result.valid, result.eval
    if not valid.size:
        return None
    capacity = cluster.gpu.memory_bytes * (1 - headroom)
    i = int(np.argmin(ev.memory["required"]))
    return (f"the leanest layout ({short(valid.row(i))}) needs {ev.memory['total'][i] / 2**30:.1f} GiB "
            f"per GPU of {capacity / 2**30:.1f} GiB usable")


def best_text(result: SearchResult) -> str:
    """The fastest fitting layout of a search result with its memory per GPU."""
    i = int(result.order[0])
    return f"{short(result.valid.row(i))}, {result.eval.memory['total'][i] / 2**30:.1f} GiB per GPU"


def pareto_front(memory_bytes: np.ndarray, tokens_per_s: np.ndarray) -> np.ndarray:
    """Mask of the points no other point beats on both axes (less memory and more speed): sorted by
    memory, a point is on the front when it is faster than every point that needs less."""
    order = np.lexsort((-tokens_per_s, memory_bytes))
    speed = tokens_per_s[order]
    best_before = np.concatenate(([-np.inf], np.maximum.accumulate(speed)[:-1]))
    mask = np.zeros(memory_bytes.shape, dtype=bool)
    mask[order[speed > best_before]] = True
    return mask


def landscape(result: SearchResult, limit: int) -> dict:
    """Up to `limit` fitting layouts for a speed-versus-memory plot: the whole Pareto front, then
    layouts evenly spaced through the speed ranking."""
    fitting = result.order
    memory_bytes = np.asarray(result.eval.memory["required"])[fitting]
    speed = np.asarray(result.eval.tokens_per_s)[fitting]
    front = np.flatnonzero(pareto_front(memory_bytes, speed))[:limit]
    spread = np.unique(np.linspace(0, fitting.size - 1, max(0, limit - front.size)).astype(np.int64)) if fitting.size else []
    picked = np.union1d(front, spread).astype(np.int64)
    on_front = np.isin(picked, front)
    return {"label": [short(result.valid.row(int(fitting[k]))) for k in picked],
            "gpu_bytes": [int(memory_bytes[k]) for k in picked], "tokens_per_s": [float(speed[k]) for k in picked],
            "pareto": [bool(f) for f in on_front], "fitting": int(fitting.size)}
