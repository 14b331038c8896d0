"""The answers as text: tables and lines users read (the JSON comes from the answers' to_json)."""

from __future__ import annotations

import re
import textwrap

from planner.engines import ENGINES
from planner.layout import DEFAULT_RECOMPUTE_MODULES
from planner.memory import BREAKDOWN_KEYS
from planner.results import short

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
    if model.mtp_layers:
        moe += f"; {model.mtp_layers} MTP depth{'s' if model.mtp_layers > 1 else ''} on the last stage"
    if model.kv_lora_rank:
        moe += (f"; MLA kv_lora {model.kv_lora_rank} q_lora {model.q_lora_rank or '-'} "
                f"qk {model.dim_per_head - model.qk_rope_head_dim}+{model.qk_rope_head_dim} v {model.v_head_dim}")
    return (f"model {model.name}: {model.params:,} params, L={model.layers} h={model.hidden} a={model.heads} "
            f"kv={model.kv_heads} ffn={model.ffn} ({model.ffn_kind}) V={model.vocab}{moe}\n"
            f"cluster {cluster.num_gpus} x {cluster.gpu.name} ({cluster.gpus_per_node} per node, "
            f"{cluster.gpu.memory_bytes / 2**30:.1f} GiB each{pod_text(cluster)}); seq {training.seq_len}, "
            f"{f'fp8 GEMMs ({training.fp8_recipe}) over bf16' if training.fp8_recipe else training.precision}, "
            f"{training.optimizer}, engine {training.engine.name}, "
            f"flash attention {'on' if training.flash_attention else 'off'}{', torch.compile' if training.compile else ''}"
            f"{', TP comm overlap (TransformerEngine)' if training.tp_comm_overlap else ''}"
            f"{selective_text(training)}")


def selective_text(training) -> str:
    """What selective recompute reruns where the user listed Megatron's modules."""
    modules = training.recompute_modules
    return "" if modules == DEFAULT_RECOMPUTE_MODULES else f", selective recompute of {' '.join(modules)}"


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


def assumed_text(defaults: dict, layout: dict | None) -> str:
    """The inputs the user did not give, with the values used, on one line wrapped at 100 columns;
    under estimate (a layout given) an engine chosen from the layout (api.default_engine) says which
    axis chose it."""
    from planner.inputs import DEFAULTS

    def shown(key, value):
        if key == "engine" and layout is not None and value != DEFAULTS["engine"]:
            axes = [f"--{k} {layout[k]}" for k in ("tp", "cp", "vpp") if layout.get(k, 1) > 1]
            axes += ["--sequence-parallel"] * (not axes and bool(layout.get("sequence_parallel")))
            return f"engine {value} (for {' '.join(axes) or 'the layout'}: DeepSpeed alone has none)" \
                if ENGINES[value].deepspeed and ENGINES[value].megatron else f"engine {value} (for {' '.join(axes) or 'the layout'})"
        if key == "tokens_per_step":
            return f"tokens_per_step {value:,}"
        if isinstance(value, (list, tuple)):  # recompute_modules: as the flag takes it
            return f"{key} {','.join(map(str, value))}"
        return f"{key} {value}"

    text = "assumed: " + (", ".join(shown(k, v) for k, v in defaults.items()) or "nothing (every input given)")
    return textwrap.fill(text, 100, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False)


WIDTH = 120
"""recommend's and estimate's lines stay within this many columns (the assumed line wraps at 100)."""


def fold(line: str, width: int = WIDTH, indent: str = "    ") -> str:
    """A line longer than `width` wrapped at spaces, its continuation lines indented; a line
    within it as it is (a word longer than the width stays whole)."""
    if len(line) <= width:
        return line
    lead = line[:len(line) - len(line.lstrip(" "))]
    return textwrap.fill(line, width, initial_indent="", subsequent_indent=lead + indent, break_on_hyphens=False,
                         break_long_words=False, drop_whitespace=True)


def answer_line(prefix: str, rec: dict, extra: str = "") -> str:
    """The first line: the layout, its tokens/s, MFU and step time, then its memory verdict with
    the margin (GiB free of capacity, or over it); the verdict on a line of its own where one line
    would pass WIDTH."""
    mem, th = rec["memory"], rec["throughput"]
    cap, margin = mem["capacity_bytes"], mem["fit_margin_bytes"]
    room = f"{gib(margin)} GiB free of {gib(cap)} GiB" if margin >= 0 else f"{gib(-margin)} GiB over {gib(cap)} GiB"
    verdict = {"oom": "DOES NOT FIT"}.get(mem["verdict"], mem["verdict"])
    head = (f"{prefix} {short(rec['layout'])}: {th['tokens_per_s']:,.0f} tokens/s, MFU {th['mfu']:.1%}, "
            f"step {rec['time']['step_s']:.2f} s")
    one = f"{head}; {verdict}, {room}{extra}"
    return one if len(one) <= WIDTH else "\n".join([fold(head), fold(f"  memory: {verdict}, {room} per GPU{extra}")])


LEGEND_AXES = (("tp", "tensor"), ("pp", "pipeline"), ("cp", "context"), ("ep", "expert"), ("etp", "expert-tensor"),
               ("dp", "data"))
LEGEND = (  # (token pattern in a label, what it means: None where the tokens found say it)
    (r"vpp\d+", "vppN virtual stages per pipeline rank"),
    (r"z[0-3]", "zN ZeRO stage"),
    (r"mbs\d+x\d+", "mbsMxG M sequences a micro-batch x G micro-batches a step"),
    (r"(?:ful|sel)-rc", None),
    (r"rc-layers\d+", "rc-layersN N layers a chunk recomputed"),
    (r"rc-groups\d+", "rc-groupsN recompute in groups of N layers"),
    (r"sp", "sp sequence parallel"),
    (r"pp-inner", "pp-inner pipelines inside nodes (tp-cp-pp-dp)"),
    (r"gpipe|zb-h1", None),
    (r"off-(?:opt|par):(?:cpu|nvme)", None),
)


def label_tokens(text: str, pattern: str) -> list:
    """The tokens of layout labels in `text` matching `pattern`, in order, each once."""
    found = re.findall(rf"(?<![\w:-])(?:{pattern})(?![\w-])", text)
    return list(dict.fromkeys(found))


def legend_text(text: str) -> str | None:
    """One line (folded at WIDTH) explaining each abbreviation of the layout labels (results.short)
    that appears in `text`; None where none does."""
    parts = []
    axes = [(a, w) for a, w in LEGEND_AXES if label_tokens(text, a + r"\d+")]
    if axes:
        parts.append(f"{'/'.join(a for a, _ in axes)}N {'/'.join(w for _, w in axes)} parallel")
    for pattern, words in LEGEND:
        kinds = label_tokens(text, pattern)
        if not kinds:
            continue
        if words is None and kinds[0].endswith("-rc"):
            kinds = sorted(kinds)
            words = f"{'/'.join(kinds)} {'/'.join({'ful-rc': 'full', 'sel-rc': 'selective'}[k] for k in kinds)} recompute"
        elif words is None and kinds[0].startswith("off-"):
            whats = sorted({k.split(":")[0] for k in kinds}, key=["off-opt", "off-par"].index)
            devices = sorted({k.split(":")[1] for k in kinds})
            names = {"off-opt": "optimizer", "off-par": "parameters"}
            words = (f"{'/'.join(whats)}:{'/'.join(devices)} {'/'.join(names[w] for w in whats)} offloaded to "
                     f"{' or '.join(devices)}")
        elif words is None:
            words = f"{'/'.join(sorted(kinds))} pipeline schedule"
        parts.append(words)
    return fold("legend: " + "; ".join(parts)) if parts else None


def estimate_text(e) -> str:
    """`planner estimate` without --json: first the answer (the layout's tokens/s, MFU, step time
    and memory verdict), then what it assumed, the model and cluster, the memory and time (the
    verdict and step lines whole, as the dashboard and `check` quote them), the legend of the label."""
    mem = e.memory
    lines = [answer_line("layout", e.record), assumed_text(e.defaults, e.layout),
             *map(fold, describe(e.model, e.cluster, e.training).splitlines()), "", memory_table(mem),
             f"peak rank total {gib(mem['gpu_bytes'])} GiB at the {mem['peak_phase']} peak"
             f"; CPU per node {gib(mem['cpu_bytes_per_node'])} GiB -> {'fits' if mem['fits'] else 'DOES NOT FIT'}",
             verdict_text(mem, e.cluster)] + other_moment_lines(mem) + ["", time_text(e.record)]
    if e.time_to_train:
        lines.append(train_time_text(e.time_to_train))
    if e.deepspeed_estimator:
        lines.append(ds_estimator_text(e.deepspeed_estimator))
    legend = legend_text(lines[0])
    return "\n".join(lines + ([legend] if legend else []))


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
    """`planner recommend` without --json. Where the answer changed the question (another engine
    than the default) or the batch is why nothing fits, that comes first; then the answer: the
    layout to launch (the one --emit writes) with its speed and memory verdict, and the best other
    engine; then what was assumed, the table of the fastest layouts, and a legend of their labels."""
    lead = list(r.notes)
    if not r.layouts and r.batch_note:
        lead.append(f"nothing fits {r.training.engine.name}: {r.batch_note}")
    lines = lead + [fold(x) for x in batch_text(r)]
    if r.layouts:
        lines += answer_lines(r)
    lines += [assumed_text(r.assumptions, None), *map(fold, describe(r.model, r.cluster, r.training).splitlines()), ""]
    if not r.layouts:
        fits_elsewhere = [e for e in r.engines if e["layout"] is not None]
        lines += [fold("nothing fits. " + "; ".join(r.suggestions)), fold(rejections_text(r))]
        lines += [fold(x) for x in engines_text(fits_elsewhere, r.assumptions).splitlines()] if fits_elsewhere else []
        legend = legend_text("\n".join(lines[len(lead):]))
        return "\n".join(lines + ([legend] if legend else []))
    lines += layouts_table(r.layouts)
    lines.append(binding_text(r))
    legend = legend_text("\n".join(lines[len(lead):]) + "\n" + engines_text(r.engines, r.assumptions) + "\n"
                         + (clear_fit_text(r.layouts[0]["memory"], r.clear_fit) if r.clear_fit else ""))
    lines += [legend] if legend else []
    if len(r.layouts) > 1:
        gap = 1 - r.layouts[1]["throughput"]["tokens_per_s"] / r.layouts[0]["throughput"]["tokens_per_s"]
        lines.append(f"runner-up is {gap:.1%} slower")
    if r.layouts[0]["memory"]["verdict"] != "fits":
        lines.append(fold(clear_fit_text(r.layouts[0]["memory"], r.clear_fit)))
    lines += [fold(x) for x in engines_text(r.engines, r.assumptions).splitlines()]
    if r.layouts[0].get("time_to_train"):
        lines.append(fold("#1 " + train_time_text(r.layouts[0]["time_to_train"])))
    lines.append(fold(rejections_text(r)))
    return "\n".join(lines)


def answer_lines(r) -> list:
    """The layout to launch (the clear fit under a borderline #1, as --emit writes) and the best
    other engine against #1."""
    chosen = r.clear_fit or r.layouts[0]
    where = "" if chosen is r.layouts[0] else (
        f" (#{chosen['rank']}: #1 is borderline and {1 / chosen['relative_speed'] - 1:.1%} faster)" if chosen["rank"]
        else f" (not in the table: #1 is borderline and {1 / chosen['relative_speed'] - 1:.1%} faster)")
    lines = answer_line("launch", chosen, extra=where).splitlines()
    fitting = [e for e in r.engines if e["layout"] is not None and e["relative_speed"] is not None]
    if fitting:
        e = max(fitting, key=lambda e: e["relative_speed"])
        lines.append(fold(f"best other engine: {e['engine']}{in_precision(e, r.assumptions)}, "
                          f"{ratio_text(e['relative_speed'])} than #1 ({e['tokens_per_s']:,.0f} tokens/s): {short(e['layout'])}"))
    elif r.engines:
        lines.append("best other engine: none fits (see other engines below)")
    return lines


def ratio_text(rel: float) -> str:
    return f"{rel:.2f}x faster" if rel > 1.005 else f"{1 / rel:.2f}x slower" if rel < 0.995 else "as fast"


def binding_code(text: str) -> str:
    """A binding constraint (results.binding_constraint) as a table cell: 'memory +6%' where a faster
    variant does not fit, '<overhead> 12%' for the largest overhead's share of the step."""
    m = re.fullmatch(r"memory: .* would be (\S+) faster but needs \S+ GiB", text)
    if m:
        return f"memory +{m.group(1)}"
    m = re.fullmatch(r"(\S+) \((\S+) of step\)", text)
    if m:
        return f"{m.group(1)} {m.group(2)}"
    return text if len(text) <= 16 else text[:15] + "~"


def layouts_table(layouts: list, width: int = WIDTH) -> list:
    """The fastest layouts, one row each; the label last, left-aligned, wrapped where the row would
    pass `width`. The step time is not a column: every row steps the same tokens (step s = tokens per
    step / tokens/s; #1's is on the first line, each one in --json)."""
    head = ["#", "tokens/s", "MFU", "GiB/GPU", "free", "fit", "binding", "layout"]
    rows = []
    for k, rec in enumerate(layouts, 1):
        mem, th = rec["memory"], rec["throughput"]
        rows.append([str(k), f"{th['tokens_per_s']:,.0f}", f"{th['mfu']:.1%}", gib(mem["gpu_bytes"]),
                     gib(mem["headroom_bytes"]), mem["verdict"], binding_code(rec["binding_constraint"]),
                     short(rec["layout"])])
    widths = [max(len(h), *(len(r[j]) for r in rows)) for j, h in enumerate(head)]
    left = sum(widths[:-1]) + 2 * (len(head) - 1)  # where the label starts
    room = max(width - left, 24)
    widths[-1] = min(widths[-1], room)

    def cells(r):
        label = textwrap.wrap(r[-1], room, break_on_hyphens=False, break_long_words=False) or [""]
        first = "  ".join([*(c.rjust(w) for c, w in zip(r[:-1], widths)), label[0]]).rstrip()
        return [first] + [" " * left + x for x in label[1:]]

    lines = cells(head) + ["  ".join("-" * w for w in widths)]
    for r in rows:
        lines += cells(r)
    return lines


def binding_text(r) -> str:
    """Under the table: #1's binding constraint in full (and the launched layout's where that is
    another row; every row's is in --json)."""
    text = "#1 is bound by " + r.layouts[0]["binding_constraint"]
    rank = (r.clear_fit or {}).get("rank")
    if rank and rank != 1:
        text += f"; #{rank} by " + r.layouts[rank - 1]["binding_constraint"]
    return fold(text)


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


def in_precision(entry: dict, assumptions: dict) -> str:
    """' in bf16' where another engine answers in another precision than the question's (no FP8 path)."""
    other = entry.get("precision")
    return f" in {other}" if other and other != assumptions.get("precision") else ""


def engines_text(engines: list, assumptions: dict) -> str:
    """The fastest layout under each other engine, against the recommended one."""
    lines = ["other engines (the fastest layout of each that fits; speed against #1):"]
    width = max((len(e["engine"]) for e in engines), default=0)
    for e in engines:
        if e["layout"] is None:
            lines.append(f"  {e['engine']:{width}s}  {e['note']}")
            continue
        rel = e["relative_speed"]
        how = "" if rel is None else ", " + ratio_text(rel)
        flags = settings_flags(e.get("settings", {}))
        chosen = f" ({flags})" if flags else ""
        lines.append(f"  {e['engine']:{width}s}  {short(e['layout'])}{chosen}{in_precision(e, assumptions)}: "
                     f"{e['tokens_per_s']:,.0f} tokens/s{how}")
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
                     f"fitted on {fit_rows_text(f)} {f['value_all']:.4g}, MAPE {_pct(f['mape_all'])}):")
        body = [[x["held_out"], str(x["cases"]), f"{x['value']:.4g}", _pct(x["fit_mape"]), _pct(x["mape"]),
                 f"{x['mean_error']:+.1%}"] for x in f["folds"]]
        lines += ["  " + x for x in table(["held out", "cases", "fitted", "MAPE of the rest", "held-out MAPE",
                                           "held-out mean error"], body).splitlines()] + [""]
    return lines


def fit_rows_text(fit: dict) -> str:
    """The rows a corpus-fitted coefficient was fitted to (corpus._reads)."""
    return {"all": "every trusted source", "fp8": "the trusted rows with FP8 GEMMs",
            "expandable": "the measured peaks under expandable segments",
            "triton": "the rows with llm-foundry's Triton attention"}[fit["rows"]]


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
