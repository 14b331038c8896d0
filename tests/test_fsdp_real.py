"""FSDP2 on 2 gloo ranks (torchrun, calibrate/fsdp_worker.py) against the planner's fsdp engine.

Every dimension of the model is even, so fully_shard's dim-0 shards need no padding and the
expected bytes are exact: P = 158,016 parameters (the tiny Llama of calibrate/fsdp_worker.py)."""

from __future__ import annotations

import pytest

from calibrate.record import run_case
from calibrate.torch_cases import cases

pytestmark = pytest.mark.slow
P, D = 158_016, 2


@pytest.fixture(scope="module")
def records():
    return {r["name"]: r for r in (run_case(c) for c in cases("cpu"))}


@pytest.mark.parametrize("name", ["fsdp2/bf16-mixed/reshard-true", "fsdp2/fp32/reshard-true",
                                  "fsdp2/bf16-mixed/reshard-false", "fsdp2/fp32/reshard-false"])
def test_model_states(records, name):
    r = records[name]
    assert r["outcome"]["status"] == "ok", r["outcome"]
    m = r["measurement"]
    # MixedPrecisionPolicy(bf16, fp32) or none: the shard stays fp32 (the master), fp32 gradients,
    # AdamW exp_avg + exp_avg_sq: (4 + 4 + 8) / D bytes per parameter, nothing else
    assert m["param_dtype"] == "torch.float32"
    assert m["grad_bytes"] == 4 * P // D
    assert m["model_state_bytes"] == 16 * P // D
    if "reshard-true" in name:  # --zero 3 (see calibrate/torch_cases.py for --zero 2)
        assert r["prediction"]["model_state_bytes"] == m["model_state_bytes"]
    assert r["prediction"]["grad_bytes"] == m["grad_bytes"]
