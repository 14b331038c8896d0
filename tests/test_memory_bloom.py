"""DeepSpeed's PipelineEngine buffers (planner/activations.py deepspeed_pipe_buffer_bytes), the engine
BLOOM trained on (Megatron-DeepSpeed's GPTModelPipe under deepspeed.runtime.pipe).

Two sources, independent of the planner: DeepSpeed 0.19.8 runtime/pipe/engine.py and schedule.py read
as arithmetic (written beside each assert), and the engine itself on 2 and 4 gloo ranks
(calibrate/engines/deepspeed_pipe_buffers_worker.py: it counts by distinct storage what the engine holds in
pipe_buffers, pipe_recv_buf and grad_layer after every instruction of two steps, and whether a later
stage runs its first module on the kept buffer or on a copy)."""

from __future__ import annotations

import json
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before any deepspeed import

import numpy as np
import pytest

from planner import activations as A
from planner import layout
from planner.model import lookup, with_overrides
from planner.stage import Stage

# BLOOM-176B's prequel shape (bigscience train/tr11-176B-ml/chronicles-prequel.md, '48 node contenders':
# NHIDDEN=14336, NLAYERS=72, seq 2048, vocab padded to 250880), Megatron-DeepSpeed, TP 8, PP 12, MBS 8
H, S, V, MBS, TP, PP, GAS = 14336, 2048, 250_880, 8, 8, 12, 64
B = S * MBS * H * 2  # one micro-batch's boundary hidden states [s, b, h] in bf16: 469,762,048 B


def _bloom(stage: int, tp: int = TP, engine: str = "megatron-deepspeed") -> dict:
    model = with_overrides(lookup("gpt3-175b"), layers=72, hidden=H, heads=64, kv_heads=64, ffn=4 * H, vocab=V)
    training = layout.Training(seq_len=S, engine=engine)
    lay = layout.single(tp=tp, pp=PP, dp=4, zero=1, mbs=MBS, gas=GAS, recompute="full")
    return {k: float(np.asarray(v).ravel()[0]) for k, v in
            A.deepspeed_pipe_buffer_bytes(Stage(model, training, lay, np.array([stage]))).items()}


def test_first_stage_keeps_each_in_flight_output_partitioned():
    # schedule.py TrainSchedule.num_pipe_buffers: min(stages - stage_id, micro_batches) = min(12, 64) = 12
    # micro-batches in flight on stage 0; engine.py _exec_forward_pass keeps each output's PartitionedTensor
    # part (numel / mp size: 469,762,048 / 8 B) while first_output.data = torch.zeros(1)
    got = _bloom(stage=0)
    assert got["outputs"] == 12 * B / 8 == 704_643_072
    # _exec_recv_grads: grad_layer sized like the partitioned output (grad_partitioned); no pipe_recv_buf
    assert got["persistent"] == B / 8
    # stage 0 receives no activations (its inputs are the token ids)
    assert got["inputs"] == 0
    # _exec_backward_pass: part_output.full() and part_grad.full() for the micro-batch in its backward
    assert got["backward"] == 2 * B
    assert got["model_outputs"] == 0


def test_last_stage_keeps_the_last_two_fp32_logits():
    # _exec_backward_pass returns after backward(loss) on the last stage, so pipe_buffers['outputs'] keeps
    # the model outputs of its num_pipe_buffers = max(2, min(12 - 11, 64)) = 2 buffers; GPTModelPipe's last
    # layer is float16_to_fp32: fp32 logits [s, b, v / t] = 2048 x 8 x 31,360 x 4 B each
    got = _bloom(stage=PP - 1)
    assert got["model_outputs"] == 2 * S * MBS * (V // TP) * 4 == 4_110_417_920
    # its received input (part_input.full(), the first checkpoint's input) is counted with the blocks;
    # pipe_recv_buf holds the partitioned part
    assert got["inputs"] == 0 and got["persistent"] == B / 8 and got["outputs"] == 0 and got["backward"] == 0


def test_without_tensor_parallelism_a_later_stage_keeps_the_received_tensor_beside_its_copy():
    # is_pipe_partitioned needs a model-parallel axis: at t = 1 the middle stage 5 keeps whole outputs
    # (min(12 - 5, 64) = 7 in flight), each received tensor (the stage runs on a .clone()), pipe_recv_buf
    # and grad_layer whole
    got = _bloom(stage=5, tp=1)
    b1 = S * MBS * H * 2
    assert got["outputs"] == 7 * b1 and got["inputs"] == 7 * b1 and got["persistent"] == 2 * b1
    assert got["backward"] == 0


def test_other_engines_book_none():
    assert all(v == 0 for v in _bloom(stage=0, engine="megatron").values())


# ---------------------------------------------------------------------------------------------------
# measured: DeepSpeed 0.19.8's own PipelineEngine on gloo ranks

WIDTH, SEQ, TOY_MBS, TOY_GAS = 64, 8, 2, 4  # calibrate/engines/deepspeed_pipe_buffers_worker.py


def _toy(stage: int, tp: int) -> dict:
    """The planner's parts for the worker's layout: boundary [2, 8, 64] bf16 = 2,048 B; its last stage
    outputs the hidden states, read as 16-bit logits of a 64-entry vocabulary (the deepspeed engine's
    Hugging Face modules), unsplit at t = 1."""
    model = with_overrides(lookup("llama-2-7b"), layers=4, hidden=WIDTH, heads=1, kv_heads=1, ffn=4 * WIDTH,
                           vocab=WIDTH)
    training = layout.Training(seq_len=SEQ, engine="deepspeed" if tp == 1 else "megatron-deepspeed")
    lay = layout.single(tp=tp, pp=2, dp=1, mbs=TOY_MBS, gas=TOY_GAS)
    return {k: float(np.asarray(v).ravel()[0]) for k, v in
            A.deepspeed_pipe_buffer_bytes(Stage(model, training, lay, np.array([stage]))).items()}


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def measured(request):
    pytest.importorskip("deepspeed")
    from calibrate.harness.launch import launch

    tp = request.param
    out = launch("calibrate.engines.deepspeed_pipe_buffers_worker", [json.dumps({"gas": TOY_GAS, "tp": tp})],
                 nproc=2 * tp, env={"DS_ACCELERATOR": "cpu"}, timeout_s=420)
    assert out.status == "ok" and len(out.ranks) == 2 * tp, (out.status, out.error, out.log_tail)
    return tp, out.ranks


@pytest.mark.slow
def test_engine_buffers_match_the_engine(measured):
    """tp 1: stage 0 held 4,096 B of outputs (2 in flight x 2,048) and a 2,048 B grad_layer; stage 1 the
    received 2,048 B beside the copy its first block ran on, a 2,048 B pipe_recv_buf and 4,096 B of
    model outputs (the last 2). tp 2: stage 0 2,048 B of output parts (2 x 1,024) and a 1,024 B
    grad_layer part; stage 1 ran on the kept full() input (counted with the blocks) and held a 1,024 B
    pipe_recv_buf part and its 2 whole model outputs."""
    tp, ranks = measured
    for rank in ranks:
        peak, stage = rank["peak"], rank["stage"]
        plan = _toy(stage, tp)
        assert rank["partitioned"] == (tp > 1) and rank["boundary_bytes"] == 2048
        assert plan["outputs"] == peak["outputs"] if stage == 0 else plan["outputs"] == 0
        assert plan["persistent"] == peak["pipe_recv_buf"] + peak["grad_layer"]
        if stage == 1:
            # the received tensor is extra only where the stage runs on a copy of it
            assert rank["first_input_is_kept_buffer"] == [tp > 1]
            assert plan["inputs"] == (peak["inputs"] if tp == 1 else 0)
            if tp == 1:  # the toy's output is no vocab-parallel logits: compared unsplit only
                assert plan["model_outputs"] == peak["outputs"] == 4096
