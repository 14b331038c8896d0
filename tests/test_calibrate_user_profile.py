"""A user's calibration runs land in a profile of their own ($PLANNER_HOME/calibration/NAME.json, or
--out PATH), never in a profile shipped in data/calibration/ unless --update-shipped; a name then
reads the user's profile before the shipped one (planner/calibration.py, calibrate/harness/cli.py)."""

from __future__ import annotations

import json

import pytest

from calibrate.harness import cli as calibrate_cli
from planner import calibration, cli

SHIPPED = calibration.CALIBRATION_DIR / "cpu-gloo.json"
LLAMA7 = ["estimate", "--model", "llama-2-7b", "--gpus", "8", "--zero", "3"]
GEMM = {"m": 64, "n": 64, "k": 64, "dtype": "float32", "flops": 524288.0, "gemm_s": 1.25e-05}
"""One GEMM as calibrate/benches/bench.py measures it (what the fit takes)."""


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("PLANNER_HOME", str(tmp_path))
    return tmp_path / "calibration"


@pytest.fixture
def fake_run(monkeypatch):
    """`calibrate run` with one fake case measured: the command's own path to the profile, no launch."""
    from calibrate.harness import record

    monkeypatch.setattr(calibrate_cli, "collect", lambda *a: [record.Case(
        "bench/gemm/float32/64", "gemm", {}, dict, lambda ranks: ranks[0], run_inline=lambda: dict(GEMM))])
    monkeypatch.setattr(record, "environment", lambda: {"host": "test"})


def test_run_writes_the_users_profile_and_the_name_then_reads_it(home, fake_run, capsys):
    shipped = SHIPPED.read_bytes()
    # measured on an H100 (as told), so that the planner's H100 answer takes it where it refuses the shipped one
    assert calibrate_cli.main(["run", "cpu-gloo", "--gpu", "h100-sxm"]) == 0
    assert SHIPPED.read_bytes() == shipped
    user = home / "cpu-gloo.json"
    doc = json.loads(user.read_text())
    assert doc["profile"] == "cpu-gloo" and [r["measurement"] for r in doc["runs"]] == [GEMM]
    assert f"appended to {user}" in capsys.readouterr().out
    # a name finds the user's profile first (whole: the shipped runs are not merged in)
    assert calibration.resolve_path("cpu-gloo") == user and calibration.resolve_path("h200").parent \
        == calibration.CALIBRATION_DIR
    assert calibration.known_profiles()["cpu-gloo"] == user
    assert calibration.load("cpu-gloo", "h100-sxm").path == str(user)
    assert cli.main(LLAMA7 + ["--gpu", "h100-sxm", "--calibration", "cpu-gloo"]) == 0
    capsys.readouterr()
    # report and fit work on it; the fit lands in it, the shipped file is untouched
    assert calibrate_cli.main(["report", "cpu-gloo"]) == 0
    assert "profile cpu-gloo (h100-sxm, 1 runs)" in capsys.readouterr().out
    assert calibrate_cli.main(["fit", "cpu-gloo", "--folds", "2"]) == 0
    assert f"fit written to {user}" in capsys.readouterr().out
    assert json.loads(user.read_text())["fit"] is not None and SHIPPED.read_bytes() == shipped


def test_out_writes_where_told(home, fake_run, tmp_path):
    out = tmp_path / "elsewhere" / "mine.json"
    assert calibrate_cli.main(["run", "cpu-gloo", "--gpu", "cpu", "--out", str(out)]) == 0
    assert len(json.loads(out.read_text())["runs"]) == 1 and not home.exists()


@pytest.mark.parametrize("argv, flag", [
    (["run", str(SHIPPED)], "PROFILE"),
    (["run", "mine", "--out", str(SHIPPED)], "--out"),
])
def test_a_shipped_file_is_written_only_when_asked(home, fake_run, capsys, argv, flag):
    shipped = SHIPPED.read_bytes()
    assert calibrate_cli.main(argv + (["--gpu", "cpu"] if argv[0] == "run" else [])) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"calibrate: error: {flag}:") and "--update-shipped" in err[0], err
    assert SHIPPED.read_bytes() == shipped and not home.exists()


def test_fitting_a_shipped_profile_by_name_writes_the_users_copy(home, capsys):
    shipped = SHIPPED.read_bytes()
    assert calibrate_cli.main(["fit", "cpu-gloo", "--folds", "2"]) == 0
    assert SHIPPED.read_bytes() == shipped
    user = json.loads((home / "cpu-gloo.json").read_text())
    assert len(user["runs"]) == len(json.loads(shipped)["runs"]) and user["fit"] is not None


def test_update_shipped_is_the_one_way_in(home, fake_run, monkeypatch, tmp_path):
    # a stand-in for data/calibration/, so that the real shipped file stays as it is
    monkeypatch.setattr(calibration, "CALIBRATION_DIR", tmp_path / "shipped")
    monkeypatch.setattr(calibrate_cli, "CALIBRATION_DIR", tmp_path / "shipped")
    assert calibrate_cli.main(["run", "cpu-gloo", "--gpu", "cpu", "--update-shipped"]) == 0
    shipped = tmp_path / "shipped" / "cpu-gloo.json"
    assert len(json.loads(shipped.read_text())["runs"]) == 1 and not home.exists()
    # with a user's profile of that name beside it, --update-shipped fits the shipped runs, in place
    for _ in range(2):
        assert calibrate_cli.main(["run", "cpu-gloo", "--gpu", "cpu"]) == 0
    assert calibrate_cli.main(["fit", "cpu-gloo", "--folds", "2", "--update-shipped"]) == 0
    doc = json.loads(shipped.read_text())
    assert len(doc["runs"]) == 1 and doc["fit"]["runs_used"] == 1
    assert json.loads((home / "cpu-gloo.json").read_text())["fit"] is None
