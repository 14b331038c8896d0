"""DeepSpeed's pipeline engine with ZeRO-1 and the optimizer offloaded to the CPU, against the planner.

One torchrun launch of calibrate/engines/deepspeed_pipe_worker.py (DeepSpeed 0.19.8, 2 gloo ranks, one
pipeline stage each, dp 1; a stack of 4 bf16 MLP blocks, 64 -> 256 -> 64: 66,176 parameters a stage,
the largest tensors 64 x 256 = 16,384 elements; gradient accumulation 4; torch's AdamW, not
DeepSpeedCPUAdam: the same fp32 states). Each rank counts the distinct storages the engine holds
after every backward pass of the schedule, by dtype. On the CPU accelerator the GPU and the host are
one memory, so the count is the planner's GPU bytes plus its host bytes, per parameter of the stage
(the MLP stack is no catalog model: the planner's bytes per parameter come from Llama-2-7B in the
same layout, pp 2, dp 1, ZeRO-1, offload cpu, gas 4; the staging buffers from the largest tensor).
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before any deepspeed import

import pytest

from planner import layout, sharding, states
from planner.model import lookup
from planner.engines.deepspeed.memory import deepspeed_offload_staging_bytes
from planner.stage import Stage

pytestmark = pytest.mark.slow

STAGE_PARAMS, LARGEST, GAS = 66_176, 64 * 256, 4


@pytest.fixture(scope="module")
def ranks():
    pytest.importorskip("deepspeed")
    from calibrate.harness.launch import launch

    cfg = {"zero": 1, "gas": GAS, "ds": {"zero_force_ds_cpu_optimizer": False, "zero_optimization": {
        "stage": 1, "reduce_bucket_size": 4096, "allgather_bucket_size": 4096,
        "offload_optimizer": {"device": "cpu", "pin_memory": False}}}}
    out = launch("calibrate.engines.deepspeed_pipe_worker", [json.dumps(cfg)], nproc=2, env={"DS_ACCELERATOR": "cpu"},
                 timeout_s=240)
    assert out.status == "ok" and len(out.ranks) == 2, (out.status, out.error, out.log_tail)
    return out.ranks


def _planned_per_param() -> dict:
    """Bytes per parameter of the stage: GPU (weights, gradients), host (less the staging buffer), and
    the staging buffer's bytes per element of the largest tensor (on each side)."""
    model, training = lookup("llama-2-7b"), layout.Training(seq_len=16, engine="deepspeed")
    lay = layout.single(pp=2, dp=1, zero=1, gas=GAS, offload_optimizer="cpu")
    params = sum(sharding.rank_params(Stage(model, training, lay, 0)))[0]
    largest = sharding.largest_tensor_params(Stage(model, training, lay, 0))[0]
    staging = deepspeed_offload_staging_bytes(Stage(model, training, lay, 0))[0]
    return {"weights": states.weight_bytes(Stage(model, training, lay, 0))[0] / params,
            "grads": states.grad_bytes(Stage(model, training, lay, 0))[0] / params,
            "gpu_optimizer": (states.optimizer_bytes(Stage(model, training, lay, 0))[0] - staging) / params,
            "host": (states.host_bytes(Stage(model, training, lay, 0))[0] - staging) / params,
            "staging_per_element": staging / largest}


def test_planner_terms():
    # 16-bit weights, the whole 16-bit gradient through the schedule (the pipeline defers the
    # reduction), nothing else of the optimizer on the GPU; on the host fp32 master, its gradient and
    # Adam's two states (16) and the 16-bit copy of the partition (2); the staging buffer 2 B an element
    plan = _planned_per_param()
    assert (plan["weights"], plan["grads"], plan["gpu_optimizer"]) == (2.0, 2.0, 0.0)
    assert plan["host"] == pytest.approx(18.0, rel=1e-12)
    assert plan["staging_per_element"] == 2.0


def test_pipeline_zero1_offload_holds_what_the_planner_books(ranks):
    """Measured on both stages after every backward pass: bf16 462,592 B = (2 + 2 + 2) x 66,176 + the
    staging buffer twice (2 x 2 x 16,384); fp32 1,058,816 B = 16 x 66,176 (+ 8 B of scalars)."""
    plan = _planned_per_param()
    # the host's 16-bit part: its bytes less the 16 fp32 ones (master, gradient, two moments)
    sixteen = (plan["weights"] + plan["grads"] + plan["host"] - 16) * STAGE_PARAMS \
        + 2 * plan["staging_per_element"] * LARGEST
    for rank in ranks:
        assert rank["optimizer"] == "DeepSpeedZeroOptimizer" and rank["stage_params"] == STAGE_PARAMS
        assert len(rank["after_backward"]) == GAS
        for held in rank["after_backward"]:
            assert held["by_dtype"]["bfloat16"] == sixteen == 462_592
            assert 0 <= held["by_dtype"]["float32"] - 16 * STAGE_PARAMS <= 64
