"""The counts behind planner/timing.py deepspeed_step_s, taken again from the real engine: DeepSpeed's
ZeRO-1/2 step on one gloo rank (python -m calibrate.deepspeed_step_ops) against the shipped
data/references/deepspeed_step_cpu.json."""

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SHIPPED = Path(__file__).resolve().parent.parent / "data" / "references" / "deepspeed_step_cpu.json"


def test_counts_match_the_shipped_file():
    pytest.importorskip("deepspeed")
    from calibrate import deepspeed_step_ops

    shipped = json.loads(SHIPPED.read_text())["zero_step"]
    measured = deepspeed_step_ops.measure()
    assert set(measured) == set(shipped) == {"1", "2"}
    for stage, got in measured.items():
        want = shipped[stage]
        assert got["optimizer"] == want["optimizer"] == "DeepSpeedZeroOptimizer"
        # per gradient tensor: has_inf_or_nan (abs, ne, eq, mul twice each; amax, amin, logical_and,
        # logical_not; add_ into the count), the fp64 norm (_to_copy, linalg_vector_norm, detach) and the
        # bit16 update's views; the rest once a step
        assert got["ops_per_tensor"] == want["ops_per_tensor"] == 22
        assert got["ops_fixed"] == want["ops_fixed"]
        assert got["bytes_per_param"] == pytest.approx(want["bytes_per_param"], rel=1e-9)
        # bf16 gradient read by ~a dozen element-wise ops, its fp64 copy (w 8, r 8), the fp32 flat
        # gradient (w 4) and the master's copy back (r 4, w 2): far above the 2 + 2 B of one read and write
        assert 30 < got["bytes_per_param"] < 80
