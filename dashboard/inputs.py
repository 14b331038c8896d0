"""The dashboard's sidebar: the model, cluster, training and layout inputs, as the planning API takes
them."""

from __future__ import annotations

import streamlit as st

from dashboard.answers import profile_hardware
from planner.api import ENGINE_NAMES as ENGINES
from planner.api import ENGINES as ENGINE_SPECS
from planner.api import (InputError, Optimizer, Precision, Schedule, known_profiles, load_catalog, load_gpus,
                         offloads_checkpoints, parse_json)

# (comments, not attribute docstrings: Streamlit's "magic" would print a bare string on the page)
MAX_UPLOAD_BYTES = 2**20  # a Hugging Face config.json is a few KiB; anything past 1 MiB is not one
PIN_CHOICES = {"tp": (1, 2, 4, 8), "pp": (1, 2, 4, 8, 16), "cp": (1, 2, 4, 8), "vpp": (1, 2, 4),
               "zero": (0, 1, 2, 3), "offload_optimizer": ("none", "cpu", "nvme"), "offload_params": ("none", "cpu", "nvme"),
               "mbs": (1, 2, 4, 8), "recompute": ("none", "selective", "full"), "sequence_parallel": (False, True),
               "rank_order": ("tp-cp-dp-pp", "tp-cp-pp-dp")}


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
