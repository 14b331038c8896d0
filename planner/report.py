"""Evaluate layouts and turn the arrays into the JSON records and text tables users read."""

from __future__ import annotations

import numpy as np

from planner import memory, timing
from planner.hardware import Cluster
from planner.layout import Layouts, Training
from planner.model import ModelSpec

GiB = 2**30


def evaluate(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts, headroom: float = 0.0) -> dict:
    """Memory (peak rank) and step time of every candidate, in one vectorized pass."""
    mem = memory.rank_memory(model, cluster, training, lay)
    capacity = cluster.gpu.memory_bytes * (1.0 - headroom)
    cpu_ok = mem["cpu_per_node"] <= cluster.gpu.host_ram_bytes_per_node
    fits = (mem["total"] <= capacity) & cpu_ok
    return {"memory": mem, "time": timing.step_time(model, cluster, training, lay), "fits": fits, "cpu_fits": cpu_ok}


def _pick(tree, i):
    if isinstance(tree, dict):
        return {k: _pick(v, i) for k, v in tree.items()}
    return float(np.asarray(tree).flat[i]) if np.ndim(tree) else float(tree)


def layout_record(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts, ev: dict, i: int,
                  with_stages: bool = False) -> dict:
    """One candidate as {layout, memory, time, throughput} (the `planner estimate --json` keys)."""
    mem = ev["memory"]
    record = {
        "layout": lay.row(i),
        "memory": {
            "gpu_bytes": int(mem["total"][i]),
            "cpu_bytes_per_node": int(mem["cpu_per_node"][i]),
            "capacity_bytes": int(cluster.gpu.memory_bytes),
            "headroom_bytes": int(cluster.gpu.memory_bytes - mem["total"][i]),
            "fits": bool(ev["fits"][i]),
            "peak_phase": "optimizer step" if mem["phase"][i] else "forward/backward",
            "breakdown": {k: int(mem[k][i]) for k in memory.BREAKDOWN_KEYS},
        },
    }
    time = ev["time"]
    record["time"] = {"step_s": _pick(time["step_s"], i), "breakdown": _pick(time["breakdown"], i)}
    record["throughput"] = _pick(time["throughput"], i)
    if with_stages:
        one = lay.take(np.array([i]))
        record["memory"]["per_stage"] = [
            {"stage": s, "gpu_bytes": int(row["total"]), "cpu_bytes_per_node": int(row["cpu_per_node"]),
             "breakdown": {k: int(row[k]) for k in memory.BREAKDOWN_KEYS}}
            for s, row in enumerate(memory.per_stage(model, cluster, training, one))
        ]
    return record


def gib(x: float) -> str:
    return f"{x / GiB:.2f}"


def memory_table(record: dict, capacity_bytes: int) -> str:
    """Per-stage memory table with each part, total, capacity, headroom and fit."""
    stages = record["memory"]["per_stage"]
    keys = memory.BREAKDOWN_KEYS
    head = ["stage", *keys, "total", "capacity", "headroom", "fits"]
    rows = []
    for st in stages:
        total = st["gpu_bytes"]
        rows.append([str(st["stage"]), *(gib(st["breakdown"][k]) for k in keys), gib(total), gib(capacity_bytes),
                     gib(capacity_bytes - total), "yes" if total <= capacity_bytes else "NO"])
    return table(head, rows) + "\n(GiB per GPU; every rank of a stage holds the same)"


def table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[j]) for r in rows)) if rows else len(h) for j, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)
