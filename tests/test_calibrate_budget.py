"""`python -m calibrate run --budget-s`: the one-command calibration stops launching cases once its wall
time is spent, skipping a case whose last measured run no longer fits and cutting the others' timeout
to what is left; what it skipped is named, and nothing is written for it."""

from __future__ import annotations

import json

import pytest

from calibrate.harness.cli import last_wall_s, main

GEMM = "bench/gemm/float32/64"  # an in-process micro-benchmark of a few milliseconds


def _runs(path) -> list:
    return json.loads(path.read_text())["runs"]


def test_a_case_measured_longer_than_what_is_left_is_skipped(tmp_path, capsys):
    path = tmp_path / "p.json"
    assert main(["run", str(path), "--only", GEMM, "--budget-s", "60"]) == 0  # fits: measured
    assert [r["name"] for r in _runs(path)] == [GEMM]
    # its last run is taken as what it costs: one that took 100 s does not fit in 60
    doc = json.loads(path.read_text())
    doc["runs"][0]["outcome"]["wall_s"] = 100.0
    path.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["run", str(path), "--only", GEMM, "--budget-s", "60"]) == 0
    out = capsys.readouterr().out
    assert f"skipped 1 case(s) for --budget-s 60: {GEMM}" in out
    assert len(_runs(path)) == 1  # nothing appended for it
    # without a budget it runs again
    assert main(["run", str(path), "--only", GEMM]) == 0 and len(_runs(path)) == 2


def test_a_bad_budget_is_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "p.json"
    for bad in ("0", "-5"):
        assert main(["run", str(path), "--only", GEMM, "--budget-s", bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--budget-s" in err[0], err
    with pytest.raises(SystemExit) as exit_:  # argparse's own refusal, one line too
        main(["run", str(path), "--only", GEMM, "--budget-s", "abc"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and "--budget-s" in err[0], err
    assert not path.exists()


def test_a_sweep_is_timed_as_its_one_launch():
    runs = [{"name": "bench/collectives/all_reduce/1024", "kind": "collective", "outcome": {"wall_s": 9.3}},
            {"name": "bench/collectives/all_gather/4096", "kind": "collective", "outcome": {"wall_s": 9.3}},
            {"name": "fsdp2/fp32/reshard-true", "kind": "memory", "outcome": {"wall_s": 24.5}},
            {"name": "fsdp2/fp32/reshard-true", "kind": "memory", "outcome": {"wall_s": 22.0}}]
    assert last_wall_s(runs) == {"bench/collectives": 9.3, "fsdp2/fp32/reshard-true": 22.0}  # the latest
