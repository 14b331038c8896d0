"""Calibration profiles as the planner reads them: refused when bad, applied when good, and the fit
call as a margin with an error band (planner/calibration.py; calibrate/ writes the profiles)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from planner import api, calibration, cli
from planner.errors import InputError

ROOT = Path(__file__).resolve().parent.parent
LLAMA7 = ["estimate", "--model", "llama-2-7b", "--gpus", "8", "--zero", "3", "--json"]


def profile(tmp_path, gpu="h100-sxm", fit=None, schema=calibration.SCHEMA, name="lab") -> Path:
    doc = {"schema": schema, "profile": name, "hardware": {"gpu": gpu}, "environment": {}, "runs": [], "fit": fit}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


def run_cli(argv, capsys):
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("make, says", [
    (lambda p: "nope", "no profile 'nope'"),
    (lambda p: str(p / "missing.json"), "no such file"),
    (lambda p: (p / "bad.json").write_text("{not json") and str(p / "bad.json"), "not valid JSON"),
    (lambda p: str(ROOT / "data" / "coefficients.json"), "not a calibration profile"),
    (lambda p: str(profile(p, schema="planner-calibration/0")), "not a calibration profile"),
    (lambda p: str(profile(p, gpu="a100-80gb")), "measured on a100-80gb, not h100-sxm"),
    (lambda p: str(profile(p, fit={"coefficients": {"time": {"made_up": {"value": 1}}}})), "unknown coefficient"),
    (lambda p: str(profile(p, fit={"coefficients": {"memory": {"allocator_fragmentation": {"value": -1}}}})),
     "must be a number >= 0"),
    (lambda p: str(profile(p, fit={"bands": {"peak_memory": float("nan")}}).with_suffix(".json")), "band"),
])
def test_a_bad_profile_is_one_line_and_exit_2(tmp_path, capsys, make, says):
    spec = make(tmp_path)
    if says == "band":  # NaN is no JSON number: write the text by hand
        Path(spec).write_text(Path(spec).read_text().replace("NaN", "1e400"))
        says = "overflows"
    code, out, err = run_cli(LLAMA7 + ["--calibration", spec], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("planner: error: --calibration:") and says in err, err


def test_no_profile_means_the_priors_and_says_so(capsys):
    code, out, _ = run_cli(LLAMA7[:-1], capsys)
    assert code == 0 and "uncalibrated prior" in out
    d = api.estimate("llama-2-7b", {"gpus": 8}, {}, {"zero": 3}).to_json()
    assert d["cluster"]["calibration"] is None
    assert d["memory"]["error_band"] == 0.10  # data/coefficients.json bands.peak_memory prior


def test_fitted_coefficients_and_band_reach_the_answer(tmp_path):
    fit = {"coefficients": {"memory": {"allocator_fragmentation": {"value": 0.5}},
                            "time": {"gemm_efficiency_max": {"value": 0.4}}},
           "bands": {"peak_memory": 0.2}}
    path = profile(tmp_path, fit=fit)
    prior = api.estimate("llama-2-7b", {"gpus": 8}, {}, {"zero": 3})
    fitted = api.estimate("llama-2-7b", {"gpus": 8, "calibration": str(path)}, {}, {"zero": 3})
    m0, m1 = prior.memory, fitted.memory
    assert m1["allocated_bytes"] == m0["allocated_bytes"]  # the tensors do not depend on the allocator
    assert m1["reserved_bytes"] == math.ceil(m1["allocated_bytes"] * 1.5)  # allocated x (1 + 0.5)
    assert m0["reserved_bytes"] == math.ceil(m0["allocated_bytes"] * 1.19)  # the 19 % prior
    assert m1["gpu_bytes"] - m0["gpu_bytes"] == m1["reserved_bytes"] - m0["reserved_bytes"]  # context, NCCL unchanged
    assert m1["required_bytes"] == m0["required_bytes"]  # what must fit: allocated, context, NCCL
    assert m1["error_band"] == 0.2 and m1["error_band_bytes"] == math.ceil(0.2 * m1["required_bytes"])
    # GEMMs at 0.4 of peak instead of 0.8: the GEMM-bound part of the compute doubles (about half of
    # an eager Llama-2-7B block's on H100, beside its memory-bound kernels and attention)
    assert fitted.time["breakdown"]["compute"] > 1.4 * prior.time["breakdown"]["compute"]
    c = fitted.to_json()["cluster"]["calibration"]
    assert c["profile"] == "lab" and c["coefficients"]["memory.allocator_fragmentation"] == 0.5


def test_verdict_is_a_margin_against_the_band():
    base = api.estimate("llama-2-7b", {"gpus": 8}, {}, {"zero": 3}).memory
    need_gib = base["required_bytes"] / 2**30  # capacity does not change what the rank needs

    def verdict(capacity_gib):
        m = api.estimate("llama-2-7b", {"gpus": 8, "gpu_memory_gib": capacity_gib}, {}, {"zero": 3}).memory
        assert m["fit_margin_bytes"] == m["capacity_bytes"] - m["required_bytes"]
        return m["verdict"]

    assert verdict(need_gib * 1.15) == "fits"  # the +10 % band ends below capacity
    assert verdict(need_gib * 1.05) == "borderline"  # capacity inside need +-10 %
    assert verdict(need_gib * 0.95) == "borderline"
    assert verdict(need_gib * 0.85) == "oom"  # even 10 % less would not fit


def test_recommend_names_the_profile_and_band(tmp_path):
    path = profile(tmp_path, fit={"bands": {"peak_memory": 0.03}})
    r = api.recommend(7e9, {"gpus": 8, "calibration": str(path)}, {}, top=1).to_json()
    assert r["assumptions"]["calibration"] == "lab" and r["assumptions"]["peak_memory_band"] == 0.03
    assert r["layouts"][0]["memory"]["verdict"] in ("fits", "borderline")


def test_a_borderline_first_names_the_fastest_layout_that_clears_the_band(tmp_path):
    """70B on 16 H100s under Megatron: the fastest layout's peak is within the +-10 % prior band of
    capacity; the answer names the fastest one whose peak plus its band still fits, in the table or past it."""
    r = api.recommend(70e9, {"gpus": 16}, {"engine": "megatron"}, top=5)
    first, clear = r.layouts[0]["memory"], r.clear_fit
    assert first["verdict"] == "borderline"
    assert clear["memory"]["required_bytes"] * 1.10 <= clear["memory"]["capacity_bytes"]  # need + 10 % fits
    assert [x["memory"]["verdict"] for x in r.layouts[:clear["rank"]]] == ["borderline"] * (clear["rank"] - 1) + ["fits"]
    assert clear["relative_speed"] == pytest.approx(r.layouts[clear["rank"] - 1]["throughput"]["tokens_per_s"]
                                                    / r.layouts[0]["throughput"]["tokens_per_s"])
    # with the table cut to #1 the same layout is named from past it
    one = api.recommend(70e9, {"gpus": 16}, {"engine": "megatron"}, top=1)
    assert one.clear_fit["rank"] is None and one.clear_fit["layout"] == clear["layout"]
    # a calibrated band of 3 % clears #1 itself: nothing to name
    path = profile(tmp_path, fit={"bands": {"peak_memory": 0.03}})
    calibrated = api.recommend(70e9, {"gpus": 16, "calibration": str(path)}, {"engine": "megatron"}, top=1)
    assert calibrated.layouts[0]["memory"]["verdict"] == "fits" and calibrated.clear_fit is None


def test_append_keeps_runs_refuses_other_hardware_and_writes_atomically(tmp_path, monkeypatch):
    path = tmp_path / "p.json"
    calibration.append_runs(path, [{"name": "a"}], "p", "cpu", {"torch": "x"})
    calibration.append_runs(path, [{"name": "b"}], "p", "cpu", {"torch": "x"})
    assert [r["name"] for r in json.loads(path.read_text())["runs"]] == ["a", "b"]
    with pytest.raises(InputError, match="measured on cpu, not h100-sxm"):
        calibration.append_runs(path, [{"name": "c"}], "p", "h100-sxm", {})
    before = path.read_bytes()

    def killed(*args):  # the process dies between writing the temporary file and renaming it
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.replace", killed)
    with pytest.raises(InputError, match="No space left"):
        calibration.append_runs(path, [{"name": "c"}], "p", "cpu", {})
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["p.json"]


def test_a_profile_costs_no_heavy_import(tmp_path):
    path = profile(tmp_path, fit={"bands": {"peak_memory": 0.03}})
    code = (
        "import sys, io; from planner.cli import main;"
        f"assert main(['estimate','--model','llama-2-7b','--gpus','8','--calibration',{str(path)!r},'--json'],"
        " out=io.StringIO()) == 0;"
        "print(','.join(m for m in ('torch','deepspeed','scipy.optimize','calibrate') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_shipped_cpu_profile_still_matches_the_planner():
    """data/calibration/cpu-gloo.json holds real runs (python -m calibrate run cpu-gloo --gpu cpu --update-shipped);
    every memory case measured there is predicted again by today's planner and must still match
    the measured bytes (up to the optimizers' 0-d scalars)."""
    pytest.importorskip("torch")
    from calibrate.engines import deepspeed_cases, torch_cases

    doc = calibration.read_profile("cpu-gloo")
    assert doc["hardware"]["gpu"] == "cpu" and doc["fit"]["error"]
    known = {c.name: c for c in deepspeed_cases.cases("cpu") + torch_cases.cases("cpu")}
    checked = 0
    for run in doc["runs"]:
        if run["kind"] != "memory" or run["outcome"]["status"] != "ok" or run["name"] not in known \
                or "model_state_bytes" not in run["measurement"]:
            continue
        predicted = known[run["name"]].predict().get("model_state_bytes")
        measured = run["measurement"]["model_state_bytes"]
        if predicted is None:  # FSDP2 --zero 2: no planner figure at the measured moment
            continue
        assert 0 <= measured - predicted <= deepspeed_cases.SCALARS_BYTES, (run["name"], predicted, measured)
        checked += 1
    assert checked >= 4


def test_a_cpu_profile_is_refused_for_a_gpu(capsys):
    code, out, err = run_cli(LLAMA7 + ["--calibration", "cpu-gloo"], capsys)
    assert code == 2 and "measured on cpu, not h100-sxm" in err
