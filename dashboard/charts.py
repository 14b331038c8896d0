"""The dashboard's Altair charts: memory per pipeline stage at a moment of the step, the step's time,
and every fitting layout's speed against its memory."""

from __future__ import annotations

import json

import altair as alt
import pandas as pd

from planner.api import PHASES

# (comments, not attribute docstrings: Streamlit's "magic" would print a bare string on the page)
GiB = 2**30
# a colour per component, by its place in the answer's full list of components (every record lists
# them all, zeros included), so a component keeps its colour whichever ones a layout has; no red,
# which marks capacity and OOM
MEMORY_COLOURS = ("#4c78a8", "#72b7b2", "#54a24b", "#f58518", "#eeca3b", "#b279a2", "#9d755d", "#bab0ac",
                  "#9ecae9", "#ffbf79")
TIME_COLOURS = ("#4c78a8", "#9ecae9", "#f58518", "#ffbf79", "#54a24b", "#88d27a", "#b279a2", "#9d755d", "#eeca3b",
                "#bab0ac", "#72b7b2", "#d6a5c9")
# drawn as SVG (Streamlit's choice is a canvas): crisp text, and a legend the browser test can measure
SVG = {"embedOptions": {"renderer": "svg"}}
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
