"""torchtitan's pipeline stages under FSDP2: what the planner books against torch's own engines.

One torchrun launch of calibrate/engines/fsdp_pipe_worker.py for both schedules (one after the other,
a model, stage and optimizer of its own each) on 2 gloo ranks: a 2-layer
transformers Llama (158,016 parameters) under fully_shard (bf16 parameters, fp32 reduction,
reshard_after_forward False as torchtitan sets it with a pipeline) inside a torch.distributed.
pipelining stage, Schedule1F1B with 4 micro-batches and ScheduleGPipe with 2, then AdamW. Each
rank counts every FSDPParam's tensors and AdamW's states after each micro-batch's backward, around
perform_reduce_grad and after the step. The planner's figures are those of torchtitan's stage 0 of
pp 2 over dp 2, per parameter of the stage (calibrate/engines/torch_cases.py pipelined_prediction).
"""

from __future__ import annotations

import json

import pytest

from calibrate.engines.torch_cases import pipelined_prediction, pipelined_terms

pytestmark = pytest.mark.slow
RANKS = 2


SCHEDULES = [("1f1b", 4), ("gpipe", 2)]


@pytest.fixture(scope="module")
def launched():
    """Each rank's results, one a schedule of SCHEDULES."""
    from calibrate.harness.launch import launch

    runs = [{"m": m, "schedule": schedule} for schedule, m in SCHEDULES]
    out = launch("calibrate.engines.fsdp_pipe_worker", [json.dumps({"runs": runs})], nproc=RANKS, timeout_s=600)
    assert out.status == "ok" and len(out.ranks) == RANKS, out.to_json()
    return out.ranks


@pytest.fixture(scope="module", params=range(len(SCHEDULES)), ids=["1f1b-m4", "gpipe-m2"])
def run(request, launched):
    ranks = [rank["runs"][request.param] for rank in launched]
    assert {rank["m"] for rank in ranks} == {SCHEDULES[request.param][1]}
    return ranks[0]["m"], ranks


def test_every_micro_batch_keeps_the_stage_gathered_with_fp32_gradients(run):
    # stage.py backward_maybe_with_nosync: no reduction and no reshard until perform_reduce_grad, the
    # gradients accumulated in the fp32 reduce dtype (_fsdp_param.py to_accumulated_grad_if_needed):
    # bf16 parameters 2 B, fp32 gradients 4 B, the fp32 shard and AdamW's two states 12 / 2 = 6 B
    m, ranks = run
    planned = pipelined_prediction(m, RANKS)["backward"]
    assert planned == {"weights": 2.0, "optimizer": 6.0, "grads": 4.0}
    for rank in ranks:
        moments = [x for x in rank["moments"] if x["moment"].startswith("backward") or x["moment"] == "before reduce"]
        assert len(moments) == m + 1
        for x in moments:
            assert pipelined_terms(x["held"], rank["params"]) == planned, x["moment"]


def test_the_reduction_after_the_schedule_shards_gradients_and_frees_the_gathered_stage(run):
    # perform_reduce_grad: post_backward reduce-scatters into the fp32 shard (4 / 2 = 2 B) and reshards
    m, ranks = run
    planned = pipelined_prediction(m, RANKS)["reduced"]
    for rank in ranks:
        after = next(x for x in rank["moments"] if x["moment"] == "after reduce")
        assert pipelined_terms(after["held"], rank["params"]) == {"weights": 0.0, **planned}
