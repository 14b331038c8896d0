"""The answers as text: tables and lines users read (the JSON comes from the answers' to_json)."""

from __future__ import annotations

import textwrap

from planner.memory import BREAKDOWN_KEYS
from planner.search import short

GiB = 2**30


def gib(x: float) -> str:
    return f"{x / GiB:.2f}"


def table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[j]) for r in rows)) if rows else len(h) for j, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def describe(model, cluster, training) -> str:
    moe = ""
    if model.experts > 1:
        moe = f" MoE {model.experts} experts top-{model.experts_per_token}"
        moe += f" + shared {model.shared_expert_ffn}" if model.shared_expert_ffn else ""
        moe += f", first {model.dense_layers} dense (ffn {model.dense_ffn})" if model.dense_layers else ""
        moe += f", 1 block in {model.moe_layer_step} routed (others ffn {model.dense_ffn})" \
            if model.moe_layer_step > 1 else ""
        moe += f" ({model.active_params:,} active)"
    if model.kv_lora_rank:
        moe += (f"; MLA kv_lora {model.kv_lora_rank} q_lora {model.q_lora_rank or '-'} "
                f"qk {model.dim_per_head - model.qk_rope_head_dim}+{model.qk_rope_head_dim} v {model.v_head_dim}")
    return (f"model {model.name}: {model.params:,} params, L={model.layers} h={model.hidden} a={model.heads} "
            f"kv={model.kv_heads} ffn={model.ffn} ({model.ffn_kind}) V={model.vocab}{moe}\n"
            f"cluster {cluster.num_gpus} x {cluster.gpu.name} ({cluster.gpus_per_node} per node, "
            f"{cluster.gpu.memory_bytes / 2**30:.1f} GiB each{pod_text(cluster)}); seq {training.seq_len}, {training.precision}, "
            f"{training.optimizer}, engine {training.engine.name}, "
            f"flash attention {'on' if training.flash_attention else 'off'}{', torch.compile' if training.compile else ''}"
            f"{', TP comm overlap (TransformerEngine)' if training.tp_comm_overlap else ''}")


def pod_text(cluster) -> str:
    if cluster.oversubscription == 1:
        return ""
    return f"; pods of {cluster.pod_gpus} GPUs, 1:{cluster.oversubscription:g} above them"


def memory_table(memory: dict) -> str:
    """Per-stage memory table with each part, total, capacity, headroom and fit."""
    capacity = memory["capacity_bytes"]
    head = ["stage", *BREAKDOWN_KEYS, "total", "capacity", "headroom", "fits"]
    rows = []
    for st in memory["per_stage"]:
        total = st["gpu_bytes"]
        rows.append([str(st["stage"]), *(gib(st["breakdown"][k]) for k in BREAKDOWN_KEYS), gib(total), gib(capacity),
                     gib(capacity - total), "yes" if total <= capacity else "NO"])
    return table(head, rows) + "\n(GiB per GPU; every rank of a stage holds the same)"


def time_text(record: dict) -> str:
    t, th = record["time"], record["throughput"]
    parts = ", ".join(f"{k} {v:.3f}" for k, v in t["breakdown"].items() if v > 0)
    return (f"step {t['step_s']:.3f} s +-{t['error_band']:.0%} ({parts})\n"
            f"{th['tokens_per_s']:,.0f} tokens/s, {th['model_tflops_per_gpu']:.0f} model TFLOP/s per GPU, "
            f"MFU {th['mfu']:.1%}, HFU {th['hfu']:.1%}")


def train_time_text(tt: dict) -> str:
    text = f"time to train: {tt['days']:.1f} days, {tt['gpu_hours']:,.0f} GPU-hours"
    if tt.get("cost") is not None:
        text += f", cost {tt['cost']:,.0f}"
    return text


def ds_estimator_text(rows: dict) -> str:
    lines = ["DeepSpeed's own estimator (model states only; GiB per GPU / per node CPU):"]
    lines += [f"  {k}: {v['gpu_bytes'] / 2**30:.2f} / {v['cpu_bytes_per_node'] / 2**30:.2f}" for k, v in rows.items()]
    return "\n".join(lines)


def assumed_text(defaults: dict, layout: dict) -> str:
    """estimate's inputs the user did not give, with the values used, on one wrapped line; an
    engine chosen from the layout (api.default_engine) says which axis chose it."""
    from planner.inputs import DEFAULTS

    def shown(key, value):
        if key == "engine" and value != DEFAULTS["engine"]:
            axes = [f"--{k} {layout[k]}" for k in ("tp", "cp", "vpp") if layout.get(k, 1) > 1]
            axes += ["--sequence-parallel"] * (not axes and bool(layout.get("sequence_parallel")))
            return f"engine {value} (for {' '.join(axes) or 'the layout'}: DeepSpeed alone has none)" \
                if value == "megatron-deepspeed" else f"engine {value} (for {' '.join(axes) or 'the layout'})"
        if key == "tokens_per_step":
            return f"tokens_per_step {value:,}"
        return f"{key} {value}"

    text = "assumed: " + (", ".join(shown(k, v) for k, v in defaults.items()) or "nothing (every input given)")
    return textwrap.fill(text, 100, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False)


def estimate_text(e) -> str:
    """`planner estimate` without --json."""
    mem = e.memory
    lines = [assumed_text(e.defaults, e.layout), describe(e.model, e.cluster, e.training), "", memory_table(mem),
             f"peak rank total {gib(mem['gpu_bytes'])} GiB at the {mem['peak_phase']} peak"
             f"; CPU per node {gib(mem['cpu_bytes_per_node'])} GiB -> {'fits' if mem['fits'] else 'DOES NOT FIT'}",
             verdict_text(mem, e.cluster)] + other_moment_lines(mem) + ["",
             time_text(e.record)]
    if e.time_to_train:
        lines.append(train_time_text(e.time_to_train))
    if e.deepspeed_estimator:
        lines.append(ds_estimator_text(e.deepspeed_estimator))
    return "\n".join(lines)


def other_moment_lines(mem: dict) -> list:
    """Where the peak is not forward/backward, that moment's total and activations: the table above
    shows the peak's parts, where activations are 0 because they are freed by then, not unmodelled."""
    fwd = mem.get("phases", {}).get("forward/backward")
    if fwd is None or mem["peak_phase"] == "forward/backward":
        return []
    b = fwd["breakdown"]
    return [f"forward/backward: {gib(fwd['gpu_bytes'])} GiB, activations {gib(b['activations'])} GiB, "
            f"logits {gib(b['logits'])} GiB (the table shows the {mem['peak_phase']} peak, when they are freed)"]


def verdict_text(mem: dict, cluster) -> str:
    """The fit as a margin: allocated and reserved peaks, the distance to capacity, the error band
    and where it comes from."""
    cal = cluster.calibration
    source = f"calibration {cal.name}" if cal else "uncalibrated prior; --calibration NAME to use a measured profile"
    return (f"allocated {gib(mem['allocated_bytes'])} GiB, reserved {gib(mem['reserved_bytes'])} GiB; "
            f"margin to {gib(mem['capacity_bytes'])} GiB: {gib(mem['fit_margin_bytes'])} GiB, "
            f"peak memory +-{mem['error_band']:.0%} ({gib(mem['error_band_bytes'])} GiB, {source}) "
            f"-> {mem['verdict']}")


def rejections_text(r) -> str:
    rej = ", ".join(f"{k} {v:,}" for k, v in sorted(r.rejected.items(), key=lambda kv: -kv[1]))
    return f"{r.candidates_evaluated:,} candidates evaluated in {r.elapsed_s:.2f} s; rejected: {rej or 'none'}"


def batch_text(r) -> list:
    """Where the batch is why nothing fits an engine: the nearest batches that fit it."""
    if not r.batch_proposals:
        return []
    engine = r.batch_proposals[0]["engine"]
    lines = [f"batches that fit {engine} (nearest first; --gbs G):"]
    for p in r.batch_proposals:
        flags = settings_flags(p.get("settings", {}))
        lines.append(f"  --gbs {p['gbs']} ({p['tokens_per_step']:,} tokens): {short(p['layout'])}"
                     f"{f' ({flags})' if flags else ''}, {p['tokens_per_s']:,.0f} tokens/s")
    return lines


def recommend_text(r) -> str:
    """`planner recommend` without --json. Its first line says what the answer changed from the
    question (another engine than the default) or, where the batch is why nothing fits, so."""
    lead = list(r.notes)
    if not r.layouts and r.batch_note:
        lead.append(f"nothing fits {r.training.engine.name}: {r.batch_note}")
    lines = lead + batch_text(r) + ["assumed: " + ", ".join(f"{k} {v}" for k, v in r.assumptions.items()),
                                    describe(r.model, r.cluster, r.training), ""]
    if not r.layouts:
        fits_elsewhere = [e for e in r.engines if e["layout"] is not None]
        return "\n".join(lines + ["nothing fits. " + "; ".join(r.suggestions), rejections_text(r)]
                         + ([engines_text(fits_elsewhere)] if fits_elsewhere else []))
    head = ["#", "layout", "GiB/GPU", "free", "fit", "step s", "tokens/s", "MFU", "binding constraint"]
    rows = []
    for k, rec in enumerate(r.layouts, 1):
        mem, th = rec["memory"], rec["throughput"]
        rows.append([str(k), short(rec["layout"]), gib(mem["gpu_bytes"]), gib(mem["headroom_bytes"]), mem["verdict"],
                     f"{rec['time']['step_s']:.2f}", f"{th['tokens_per_s']:,.0f}", f"{th['mfu']:.1%}",
                     rec["binding_constraint"]])
    lines.append(table(head, rows))
    if len(r.layouts) > 1:
        gap = 1 - r.layouts[1]["throughput"]["tokens_per_s"] / r.layouts[0]["throughput"]["tokens_per_s"]
        lines.append(f"runner-up is {gap:.1%} slower")
    if r.layouts[0]["memory"]["verdict"] != "fits":
        lines.append(clear_fit_text(r.layouts[0]["memory"], r.clear_fit))
    lines.append(engines_text(r.engines))
    if r.layouts[0].get("time_to_train"):
        lines.append("#1 " + train_time_text(r.layouts[0]["time_to_train"]))
    lines.append(rejections_text(r))
    return "\n".join(lines)


def clear_fit_text(first: dict, clear: dict | None) -> str:
    """Under a borderline #1: the fastest layout whose peak clears the error band, or that none does."""
    band = f"the +-{first['error_band']:.0%} band of its peak ({gib(first['gpu_bytes'])} GiB) straddles {gib(first['capacity_bytes'])} GiB"
    if clear is None:
        return f"#1 is borderline: {band}, and so it does for every layout found; --calibration narrows the band"
    where = f"#{clear['rank']}" if clear["rank"] else "not in the table:"
    return (f"#1 is borderline: {band}; the fastest layout that clears it is {where} {short(clear['layout'])} "
            f"({gib(clear['memory']['gpu_bytes'])} GiB), {1 - clear['relative_speed']:.1%} slower")


def settings_flags(settings: dict) -> str:
    """Training settings a search chose, as the flags that give them to `planner estimate`."""
    return " ".join("--" + k.replace("_", "-") + ("" if v is True else f" {v}") for k, v in settings.items())


def engines_text(engines: list) -> str:
    """The fastest layout under each other engine, against the recommended one."""
    lines = ["other engines (the fastest layout of each that fits; speed against #1):"]
    width = max((len(e["engine"]) for e in engines), default=0)
    for e in engines:
        if e["layout"] is None:
            lines.append(f"  {e['engine']:{width}s}  {e['note']}")
            continue
        rel = e["relative_speed"]
        how = ("" if rel is None else ", " + (f"{rel:.2f}x faster" if rel > 1.005 else
                                              f"{1 / rel:.2f}x slower" if rel < 0.995 else "as fast"))
        flags = settings_flags(e.get("settings", {}))
        chosen = f" ({flags})" if flags else ""
        lines.append(f"  {e['engine']:{width}s}  {short(e['layout'])}{chosen}: {e['tokens_per_s']:,.0f} tokens/s{how}")
    return "\n".join(lines)


def validate_text(v: dict) -> str:
    """`planner validate` without --json: the paper figures, then the published-run corpus."""
    rows = v["cases"]
    lines = []
    if rows:
        head = ["case", "metric", "published", "predicted", "error"]
        body = [[r["id"], r["metric"], f"{r['published']:.4g}", f"{r['predicted']:.4g}", f"{r['error']:+.1%}"] for r in rows]
        lines += [table(head, body), ""]
        groups = [[g["source"], g["engine"], g["metric"], str(g["cases"]), f"{g['mape']:.1%}", f"{g['mean_error']:+.1%}",
                   g["leaning"]] for g in v["by_group"]]
        lines += [table(["source", "engine", "metric", "cases", "MAPE", "mean error", "leaning"], groups), ""]
        lines += [f"MAPE {m}: {x:.1%}" for m, x in v["mape_by_metric"].items()]
        lines.append(f"MAPE all {len(rows)} figures: {v['mape']:.1%}")
    if "corpus" in v and v["corpus"]["rows"]:
        lines += ["" if rows else None, corpus_text(v["corpus"])]
    return "\n".join(x for x in lines if x is not None)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def corpus_text(c: dict) -> str:
    """The corpus part of `planner validate`: per source its fit calls and its figures' errors,
    the rows not expressed with why, the leave-one-source-out fits, and the summary line."""
    lines = [f"published-run corpus (data/references/corpus_runs.json): {len(c['rows'])} rows; "
             "error = predicted / published - 1; a run that ran is called fits / borderline / oom", ""]
    for calls in c["fit_calls"]:
        src = calls["source"]
        ran = calls["ran_fits"] + calls["ran_borderline"] + calls["ran_oom"]
        text = [f"ran {ran}: fits {calls['ran_fits']}, borderline {calls['ran_borderline']}, oom {calls['ran_oom']}"] if ran else []
        if calls["oom_called"] + calls["oom_missed"]:
            text.append(f"published OOM called oom {calls['oom_called']}/{calls['oom_called'] + calls['oom_missed']}")
        text += [f"not expressed {calls['not_expressed']}"] * bool(calls["not_expressed"])
        text += [f"no fit call {calls['no_call']}"] * bool(calls["no_call"])
        lines.append(f"{src}: {calls['rows']} rows; " + "; ".join(text))
        body = [[g["engine"], g["metric"] + (" (low trust)" if g["low_trust"] else ""), str(g["cases"]),
                 f"{g['mean_error']:+.1%}", f"{g['mape']:.1%}"] for g in c["groups"] if g["source"] == src]
        if body:
            lines += ["  " + x for x in table(["engine", "metric", "cases", "mean error", "MAPE"], body).splitlines()]
        lines.append("")
    why: dict = {}
    for n in c["not_expressed"]:
        why.setdefault(n["reason"], []).append(n["id"])
    if why:
        lines.append(f"not expressed ({len(c['not_expressed'])} rows):")
        lines += [textwrap.fill(f"{reason} ({len(ids)}): {', '.join(ids)}", 120, initial_indent="  ",
                                subsequent_indent="    ", break_on_hyphens=False) for reason, ids in why.items()]
        lines.append("")
    lines += loso_text(c["loso"]) + [corpus_summary_text(c["summary"])]
    return "\n".join(lines)


def loso_text(fits: list) -> list:
    """Leave-one-source-out: each corpus-fitted coefficient's held-out error per source."""
    if not fits:
        return ["leave-one-source-out: no coefficient is fitted to the corpus", ""]
    lines = []
    for f in fits:
        name = f"{f['section']}.{f['name']}"
        if "folds" not in f:
            lines += [f"leave-one-source-out {name}: {f['note']}", ""]
            continue
        lines.append(f"leave-one-source-out {name} (prior {f['value']:.4g}, range {f['low']:.4g}-{f['high']:.4g}; "
                     f"fitted on every trusted source {f['value_all']:.4g}, MAPE {_pct(f['mape_all'])}):")
        body = [[x["held_out"], str(x["cases"]), f"{x['value']:.4g}", _pct(x["fit_mape"]), _pct(x["mape"]),
                 f"{x['mean_error']:+.1%}"] for x in f["folds"]]
        lines += ["  " + x for x in table(["held out", "cases", "fitted", "MAPE of the rest", "held-out MAPE",
                                           "held-out mean error"], body).splitlines()] + [""]
    return lines


def corpus_summary_text(s: dict) -> str:
    """The corpus summary in one line (as the corpus's own scorer prints it)."""
    rho = "-" if s["bloom_rank_rho"] is None else f"{s['bloom_rank_rho']:.2f}"
    return (f"corpus: throughput MAPE {_pct(s['throughput_mape'])} (n={s['throughput_n']}; not bloom, torchtitan), "
            f"memory MAPE {_pct(s['memory_mape'])} (n={s['memory_n']}), OOMs called {s['ooms_called']}/{s['ooms']}, "
            f"measured runs called fitting {s['measured_called_fitting']}/{s['measured']}, BLOOM rank rho {rho}, "
            f"refused {s['refused']}/{s['asked']}, MoE rows not expressible {s['moe_not_expressible']}, "
            f"published runs that ran called oom {s['ran_called_oom']}/{s['ran']} (borderline {s['ran_borderline']})")


def check_text(r) -> str:
    """`planner check` without --json: the prediction, then the findings, worst first."""
    lines = []
    if r.estimate is not None:
        lines += [estimate_text(r.estimate), ""]
    order = {"error": 0, "warning": 1, "info": 2}
    for f in sorted(r.findings, key=lambda f: order[f.severity]):
        lines.append(f"{f.severity.upper():7s} [{f.kind}] {f.message}")
    lines.append("verdict: " + ("runs and fits" if r.ok else "will not run as configured"))
    return "\n".join(lines)
