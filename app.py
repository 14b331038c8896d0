"""What-if dashboard: `streamlit run app.py`.

Every number on the page comes from the planning API (planner/api.py), the same calls the CLI
makes: `recommend` in auto mode, `estimate` for the chosen layout (and in manual mode), `check` on
a pasted ds_config.json, `export.render` for the downloads. The page only arranges them; it holds
no formula of its own.
"""

from __future__ import annotations

import traceback

import altair as alt
import pandas as pd
import streamlit as st

from planner import api, export, report
from planner.calibration import known_profiles
from planner.data import parse_json
from planner.activations import offloads_checkpoints
from planner.engines import ENGINES as ENGINE_SPECS
from planner.engines import NAMES as ENGINES
from planner.errors import InputError
from planner.hardware import load_gpus
from planner.memory import BREAKDOWN_KEYS, PHASES
from planner.model import load_catalog
from planner.options import Optimizer, Precision, Schedule
from planner.search import PINNABLE, short

GiB = 2**30
# (comments, not attribute docstrings: Streamlit's "magic" would print a bare string on the page)
MAX_UPLOAD_BYTES = 2**20  # a Hugging Face config.json is a few KiB; anything past 1 MiB is not one
LANDSCAPE_POINTS = 1500  # fitting layouts drawn in the speed-versus-memory plot (the Pareto front, then a spread)
PIN_CHOICES = {"tp": (1, 2, 4, 8), "pp": (1, 2, 4, 8, 16), "cp": (1, 2, 4, 8), "vpp": (1, 2, 4),
               "zero": (0, 1, 2, 3), "offload_optimizer": ("none", "cpu", "nvme"), "offload_params": ("none", "cpu", "nvme"),
               "mbs": (1, 2, 4, 8), "recompute": ("none", "selective", "full"), "sequence_parallel": (False, True),
               "rank_order": ("tp-cp-dp-pp", "tp-cp-pp-dp")}


# ---------------------------------------------------------------------------------------------
# the API calls, cached on their inputs (plain values), returning JSON-like answers


@st.cache_data(max_entries=64, show_spinner=False)
def recommend_answer(model, cluster: dict, training: dict, top: int, headroom: float, pinned: dict) -> dict:
    r = api.recommend(model, cluster, training, top=top, memory_headroom=headroom, pinned=pinned,
                      landscape=LANDSCAPE_POINTS)
    return {**r.to_json(), "landscape": r.landscape, "describe": report.describe(r.model, r.cluster, r.training),
            "gbs": r.training.gbs, "engine": r.training.engine.name}


@st.cache_data(max_entries=64, show_spinner=False)
def estimate_answer(model, cluster: dict, training: dict, layout: dict) -> dict:
    return estimate_page(api.estimate(model, cluster, training, layout))


def estimate_page(e, row: dict | None = None) -> dict:
    """An Estimate as the page shows it, with the launch files of `row` (default: its own layout)."""
    try:
        files = [(name, text) for name, text, _ in export.render(e.model, e.cluster, e.training, row or e.layout)]
        export_error = None
    except InputError as exc:
        files, export_error = [], str(exc)
    return {**e.to_json(), "describe": report.describe(e.model, e.cluster, e.training),
            "verdict_text": report.verdict_text(e.memory, e.cluster), "files": files, "export_error": export_error}


@st.cache_data(max_entries=32, show_spinner=False)
def check_answer(config_text: str, model, cluster: dict, training: dict, layout: dict, mbs: int | None,
                 deepspeed: bool) -> dict:
    config = parse_json(config_text.encode(), "ds_config.json", "the pasted config")
    if not isinstance(config, dict):
        raise InputError("ds_config.json: the pasted config is not a JSON object")
    r = api.check(config, model, cluster, training, layout, mbs=mbs, deepspeed=deepspeed)
    out = r.to_json()
    out["page"] = None if r.estimate is None else estimate_page(r.estimate, r.better["layout"] if r.better else None)
    return out


def layout_input(row: dict) -> dict:
    """A recommended layout row as estimate's layout input (gas and gbs follow from the training)."""
    return {k: row[k] for k in (*PINNABLE, "schedule")}


# ---------------------------------------------------------------------------------------------
# inputs


def model_from_sidebar():
    """The model input: a catalog name, a parameter count or an uploaded config.json, with shape overrides."""
    source = st.sidebar.radio("Model", ("catalog", "parameter count", "config.json"), horizontal=True, key="model_source")
    if source == "catalog":
        names = list(load_catalog())
        model = {"name": st.sidebar.selectbox("Catalog model", names, index=names.index("llama-3-70b"), key="model_name")}
    elif source == "parameter count":
        model = {"params": st.sidebar.number_input("Parameters (billions)", 0.01, 100_000.0, 70.0, key="params_b") * 1e9}
    else:
        upload = st.sidebar.file_uploader("Hugging Face config.json", type=["json"], key="config_upload")
        if upload is None:
            raise InputError("config.json: upload a Hugging Face config.json, or pick a catalog model")
        model = {"config": config_from_upload(upload.name, upload.getvalue())}
    with st.sidebar.expander("Shape overrides (0 keeps the model's)"):
        for key in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab"):
            value = st.number_input(key, 0, 10_000_000, 0, key=f"shape_{key}")
            if value:
                model[key] = int(value)
    return model


def config_from_upload(name: str, raw: bytes) -> dict:
    """An uploaded file as a Hugging Face config dict; InputError when it is too big or not one.
    Its values are checked by the API when the model is resolved (planner/hf_config.py)."""
    if len(raw) > MAX_UPLOAD_BYTES:
        raise InputError(f"config.json: {name!r} is {len(raw):,} bytes; a config.json is under 1 MiB")
    config = parse_json(raw, "config.json", name)
    if not isinstance(config, dict) or "model_type" not in config:
        raise InputError(f"config.json: {name!r} is not a Hugging Face model config (no model_type)")
    return config


def cluster_from_sidebar() -> dict:
    gpus = list(dict.fromkeys(g.name for g in load_gpus().values()))
    cluster = {"gpu": st.sidebar.selectbox("GPU", gpus, index=gpus.index("h100-sxm"), key="gpu"),
               "gpus": int(st.sidebar.number_input("GPUs", 1, 1_000_000, 16, key="gpus"))}
    per_node = int(st.sidebar.number_input("GPUs per node (0: the GPU's usual node)", 0, 1024, 0, key="gpus_per_node"))
    if per_node:
        cluster["gpus_per_node"] = per_node
    pod = int(st.sidebar.number_input("GPUs per pod (0: a non-blocking network)", 0, 1_000_000, 0, key="pod_gpus"))
    if pod:
        cluster["pod_gpus"] = pod
        cluster["oversubscription"] = float(st.sidebar.number_input("Oversubscription above a pod (7 for 1:7)", 1.0,
                                                                    1024.0, 1.0, key="oversubscription"))
    profiles = ["none", *known_profiles()]  # the shipped ones and the user's (calibrate run NAME)
    profile = st.sidebar.selectbox("Calibration profile", profiles, key="calibration")
    if profile != "none":
        cluster["calibration"] = profile
    return cluster


def training_from_sidebar() -> dict:
    sb = st.sidebar
    training = {"seq_len": int(sb.number_input("Sequence length", 1, 10_000_000, 4096, key="seq_len")),
                "engine": sb.selectbox("Engine", ENGINES, key="engine"),
                "precision": sb.selectbox("Precision", [p.value for p in Precision], key="precision"),
                "optimizer": sb.selectbox("Optimizer", [o.value for o in Optimizer], key="optimizer"),
                "flash_attention": sb.checkbox("FlashAttention", True, key="flash_attention")}
    if training["engine"] == "megatron":
        overlap = sb.selectbox("TP comm overlap (TransformerEngine)", ("searched", "on", "off"), key="tp_comm_overlap",
                               help="--tp-comm-overlap / --no-tp-comm-overlap; searched: on where it makes the "
                                    "fastest layout faster (auto mode), off for a single estimate")
        if overlap != "searched":
            training["tp_comm_overlap"] = overlap == "on"
    if training["engine"] in ("deepspeed", "fsdp") and sb.checkbox("torch.compile the blocks (--compile)", key="compile"):
        training["compile"] = True
    if training["engine"] in ("deepspeed", "fsdp"):
        modules = sb.selectbox("Model code (--modules)", ("the engine's default", "hf", "hf-liger", "llm-foundry"),
                               key="modules", help="whose transformer block is trained: what it saves for backward and "
                                                   "how its loss holds the logits (the answer's defaults name the choice)")
        if modules != "the engine's default":
            training["modules"] = modules
    if offloads_checkpoints(ENGINE_SPECS[training["engine"]]) and sb.checkbox(
            "Checkpointed inputs in host memory (--cpu-checkpointing)", key="cpu_checkpointing"):
        training["cpu_checkpointing"] = True
    if training["engine"] == "megatron":
        if not sb.checkbox("Interleaved pipeline sends overlap compute", True, key="overlap_p2p"):
            training["overlap_p2p"] = False  # --no-overlap-p2p-communication
        split = sb.selectbox("Embedding and loss as a pipeline block each", ("searched", "yes", "no"), key="edges",
                             help="--account-for-embedding/loss-in-pipeline-split (--pp-edge-layers)")
        if split != "searched":
            training["pipeline_edge_layers"] = int(split == "yes")
        share = sb.selectbox("Optimizer share on the host with optimizer offload", ("searched", 0.25, 0.5, 0.75, 1.0),
                             key="offload_share", help="megatron-core --optimizer-offload-fraction (HybridDeviceOptimizer)")
        if share != "searched":
            training["optimizer_offload_fraction"] = float(share)
    if sb.radio("Batch given as", ("tokens per step", "sequences"), horizontal=True, key="batch_kind") == "sequences":
        training["gbs"] = int(sb.number_input("Global batch (sequences)", 1, 100_000_000, 1024, key="gbs"))
    else:
        training["tokens_per_step"] = sb.number_input("Tokens per step (millions)", 0.001, 1e6, 4.194304,
                                                      format="%.6f", key="tokens_per_step_m") * 1e6
    tokens_b = sb.number_input("Training tokens (billions; 0: skip time to train)", 0.0, 1e9, 0.0, key="tokens_b")
    if tokens_b:
        training["tokens"] = tokens_b * 1e9
        price = sb.number_input("Price per GPU-hour (0: no cost)", 0.0, 1e6, 0.0, key="price")
        if price:
            training["price_per_gpu_hour"] = price
    return training


def pins_from_sidebar() -> dict:
    with st.sidebar.expander("Pin layout axes (the search covers the rest)"):
        pins = {k: st.selectbox(k, ("any", *values), key=f"pin_{k}") for k, values in PIN_CHOICES.items()}
    return {k: v for k, v in pins.items() if v != "any"}


def manual_layout_from_sidebar(engine: str) -> dict:
    sb = st.sidebar
    lay = {k: int(sb.number_input(k, 1, 4096, 1, key=f"man_{k}")) for k in ("tp", "pp", "vpp", "cp", "ep")}
    dp = int(sb.number_input("dp (0: gpus / (tp pp cp))", 0, 1_000_000, 0, key="man_dp"))
    if dp:
        lay["dp"] = dp
    etp = int(sb.number_input("etp: TP ranks per expert (0: the engine's default)", 0, 4096, 0, key="man_etp"))
    if etp:
        lay["etp"] = etp
    lay["zero"] = sb.selectbox("ZeRO stage", (0, 1, 2, 3), key="man_zero")
    lay["offload_optimizer"] = sb.selectbox("Offload optimizer", ("none", "cpu", "nvme"), key="man_offload_optimizer")
    lay["offload_params"] = sb.selectbox("Offload parameters", ("none", "cpu", "nvme"), key="man_offload_params")
    lay["mbs"] = int(sb.number_input("Micro-batch", 1, 4096, 1, key="man_mbs"))
    choices = ("none", "selective", "full") if ENGINE_SPECS[engine].selective_recompute else ("none", "full")
    lay["recompute"] = sb.selectbox("Recompute", choices, key="man_recompute")
    if lay["recompute"] == "full":
        layers = int(sb.number_input("Recompute layers N (0: every layer, one checkpoint each)", 0, 16384, 0,
                                     key="man_recompute_layers"))
        lay["recompute_layers"] = layers or None
        if layers:  # Megatron --recompute-method: the first N layers of each chunk, or checkpoints of N layers
            lay["recompute_method"] = sb.selectbox("Recompute method", ("block", "uniform"), key="man_recompute_method")
    lay["sequence_parallel"] = sb.checkbox("Sequence parallel", False, key="man_sp")
    if ENGINE_SPECS[engine].rank_order_choice:  # Megatron-LM --use-tp-pp-dp-mapping
        lay["rank_order"] = sb.selectbox("Rank order (innermost first)", ("tp-cp-dp-pp", "tp-cp-pp-dp"), key="man_rank_order")
    schedule = sb.selectbox("Schedule", ("default", *Schedule.words()), key="man_schedule")
    if schedule != "default":
        lay["schedule"] = schedule
    return lay


# ---------------------------------------------------------------------------------------------
# charts


PEAK = "peak"  # the memory chart's default moment: each stage at its own largest (memory.peak_phase)


def memory_moments(est: dict) -> list:
    """The moments the memory chart can show: the peak, then every moment of the step some stage
    models (planner/memory.py PHASES, in its order: the estimate record's per_stage phases)."""
    modelled = {name for s in est["memory"]["per_stage"] for name in s.get("phases", {})}
    return [PEAK] + [name for name in PHASES if name in modelled]


def moment_title(est: dict, moment: str) -> str:
    """Which moment the memory chart shows, in words: the peak names its moment (per stage where the
    stages peak at different ones), since activations read 0 at an optimizer-step peak."""
    if moment != PEAK:
        return f"Memory per pipeline stage at the {moment} moment"
    peaks = [s.get("peak_phase", est["memory"]["peak_phase"]) for s in est["memory"]["per_stage"]]
    if len(set(peaks)) == 1:
        return f"Memory per pipeline stage at the peak ({peaks[0]})"
    return "Memory per pipeline stage at each stage's peak (" + \
        ", ".join(f"stage {k}: {p}" for k, p in enumerate(peaks)) + ")"


def memory_chart(est: dict, moment: str = PEAK) -> alt.LayerChart:
    """Memory per component per pipeline stage (stacked) at `moment` (PEAK or one of PHASES; a stage
    that does not model that moment is left out), the capacity line and the error band; the title
    names the moment."""
    mem = est["memory"]
    stages = [(s["stage"], s if moment == PEAK else s["phases"][moment]) for s in mem["per_stage"]
              if moment == PEAK or moment in s.get("phases", {})]
    rows = [{"stage": f"stage {k}", "component": c, "GiB": s["breakdown"][c] / GiB}
            for k, s in stages for c in BREAKDOWN_KEYS if s["breakdown"][c]]
    totals = pd.DataFrame([{"stage": f"stage {k}", "low": s["gpu_bytes"] * (1 - mem["error_band"]) / GiB,
                            "high": s["gpu_bytes"] * (1 + mem["error_band"]) / GiB} for k, s in stages])
    bars = alt.Chart(pd.DataFrame(rows)).mark_bar().encode(
        x=alt.X("stage:N", title=None, sort=None), y=alt.Y("sum(GiB):Q", title="GiB per GPU"),
        color=alt.Color("component:N", sort=list(BREAKDOWN_KEYS)), tooltip=["stage", "component", alt.Tooltip("GiB:Q", format=".2f")])
    band = alt.Chart(totals).mark_errorbar(color="black", ticks=True).encode(
        x="stage:N", y=alt.Y("low:Q", title="GiB per GPU"), y2="high:Q")
    capacity = alt.Chart(pd.DataFrame({"capacity": [mem["capacity_bytes"] / GiB]})).mark_rule(
        color="red", strokeDash=[6, 3]).encode(y="capacity:Q", tooltip=[alt.Tooltip("capacity:Q", format=".1f")])
    return alt.layer(bars, band, capacity).properties(height=340, title=moment_title(est, moment))


def time_chart(est: dict) -> alt.Chart:
    parts = [{"step": "step", "part": k, "s": v} for k, v in est["time"]["breakdown"].items() if v > 0]
    return alt.Chart(pd.DataFrame(parts)).mark_bar().encode(
        x=alt.X("sum(s):Q", title="seconds per step"), y=alt.Y("step:N", title=None), color="part:N",
        tooltip=["part", alt.Tooltip("s:Q", format=".3f")]).properties(height=110)


def landscape_chart(points: dict, chosen_label: str) -> alt.LayerChart:
    df = pd.DataFrame({"layout": points["label"], "GiB": [b / GiB for b in points["gpu_bytes"]],
                       "tokens/s": points["tokens_per_s"], "Pareto front": points["pareto"]})
    df["chosen"] = df["layout"] == chosen_label
    dots = alt.Chart(df).mark_circle(size=36, opacity=0.5).encode(
        x=alt.X("GiB:Q", title="peak GiB per GPU"), y=alt.Y("tokens/s:Q"),
        color=alt.Color("Pareto front:N", scale=alt.Scale(domain=[False, True], range=["#4c78a8", "#f58518"])),
        tooltip=["layout", alt.Tooltip("GiB:Q", format=".2f"), alt.Tooltip("tokens/s:Q", format=",.0f")])
    front = alt.Chart(df[df["Pareto front"]]).mark_line(point=True, color="orange").encode(
        x="GiB:Q", y="tokens/s:Q", order="GiB:Q")
    chosen = alt.Chart(df[df["chosen"]]).mark_point(size=220, shape="diamond", color="red", filled=True).encode(
        x="GiB:Q", y="tokens/s:Q", tooltip=["layout"])
    return alt.layer(dots, front, chosen).properties(height=340)


# ---------------------------------------------------------------------------------------------
# sections of the page


def ranked_table(rec: dict) -> pd.DataFrame:
    return pd.DataFrame([{"#": k, "layout": short(r["layout"]), "GiB/GPU": r["memory"]["gpu_bytes"] / GiB,
                          "free GiB": r["memory"]["headroom_bytes"] / GiB, "fit": r["memory"]["verdict"],
                          "step s": r["time"]["step_s"], "tokens/s": r["throughput"]["tokens_per_s"],
                          "MFU": r["throughput"]["mfu"], "binding constraint": r["binding_constraint"]}
                         for k, r in enumerate(rec["layouts"], 1)])


def _select_from_table():
    rows = st.session_state["ranked"].selection.rows
    if rows:
        st.session_state["chosen"] = rows[0] + 1


def show_recommendation(rec: dict) -> int:
    """The ranked layouts; returns the chosen one's index (0-based)."""
    st.subheader("Fastest layouts that fit")
    st.caption(", ".join(f"{k} {v}" for k, v in rec["assumptions"].items()))
    st.dataframe(ranked_table(rec), hide_index=True, on_select=_select_from_table, selection_mode="single-row",
                 key="ranked", column_config={"GiB/GPU": st.column_config.NumberColumn(format="%.2f"),
                                              "free GiB": st.column_config.NumberColumn(format="%.2f"),
                                              "step s": st.column_config.NumberColumn(format="%.3f"),
                                              "tokens/s": st.column_config.NumberColumn(format="%.0f"),
                                              "MFU": st.column_config.NumberColumn(format="percent")})
    rej = ", ".join(f"{k} {v:,}" for k, v in sorted(rec["rejected"].items(), key=lambda kv: -kv[1]))
    st.caption(f"{rec['candidates_evaluated']:,} candidates evaluated; rejected: {rej or 'none'}. "
               "Click a row (or pick its number) to make it the chosen layout.")
    if rec["layouts"][0]["memory"]["verdict"] != "fits":
        st.warning(report.clear_fit_text(rec["layouts"][0]["memory"], rec["clear_fit"]))
    if rec["engines"]:
        st.markdown("**Other engines**: the fastest layout of each that fits, against #1")
        st.dataframe(pd.DataFrame([{"engine": e["engine"], "layout": short(e["layout"]) if e["layout"] else e["note"],
                                    "settings": report.settings_flags(e["settings"]),
                                    "tokens/s": e["tokens_per_s"],
                                    "speed vs #1": None if e["relative_speed"] is None else f"{e['relative_speed']:.2f}x"}
                                   for e in rec["engines"]]), hide_index=True,
                     column_config={"tokens/s": st.column_config.NumberColumn(format="%.0f")})
    n = len(rec["layouts"])
    if st.session_state.get("chosen", 1) > n:
        st.session_state["chosen"] = 1
    return st.selectbox("Chosen layout", range(1, n + 1), key="chosen") - 1


def show_layout(est: dict) -> None:
    mem, th, t = est["memory"], est["throughput"], est["time"]
    st.subheader(f"Chosen layout: {short(est['layout'])}")
    cols = st.columns(5)
    cols[0].metric("Peak GiB per GPU", f"{mem['gpu_bytes'] / GiB:.2f}", f"{mem['verdict']}", delta_color="off")
    cols[1].metric("Step time (s)", f"{t['step_s']:.3f}", f"±{t['error_band']:.0%}", delta_color="off")
    cols[2].metric("Tokens/s", f"{th['tokens_per_s']:,.0f}")
    cols[3].metric("MFU", f"{th['mfu']:.1%}")
    tt = est.get("time_to_train")
    cols[4].metric("Time to train", f"{tt['days']:.1f} days" if tt else "—",
                   None if not tt or tt.get("cost") is None else f"cost {tt['cost']:,.0f}", delta_color="off")
    st.caption(est["verdict_text"])
    left, right = st.columns(2)
    # the peak by default; the other moments show what the peak's parts leave out (an optimizer-step
    # peak holds no activations: they are freed by then, not unmodelled)
    moments = memory_moments(est)
    if st.session_state.get("memory_moment", PEAK) not in moments:  # a moment the new layout does not model
        st.session_state["memory_moment"] = PEAK
    moment = left.radio("Moment of the step", moments, horizontal=True, key="memory_moment")
    left.altair_chart(memory_chart(est, moment), width="stretch")
    left.caption("red: capacity; whiskers: error band")
    right.markdown("**Step time**")
    right.altair_chart(time_chart(est), width="stretch")
    right.markdown(report.time_text(est).replace("\n", "  \n"))


def show_downloads(est: dict) -> None:
    st.subheader("Launch files")
    if est["export_error"]:
        st.info(est["export_error"])
        return
    cols = st.columns(len(est["files"]))
    for col, (name, text) in zip(cols, est["files"]):
        col.download_button(name, text, file_name=name, key=f"download_{name}")
    for name, text in est["files"]:
        if name == export.MEGATRON_ARGS:
            with st.expander("Megatron arguments"):
                st.code(text, language="bash")


def show_comparison(rec: dict, training: dict, model, cluster: dict, chosen: int) -> None:
    n = len(rec["layouts"])
    if n < 2:
        return
    st.subheader("Side by side")
    other = st.selectbox("Compare the chosen layout with", [k for k in range(1, n + 1) if k != chosen + 1],
                         key="compare") - 1
    rows = {}
    for k in (chosen, other):
        est = estimate_answer(model, cluster, training, layout_input(rec["layouts"][k]["layout"]))
        m, th = est["memory"], est["throughput"]
        rows[f"#{k + 1} {short(est['layout'])}"] = {
            "peak GiB/GPU": round(m["gpu_bytes"] / GiB, 2), "reserved GiB": round(m["reserved_bytes"] / GiB, 2),
            "fit": m["verdict"], "step s": round(est["time"]["step_s"], 3),
            "tokens/s": round(th["tokens_per_s"]), "MFU": f"{th['mfu']:.1%}",
            **{f"{p} s": round(v, 3) for p, v in est["time"]["breakdown"].items() if v > 0}}
    st.dataframe(pd.DataFrame(rows).astype(str))


EXAMPLE_CONFIG = """{
  "train_batch_size": 256,
  "train_micro_batch_size_per_gpu": 4,
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 2, "overlap_comm": true}
}"""
SEVERITY = {"error": st.error, "warning": st.warning, "info": st.info}


def show_check(model, cluster: dict, training: dict) -> None:
    """`planner check` on a pasted ds_config.json: the findings, worst first, then the prediction
    and the closest better config's launch files."""
    st.subheader("Check your DeepSpeed config")
    text = st.text_area("ds_config.json", EXAMPLE_CONFIG, height=220, key="check_config")
    sb = st.sidebar
    layout = {"tp": int(sb.number_input("Launch TP (Megatron-DeepSpeed)", 1, 64, 1, key="chk_tp")),
              "pp": int(sb.number_input("Pipeline stages", 1, 1024, 1, key="chk_pp")),
              "recompute": sb.selectbox("The script's activation checkpointing", ("none", "selective", "full"),
                                        key="chk_recompute")}
    mbs = int(sb.number_input("Per-device batch, for an 'auto' micro-batch (0: 1)", 0, 4096, 0, key="chk_mbs")) or None
    native = sb.checkbox("Also ask DeepSpeed's own config class (about 2 s)", False, key="chk_deepspeed")
    answer = check_answer(text, model, cluster, {"seq_len": training["seq_len"]}, layout, mbs, native)
    order = {"error": 0, "warning": 1, "info": 2}
    for f in sorted(answer["findings"], key=lambda f: order[f["severity"]]):
        SEVERITY[f["severity"]](f"[{f['kind']}] {f['message']}")
    st.markdown(f"**Verdict: {'runs and fits' if answer['ok'] else 'will not run as configured'}**")
    if answer["page"] is not None:
        show_layout(answer["page"])
        if answer["better"]:
            st.caption(f"Launch files below are for the closest better config: {answer['better']['label']}")
            show_downloads(answer["page"])


def main() -> None:
    st.set_page_config(page_title="planner: distributed training what-if", layout="wide")
    st.title("Will it train, and how fast?")
    st.sidebar.header("Inputs")
    try:
        model = model_from_sidebar()
        cluster = cluster_from_sidebar()
        training = training_from_sidebar()
    except InputError as exc:
        st.error(str(exc))
        return
    mode = st.sidebar.radio("Mode", ("auto", "manual", "check my config"), horizontal=True, key="mode")
    try:
        if mode == "auto":
            pins = pins_from_sidebar()
            top = int(st.sidebar.number_input("Layouts shown", 1, 50, 10, key="top"))
            headroom = st.sidebar.slider("Memory headroom kept free", 0.0, 0.5, 0.05, 0.01, key="headroom")
            rec = recommend_answer(model, cluster, training, top, headroom, pins)
            st.caption(rec["describe"].replace("\n", "  \n"))
            if not rec["layouts"]:
                st.error("Nothing fits. " + "; ".join(rec["suggestions"]))
                return
            chosen = show_recommendation(rec)
            # estimate takes the recommended global batch and engine, so its numbers are the row's
            # and the pipeline split, ZeRO-3 knobs, offloaded share and TP overlap it chose
            fixed = {**{k: v for k, v in training.items() if k != "tokens_per_step"}, "gbs": rec["gbs"],
                     "engine": rec["engine"], "pipeline_edge_layers": rec["assumptions"]["pp_edge_layers"],
                     **{k: rec["assumptions"][k] for k in ("stage3_max_live_parameters", "stage3_max_reuse_distance",
                                                           "optimizer_offload_fraction", "tp_comm_overlap")
                        if k in rec["assumptions"]}}
            est = estimate_answer(model, cluster, fixed, layout_input(rec["layouts"][chosen]["layout"]))
            show_layout(est)
            st.subheader("All fitting layouts: speed against memory")
            st.caption(f"{len(rec['landscape']['label']):,} of {rec['landscape']['fitting']:,} fitting layouts "
                       "drawn; the line is the Pareto front, the diamond the chosen layout")
            st.altair_chart(landscape_chart(rec["landscape"], short(est["layout"])), width="stretch")
            show_comparison(rec, fixed, model, cluster, chosen)
        elif mode == "check my config":
            show_check(model, cluster, training)
            return
        else:
            if "tokens_per_step" in training:  # estimate takes the batch in sequences
                training["gbs"] = max(1, round(training.pop("tokens_per_step") / training["seq_len"]))
            est = estimate_answer(model, cluster, training, manual_layout_from_sidebar(training["engine"]))
            st.caption(est["describe"].replace("\n", "  \n"))
            show_layout(est)
        show_downloads(est)
    except InputError as exc:
        st.error(str(exc))
    except Exception as exc:  # a bug of ours: one line on the page, the traceback in the server's log
        traceback.print_exc()
        st.error(f"internal error ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                 "please report it with these inputs")


if __name__ == "__main__":  # streamlit runs the page as __main__; tests import its helpers
    main()
