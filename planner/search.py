"""`planner recommend`: enumerate every layout, evaluate all in one vectorized pass, rank by speed."""

from __future__ import annotations

import json
import time

import numpy as np

from planner import layout as L
from planner import report
from planner.errors import InputError
from planner.hardware import Cluster
from planner.layout import Layouts, Training
from planner.model import ModelSpec

DEFAULT_TOKENS_PER_STEP = 4 * 2**20  # 4Mi tokens: Llama 2 (Touvron et al. 2023, Table 1) used 4M-token batches
VPP_CHOICES = (1, 2, 3, 4, 6, 8)
CP_CHOICES = (1, 2, 4, 8)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_layouts(model: ModelSpec, cluster: Cluster, training: Training, max_mbs: int = 16) -> tuple:
    """Every combination of the searched dimensions, and how many were dropped for divisibility.

    tp: divisors of the node size; pp: divisors of gpus/tp up to L; cp: 1-8; dp = gpus/(tp pp cp);
    vpp: a few values; mbs 1..max_mbs; ZeRO 0-3; offload none/cpu/nvme for optimizer and params;
    recompute none/selective/full; sequence parallel off/on; ep: divisors of the expert count.
    (tp, pp, cp, dp, mbs, vpp) combinations whose batch or layers do not divide are dropped before
    the product (counted as 'divisibility'); every other rule is applied afterwards, vectorized."""
    g = cluster.num_gpus
    struct = np.array([(tp, pp, cp, g // (tp * pp * cp))
                       for tp in divisors(min(cluster.gpus_per_node, g)) for pp in divisors(g // tp)
                       for cp in CP_CHOICES if (g // tp // pp) % cp == 0], dtype=np.int64).reshape(-1, 4)
    s, mbs, vpp = (x.ravel() for x in np.meshgrid(np.arange(len(struct)), np.arange(1, max_mbs + 1),
                                                   np.array(VPP_CHOICES), indexing="ij"))
    tp, pp, cp, dp = (struct[s, j] for j in range(4))
    keep = (training.gbs % (mbs * dp) == 0) & (pp <= model.layers)
    keep &= (vpp == 1) | ((pp > 1) & (model.layers % (pp * vpp) == 0))
    experts = np.array(divisors(model.experts))
    rest = (4, 3, 3, 3, 2, experts.size)  # zero, offload_optimizer, offload_params, recompute, sp, ep
    dropped = int(np.count_nonzero(~keep)) * int(np.prod(rest))
    base = np.flatnonzero(keep)
    grids = np.meshgrid(base, *(np.arange(n) for n in rest), indexing="ij")
    b, zero, oo, op, rc, sp, e = (x.ravel() for x in grids)
    tp, pp, cp, dp, mbs, vpp = (a[b] for a in (tp, pp, cp, dp, mbs, vpp))
    lay = Layouts(tp=tp, pp=pp, dp=dp, cp=cp, ep=experts[e], vpp=vpp, zero=zero, offload_optimizer=oo,
                  offload_params=op, mbs=mbs, gas=training.gbs // (mbs * dp), recompute=rc, sequence_parallel=sp,
                  schedule=np.where(vpp > 1, 1, 0))
    return lay, dropped


def first_violation(model, cluster, training, lay) -> np.ndarray:
    """Index of the reason group each candidate is rejected for (-1: valid)."""
    groups = sorted(set(L.REASON_GROUP.values()))
    reason = np.full(lay.tp.shape, -1, dtype=np.int64)
    for name, (mask, _) in reversed(list(L.rule_violations(model, cluster, training, lay).items())):
        reason = np.where(mask, groups.index(L.REASON_GROUP[name]), reason)
    return reason, groups


def search(model: ModelSpec, cluster: Cluster, training: Training, headroom: float = 0.05, max_mbs: int = 16) -> dict:
    """All candidates, the ones that fit ranked by tokens/s, and rejection counts per reason."""
    start = time.perf_counter()
    lay, dropped = enumerate_layouts(model, cluster, training, max_mbs)
    reason, groups = first_violation(model, cluster, training, lay)
    rejected = {g: int(np.count_nonzero(reason == i)) for i, g in enumerate(groups)}
    rejected["divisibility"] = rejected.get("divisibility", 0) + dropped
    valid = lay.take(reason < 0)
    ev = report.evaluate(model, cluster, training, valid, headroom)
    rejected["out of memory"] = int(np.count_nonzero(~ev["fits"]))
    tokens_per_s = np.where(ev["fits"], ev["time"]["throughput"]["tokens_per_s"], -np.inf)
    # fastest first; among equals, the simpler layout (less offload, less recompute), then less memory
    simpler = valid.offload_optimizer + valid.offload_params
    order = np.lexsort((ev["memory"]["total"], valid.recompute, simpler, -np.round(tokens_per_s, 6)))
    order = order[np.isfinite(tokens_per_s[order])]
    return {"candidates": lay.size + dropped, "valid": valid, "eval": ev, "order": order,
            "rejected": {k: v for k, v in rejected.items() if v}, "elapsed_s": time.perf_counter() - start}


def short(row: dict) -> str:
    """Compact layout label, e.g. 'tp8 pp4 dp2 z1 mbs1x64 sel sp'."""
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


def binding_constraint(result: dict, i: int, record: dict, headroom: float) -> str:
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
    parts = {k: v for k, v in record["time"]["breakdown"].items() if k != "compute"}
    worst = max(parts, key=parts.get)
    return f"{worst} ({parts[worst] / record['time']['step_s']:.0%} of step)"


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


def what_would_fit(model, cluster, training, headroom, max_mbs) -> list[str]:
    """When nothing fits: the least memory any valid layout needs, and what changes would fit."""
    from dataclasses import replace

    from planner.hardware import Cluster as C

    hints = []
    lay, _ = enumerate_layouts(model, cluster, training, max_mbs)
    reason, _ = first_violation(model, cluster, training, lay)
    valid = lay.take(reason < 0)
    capacity = cluster.gpu.memory_bytes * (1 - headroom)
    if valid.size:
        ev = report.evaluate(model, cluster, training, valid, headroom)
        i = int(np.argmin(ev["memory"]["total"]))
        hints.append(f"the leanest layout ({short(valid.row(i))}) needs {ev['memory']['total'][i] / 2**30:.1f} GiB "
                     f"per GPU of {capacity / 2**30:.1f} GiB usable")
    for engine in L.ENGINES:
        if engine == training.engine:
            continue
        other = search(model, cluster, replace(training, engine=engine), headroom, max_mbs)
        if len(other["order"]):
            hints.append(f"--engine {engine} fits ({_best(other)})")
    for factor in (2, 4, 8, 16):
        bigger = C(cluster.gpu, cluster.num_gpus * factor, cluster.gpus_per_node)
        res = search(model, bigger, training, headroom, max_mbs)
        if len(res["order"]):
            hints.append(f"--gpus {bigger.num_gpus} fits ({_best(res)})")
            break
    return hints


def _best(result: dict) -> str:
    """The fastest fitting layout of a search result with its memory per GPU."""
    i = int(result["order"][0])
    return f"{short(result['valid'].row(i))}, {result['eval']['memory']['total'][i] / 2**30:.1f} GiB per GPU"


def run_cli(args, out) -> int:
    """`planner recommend`: print assumptions, the top K, the runner-up gap and rejection counts."""
    from planner import cli

    model = cli.resolve_model(args)
    seq_len = args.seq_len or 4096
    if args.gbs and args.tokens_per_step:
        raise InputError("--gbs and --tokens-per-step: give one of them, not both")
    tokens = args.tokens_per_step or DEFAULT_TOKENS_PER_STEP
    gbs = args.gbs or max(1, int(round(tokens / seq_len)))
    if args.gpus is None:
        raise InputError("--gpus: required for recommend (total GPUs, e.g. --gpus 16)")
    cluster = cli.resolve_cluster(args, args.gpus)
    args.seq_len = seq_len
    training = cli.resolve_training(args, gbs, "deepspeed")
    result = search(model, cluster, training, args.memory_headroom, args.max_mbs)
    assumptions = {
        "gpu": cluster.gpu.name, "gpus_per_node": cluster.gpus_per_node, "seq_len": seq_len, "gbs": gbs,
        "tokens_per_step": gbs * seq_len, "engine": training.engine, "precision": training.precision,
        "optimizer": training.optimizer, "flash_attention": training.flash_attention,
        "memory_headroom": args.memory_headroom,
    }
    valid, ev = result["valid"], result["eval"]
    top = distinct_top(result, args.top)
    records = [report.layout_record(model, cluster, training, valid, ev, i) for i in top]
    for i, rec in zip(top, records):
        rec["binding_constraint"] = binding_constraint(result, i, rec, args.memory_headroom)
        if args.tokens:
            rec["time_to_train"] = cli.train_time(args, {**rec, "training": {"seq_len": seq_len}}, cluster)
    hints = [] if records else what_would_fit(model, cluster, training, args.memory_headroom, args.max_mbs)
    if records and args.emit:
        from planner import export
        records[0]["emitted"] = [str(p) for p in export.emit(args.emit, model, cluster, training, records[0]["layout"])]
    if args.json:
        out.write(json.dumps({"model": model.shape_dict(), "assumptions": assumptions,
                              "candidates_evaluated": result["candidates"], "rejected": result["rejected"],
                              "layouts": records, "suggestions": hints}, indent=1) + "\n")
        return 0 if records else 2
    out.write("assumed: " + ", ".join(f"{k} {v}" for k, v in assumptions.items()) + "\n")
    out.write(cli.describe(model, cluster, training) + "\n\n")
    if not records:
        out.write("nothing fits. " + "; ".join(hints) + "\n")
        out.write(rejections_text(result) + "\n")
        return 2
    head = ["#", "layout", "GiB/GPU", "free", "step s", "tokens/s", "MFU", "binding constraint"]
    rows = []
    for k, rec in enumerate(records, 1):
        mem, th = rec["memory"], rec["throughput"]
        rows.append([str(k), short(rec["layout"]), report.gib(mem["gpu_bytes"]), report.gib(mem["headroom_bytes"]),
                     f"{rec['time']['step_s']:.2f}", f"{th['tokens_per_s']:,.0f}", f"{th['mfu']:.1%}",
                     rec["binding_constraint"]])
    out.write(report.table(head, rows) + "\n")
    if len(records) > 1:
        gap = 1 - records[1]["throughput"]["tokens_per_s"] / records[0]["throughput"]["tokens_per_s"]
        out.write(f"runner-up is {gap:.1%} slower\n")
    if args.tokens:
        out.write("#1 " + cli.train_time_text(records[0]["time_to_train"]) + "\n")
    out.write(rejections_text(result) + "\n")
    if args.emit:
        out.write("wrote " + ", ".join(records[0]["emitted"]) + "\n")
    return 0


def rejections_text(result) -> str:
    rej = ", ".join(f"{k} {v:,}" for k, v in sorted(result["rejected"].items(), key=lambda kv: -kv[1]))
    return f"{result['candidates']:,} candidates evaluated in {result['elapsed_s']:.2f} s; rejected: {rej or 'none'}"
