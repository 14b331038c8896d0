"""FSDP2's transient memory (torch 2.13 fully_shard) on 2 gloo ranks against the planner's fsdp terms.

One torchrun launch of calibrate/engines/fsdp_transient_worker.py: the tiny Llama of calibrate/engines/fsdp_worker.py
with 3 decoder layers (the middle one shows a block's steady state in backward: the next block
prefetched on one side, the previous one's reduce-scatter input on the other), fully_shard per layer
and at the root, MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) ("bf16") or none ("fp32"),
reshard_after_forward True (the planner's --zero 3) and False (--zero 2), 1 and 2 micro-batches a
step, AdamW(foreach=False), gradients zeroed with set_to_none=False. The worker tracks every buffer
FSDP allocates and the unsharded gradients autograd makes for it, by storage, and sums them after
each allocation: the exact peak of FSDP's bytes above the model states, at three moments: forward,
backward (autograd running) and the final callback (the root unit's post_backward, after autograd).
The optimizer step is profiled as calibrate/engines/deepspeed_transient_worker.py does.

Sizes (elements; every dimension even, so no shard padding): a block B = 46,208 (q 4,096, k 2,048,
v 2,048, o 4,096, gate/up/down 3 x 11,264, two norms 2 x 64); the root unit R = 65,600 (embed_tokens
32,768, norm 64, lm_head 32,768); its first gradients R_out = norm + lm_head = 32,832; its last
registered parameter lm_head 32,768; the rank P = R + 3B = 204,224. Bytes per element: unsharded
parameters w (bf16 2, fp32 4) and their gradients g = w; reduce dtype r = 4; D = 2 shard ranks.
Two more runs move the vocabulary: 64 (R = 8,256 < B: a later block's forward copy-out is the largest)
and 4,096 (R = 524,352 > 3B: under --zero 2 the first block's copy-out beside the root's all-gather
output exceeds the last two blocks' all-gather outputs).

CPU (gloo) vs CUDA (NCCL), the translation: (1) FSDP's own buffers are the same Python objects with the
same lifetimes on both; the worker counts only those. (2) gloo's own copies (c10d::_allgather_base_: a
flat temporary of the output; c10d::_reduce_scatter_base_: a clone of the input; its worker thread's
temporaries) and CPU aten::_chunk_cat's per-parameter temporary (CPU runs the composite
_chunk_cat_out, CUDA its own kernel; not measured here: no GPU) are not FSDP's and not counted:
test_cpu_only_copies bounds them, not planner terms. (3) With FSDP's default gloo comms,
ProcessGroupGloo's worker thread drops its reference to a collective's tensors after the caller has
resumed, now and then after FSDP dropped its own (the last block's all-gather output was seen alive
in the next backward, and torch.profiler then records no free for it at all); the worker hands gloo
private copies through FSDPModule.set_custom_all_gather / set_custom_reduce_scatter, FSDP's buffers
unchanged.

Run: python -m pytest -q -p no:cacheprovider tests/test_fsdp_transients_real.py (about 15 s on 2 cores)
"""

from __future__ import annotations

import json

import pytest

from calibrate.engines.fsdp_worker import LLAMA
from planner.stage import Stage

pytestmark = pytest.mark.slow

D, MBS, SEQ = 2, 2, 32
LAYERS = 3
B, R, R_OUT, LM_HEAD, H = 46_208, 65_600, 32_832, 32_768, 64
P = R + LAYERS * B
R_BYTES = 4  # reduce_dtype float32 (and the fp32 gradients without MixedPrecisionPolicy)
LAST_GRAD = 2 * H  # bf16: a block's last unsharded gradient (post_attention_layernorm, h) kept by foreach_reduce's loop
SCALARS = 256  # AdamW's 0-d step tensors and scalars in step() (140 B measured)
RUNS = {  # name: (mixed, reshard_after_forward, gas, llama overrides)
    **{f"{p}/reshard-{str(rf).lower()}/gas{g}": (p == "bf16", rf, g, {})
       for p in ("bf16", "fp32") for rf in (True, False) for g in (1, 2)},
    "bf16/vocab-64/reshard-true/gas1": (True, True, 1, {"vocab_size": 64}),
    "bf16/vocab-4096/reshard-false/gas1": (True, False, 1, {"vocab_size": 4096}),
}
MAIN = [n for n in RUNS if "vocab" not in n]


@pytest.fixture(scope="module")
def measured():
    """{name: [rank 0 run, rank 1 run]} from one launch."""
    from calibrate.harness.launch import launch

    runs = [{"name": n, "mixed": m, "reshard_after_forward": rf, "gas": g,
             "llama": {"num_hidden_layers": LAYERS, **over}} for n, (m, rf, g, over) in RUNS.items()]
    out = launch("calibrate.engines.fsdp_transient_worker", [json.dumps({"runs": runs})], nproc=D, timeout_s=240)
    print(f"\n[fsdp_transients] {D} ranks x {len(runs)} runs: {out.wall_s:.1f} s")
    assert out.status == "ok" and len(out.ranks) == D, (out.status, out.error, out.log_tail)
    return {r["name"]: [rank["runs"][i] for rank in out.ranks] for i, r in enumerate(runs)}


def _peak(measured, name: str, moment: str) -> int:
    """The moment's peak, the same on both ranks and in every micro-batch (asserted)."""
    values = {m[moment]["peak"] for run in measured[name] for m in run["micro"]}
    assert len(values) == 1, (name, moment, values)
    return values.pop()


def _at_peak(measured, name: str, moment: str) -> dict:
    return measured[name][0]["micro"][0][moment]["by_unit"]


def _plan(name: str):
    """The planner's FSDP terms for this run's shape: the worker's Llama read as a config.json."""
    from planner import layout, memory, states
    from planner.hf_config import from_hf_config

    mixed, reshard, gas, over = RUNS[name]
    model = from_hf_config({**LLAMA, "num_hidden_layers": LAYERS, **over, "model_type": "llama"})
    training = layout.Training(seq_len=SEQ, precision="bf16" if mixed else "fp32", engine="fsdp")
    lay = layout.single(dp=D, zero=3 if reshard else 2, mbs=MBS, gas=gas)
    moments = {m: float(memory.fsdp_unsharded_unit_bytes(Stage(model, training, lay, 0), moment=m)[0])
               for m in ("forward", "backward", "peak", "reduction")}
    fwd, step = memory.engine_buffers(Stage(model, training, lay, 0))
    grads, reduce = memory.reduction_copy_bytes(Stage(model, training, lay, 0))
    return {**moments, "weights": float(states.weight_bytes(Stage(model, training, lay, 0))[0]),
            "fwd_buffers": float(fwd[0]), "step_buffers": float(step[0]), "reduce_grads": float(grads[0]),
            "reduce_buffers": float(reduce[0]),
            "step_grads": float(states.grad_bytes(Stage(model, training, lay, 0), at_step=True)[0]),
            "optimizer": float(states.optimizer_bytes(Stage(model, training, lay, 0))[0])}


def _w(name: str) -> int:
    return 2 if RUNS[name][0] else 4


def test_same_shapes_and_model_states(measured):
    """The worker's units are the planner's blocks and root; the model states it leaves out of the
    transients are the planner's (fp32 shards as master, fp32 gradients, AdamW: 16 B x P / D)."""
    from planner import layout, sharding
    from planner.hf_config import from_hf_config

    for name in MAIN:
        for run in measured[name]:
            assert run["units"] == {**{f"model.layers.{i}": B for i in range(LAYERS)}, "root": R}
            states = run["model_states"]
            assert states["param_bytes"] + states["grad_bytes"] + states["optimizer_bytes"] == 16 * P // D
        plan = _plan(name)
        if RUNS[name][1]:  # --zero 3: the planner's model states at the step are the sharded ones
            assert plan["weights"] + plan["step_grads"] + plan["optimizer"] == 16 * P // D
    model = from_hf_config({**LLAMA, "num_hidden_layers": LAYERS, "model_type": "llama"})
    training, lay = layout.Training(engine="fsdp"), layout.single(dp=D, zero=3)
    assert sharding.block_params(model, training, lay)[0] == B
    assert sum(x[0] for x in sharding.rank_params(Stage(model, training, lay, 0))) == P


@pytest.mark.parametrize("name", [n for n in MAIN if "reshard-true" in n])
def test_zero3_forward(measured, name):
    """Forward, --zero 3: the peak is block 0's copy-out (_fsdp_collectives.py foreach_all_gather_copy_out
    into _fsdp_param.py alloc_all_gather_outputs) with the root unit gathered for the whole forward and
    the root's all-gather output still alive (_fsdp_param_group.py wait_for_unshard's
    prev_all_gather_state is released when it returns): unsharded parameters and all-gather output of
    the root and of block 0, 2 x w x (R + B) = 447,232 B in bf16, 894,464 in fp32."""
    w = _w(name)
    got = _peak(measured, name, "forward")
    assert got == 2 * w * (R + B)  # 2 (params + all-gather output) x w x (R + B)
    assert _at_peak(measured, name, "forward") == {
        "unsharded_params/root": w * R, "all_gather_output/root": w * R,
        "unsharded_params/model.layers.0": w * B, "all_gather_output/model.layers.0": w * B}
    assert _plan(name)["forward"] == got


@pytest.mark.parametrize("name", [n for n in MAIN if "reshard-true" in n])
def test_zero3_backward(measured, name):
    """Backward, --zero 3: the peak is the middle block's gradients all made, before its post_backward:
    the root unit gathered (its post_backward is queued last) with its first gradients (norm, lm_head),
    block 1's unsharded parameters and gradients, block 0 prefetched (_fsdp_param_group.py
    _backward_prefetch: its all-gather output, copied out at its own pre_backward) and block 2's fp32
    reduce_scatter_input (_fsdp_collectives.py foreach_reduce; kept in comm_ctx.reduce_scatter_states
    until block 1's post_backward): w R + g R_out + (2w + g + r) B = 658,944 B in bf16, 1,133,056 in fp32
    (the planner before: the current and the prefetched block, 2 w B = 184,832 / 369,664)."""
    w = _w(name)
    got = _peak(measured, name, "backward")
    # w R (root) + g R_out (its first grads) + (w params + g grads + w prefetched + r RS input) x B, g = w
    assert got == w * R + w * R_OUT + (w + w + w + R_BYTES) * B
    assert _at_peak(measured, name, "backward") == {
        "unsharded_params/root": w * R, "unsharded_grads/root": w * R_OUT,
        "unsharded_params/model.layers.1": w * B, "unsharded_grads/model.layers.1": w * B,
        "all_gather_output/model.layers.0": w * B, "reduce_scatter_input/model.layers.2": R_BYTES * B}
    plan = _plan(name)
    assert plan["backward"] == got
    assert plan["fwd_buffers"] == plan["peak"] == max(_peak(measured, name, "forward"), got)


@pytest.mark.parametrize("name", MAIN)
def test_final_callback_reduction(measured, name):
    """The root unit's post_backward, in the final callback after autograd (activations freed): the
    planner's 'gradient reduction' moment for FSDP (reduction_copy_bytes: the sharded gradients and
    this). bf16: the root's fp32 reduce_scatter_input, its reduce_output and lm_head's gradient, kept by
    foreach_reduce's loop variable: r R + r R / D + g lm_head = 459,136 B. fp32: the callback's start,
    the root still gathered with all its gradients and block 0's reduce_scatter_input: w R + g R + r B
    = 709,632 B. The same with --zero 2 (every block resharded after its backward): the planner books
    what exceeds its whole gathered weights (w P), 50,688 B in bf16, none in fp32."""
    w = _w(name)
    got = _peak(measured, name, "final_callback")
    if w == 2:
        assert got == R_BYTES * R + R_BYTES * R // D + w * LM_HEAD  # RS input + RS output + lm_head grad
        assert _at_peak(measured, name, "final_callback") == {
            "reduce_scatter_input/root": R_BYTES * R, "reduce_scatter_output/root": R_BYTES * R // D,
            "unsharded_grads/root": w * LM_HEAD}
    else:
        assert got == w * R + w * R + R_BYTES * B  # root params + root grads + block 0's RS input
    plan = _plan(name)
    reshard = RUNS[name][1]
    assert plan["reduction"] == (got if reshard else max(0, got - w * P))
    assert plan["reduce_buffers"] == plan["reduction"]
    assert plan["reduce_grads"] == (plan["step_grads"] if plan["reduction"] > 0 else 0)  # the sharded fp32 gradients


@pytest.mark.parametrize("name", [n for n in MAIN if "reshard-false" in n])
def test_zero2_beyond_gathered_weights(measured, name):
    """--zero 2 (reshard_after_forward False): the planner books every unit gathered as weights (w P) for
    the whole step, FSDP's other bytes as buffers. Forward: the last block's copy-out, everything
    gathered and the last two blocks' all-gather outputs: w P + 2 w B. Backward: the largest is block 1
    at the end of its backward (block 2 resharded) with the root's first gradients and block 2's
    reduce_scatter_input, w P + g R_out + r B; in bf16 with D = 2, block 2's reduce-scatter (its
    reduce_output r B / D = w B in place of its resharded parameters) ties it but for LAST_GRAD, the
    block's last gradient foreach_reduce's loop variable keeps (a named gap of g h = 128 B)."""
    w = _w(name)
    fwd, bwd = _peak(measured, name, "forward"), _peak(measured, name, "backward")
    assert fwd == w * P + 2 * w * B  # whole model + 2 all-gather outputs
    gap = LAST_GRAD if w == 2 else 0
    # w (P - B) (block 2 resharded) + g R_out + g B (block 1's grads) + r B (block 2's RS input), g = w
    assert bwd == w * P + w * R_OUT + R_BYTES * B + gap
    plan = _plan(name)
    assert plan["weights"] == w * P
    assert plan["forward"] == fwd - w * P
    assert plan["backward"] == bwd - w * P - gap
    assert plan["fwd_buffers"] == max(plan["forward"], plan["backward"])


def test_root_size_moves_the_forward_peak(measured):
    """The forward candidates not reached by the main runs. vocab 64 (R = 8,256 < B), --zero 3: a later
    block's copy-out, the root gathered beside the previous block's all-gather output and this block's
    parameters and all-gather output, w (R + 3B) = 293,760 B (block 0's, 2 w (R + B) = 108,928 x 2, is
    smaller). vocab 4,096 (R = 524,352), --zero 2: block 0's copy-out with the root's all-gather output,
    2 w (R + B) = 2,282,240 B, beyond the gathered weights w P = 1,325,952 (more than the last two
    blocks' all-gather outputs 2 w B = 184,832)."""
    small, big = "bf16/vocab-64/reshard-true/gas1", "bf16/vocab-4096/reshard-false/gas1"
    r_small, r_big = 2 * 64 * 64 + H, 2 * 4096 * 64 + H
    assert measured[small][0]["units"]["root"] == r_small and measured[big][0]["units"]["root"] == r_big
    got = _peak(measured, small, "forward")
    assert got == 2 * (r_small + 3 * B) == 293_760  # w x (root + previous AG output + block params + its AG output)
    assert _plan(small)["forward"] == got
    got = _peak(measured, big, "forward")
    p_big = r_big + LAYERS * B
    assert got == 2 * 2 * (r_big + B) == 2_282_240  # 2 x w x (R + B) at block 0's copy-out
    assert _plan(big)["forward"] == got - 2 * p_big
    # the big root's reduction: r R + r R / D + g lm_head (4096 x 64), beyond the gathered weights
    red = _peak(measured, big, "final_callback")
    assert red == 4 * r_big + 4 * r_big // D + 2 * 4096 * 64 == 3_670_400
    assert _plan(big)["reduction"] == red - 2 * p_big
    # the small root's: its start, w R + g R + r B (the root still gathered with block 0's RS input)
    assert _peak(measured, small, "final_callback") == 2 * r_small + 2 * r_small + 4 * B == _plan(small)["reduction"]


@pytest.mark.parametrize("name", list(RUNS))
def test_root_reduce_scatter_input_beside_its_gradients(measured, name):
    """The root's reduce_scatter_input is allocated while all the root's unsharded gradients are alive
    (foreach_reduce copies them in before unsharded_grads.clear(); its parameters resharded and block
    0's input released just before): r R + g R, whatever D. At D = 2 the reduce_output beside lm_head's
    gradient is larger in bf16 (above); past 4 shard ranks this instant is the reduction's largest:
    the planner at dp 8 books it for the 4,096 vocabulary (3,146,112 B), a reading of the same instant."""
    w = _w(name)
    root = measured[name][0]["units"]["root"]
    for run in measured[name]:
        for m in run["micro"]:
            # r R (RS input) + g R (every root gradient), g = w
            assert m["at_reduce_scatter"]["reduce_scatter_input/root"] == R_BYTES * root + w * root
    if name == "bf16/vocab-4096/reshard-false/gas1":
        from planner import layout, memory
        from planner.hf_config import from_hf_config

        model = from_hf_config({**LLAMA, "num_hidden_layers": LAYERS, "vocab_size": 4096, "model_type": "llama"})
        training = layout.Training(seq_len=SEQ, precision="bf16", engine="fsdp")
        planned = memory.fsdp_unsharded_unit_bytes(Stage(model, training, layout.single(dp=8, zero=3), 0), moment="reduction")
        assert planned[0] == R_BYTES * root + w * root == 3_146_112


@pytest.mark.parametrize("name", MAIN)
def test_micro_batches_alike(measured, name):
    """FSDP2 reduce-scatters every micro-batch (reshard after backward, no no_sync): the second
    micro-batch of a step holds what the first does (asserted by _peak: one value per moment over both
    ranks and every micro-batch), and a 2-micro-batch step what a 1-micro-batch one does."""
    one = name.replace("gas2", "gas1")
    for moment in ("forward", "backward", "final_callback"):
        assert _peak(measured, name, moment) == _peak(measured, one, moment)
    assert _peak(measured, name, "after") == 0  # nothing of FSDP's outlives the micro-batch


@pytest.mark.parametrize("name", MAIN)
def test_optimizer_step(measured, name):
    """opt.step(): FSDP2 allocates nothing (no optimizer hook in torch 2.13 fully_shard; the sharded
    DTensor parameters step in place): every byte is AdamW(foreach=False)'s own, the sqrt and the
    division of exp_avg_sq for the largest shard (embed_tokens / lm_head, 32,768 / D elements):
    2 x 4 B x 16,384 = 131,072 B. The planner books CUDA's default instead, foreach AdamW, whose
    sqrt of every exp_avg_sq shard is allocated at once (torch 2.13 optim/adam.py _multi_tensor_adam;
    measured in tests/test_step_memory.py): 4 B x P / D."""
    for run in measured[name]:
        step = run["step"]
        assert step["by"]["model"] == step["by"]["deepspeed"] == step["by"]["autograd"] == 0
        # the rest alive at the peak: Python scalars wrapped as 8-B tensors outside any op
        assert step["peak"] == step["by"]["optimizer"] + step["by"]["unattributed"]
        assert step["by"]["unattributed"] <= 8
        assert 2 * 4 * LM_HEAD // D <= step["peak"] <= 2 * 4 * LM_HEAD // D + SCALARS
    assert _plan(name)["step_buffers"] == 4 * P // D  # 4 x 204,224 / 2


@pytest.mark.parametrize("name", [n for n in MAIN if "gas1" in n])
def test_cpu_only_copies(measured, name):
    """What the CPU path allocates beyond FSDP's buffers (torch.profiler events under c10d ops, gloo's
    worker thread and aten::_chunk_cat; with FSDP's default gloo comms). Not counted above, not planner
    terms: gloo clones each reduce-scatter input (c10d::_reduce_scatter_base_; the root's is the largest,
    r R = 262,400 B) and copies each all-gather output; the CPU _chunk_cat cats a bf16 gradient into the
    fp32 reduce_scatter_input through a temporary of the gradient (the largest: lm_head, 2 x 32,768 B),
    none without a dtype change (fp32). Lower bounds only: torch.profiler may miss a free made on
    gloo's worker thread, which only adds."""
    for run in measured[name]:
        cpu = run["cpu_only_peak"]
        assert cpu["gloo_copy"] >= R_BYTES * R
        assert cpu.get("chunk_cat_cpu", 0) == (2 * LM_HEAD if _w(name) == 2 else 0)
