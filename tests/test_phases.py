"""memory.phases: every moment of the step the planner models (planner/memory.py PHASES), not only
the peak. A ZeRO-0 layout whose peak is the optimizer step reads "activations 0" at the peak; its
forward/backward moment must still show them, in the JSON, the CLI text and the dashboard chart."""

import io
import json
from pathlib import Path

import numpy as np
import pytest

from planner import activations as A
from planner import api, cli, memory
from planner.layout import single
from planner.stage import Stage

GiB = 2**30
APP = Path(__file__).resolve().parent.parent / "app.py"
# llama-3-8b on 8 GPUs under DeepSpeed ZeRO-0 with one sequence a micro-batch: the whole fp32 master,
# Adam states and gradients on every rank outweigh one micro-batch's activations, so the peak is
# the optimizer step (its fp32 gradient copies); from two sequences on, forward/backward is
STEP_PEAK = dict(model="llama-3-8b", cluster={"gpus": 8}, training={"engine": "deepspeed"})
FWD, STEP, REDUCE = memory.PHASES
NOT_OVERHEAD = memory.BREAKDOWN_KEYS[:-1]


def estimate(mbs: int, zero: int = 0, **layout):
    return api.estimate(STEP_PEAK["model"], STEP_PEAK["cluster"], STEP_PEAK["training"],
                        {"zero": zero, "mbs": mbs, **layout})


@pytest.fixture(scope="module")
def step_peak():
    return estimate(1)


def test_the_layout_peaks_at_the_optimizer_step_and_its_phase_is_the_peak(step_peak):
    mem = step_peak.memory
    assert mem["peak_phase"] == STEP
    assert mem["breakdown"]["activations"] == 0  # what users read as "not modelled"
    assert set(mem["phases"]) == {FWD, STEP}  # ZeRO-0 DeepSpeed makes no reduction copy
    step = mem["phases"][STEP]
    assert step["gpu_bytes"] == mem["gpu_bytes"]
    assert step["allocated_bytes"] == mem["allocated_bytes"]
    assert step["reserved_bytes"] == mem["reserved_bytes"]
    assert step["required_bytes"] == mem["required_bytes"]
    assert step["breakdown"] == mem["breakdown"]


def test_forward_backward_holds_the_activations_the_activation_model_gives(step_peak):
    fwd = step_peak.memory["phases"][FWD]
    assert fwd["allocated_bytes"] < step_peak.memory["allocated_bytes"]  # not the peak
    # planner/activations.py's term for this layout, straight (HF modules: no autocast weight copies)
    lay = single(tp=1, pp=1, dp=8, mbs=1, gas=1024 // 8, zero=0)
    expected = float(np.ceil(A.stage_activation_bytes(Stage(step_peak.model, step_peak.training, lay, np.zeros(1)))[0]))
    assert fwd["breakdown"]["activations"] == expected > 1 * GiB


def test_forward_backward_is_what_a_larger_micro_batch_shows_at_its_peak(step_peak):
    """At two sequences a micro-batch forward/backward is the peak, so its breakdown is the one the
    peak has always shown: the model states are the same (they do not read the micro-batch) and
    activations and logits are twice one sequence's (every term is per sequence here: no
    pipeline, no recompute working set that does not scale)."""
    fwd = step_peak.memory["phases"][FWD]["breakdown"]
    two = estimate(2).memory
    assert two["peak_phase"] == FWD and two["phases"][FWD]["breakdown"] == two["breakdown"]
    for key in ("params", "grads", "optimizer", "buffers", "overhead"):
        assert fwd[key] == two["breakdown"][key], key
    for key in ("activations", "logits"):
        assert 2 * fwd[key] == two["breakdown"][key] > 0, key
    # the optimizer step does not read the micro-batch either
    assert two["phases"][STEP]["breakdown"] == step_peak.memory["phases"][STEP]["breakdown"]


def phases_add_up(mem: dict) -> None:
    """Every moment's parts add up to its allocated bytes (the overhead is what the device holds
    beyond: the allocator's reserve, the CUDA context and NCCL's buffers), and gpu_bytes to all."""
    outside = mem["required_bytes"] - mem["allocated_bytes"]
    for name, p in mem["phases"].items():
        assert sum(p["breakdown"][k] for k in NOT_OVERHEAD) == p["allocated_bytes"] > 0, name
        assert sum(p["breakdown"].values()) == p["gpu_bytes"], name
        assert p["required_bytes"] == p["allocated_bytes"] + outside, name
        assert p["allocated_bytes"] <= p["reserved_bytes"] and p["gpu_bytes"] >= p["required_bytes"], name
        assert p["allocated_bytes"] <= mem["allocated_bytes"], name  # the peak is the largest
    assert mem["phases"][mem["peak_phase"]]["gpu_bytes"] == mem["gpu_bytes"]


@pytest.mark.parametrize("zero,extra", [(0, {}), (1, {}), (2, {}), (3, {}), (1, {"pp": 2}),
                                        (1, {"offload_optimizer": "cpu"})])
def test_every_phase_adds_up(zero, extra):
    e = estimate(1, zero, **extra)
    phases_add_up(e.memory)
    for stage in e.memory["per_stage"]:  # and per pipeline stage, each at its own peak
        assert stage["phases"][stage["peak_phase"]]["gpu_bytes"] == stage["gpu_bytes"]
        assert stage["phases"][stage["peak_phase"]]["breakdown"] == stage["breakdown"]
        for name, p in stage["phases"].items():
            assert sum(p["breakdown"][k] for k in NOT_OVERHEAD) == p["allocated_bytes"], name


def test_zero1_reduction_holds_the_full_gradient_beside_the_new_partition():
    """DeepSpeed ZeRO-1 at the accumulation boundary (memory.reduction_copy_bytes): the full 16-bit
    gradient backward built and the partition it is reduced into, no activation."""
    mem = estimate(1, 1).memory
    assert set(mem["phases"]) == {FWD, STEP, REDUCE}
    fwd, step, red = (mem["phases"][p]["breakdown"] for p in (FWD, STEP, REDUCE))
    params = step_params = 8_030_261_248  # llama-3-8b, whole on each of the 8 ranks (no TP/PP)
    assert fwd["grads"] == 2 * params  # bf16, whole until the boundary
    assert step["grads"] == pytest.approx(2 * step_params / 8, abs=8)  # the rank's partition
    assert red["grads"] == fwd["grads"] + step["grads"]
    assert red["activations"] == red["logits"] == step["activations"] == 0
    assert fwd["activations"] > 0


def test_recommend_records_carry_phases():
    r = api.recommend("llama-3-8b", {"gpus": 8}, {"engine": "deepspeed"}, top=3)
    assert r.layouts
    for rec in r.layouts:
        phases_add_up(rec["memory"])
        assert rec["memory"]["phases"][rec["memory"]["peak_phase"]]["breakdown"] == rec["memory"]["breakdown"]


def test_json_only_gains_keys(step_peak):
    out = io.StringIO()
    assert cli.main(["estimate", "--model", "llama-3-8b", "--gpus", "8", "--engine", "deepspeed", "--zero", "0",
                     "--mbs", "1", "--json"], out=out) == 0
    mem = json.loads(out.getvalue())["memory"]
    assert mem["phases"] == step_peak.memory["phases"]
    assert {"gpu_bytes", "allocated_bytes", "reserved_bytes", "required_bytes", "breakdown", "peak_phase",
            "per_stage"} <= set(mem)
    assert set(mem["phases"][FWD]) == {"gpu_bytes", "allocated_bytes", "reserved_bytes", "required_bytes", "breakdown"}
    assert list(mem["phases"][FWD]["breakdown"]) == list(memory.BREAKDOWN_KEYS)


def text_of(*argv) -> str:
    out = io.StringIO()
    assert cli.main(["estimate", "--model", "llama-3-8b", "--gpus", "8", "--engine", "deepspeed", "--zero", "0",
                     *argv], out=out) == 0
    return out.getvalue()


def test_cli_names_the_peak_and_the_forward_backward_moment(step_peak):
    text = text_of("--mbs", "1")
    assert "at the optimizer step peak" in text
    fwd = step_peak.memory["phases"][FWD]
    line = next(line for line in text.splitlines() if line.startswith("forward/backward: "))
    assert line.startswith(f"forward/backward: {fwd['gpu_bytes'] / GiB:.2f} GiB, "
                           f"activations {fwd['breakdown']['activations'] / GiB:.2f} GiB")
    # at a forward/backward peak the table already shows them: no extra line
    text = text_of("--mbs", "2")
    assert "at the forward/backward peak" in text
    assert not any(line.startswith("forward/backward: ") for line in text.splitlines())


# ---------------------------------------------------------------------------------------------
# the dashboard


def load_charts():
    pytest.importorskip("streamlit")
    pytest.importorskip("altair")
    from dashboard import charts

    return charts


def chart_values(chart) -> list:
    spec = chart.to_dict()
    bars = spec["layer"][0]
    return spec["datasets"][bars["data"]["name"]]


def test_memory_chart_draws_the_chosen_moment(step_peak):
    charts = load_charts()
    est = step_peak.to_json()
    assert charts.memory_moments(est) == ["peak", FWD, STEP]
    peak, fwd = charts.memory_chart(est), charts.memory_chart(est, FWD)
    assert peak.to_dict()["title"] == "Memory per pipeline stage at the peak (optimizer step)"
    assert fwd.to_dict()["title"] == "Memory per pipeline stage at the forward/backward moment"
    drawn = {r["component"]: r["GiB"] for r in chart_values(fwd)}
    assert drawn["activations"] == step_peak.memory["phases"][FWD]["breakdown"]["activations"] / GiB > 1
    assert "activations" not in {r["component"] for r in chart_values(peak)}  # 0 at the step: not drawn


@pytest.mark.slow
def test_dashboard_has_the_moment_selector_and_names_the_moment():
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP), default_timeout=120).run()
    assert not at.exception
    at.radio(key="mode").set_value("manual").run()
    at.selectbox(key="model_name").set_value("llama-3-8b")
    at.number_input(key="gpus").set_value(8)
    at.selectbox(key="engine").set_value("deepspeed").run()
    at.selectbox(key="man_zero").set_value(0)
    at.number_input(key="man_mbs").set_value(1)
    at.run()
    assert not at.exception and not at.error
    moment = at.radio(key="memory_moment")
    assert moment.options == ["peak", FWD, STEP] and moment.value == "peak"
    title = json.loads(at.get("vega_lite_chart")[0].proto.spec)["title"]
    assert title == "Memory per pipeline stage at the peak (optimizer step)"
    moment.set_value(FWD).run()
    assert not at.exception
    assert json.loads(at.get("vega_lite_chart")[0].proto.spec)["title"] == \
        "Memory per pipeline stage at the forward/backward moment"
    assert len(at.get("vega_lite_chart")) == 2  # memory and step time, as before
