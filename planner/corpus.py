"""`planner validate`'s corpus report (corpus_rows reads and asks, corpus_score scores), with the
leave-one-source-out fit of every coefficient declared fitted to the corpus.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from planner import memory, timing
from planner.calibration import Calibration
from planner.corpus_rows import Answer, ask, load_rows, read
from planner.corpus_score import LOW_TRUST, MEMORY_METRIC, fit_calls, groups, score, summary
from planner.data import catalog
from planner.modules import Modules, block_modules

FIT_POINTS = 9
"""Coefficient values a leave-one-source-out fit evaluates each throughput row at."""


def fitted_coefficients() -> list[dict]:
    """Coefficients of data/coefficients.json declared `"fitted_to": "corpus"`: {section, name,
    value, low, high, rows, fold_by}; the range is the entry's `fit_range`, else half to twice its value;
    `fit_rows` names the rows that read it (_reads: 'fp8', 'expandable', 'triton'; the others do not),
    `fit_folds` 'gpu' holds out each GPU of its rows where one source alone reads it. The
    refit reaches a value through a calibration override (planner/calibration.py), so it must be
    a `memory` or `time` coefficient the model reads through memory.coefficients."""
    out = []
    for section, entries in catalog("coefficients.json").items():
        for name, entry in (entries.items() if isinstance(entries, dict) and not section.startswith("_") else ()):
            if isinstance(entry, dict) and entry.get("fitted_to") == "corpus":
                low, high = entry.get("fit_range") or (entry["value"] / 2, entry["value"] * 2)
                out.append({"section": section, "name": name, "value": entry["value"], "low": low, "high": high,
                            "rows": entry.get("fit_rows", "all"), "fold_by": entry.get("fit_folds", "source")})
    return out


def _reads(rows: str, ans: Answer) -> bool:
    """Whether a row reads a coefficient whose `fit_rows` is `rows`: 'fp8' the rows with FP8 GEMMs,
    'expandable' those launched with expandable segments, 'triton' those whose attention is
    llm-foundry's Triton kernel (compute.attention_kernel_slowdown), 'all' every one."""
    if rows == "all":
        return True
    model, _, train, _ = ans.setup
    return {"fp8": train.fp8_recipe is not None, "expandable": train.expandable_segments,
            "triton": train.flash_attention and block_modules(model, train) is Modules.LLM_FOUNDRY}[rows]


def loso(sources: list[str], published, predict, low: float, high: float, points: int = FIT_POINTS) -> dict:
    """Leave-one-source-out fit of one scalar: `predict(v)` gives every figure's prediction at
    value v; each fold picks v in [low, high] minimizing the MAPE over the other sources and
    reports the held-out source's error there. Each figure is evaluated at `points` values
    (geometric where low > 0) and interpolated between them, so the folds cost no evaluation."""
    src, pub = np.asarray(sources), np.asarray(published, dtype=np.float64)
    grid = np.geomspace(low, high, points) if low > 0 else np.linspace(low, high, points)
    at = np.array([predict(v) for v in grid])  # (points, figures)
    fine = np.linspace(grid[0], grid[-1], 40 * points + 1)
    err = np.array([np.interp(fine, grid, at[:, j]) for j in range(pub.size)]).T / pub - 1.0  # (fine, figures)

    def fit(keep):
        mape = np.abs(err[:, keep]).mean(axis=1)
        k = int(np.argmin(mape))
        return float(fine[k]), float(mape[k]), k

    value, mape, _ = fit(np.ones(pub.size, bool))
    folds = []
    for s in sorted(set(sources)):
        held = src == s
        if held.all():
            continue
        v, kept_mape, k = fit(~held)
        folds.append({"held_out": s, "cases": int(held.sum()), "value": v, "fit_mape": kept_mape,
                      "mape": float(np.abs(err[k, held]).mean()), "mean_error": float(err[k, held].mean())})
    return {"value_all": value, "mape_all": mape, "folds": folds}


def _throughput_at(scored_rows: list, section: str, name: str):
    """predict(v) for loso: every throughput figure re-timed with the coefficient at v."""
    def predict(v):
        out = []
        for s, ans in scored_rows:
            model, cluster, train, lay = ans.setup
            cal = Calibration("corpus-loso", "", cluster.gpu.name, ((section, name, float(v)),))
            th = timing.step_time(model, replace(cluster, calibration=cal), train, lay)["throughput"]
            fig = next(f for f in s["figures"] if f["metric"] != MEMORY_METRIC)
            out.append(float(np.asarray(th[fig["key"]]).flat[0]) * fig["scale"])
        return np.array(out)
    return predict


def _memory_at(scored_rows: list, section: str, name: str):
    """predict(v) for loso: every memory figure re-estimated with the coefficient at v, in the
    figure's kind and unit (score)."""
    def predict(v):
        out = []
        for s, ans in scored_rows:
            model, cluster, train, lay = ans.setup
            cal = Calibration("corpus-loso", "", cluster.gpu.name, ((section, name, float(v)),))
            mem = memory.rank_memory(model, replace(cluster, calibration=cal), train, lay)
            fig = next(f for f in s["figures"] if f["metric"] == MEMORY_METRIC)
            key = {"max_allocated": "allocated", "max_reserved": "reserved"}.get(fig["kind"], "total")
            out.append(float(np.asarray(mem[key]).flat[0]) / fig["unit_bytes"])
        return np.array(out)
    return predict


def validate(rows: list[dict] | None = None) -> dict:
    """The corpus report on `rows` (default: all): scored rows, groups, fit calls, summary, rows
    not expressed, and the leave-one-source-out error of every coefficient fitted to the corpus."""
    rows = load_rows() if rows is None else rows
    pairs = []
    for row in rows:
        reading = read(row)
        ans = ask(reading) if reading.reason is None else Answer(reading)
        pairs.append((score(row, ans), ans))
    scored = [s for s, _ in pairs]
    timed_all = [(s, a) for s, a in pairs
                 if s["source"] not in LOW_TRUST and any(f["metric"] != MEMORY_METRIC for f in s["figures"])]
    measured = [(s, a) for s, a in pairs if a.setup is not None and any(f["metric"] == MEMORY_METRIC
                                                                         for f in s["figures"])]
    fits = []
    for c in fitted_coefficients():
        if c["section"] == "memory":  # fitted to the measured peaks of the runs that read it
            chosen = [(s, a) for s, a in measured if _reads(c["rows"], a)]
            figs, predict = [next(f for f in s["figures"] if f["metric"] == MEMORY_METRIC) for s, _ in chosen], \
                _memory_at(chosen, c["section"], c["name"])
        else:
            chosen = [(s, a) for s, a in timed_all if _reads(c["rows"], a)]
            figs, predict = [next(f for f in s["figures"] if f["metric"] != MEMORY_METRIC) for s, _ in chosen], \
                _throughput_at(chosen, c["section"], c["name"])
        # a coefficient one source reads alone (fit_folds "gpu") holds out that source's GPUs in turn
        folds = [f"{s['source']}/{a.setup[1].gpu.name}" if c["fold_by"] == "gpu" else s["source"] for s, a in chosen]
        if len(set(folds)) < 2:
            fits.append({**c, "note": f"leave-one-out needs two {'GPUs' if c['fold_by'] == 'gpu' else 'sources'} "
                                      "with figures it reads"})
            continue
        fits.append({**c, **loso(folds, [f["published"] for f in figs], predict, c["low"], c["high"])})
    return {"rows": scored, "groups": groups(scored), "fit_calls": fit_calls(scored), "summary": summary(rows, scored),
            "not_expressed": [{"id": s["id"], "reason": s["reason"]} for s in scored if s["call"] == "not_expressed"],
            "loso": fits}
