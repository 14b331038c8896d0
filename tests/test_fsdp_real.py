"""FSDP2 on 2 gloo ranks (torchrun, calibrate/engines/fsdp_worker.py) against the planner's fsdp engine.

Every dimension of the model is even, so fully_shard's dim-0 shards need no padding and the
expected bytes are exact: P = 158,016 parameters (the tiny Llama of calibrate/engines/fsdp_worker.py).

Every run below is one config of the worker, and all of them share one torchrun launch (the worker
runs them in turn, a model and optimizer of their own each; calibrate/harness/record.py run_together):
the harness's FSDP2 cases of calibrate/engines/torch_cases.py that these tests check, with their own
predictions and reductions, and the two all-gather counts."""

from __future__ import annotations

import json

import pytest

from calibrate.engines.torch_cases import cases
from calibrate.harness.record import Case, run_together

pytestmark = pytest.mark.slow
P, D = 158_016, 2
STATES = ["fsdp2/bf16-mixed/reshard-true", "fsdp2/fp32/reshard-true", "fsdp2/bf16-mixed/reshard-false",
          "fsdp2/fp32/reshard-false"]
OFFLOAD = "fsdp2/bf16-mixed/offload"


def _gathers_case(reshard: bool) -> Case:
    """FSDP2 steps with 1, 2 and 4 micro-batches each; rank 0's result as it is."""
    cfg = {"mixed": True, "reshard_after_forward": reshard, "mbs": 2, "seq": 32, "gathers_for": [1, 2, 4]}
    return Case(name=f"gathers/reshard-{str(reshard).lower()}", kind="memory", config=cfg, predict=dict,
                reduce=lambda ranks: ranks[0], module="calibrate.engines.fsdp_worker", args=[json.dumps(cfg)],
                nproc=D, timeout_s=180)


@pytest.fixture(scope="module")
def records():
    """{name: record} of the one launch."""
    harness = {c.name: c for c in cases("cpu")}
    together = [harness[name] for name in STATES + [OFFLOAD]] + [_gathers_case(r) for r in (True, False)]
    assert {c.nproc for c in together} == {D}
    return {r["name"]: r for r in run_together(together)}


@pytest.mark.parametrize("name", STATES)
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
    r = records[OFFLOAD]
    assert r["outcome"]["status"] == "ok", r["outcome"]
    assert r["measurement"]["host_bytes"] == 16 * P // D == r["prediction"]["host_bytes"]


@pytest.fixture(scope="module")
def gathers(records):
    """{reshard_after_forward: rank 0's record} of FSDP2 steps with 1, 2 and 4 micro-batches each."""
    out = {}
    for reshard in (True, False):
        r = records[f"gathers/reshard-{str(reshard).lower()}"]
        assert r["outcome"]["status"] == "ok", r["outcome"]
        out[reshard] = r["measurement"]
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
