"""What-if dashboard: `streamlit run app.py`.

Every number on the page comes from the planning API (planner/api.py), the same calls the CLI
makes: `recommend` in auto mode, `estimate` for the chosen layout (and in manual mode), `check` on
a pasted ds_config.json, `export.render` for the downloads. The page only arranges them; it holds
no formula of its own.
"""

from __future__ import annotations

import json
import queue
import threading
import traceback
from collections import OrderedDict
from concurrent.futures import Future

import altair as alt
import pandas as pd
import streamlit as st

from planner import api, export, report
from planner.api import ENGINE_NAMES as ENGINES
from planner.api import ENGINES as ENGINE_SPECS
from planner.api import (PHASES, PINNABLE, InputError, Optimizer, Precision, Schedule, known_profiles, load_catalog,
                         load_gpus, offloads_checkpoints, parse_json, read_profile, short)

GiB = 2**30
# (comments, not attribute docstrings: Streamlit's "magic" would print a bare string on the page)
MAX_UPLOAD_BYTES = 2**20  # a Hugging Face config.json is a few KiB; anything past 1 MiB is not one
LANDSCAPE_POINTS = 1500  # fitting layouts drawn in the speed-versus-memory plot (the Pareto front, then a spread)
PIN_CHOICES = {"tp": (1, 2, 4, 8), "pp": (1, 2, 4, 8, 16), "cp": (1, 2, 4, 8), "vpp": (1, 2, 4),
               "zero": (0, 1, 2, 3), "offload_optimizer": ("none", "cpu", "nvme"), "offload_params": ("none", "cpu", "nvme"),
               "mbs": (1, 2, 4, 8), "recompute": ("none", "selective", "full"), "sequence_parallel": (False, True),
               "rank_order": ("tp-cp-dp-pp", "tp-cp-pp-dp")}
MODES = ("auto", "manual", "check my config")
VERDICT_COLOURS = {"fits": "green", "borderline": "orange", "oom": "red"}
# a colour per component, by its place in the answer's full list of components (every record lists
# them all, zeros included), so a component keeps its colour whichever ones a layout has; no red,
# which marks capacity and OOM
MEMORY_COLOURS = ("#4c78a8", "#72b7b2", "#54a24b", "#f58518", "#eeca3b", "#b279a2", "#9d755d", "#bab0ac",
                  "#9ecae9", "#ffbf79")
TIME_COLOURS = ("#4c78a8", "#9ecae9", "#f58518", "#ffbf79", "#54a24b", "#88d27a", "#b279a2", "#9d755d", "#eeca3b",
                "#bab0ac", "#72b7b2", "#d6a5c9")
# drawn as SVG (Streamlit's choice is a canvas): crisp text, and a legend the browser test can measure
SVG = {"embedOptions": {"renderer": "svg"}}
SEARCHING = "searching the other engines"
POLL_S = 0.3  # how often the page looks whether the other engines' comparison is done
FUTURES_KEPT = 64  # engine comparisons remembered by their inputs, as the answers' caches keep 64


# ---------------------------------------------------------------------------------------------
# the API calls, cached on their inputs (plain values), returning JSON-like answers


@st.cache_data(max_entries=64, show_spinner=False)
def recommend_answer(model, cluster: dict, training: dict, top: int, headroom: float, pinned: dict) -> dict:
    """`recommend` without its comparison with the other engines (engines_search brings that): the
    comparison is five more searches, most of the time an input change takes, and the layouts of the
    engine asked for do not depend on it. 'engines' is None here."""
    r = api.recommend(model, cluster, training, top=top, memory_headroom=headroom, pinned=pinned,
                      landscape=LANDSCAPE_POINTS, compare_engines=False)
    return {**r.to_json(), "engines": None, "landscape": r.landscape,
            "describe": report.describe(r.model, r.cluster, r.training), "gbs": r.training.gbs,
            "engine": r.training.engine.name}


def engines_answer(model, cluster: dict, training: dict, top: int, headroom: float, pinned: dict) -> list:
    """The other engines' fastest fitting layouts against #1: the whole `recommend`, as the CLI asks it."""
    return api.recommend(model, cluster, training, top=top, memory_headroom=headroom, pinned=pinned).engines


@st.cache_resource
def background() -> dict:
    """The engine comparisons: one worker thread for every session (two searches at once would only
    share the same cores), newest request first (the inputs on someone's page now), daemon so that
    stopping the server does not wait for searches nobody will read; and the requests so far, by
    their inputs."""
    jobs = queue.LifoQueue()

    def work() -> None:
        while True:
            fut, fn, args = jobs.get()
            if fut.set_running_or_notify_cancel():  # False: cancelled while it waited
                try:
                    fut.set_result(fn(*args))
                except Exception as exc:  # raised where the page reads it
                    fut.set_exception(exc)

    threading.Thread(target=work, name="planner-engines", daemon=True).start()
    return {"jobs": jobs, "futures": OrderedDict(), "lock": threading.Lock()}


def inputs_key(inputs: tuple) -> str:
    """recommend_answer's inputs (plain values) as one string, to remember answers by."""
    return json.dumps(inputs, sort_keys=True, default=str)


def engines_found(inputs: tuple) -> Future | None:
    """The other engines' comparison for recommend_answer's `inputs`, where it has been asked for."""
    bg = background()
    with bg["lock"]:
        return bg["futures"].get(inputs_key(inputs))


def engines_search(inputs: tuple) -> None:
    """Asks for the other engines' comparison for `inputs` on the worker thread. The page calls it
    once it has drawn the first answer: the search holds the interpreter lock for much of its time,
    and would slow the drawing as much as it is slowed."""
    key = inputs_key(inputs)
    bg = background()
    with bg["lock"]:
        fut = bg["futures"].get(key)
        if fut is None or fut.cancelled():
            fut = Future()
            bg["jobs"].put((fut, engines_answer, inputs))
            bg["futures"][key] = fut
            while len(bg["futures"]) > FUTURES_KEPT:
                bg["futures"].popitem(last=False)
        bg["futures"].move_to_end(key)
    previous = st.session_state.get("engines_future")
    if previous is not None and previous is not fut:
        previous.cancel()  # not yet started: this session has left those inputs
    st.session_state["engines_future"] = fut


def engines_done(fut: Future | None) -> list | None:
    """The comparison's answer, or None while it is searched; its InputError or bug raised here."""
    if fut is None or not fut.done() or fut.cancelled():
        return None
    return fut.result()


@st.fragment(run_every=POLL_S)
def engines_pending(inputs: tuple) -> None:
    """Stands in for the best other engine until its search is done, then reruns the page with it."""
    fut = engines_found(inputs)
    if fut is not None and fut.cancelled():
        engines_search(inputs)  # another session asked for the same inputs, and has left them
    elif fut is not None and fut.done():
        st.rerun()
    st.markdown(f"**Best other engine**: {SEARCHING}…")


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


@st.cache_data(max_entries=16, show_spinner=False)
def profile_hardware(found: tuple) -> dict:
    """{name: the GPU its runs were measured on (hardware.gpu), None where it cannot be read} for
    (name, path, mtime) triples of known profiles (the mtime renews the answer after a new run)."""
    out = {}
    for name, path, _ in found:
        try:
            out[name] = read_profile(path, check_fit=False)["hardware"]["gpu"]
        except InputError:
            out[name] = None  # offered: choosing it says what is wrong with it
    return out


def layout_input(row: dict) -> dict:
    """A recommended layout row as estimate's layout input (gas and gbs follow from the training)."""
    return {k: row[k] for k in (*PINNABLE, "schedule")}


def one_line(text: str) -> str:
    """A report line folded for a terminal (report.fold), unfolded for the page."""
    return " ".join(text.split())


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
    profiles, foreign = calibration_choices(cluster["gpu"])
    if st.session_state.get("calibration", "none") not in profiles:  # measured on the GPU chosen before
        st.session_state["calibration"] = "none"
    profile = st.sidebar.selectbox("Calibration profile", profiles, key="calibration",
                                   help="profiles measured on this GPU: the shipped ones and yours "
                                        "(python -m calibrate run NAME)")
    if foreign:
        st.sidebar.caption("Measured on other hardware, not offered: " +
                           ", ".join(f"{name} ({gpu})" for name, gpu in foreign.items()))
    if profile != "none":
        cluster["calibration"] = profile
    return cluster


def calibration_choices(gpu: str) -> tuple[list, dict]:
    """(['none', the profiles measured on `gpu`], {profile: GPU} of those measured on other hardware):
    the planner refuses a profile of other hardware (calibration.load), so it is not offered."""
    found = tuple((name, str(path), path.stat().st_mtime_ns) for name, path in known_profiles().items())
    measured_on = profile_hardware(found)
    foreign = {name: on for name, on in measured_on.items() if on is not None and on != gpu}
    return ["none", *(name for name in measured_on if name not in foreign)], foreign


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


def component_colour(components: list, palette: tuple, shown: list, columns: int) -> alt.Color:
    """The colour encoding of a chart's component field: every component of the answer in the scale
    (fixed colours from run to run), only the ones drawn in the legend, which sits under the chart in
    `columns` columns so that it fits half a 1280-pixel page."""
    return alt.Color("component:N", sort=list(components),
                     scale=alt.Scale(domain=list(components), range=list(palette[:len(components)])),
                     legend=alt.Legend(orient="bottom", columns=columns, title=None, values=list(shown),
                                       symbolType="square", labelLimit=0))


def memory_chart(est: dict, moment: str = PEAK) -> alt.LayerChart:
    """Memory per component per pipeline stage (stacked) at `moment` (PEAK or one of PHASES; a stage
    that does not model that moment is left out), the capacity line and the error band; the title
    names the moment."""
    mem = est["memory"]
    components = list(mem["breakdown"])  # every component, zeros included
    stages = [(s["stage"], s if moment == PEAK else s["phases"][moment]) for s in mem["per_stage"]
              if moment == PEAK or moment in s.get("phases", {})]
    rows = [{"stage": f"stage {k}", "component": c, "GiB": s["breakdown"][c] / GiB}
            for k, s in stages for c in components if s["breakdown"][c]]
    shown = [c for c in components if any(r["component"] == c for r in rows)]
    totals = pd.DataFrame([{"stage": f"stage {k}", "low": s["gpu_bytes"] * (1 - mem["error_band"]) / GiB,
                            "high": s["gpu_bytes"] * (1 + mem["error_band"]) / GiB} for k, s in stages])
    bars = alt.Chart(pd.DataFrame(rows)).mark_bar().encode(
        x=alt.X("stage:N", title=None, sort=None), y=alt.Y("sum(GiB):Q", title="GiB per GPU"),
        color=component_colour(components, MEMORY_COLOURS, shown, 4),
        order=alt.Order("order:Q"),
        tooltip=[alt.Tooltip("stage:N"), alt.Tooltip("component:N"), alt.Tooltip("GiB:Q", format=".2f")]).transform_calculate(
        order=f"indexof({json.dumps(components)}, datum.component)")
    band = alt.Chart(totals).mark_errorbar(color="black", ticks=True).encode(
        x=alt.X("stage:N"), y=alt.Y("low:Q", title="GiB per GPU"), y2=alt.Y2("high:Q"))
    capacity = alt.Chart(pd.DataFrame({"capacity": [mem["capacity_bytes"] / GiB]})).mark_rule(
        color="red", strokeDash=[6, 3]).encode(y=alt.Y("capacity:Q"), tooltip=[alt.Tooltip("capacity:Q", format=".1f")])
    # the title names the moment, in a size that keeps it whole in half a 1280-pixel page
    return alt.layer(bars, band, capacity).properties(height=380, title=moment_title(est, moment), usermeta=SVG) \
        .configure_title(fontSize=12, anchor="start")


def time_chart(est: dict) -> alt.Chart:
    """The step's exposed seconds per part, stacked in one bar."""
    components = list(est["time"]["breakdown"])  # every part, zeros included
    parts = [{"step": "step", "component": k, "s": v} for k, v in est["time"]["breakdown"].items() if v > 0]
    return alt.Chart(pd.DataFrame(parts)).mark_bar().encode(
        x=alt.X("sum(s):Q", title="seconds per step"), y=alt.Y("step:N", title=None, axis=None),
        color=component_colour(components, TIME_COLOURS, [p["component"] for p in parts], 4),
        order=alt.Order("order:Q"),
        tooltip=[alt.Tooltip("component:N"), alt.Tooltip("s:Q", format=".3f")]).transform_calculate(
        order=f"indexof({json.dumps(components)}, datum.component)").properties(height=210, usermeta=SVG)


def landscape_chart(points: dict, chosen_label: str) -> alt.LayerChart:
    df = pd.DataFrame({"layout": points["label"], "GiB": [b / GiB for b in points["gpu_bytes"]],
                       "tokens/s": points["tokens_per_s"], "Pareto front": points["pareto"]})
    df["chosen"] = df["layout"] == chosen_label
    dots = alt.Chart(df).mark_circle(size=36, opacity=0.5).encode(
        x=alt.X("GiB:Q", title="peak GiB per GPU"), y=alt.Y("tokens/s:Q"),
        color=alt.Color("Pareto front:N", scale=alt.Scale(domain=[False, True], range=["#4c78a8", "#f58518"]),
                        legend=alt.Legend(orient="bottom")),
        tooltip=[alt.Tooltip("layout:N"), alt.Tooltip("GiB:Q", format=".2f"), alt.Tooltip("tokens/s:Q", format=",.0f")])
    front = alt.Chart(df[df["Pareto front"]]).mark_line(point=True, color="orange").encode(
        x=alt.X("GiB:Q"), y=alt.Y("tokens/s:Q"), order=alt.Order("GiB:Q"))
    chosen = alt.Chart(df[df["chosen"]]).mark_point(size=220, shape="diamond", color="red", filled=True).encode(
        x=alt.X("GiB:Q"), y=alt.Y("tokens/s:Q"), tooltip=[alt.Tooltip("layout:N")])
    return alt.layer(dots, front, chosen).properties(height=340, usermeta=SVG)


# ---------------------------------------------------------------------------------------------
# sections of the page


def show_headline(box, title: str, est: dict, aside=None) -> None:
    """The answer before anything else: the layout, its memory verdict in its colour (words, not a
    metric's delta: a delta draws an up or down arrow), tokens/s, MFU, step time and peak memory, then
    `aside()` (the best other engine, or the suggested config)."""
    mem, th, t = est["memory"], est["throughput"], est["time"]
    verdict = mem["verdict"]
    with box:
        st.markdown(f"{title}  \n#### `{short(est['layout'])}` &nbsp; :{VERDICT_COLOURS[verdict]}-badge[{verdict}]")
        row = st.container(horizontal=True, gap="large")  # each figure as wide as it is, none cut short
        row.metric("Tokens/s", f"{th['tokens_per_s']:,.0f}", width="content")
        row.metric("MFU", f"{th['mfu']:.1%}", width="content")
        row.metric("Step time (s)", f"{t['step_s']:.2f}", help=f"error band ±{t['error_band']:.0%}", width="content")
        row.metric("Peak GiB per GPU", f"{mem['gpu_bytes'] / GiB:.2f}", help=est["verdict_text"], width="content")
        if aside is not None:
            aside()


def best_engine_text(engines: list) -> str:
    """The best other engine against #1, as `recommend`'s second line says it (report.answer_lines)."""
    fitting = [e for e in engines if e["layout"] is not None and e["relative_speed"] is not None]
    if not fitting:
        return "**Best other engine**: " + ("none fits" if engines else "there is no other engine")
    e = max(fitting, key=lambda e: e["relative_speed"])
    ratio = report.ratio_text(e["relative_speed"])
    return (f"**Best other engine**: {e['engine']}, {ratio} {'as' if ratio == 'as fast' else 'than'} #1 "
            f"({e['tokens_per_s']:,.0f} tokens/s): `{short(e['layout'])}`")


def show_legend(labels: list) -> None:
    """report's legend of the layout abbreviations (as the CLI prints it) for the labels on the page."""
    legend = report.legend_text("\n".join(labels))
    if legend:
        st.caption(one_line(legend))


def show_assumptions(describe: str, defaults: dict, layout: dict | None = None, shared: dict | None = None) -> None:
    with st.expander("Assumptions: the inputs the planner filled in"):
        st.markdown(describe.replace("\n", "  \n"))
        st.caption(one_line(report.assumed_text(defaults, layout)))
        if shared:
            st.caption("every layout shares: " + ", ".join(f"{k} {v}" for k, v in shared.items()))


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


def launch_rank(rec: dict) -> int:
    """The row `recommend` says to launch (its first line, what --emit writes): #1, or under a
    borderline #1 the fastest row whose peak clears the error band."""
    clear = rec["clear_fit"]
    return clear["rank"] if clear and clear["rank"] else 1


def chosen_rank(rec: dict, answer_id: str) -> int:
    """The chosen row (1-based): the one to launch for a new answer, else the one picked."""
    n = len(rec["layouts"])
    if st.session_state.get("answer_id") != answer_id or not 1 <= st.session_state.get("chosen", 0) <= n:
        st.session_state["chosen"] = launch_rank(rec)
        st.session_state["answer_id"] = answer_id
    return st.session_state["chosen"]


def show_recommendation(rec: dict, engines: list | None) -> None:
    """The ranked layouts, the other engines and the chosen row's picker."""
    st.subheader("Fastest layouts that fit")
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
    st.markdown("**Other engines**: the fastest layout of each that fits, against #1")
    if engines is None:
        st.caption(SEARCHING + "…")
    elif engines:
        st.dataframe(pd.DataFrame([{"engine": e["engine"], "layout": short(e["layout"]) if e["layout"] else e["note"],
                                    "settings": report.settings_flags(e["settings"]),
                                    "tokens/s": e["tokens_per_s"],
                                    "speed vs #1": None if e["relative_speed"] is None else f"{e['relative_speed']:.2f}x"}
                                   for e in engines]), hide_index=True,
                     column_config={"tokens/s": st.column_config.NumberColumn(format="%.0f")})
    st.selectbox("Chosen layout", range(1, len(rec["layouts"]) + 1), key="chosen")


def show_layout(est: dict, heading: str) -> None:
    """The layout's memory per stage and step time (its headline figures are at the top)."""
    st.subheader(heading)
    st.caption(est["verdict_text"])
    tt = est.get("time_to_train")
    if tt:
        cols = st.columns(4)
        cols[0].metric("Time to train", f"{tt['days']:.1f} days")
        cols[1].metric("GPU-hours", f"{tt['gpu_hours']:,.0f}")
        if tt.get("cost") is not None:
            cols[2].metric("Cost", f"{tt['cost']:,.0f}")
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
    right.markdown(report.time_text(est).replace("\n", "  \n"))
    right.altair_chart(time_chart(est), width="stretch")


def show_downloads(page: dict, oom: bool) -> None:
    """The launch files; for a layout that will not fit only behind a warning and a tick."""
    st.subheader("Launch files")
    if page["export_error"]:
        st.info(page["export_error"])
        return
    if oom:
        st.warning("This layout will not fit in GPU memory: its launch files would stop with an out-of-memory "
                   f"error ({page['verdict_text']}).")
        if not st.checkbox("Show the files anyway", key="download_anyway"):
            return
    cols = st.columns(len(page["files"]))
    for col, (name, text) in zip(cols, page["files"]):
        col.download_button(name, text, file_name=name, key=f"download_{name}")
    for name, text in page["files"]:
        if name == export.MEGATRON_ARGS:
            with st.expander("Megatron arguments"):
                st.code(text, language="bash")


def show_comparison(rec: dict, chosen: int) -> None:
    """Two of the ranked layouts side by side (their records as recommend gives them)."""
    n = len(rec["layouts"])
    if n < 2:
        return
    st.subheader("Side by side")
    other = st.selectbox("Compare the chosen layout with", [k for k in range(1, n + 1) if k != chosen + 1],
                         key="compare") - 1
    rows = {}
    for k in (chosen, other):
        r = rec["layouts"][k]
        m, th = r["memory"], r["throughput"]
        rows[f"#{k + 1} {short(r['layout'])}"] = {
            "peak GiB/GPU": round(m["gpu_bytes"] / GiB, 2), "reserved GiB": round(m["reserved_bytes"] / GiB, 2),
            "fit": m["verdict"], "step s": round(r["time"]["step_s"], 3),
            "tokens/s": round(th["tokens_per_s"]), "MFU": f"{th['mfu']:.1%}",
            **{f"{p} s": round(v, 3) for p, v in r["time"]["breakdown"].items() if v > 0}}
    st.dataframe(pd.DataFrame(rows).astype(str))


def show_auto(headline, model, cluster: dict, training: dict) -> None:
    """`recommend`: the chosen layout in the headline, the ranked layouts, the chosen one's charts,
    every fitting layout's speed against memory, two side by side, its launch files."""
    pins = pins_from_sidebar()
    top = int(st.sidebar.number_input("Layouts shown", 1, 50, 10, key="top"))
    headroom = st.sidebar.slider("Memory headroom kept free", 0.0, 0.5, 0.05, 0.01, key="headroom")
    inputs = (model, cluster, training, top, headroom, pins)
    rec = recommend_answer(*inputs)
    if not rec["layouts"]:
        show_assumptions(rec["describe"], rec["defaults"], shared=rec["assumptions"])
        st.error("Nothing fits. " + "; ".join(rec["suggestions"]))
        return
    engines = engines_done(engines_found(inputs))
    chosen = chosen_rank(rec, inputs_key(inputs)) - 1
    # estimate takes the recommended global batch and engine, so its numbers are the row's
    # and the pipeline split, ZeRO-3 knobs, offloaded share, TP overlap and overlap_comm it chose
    fixed = {**{k: v for k, v in training.items() if k != "tokens_per_step"}, "gbs": rec["gbs"],
             "engine": rec["engine"], "pipeline_edge_layers": rec["assumptions"]["pp_edge_layers"],
             **{k: rec["assumptions"][k] for k in ("stage3_max_live_parameters", "stage3_max_reuse_distance",
                                                   "optimizer_offload_fraction", "tp_comm_overlap", "overlap_comm")
                if k in rec["assumptions"]}}
    est = estimate_answer(model, cluster, fixed, layout_input(rec["layouts"][chosen]["layout"]))
    aside = (lambda: st.markdown(best_engine_text(engines))) if engines is not None else (lambda: engines_pending(inputs))
    show_headline(headline, f"Chosen layout: #{chosen + 1} of {len(rec['layouts'])}, {rec['engine']}", est, aside)
    labels = [short(r["layout"]) for r in rec["layouts"]] + [short(e["layout"]) for e in engines or [] if e["layout"]]
    show_legend(labels + ([short(rec["clear_fit"]["layout"])] if rec["clear_fit"] else []))
    show_assumptions(rec["describe"], rec["defaults"], shared=rec["assumptions"])
    try:
        show_recommendation(rec, engines)
        show_layout(est, "Memory and step time of the chosen layout")
        st.subheader("All fitting layouts: speed against memory")
        st.caption(f"{len(rec['landscape']['label']):,} of {rec['landscape']['fitting']:,} fitting layouts "
                   "drawn; the line is the Pareto front, the diamond the chosen layout")
        st.altair_chart(landscape_chart(rec["landscape"], short(est["layout"])), width="stretch")
        show_comparison(rec, chosen)
        show_downloads(est, est["memory"]["verdict"] == "oom")
    finally:  # the page is drawn (or stopped: a newer request of this session cancels this one)
        if engines is None:
            engines_search(inputs)


def show_manual(headline, model, cluster: dict, training: dict) -> None:
    """`estimate` of a layout given knob by knob."""
    if "tokens_per_step" in training:  # estimate takes the batch in sequences
        training["gbs"] = max(1, round(training.pop("tokens_per_step") / training["seq_len"]))
    est = estimate_answer(model, cluster, training, manual_layout_from_sidebar(training["engine"]))
    show_headline(headline, f"Your layout, {est['training']['engine']}", est)
    show_legend([short(est["layout"])])
    show_assumptions(est["describe"], est["defaults"], est["layout"])
    show_layout(est, "Memory and step time")
    show_downloads(est, est["memory"]["verdict"] == "oom")


EXAMPLE_CONFIG = """{
  "train_batch_size": 256,
  "train_micro_batch_size_per_gpu": 4,
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 2, "overlap_comm": true}
}"""
SEVERITY = {"error": st.error, "warning": st.warning, "info": st.info}


def suggested_text(better: dict | None) -> str:
    """The closest better config `check` found, against yours."""
    if better is None:
        return "none: the search found no faster config that fits"
    speed = f"{better['gain']:.2f}x your tokens/s" if better["gain"] is not None else \
        f"fits, {better['tokens_per_s']:,.0f} tokens/s"
    return f"`{better['label']}`, {speed}"


def show_check(headline, model, cluster: dict, training: dict) -> None:
    """`planner check` on a pasted ds_config.json: your config in the headline, the findings worst
    first, its charts, then the closest better config the search suggests and its launch files."""
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
    better, page = answer["better"], answer["page"]
    if page is not None:
        show_headline(headline, "Your config", page, lambda: st.markdown("**Suggested**: " + suggested_text(better)))
        show_legend([short(page["layout"])] + ([better["label"]] if better else []))
        show_assumptions(page["describe"], page["defaults"], page["layout"])
    order = {"error": 0, "warning": 1, "info": 2}
    for f in sorted(answer["findings"], key=lambda f: order[f["severity"]]):
        SEVERITY[f["severity"]](f"[{f['kind']}] {f['message']}")
    st.markdown(f"**Verdict: {'runs and fits' if answer['ok'] else 'will not run as configured'}**")
    if page is None:
        return
    show_layout(page, "Your config")
    st.subheader("Suggested")
    st.markdown(suggested_text(better))
    if better:
        st.caption("changes: " + (", ".join(better["changes"]) or "the same layout fields"))
        show_downloads(page, False)  # the files are the suggested config's, a layout the search found fitting


def main() -> None:
    st.set_page_config(page_title="planner: distributed training what-if", layout="wide")
    st.title("Will it train, and how fast?")
    # a control at the top rather than st.tabs: tabs run every tab's body on every rerun (all three
    # modes' API calls), and each mode asks its own inputs in the sidebar
    mode = st.radio("Mode", MODES, horizontal=True, key="mode", label_visibility="collapsed")
    headline = st.container(key="headline", border=True)  # filled once the answer is known, above everything else
    st.sidebar.header("Inputs")
    try:
        model = model_from_sidebar()
        cluster = cluster_from_sidebar()
        training = training_from_sidebar()
    except InputError as exc:
        st.error(str(exc))
        return
    try:
        {"auto": show_auto, "manual": show_manual, "check my config": show_check}[mode](headline, model, cluster,
                                                                                         training)
    except InputError as exc:
        st.error(str(exc))
    except Exception as exc:  # a bug of ours: one line on the page, the traceback in the server's log
        traceback.print_exc()
        st.error(f"internal error ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                 "please report it with these inputs")


if __name__ == "__main__":  # streamlit runs the page as __main__; tests import its helpers
    main()
