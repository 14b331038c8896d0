"""What-if dashboard: `streamlit run app.py`. The page and its three modes; its parts are dashboard/.

Every number on the page comes from the planning API (planner/api.py), the same calls the CLI
makes: `recommend` in auto mode, `estimate` for the chosen layout (and in manual mode), `check` on
a pasted ds_config.json, `export.render` for the downloads. The page only arranges them; it holds
no formula of its own.
"""

from __future__ import annotations

import traceback

import streamlit as st

from dashboard.answers import (check_answer, engines_done, engines_found, engines_pending, engines_search,
                               estimate_answer, inputs_key, layout_input, recommend_answer)
from dashboard.charts import landscape_chart
from dashboard.inputs import (cluster_from_sidebar, manual_layout_from_sidebar, model_from_sidebar, pins_from_sidebar,
                              training_from_sidebar)
from dashboard.sections import (best_engine_text, chosen_rank, show_assumptions, show_comparison, show_downloads,
                                show_headline, show_layout, show_legend, show_recommendation)
from planner.api import InputError, short

MODES = ("auto", "manual", "check my config")


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
