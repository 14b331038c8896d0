"""The corpus's answers scored against the published figures (throughput, memory, the fit call), and
the summaries by source, engine and metric.

Throughput is tokens/s per GPU where published, else TFLOP/s per GPU (hardware FLOPs where the
source counts the recompute), else MFU; memory as measured (max_allocated against allocated_bytes,
max_reserved against reserved_bytes; GiB for torchtitan).
"""

from __future__ import annotations

import numpy as np

from planner.corpus_rows import Answer, is_moe, layoutless, prefix

LOW_TRUST = ("bloom", "torchtitan")
"""Sources kept out of the throughput headline: BLOOM was timed early in its run, torchtitan's
H100s ran power-capped at 500 W (their memory figures count in full)."""
THROUGHPUT_METRICS = ("tokens/s per GPU", "TFLOP/s per GPU (hardware)", "TFLOP/s per GPU (model)", "MFU")
MEMORY_METRIC = "memory per GPU"


def throughput_figure(row: dict, rec: dict) -> dict | None:
    """{metric, published, key, scale}: the published throughput and the record's matching
    throughput[key] x scale, or None (memory-only rows, nothing comparable)."""
    m, t, n = row["measured"], rec.get("throughput", {}), row["num_gpus"]
    if prefix(row) == "mem":
        return None
    meas = None
    if m.get("iter_time_s"):
        meas = row["gbs"] * row["seq_len"] / m["iter_time_s"] / n
    elif m.get("tokens_per_s_per_gpu"):
        meas = m["tokens_per_s_per_gpu"]
    elif m.get("tokens_per_s"):
        meas = m["tokens_per_s"] / n
    if meas and t.get("tokens_per_s"):
        return {"metric": THROUGHPUT_METRICS[0], "published": meas, "key": "tokens_per_s", "scale": 1.0 / n}
    if m.get("tflops_per_gpu") and t:
        # BLOOM's and Narayanan's full-recompute TFLOP/s count the recompute pass: hardware FLOPs
        src = row["source"]
        hw = src.startswith("bigscience") or (src.startswith("Narayanan") and row["recompute"] == "full")
        key = "hardware_tflops_per_gpu" if hw else "model_tflops_per_gpu"
        if t.get(key):
            return {"metric": THROUGHPUT_METRICS[1 if hw else 2], "published": m["tflops_per_gpu"], "key": key,
                    "scale": 1.0}
    if m.get("mfu") and t.get("mfu"):
        return {"metric": "MFU", "published": m["mfu"], "key": "mfu", "scale": 1.0}
    return None


def score(row: dict, ans: Answer) -> dict:
    """One row's figures ({metric, published, predicted, error}) and its fit call: not_expressed,
    ran_fits / ran_borderline / ran_oom (a run that ran: a stated layout and a throughput figure),
    oom_called / oom_missed (a published OOM), or no_call."""
    out = {"id": row["id"], "source": prefix(row), "engine": ans.engine or ans.reading.engine, "figures": []}
    if ans.refusal is not None or ans.reading.reason is not None:
        return {**out, "call": "not_expressed", "reason": ans.reading.reason or "refused: " + ans.refusal}
    rec, m = ans.record, row["measured"]
    if not rec:  # recommend found no layout that fits this run's cluster and batch
        return {**out, "call": "not_expressed", "reason": "refused: recommend finds no layout that fits"}
    fig = throughput_figure(row, rec)
    if fig is not None:
        pred = rec["throughput"][fig["key"]] * fig["scale"]
        out["figures"].append({"metric": fig["metric"], "published": fig["published"], "predicted": pred,
                               "error": pred / fig["published"] - 1.0, "key": fig["key"], "scale": fig["scale"]})
    if out["source"] == "bloom" and row["layers"] == 72 and m.get("tflops_per_gpu") and rec.get("throughput"):
        out["rank_pair"] = (rec["throughput"]["hardware_tflops_per_gpu"], m["tflops_per_gpu"])  # BLOOM's ranking
    mem, meas = rec.get("memory"), m.get("memory_gb_per_gpu")
    out["call"], out["verdict"] = "no_call", mem and mem["verdict"]
    if mem is None:
        return out
    ran_figure = any(m.get(k) for k in ("tokens_per_s_per_gpu", "tokens_per_s", "iter_time_s", "tflops_per_gpu", "mfu"))
    if out["source"] not in ("mem", "bloom") and not layoutless(row) and meas != "OOM" and ran_figure:
        out["call"] = "ran_" + mem["verdict"]
    if meas == "OOM" or (row.get("notes") and "OOM" in str(m)):
        out["call"] = "oom_called" if mem["fits"] is False else "oom_missed"
    elif isinstance(meas, (int, float)):
        unit = 2**30 if out["source"] == "torchtitan" or m.get("memory_unit") == "GiB" else 1e9
        kind = m.get("memory_kind")  # like with like: the allocator's peak against the planner's
        peak = {"max_allocated": mem["allocated_bytes"], "max_reserved": mem["reserved_bytes"]}.get(kind, mem["gpu_bytes"])
        pred = peak / unit
        out["figures"].append({"metric": MEMORY_METRIC, "published": meas, "predicted": pred, "error": pred / meas - 1.0,
                               "kind": kind or "peak", "unit_bytes": unit})
        out["fits"] = mem["fits"]
    return out


def groups(scored: list[dict]) -> list[dict]:
    """Per (source, engine, metric): cases, mean signed error, MAPE; low_trust for the throughput
    of sources kept out of the headline."""
    acc: dict = {}
    for s in scored:
        for f in s["figures"]:
            acc.setdefault((s["source"], s["engine"], f["metric"]), []).append(f["error"])
    return [{"source": src, "engine": eng, "metric": met, "cases": len(e), "mean_error": float(np.mean(e)),
             "mape": float(np.mean(np.abs(e))), "low_trust": src in LOW_TRUST and met != MEMORY_METRIC}
            for (src, eng, met), e in sorted(acc.items())]


CALLS = ("ran_fits", "ran_borderline", "ran_oom", "oom_called", "oom_missed", "not_expressed", "no_call")


def fit_calls(scored: list[dict]) -> list[dict]:
    """Per source: rows, and how many fall in each call of CALLS (they add up to rows)."""
    out: dict = {}
    for s in scored:
        c = out.setdefault(s["source"], {"source": s["source"], "rows": 0, **dict.fromkeys(CALLS, 0)})
        c["rows"] += 1
        c[s["call"]] += 1
    return [out[k] for k in sorted(out)]


def _rho(pairs: list) -> float | None:
    """Spearman's rank correlation (ordinal ranks, as the judge computes it)."""
    if len(pairs) < 3:
        return None
    a, b = (np.argsort(np.argsort(np.array(v), kind="stable"), kind="stable") for v in zip(*pairs))
    n = len(pairs)
    return float(1 - 6 * np.sum((a - b) ** 2) / (n * (n * n - 1)))


def summary(rows: list[dict], scored: list[dict]) -> dict:
    """The judge's summary line as numbers."""
    def mean_abs(errs):
        return float(np.mean(np.abs(errs))) if errs else None

    thr = [f["error"] for s in scored if s["source"] not in LOW_TRUST for f in s["figures"] if f["metric"] != MEMORY_METRIC]
    mem = [f["error"] for s in scored for f in s["figures"] if f["metric"] == MEMORY_METRIC]
    calls = [s["call"] for s in scored]
    moe = {r["id"] for r in rows if is_moe(r)}
    refused = [s.get("reason", "").startswith("refused") for s in scored]
    return {"throughput_mape": mean_abs(thr), "throughput_n": len(thr), "memory_mape": mean_abs(mem), "memory_n": len(mem),
            "ooms_called": calls.count("oom_called"), "ooms": calls.count("oom_called") + calls.count("oom_missed"),
            "measured_called_fitting": sum(s.get("fits") is True for s in scored),
            "measured": sum("fits" in s for s in scored), "bloom_rank_rho": _rho([s["rank_pair"] for s in scored
                                                                                  if "rank_pair" in s]),
            "refused": sum(refused), "asked": sum(r or s["call"] != "not_expressed" for r, s in zip(refused, scored)),
            "moe_not_expressible": sum(s["id"] in moe and s["call"] == "not_expressed" and not r
                                       for r, s in zip(refused, scored)),
            "ran_called_oom": calls.count("ran_oom"), "ran_borderline": calls.count("ran_borderline"),
            "ran": sum(c.startswith("ran_") for c in calls)}
