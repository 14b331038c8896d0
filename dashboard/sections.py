"""The sections of the dashboard's page: the headline, the legend and assumptions, the ranked layouts,
a layout's memory and step time, its launch files, and two layouts side by side."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard.answers import SEARCHING
from dashboard.charts import PEAK, GiB, memory_chart, memory_moments, time_chart
from planner import export, report
from planner.api import short

VERDICT_COLOURS = {"fits": "green", "borderline": "orange", "oom": "red"}


def one_line(text: str) -> str:
    """A report line folded for a terminal (report.fold), unfolded for the page."""
    return " ".join(text.split())


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
