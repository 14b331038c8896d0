"""An answer's JSON records: one candidate of a search as {layout, memory, time, throughput}, its
memory at every modelled moment of the step and on every pipeline stage, and the cluster."""

from __future__ import annotations

import math

from planner import memory
from planner.calibration import prior_band, verdict
from planner.hardware import Cluster
from planner.layout import Layouts, Training
from planner.model import ModelSpec
from planner.search import Evaluation


def at(parts, i: int) -> dict:
    """Candidate i's value of each of a Lazy mapping's parts, without gathering the others'."""
    return {k: float(parts.at(k, i)) for k in parts}


def band_of(cluster: Cluster, quantity: str) -> float:
    """The relative error band of a quantity: the cluster's profile's, else the prior."""
    return cluster.calibration.band(quantity) if cluster.calibration else prior_band(quantity)


def layout_record(cluster: Cluster, lay: Layouts, ev: Evaluation, i: int) -> dict:
    """Candidate i as {layout, memory, time, throughput} (the `planner estimate --json` keys)."""
    mem = ev.memory
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
            "fits": bool(ev.fits.flat[i]),
            "peak_phase": memory.PHASES[int(mem.at("phase", i))],
            "breakdown": parts,
            "phases": phase_records(lambda k: mem.at(k, i)),
        },
        "time": {"step_s": float(ev.time["step_s"].flat[i]), "error_band": band_of(cluster, "step_time"),
                 "breakdown": at(ev.time["breakdown"], i)},
        "throughput": at(ev.time["throughput"], i),
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
