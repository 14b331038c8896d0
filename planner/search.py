"""The search: enumerate every layout, evaluate all in one vectorized pass, rank by speed.

Pure functions of resolved inputs (no argparse, no printing): planner/api.py calls them.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from planner import memory, timing
from planner.engines import ENGINES
from planner.hardware import Cluster
from planner.layout import Layouts, Training
from planner.model import ModelSpec
from planner.options import Offload, Recompute, Schedule
from planner.rules import DIVISIBILITY, first_violation

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


def evaluate(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts, headroom: float = 0.0) -> dict:
    """Memory (peak rank) and step time of every candidate, and whether each fits the GPU (less
    `headroom`) and its node's host memory."""
    mem = memory.rank_memory(model, cluster, training, lay)
    capacity = cluster.gpu.memory_bytes * (1.0 - headroom)
    cpu_ok = mem["cpu_per_node"] <= cluster.gpu.host_ram_bytes_per_node
    fits = (mem["total"] <= capacity) & cpu_ok
    return {"memory": mem, "time": timing.step_time(model, cluster, training, lay), "fits": fits, "cpu_fits": cpu_ok}


def enumerate_layouts(model: ModelSpec, cluster: Cluster, training: Training, max_mbs: int = 16) -> tuple:
    """Every combination of the searched dimensions, and how many were dropped for divisibility.

    tp: divisors of the node size; pp: divisors of gpus/tp; cp: 1-8; dp = gpus/(tp pp cp);
    vpp: a few values; mbs 1..max_mbs; ZeRO 0-3; offload none/cpu/nvme for optimizer and params;
    recompute none/selective/full; sequence parallel off/on; ep: divisors of the expert count.
    (tp, pp, cp, dp, mbs, vpp) combinations whose batch or layers do not divide are dropped before
    the product (counted, not built: only micro-batch sizes dividing the global batch are
    materialized); every other rule is applied afterwards, vectorized."""
    g = cluster.num_gpus
    struct = np.array([(tp, pp, cp, g // (tp * pp * cp))
                       for tp in divisors(min(cluster.gpus_per_node, g)) for pp in divisors(g // tp)
                       for cp in CP_CHOICES if (g // tp // pp) % cp == 0], dtype=np.int64).reshape(-1, 4)
    mbs_choices = np.array([m for m in divisors(training.gbs) if m <= max_mbs] or [1], dtype=np.int64)
    s, mbs, vpp = (x.ravel() for x in np.meshgrid(np.arange(len(struct)), mbs_choices, np.array(VPP_CHOICES),
                                                   indexing="ij"))
    tp, pp, cp, dp = (struct[s, j] for j in range(4))
    keep = (training.gbs % (mbs * dp) == 0) & (pp <= model.layers)
    keep &= (vpp == 1) | ((pp > 1) & (model.layers % (pp * vpp) == 0))
    experts = np.array(divisors(model.experts))
    rest = (4, len(Offload), len(Offload), len(Recompute), 2, experts.size)  # zero, offloads, recompute, sp, ep
    considered = len(struct) * max_mbs * len(VPP_CHOICES)
    kept = int(np.count_nonzero(keep))
    dropped = (considered - kept) * int(np.prod(rest))
    base = np.flatnonzero(keep)
    grids = np.meshgrid(base, *(np.arange(n) for n in rest), indexing="ij")
    b, zero, oo, op, rc, sp, e = (x.ravel() for x in grids)
    tp, pp, cp, dp, mbs, vpp = (a[b] for a in (tp, pp, cp, dp, mbs, vpp))
    lay = Layouts(tp=tp, pp=pp, dp=dp, cp=cp, ep=experts[e], vpp=vpp, zero=zero, offload_optimizer=oo,
                  offload_params=op, mbs=mbs, gas=training.gbs // (mbs * dp), recompute=rc, sequence_parallel=sp,
                  schedule=np.where(vpp > 1, Schedule.INTERLEAVED, Schedule.ONE_F_ONE_B))
    return lay, dropped


def search(model: ModelSpec, cluster: Cluster, training: Training, headroom: float = 0.05, max_mbs: int = 16) -> dict:
    """All candidates, the ones that fit ranked by tokens/s, and rejection counts per reason."""
    start = time.perf_counter()
    lay, dropped = enumerate_layouts(model, cluster, training, max_mbs)
    reason, groups = first_violation(model, cluster, training, lay)
    rejected = {g: int(np.count_nonzero(reason == i)) for i, g in enumerate(groups)}
    rejected[DIVISIBILITY] = rejected.get(DIVISIBILITY, 0) + dropped
    valid = lay.take(reason < 0)
    ev = evaluate(model, cluster, training, valid, headroom)
    rejected["out of memory"] = int(np.count_nonzero(~ev["fits"]))
    tokens_per_s = np.where(ev["fits"], ev["time"]["throughput"]["tokens_per_s"], -np.inf)
    # fastest first; among equals, the simpler layout (less offload, less recompute), then less memory
    simpler = valid.offload_optimizer + valid.offload_params
    order = np.lexsort((ev["memory"]["total"], valid.recompute, simpler, -np.round(tokens_per_s, 6)))
    order = order[np.isfinite(tokens_per_s[order])]
    return {"candidates": lay.size + dropped, "valid": valid, "eval": ev, "order": order,
            "rejected": {k: v for k, v in rejected.items() if v}, "elapsed_s": time.perf_counter() - start}


def short(row: dict) -> str:
    """Compact layout label, e.g. 'tp8 pp4 dp2 z1 mbs1x64 sel-rc sp'."""
    parts = [f"tp{row['tp']}", f"pp{row['pp']}"]
    parts += [f"vpp{row['vpp']}"] if row["vpp"] > 1 else []
    parts += [f"cp{row['cp']}"] if row["cp"] > 1 else []
    parts += [f"ep{row['ep']}"] if row["ep"] > 1 else []
    parts += [f"dp{row['dp']}", f"z{row['zero']}", f"mbs{row['mbs']}x{row['gas']}"]
    parts += [] if row["recompute"] == "none" else [row["recompute"][:3] + "-rc"]
    parts += ["sp"] if row["sequence_parallel"] else []
    parts += [f"off-opt:{row['offload_optimizer']}"] if row["offload_optimizer"] != "none" else []
    parts += [f"off-par:{row['offload_params']}"] if row["offload_params"] != "none" else []
    return " ".join(parts)


CORE_FIELDS = ("tp", "pp", "vpp", "cp", "ep", "dp", "zero", "sequence_parallel")


def binding_constraint(result: dict, i: int, step_breakdown: dict, step_s: float) -> str:
    """What keeps candidate i from being faster: memory, when a faster variant of the same layout
    (less recompute, a larger micro-batch, less offload) does not fit; else its largest overhead."""
    valid, ev = result["valid"], result["eval"]
    speed = ev["time"]["throughput"]["tokens_per_s"]
    same = np.ones(valid.size, dtype=bool)
    for f in CORE_FIELDS:
        same &= getattr(valid, f) == getattr(valid, f)[i]
    blocked = np.flatnonzero(same & ~ev["fits"] & (speed > speed[i] * 1.001))
    if blocked.size:
        j = int(blocked[np.argmin(ev["memory"]["total"][blocked])])  # the faster variant nearest to fitting
        row = valid.row(j)
        words = {"mbs": f"mbs {row['mbs']}", "recompute": f"recompute {row['recompute']}",
                 "offload_optimizer": f"optimizer offload {row['offload_optimizer']}",
                 "offload_params": f"param offload {row['offload_params']}"}
        changes = [words[f] for f in words if getattr(valid, f)[j] != getattr(valid, f)[i]]
        need = ev["memory"]["total"][j] / 2**30
        return f"memory: {', '.join(changes)} would be {speed[j] / speed[i] - 1:.0%} faster but needs {need:.1f} GiB"
    parts = {k: v for k, v in step_breakdown.items() if k != "compute"}
    worst = max(parts, key=parts.get)
    return f"{worst} ({parts[worst] / step_s:.0%} of step)"


def distinct_top(result: dict, k: int) -> list[int]:
    """The k fastest fitting candidates, dropping variants that differ only in the offload device
    and are exactly as fast (e.g. NVMe vs CPU when the CPU Adam step hides the NVMe traffic)."""
    valid, speed = result["valid"], result["eval"]["time"]["throughput"]["tokens_per_s"]
    seen, picked = set(), []
    for i in result["order"]:
        i = int(i)
        row = valid.row(i)
        key = tuple(row[f] for f in (*CORE_FIELDS, "mbs", "recompute")) + (round(float(speed[i]), 3),)
        if key in seen:
            continue
        seen.add(key)
        picked.append(i)
        if len(picked) == k:
            break
    return picked


def what_would_fit(model: ModelSpec, cluster: Cluster, training: Training, headroom: float, max_mbs: int) -> list[str]:
    """When nothing fits: the least memory any valid layout needs, and what changes would fit."""
    hints = []
    lay, _ = enumerate_layouts(model, cluster, training, max_mbs)
    reason, _ = first_violation(model, cluster, training, lay)
    valid = lay.take(reason < 0)
    capacity = cluster.gpu.memory_bytes * (1 - headroom)
    if valid.size:
        ev = evaluate(model, cluster, training, valid, headroom)
        i = int(np.argmin(ev["memory"]["total"]))
        hints.append(f"the leanest layout ({short(valid.row(i))}) needs {ev['memory']['total'][i] / 2**30:.1f} GiB "
                     f"per GPU of {capacity / 2**30:.1f} GiB usable")
    for engine in ENGINES.values():
        if engine is training.engine:
            continue
        other = search(model, cluster, replace(training, engine=engine), headroom, max_mbs)
        if len(other["order"]):
            hints.append(f"--engine {engine.name} fits ({best_text(other)})")
    for factor in (2, 4, 8, 16):
        if cluster.num_gpus * factor > 2**20:
            break
        bigger = Cluster(cluster.gpu, cluster.num_gpus * factor, cluster.gpus_per_node)
        res = search(model, bigger, training, headroom, max_mbs)
        if len(res["order"]):
            hints.append(f"--gpus {bigger.num_gpus} fits ({best_text(res)})")
            break
    return hints


def best_text(result: dict) -> str:
    """The fastest fitting layout of a search result with its memory per GPU."""
    i = int(result["order"][0])
    return f"{short(result['valid'].row(i))}, {result['eval']['memory']['total'][i] / 2**30:.1f} GiB per GPU"
