"""The counts behind planner/timing.py deepspeed_step_s and param_fetch_s, taken again from the real
engines: DeepSpeed's ZeRO-1/2 step, ZeRO-3's fetches and FSDP2's unit hooks on one gloo rank (python
-m calibrate.benches.engine_host) against the shipped data/references/engine_host_cpu.json and the priors."""

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SHIPPED = Path(__file__).resolve().parent.parent / "data" / "references" / "engine_host_cpu.json"


def test_counts_match_the_shipped_file():
    pytest.importorskip("deepspeed")
    from calibrate.benches import engine_host

    record = json.loads(SHIPPED.read_text())
    shipped, everything = record["zero_step"], engine_host.measure()
    measured = everything["zero_step"]
    assert set(measured) == set(shipped) == {"1", "2", "3", "bf16_optimizer"}
    for variant, got in measured.items():
        want = shipped[variant]
        assert got["optimizer"] == want["optimizer"]
        assert got["ops_per_tensor"] == want["ops_per_tensor"] and got["ops_fixed"] == want["ops_fixed"]
        assert got["bytes_per_param"] == pytest.approx(want["bytes_per_param"], rel=1e-9)
    for stage in ("1", "2"):
        got = measured[stage]
        assert got["optimizer"] == "DeepSpeedZeroOptimizer"
        # per gradient tensor: has_inf_or_nan (abs, ne, eq, mul twice each; amax, amin, logical_and,
        # logical_not; add_ into the count), the fp64 norm (_to_copy, linalg_vector_norm, detach) and the
        # bit16 update's views; the rest once a step
        assert got["ops_per_tensor"] == 22
        # bf16 gradient read by ~a dozen element-wise ops, its fp64 copy (w 8, r 8), the fp32 flat
        # gradient (w 4) and the master's copy back (r 4, w 2): far above the 2 + 2 B of one read and write
        assert 30 < got["bytes_per_param"] < 80
    assert measured["3"]["optimizer"] == "DeepSpeedZeroOptimizer_Stage3"
    # bf16 with fp32 gradient accumulation: BF16_Optimizer, which norms its flat fp32 gradients
    assert measured["bf16_optimizer"]["optimizer"] == "BF16_Optimizer"
    assert measured["bf16_optimizer"]["ops_per_tensor"] < 22
    # ZeRO-3: each Llama layer fetches 13 submodules a pass (the layer, self_attn, q, k, v, o, mlp, gate,
    # up, down, act_fn, two norms), forward and backward: 26. The host's time is wall-clock, which a
    # loaded machine bends (a negative difference was measured once): benchmarks/engine_host.py prints it
    fetch, want = everything["zero3_fetch"], record["zero3_fetch"]
    assert fetch["fetches_per_layer"] == want["fetches_per_layer"] == 26
    assert fetch["param_modules_per_layer"] == 9
    # FSDP2's hooks: the operators they dispatch per unit are counted exactly (copy-in, copy-out,
    # views and casts of the unshard, the reduce-scatter's chunk_cat and division)
    for p in ("forward", "backward"):
        assert everything["fsdp_unit"][p]["ops"] == record["fsdp_unit"][p]["ops"]
