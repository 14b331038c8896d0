"""FSDP2 on 2 gloo ranks (torchrun, calibrate/engines/fsdp_worker.py) against the planner's fsdp engine.

Every dimension of the model is even, so fully_shard's dim-0 shards need no padding and the
expected bytes are exact: P = 158,016 parameters (the tiny Llama of calibrate/engines/fsdp_worker.py)."""

from __future__ import annotations

import pytest

from calibrate.harness.record import run_case
from calibrate.engines.torch_cases import cases

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
    if "reshard-true" in name:  # --zero 3 (see calibrate/engines/torch_cases.py for --zero 2)
        assert r["prediction"]["model_state_bytes"] == m["model_state_bytes"]
    assert r["prediction"]["grad_bytes"] == m["grad_bytes"]


def test_cpu_offload_keeps_the_shard_its_gradient_and_the_states_on_the_host(records):
    # CPUOffloadPolicy: the fp32 shard (FSDP2 keeps no 16-bit one), the fp32 gradient shard and AdamW's
    # two states, (4 + 4 + 8) / D bytes per parameter, all host tensors; the planner booked a 16-bit
    # shard there too (18 / D) until this count
    r = records["fsdp2/bf16-mixed/offload"]
    assert r["outcome"]["status"] == "ok", r["outcome"]
    assert r["measurement"]["host_bytes"] == 16 * P // D == r["prediction"]["host_bytes"]


@pytest.fixture(scope="module")
def gathers():
    """{reshard_after_forward: rank 0's record} of FSDP2 steps with 1, 2 and 4 micro-batches each."""
    import json

    from calibrate.harness.launch import launch

    out = {}
    for reshard in (True, False):
        cfg = {"mixed": True, "reshard_after_forward": reshard, "mbs": 2, "seq": 32, "gathers_for": [1, 2, 4]}
        run = launch("calibrate.engines.fsdp_worker", [json.dumps(cfg)], nproc=D, timeout_s=180)
        assert run.status == "ok", run.to_json()
        out[reshard] = run.ranks[0]
    return out


def test_fsdp2_gathers_every_micro_batch(gathers):
    """FSDP2 reshards after every backward (torch 2.13 _fully_shard.py: reshard_after_backward True
    unless set_reshard_after_backward(False)), so with reshard_after_forward False (the planner's
    --zero 2) every micro-batch's forward all-gathers each unit again: 3 units (2 layers and the
    root) x m gathers a step, m = 1, 2, 4; with True (--zero 3, the root sharded with the same
    setting) the backward gathers every unit once more: 2 x 3 x m. The planner times m gathers of
    each parameter a step for --zero 2 and 2m for --zero 3 (planner/timing.py zero3_gather_s)."""
    from planner import layout
    from planner.dp_comm import zero3_gathers_per_step

    units = gathers[False]["units"]
    assert units == 3
    assert gathers[False]["gathers_per_step"] == {"1": 3, "2": 6, "4": 12}  # units x m
    assert gathers[True]["gathers_per_step"] == {"1": 6, "2": 12, "4": 24}  # 2 x units x m
    training = layout.Training(engine="fsdp")
    for zero, reshard in ((2, False), (3, True)):
        per_unit = [float(zero3_gathers_per_step(training, layout.single(dp=2, zero=zero, gas=m))[0]) for m in (1, 2, 4)]
        measured = [gathers[reshard]["gathers_per_step"][str(m)] / units for m in (1, 2, 4)]
        assert per_unit == measured  # [1, 2, 4] for --zero 2, [2, 4, 8] for --zero 3
