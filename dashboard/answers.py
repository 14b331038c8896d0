"""The dashboard's API calls, cached on their inputs (plain values) and returning JSON-like answers;
the other engines' comparison, searched on a worker thread while the page shows the first answer."""

from __future__ import annotations

import json
import queue
import threading
from collections import OrderedDict
from concurrent.futures import Future

import streamlit as st

from planner import api, export, report
from planner.api import PINNABLE, InputError, parse_json, read_profile

# (comments, not attribute docstrings: Streamlit's "magic" would print a bare string on the page)
LANDSCAPE_POINTS = 1500  # fitting layouts drawn in the speed-versus-memory plot (the Pareto front, then a spread)
SEARCHING = "searching the other engines"
POLL_S = 0.3  # how often the page looks whether the other engines' comparison is done
FUTURES_KEPT = 64  # engine comparisons remembered by their inputs, as the answers' caches keep 64


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
