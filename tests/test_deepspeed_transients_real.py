"""DeepSpeed's transient peaks (backward and step()) on 2 gloo ranks against the planner's buffer terms.

One DeepSpeed-launcher run of calibrate/engines/deepspeed_transient_worker.py (the LLAMA of
calibrate/engines/deepspeed_worker.py, P = 158,016 parameters, bf16, torch AdamW foreach=False, D = 2,
reduce_bucket_size 4,096 < every large tensor, so the bucket terms are visible). Each rank profiles,
in the second optimizer step, every micro-batch's forward + engine.backward and every engine.step()
with calibrate.benches.saved's method (torch.profiler allocation events in time order, peak above what was
live before) and tags each allocation by its innermost frame: autograd node, model forward,
DeepSpeed's Python code, torch's optimizer. "DeepSpeed's transient" is the peak of the DeepSpeed-made
allocations alone; the planner's terms come from calibrate/engines/deepspeed_cases.py transient_prediction.

Tolerance: SCALARS = 64 B, the 0-d tensors DeepSpeed makes on the way (scaled loss, loss-scale and
grad-norm scalars: 8-24 B measured); every other difference is named below.
Run: DS_ACCELERATOR=cpu python -m pytest -q -p no:cacheprovider tests/test_deepspeed_transients_real.py
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before any deepspeed import

import pytest

from calibrate.engines.deepspeed_cases import transient_prediction

pytestmark = pytest.mark.slow

D, P, BUCKET = 2, 158_016, 4096
SCALARS = 64
SMALL_BYTES = 1024  # ZeRO-3's unexplained run-to-run excess at the gathered-parameter peak (below)
FLAT = 2 * BUCKET  # stage_1_and_2.py allreduce_bucket's flat copy of one bucket (test_zero2_backward_transient)
MID = 40_000  # elements: a bucket ~P/4, smaller than the model (as 5e8 is for a 7B model)
STRADDLE0, STRADDLE1 = 8128, 64  # rank 0: 2 x (83,072 - 79,008); rank 1: 2 x (79,040 - 79,008) (whole params)
SMALL = {"reduce_bucket_size": BUCKET}
Z3 = {"reduce_bucket_size": BUCKET, "stage3_prefetch_bucket_size": BUCKET, "stage3_param_persistence_threshold": 10}
RUNS = {  # name: (zero, gas, zero_optimization); overlap_comm at DeepSpeed's default unless given
    "z1": (1, 1, SMALL),
    "z2": (2, 1, SMALL),
    "z2-overlap": (2, 1, {**SMALL, "overlap_comm": True}),
    "z2-gas2": (2, 2, SMALL),
    "z2-big-bucket": (2, 1, {"reduce_bucket_size": 1_000_000}),
    "z2-mid-bucket": (2, 1, {"reduce_bucket_size": MID}),  # P/4 < bucket < P/D: the flat copy is large
    "z3": (3, 1, Z3),
    "z3-gas2": (3, 2, Z3),
    # bf16 + ZeRO-1 + data_types.grad_accum_dtype fp32: BF16_Optimizer (engine.py _do_optimizer_sanity_check)
    "bf16opt": (1, 1, {"fp32_grad_accum": True}),
    "bf16opt-gas2": (1, 2, {"fp32_grad_accum": True}),
    # bf16 + ZeRO-2/3 + grad_accum_dtype fp32: ZeRO's own optimizer, accumulating in fp32
    "z2-acc32": (2, 1, {**SMALL, "fp32_grad_accum": True}),
    "z2-acc32-gas2": (2, 2, {**SMALL, "fp32_grad_accum": True}),
    "z2-acc32-mid-bucket": (2, 1, {"reduce_bucket_size": MID, "fp32_grad_accum": True}),
    "z2-acc32-big-bucket": (2, 1, {"reduce_bucket_size": 1_000_000, "fp32_grad_accum": True}),
    "z3-acc32-gas2": (3, 2, {**Z3, "fp32_grad_accum": True}),
    # fp32 weights (bf16 off)
    "z2-fp32": (2, 1, {**SMALL, "precision": "fp32"}),
    "z3-fp32": (3, 1, {**Z3, "precision": "fp32"}),
    # the optimizer offloaded to the CPU (torch's AdamW: zero_force_ds_cpu_optimizer off)
    "z1-offload": (1, 1, {**SMALL, "offload_optimizer": "cpu"}),
    "z2-offload": (2, 1, {**SMALL, "offload_optimizer": "cpu"}),
    "z2-offload-gas2": (2, 2, {**SMALL, "offload_optimizer": "cpu"}),
    "z3-offload": (3, 1, {**Z3, "offload_optimizer": "cpu"}),
}
PLANNER_ONLY = ("fp32_grad_accum", "precision", "offload_optimizer")


@pytest.fixture(scope="module")
def measured():
    """{name: [rank0 run, rank1 run]} and the plain (no DeepSpeed) baselines, from one launch."""
    pytest.importorskip("deepspeed")
    from calibrate.harness.launch import launch

    offload = {"offload_optimizer": {"device": "cpu", "pin_memory": False}}
    runs = [{"name": n, "zero": z, "gas": g,
             "zero_optimization": {**{k: v for k, v in zo.items() if k not in PLANNER_ONLY},
                                   **(offload if "offload_optimizer" in zo else {})},
             "ds": {**({"data_types": {"grad_accum_dtype": "fp32"}} if zo.get("fp32_grad_accum") else {}),
                    **({"bf16": {"enabled": False}} if zo.get("precision") == "fp32" else {}),
                    **({"zero_force_ds_cpu_optimizer": False} if "offload_optimizer" in zo else {})}}
            for n, (z, g, zo) in RUNS.items()]
    out = launch("calibrate.engines.deepspeed_transient_worker", [json.dumps({"runs": runs})], nproc=D, timeout_s=300,
                 launcher="deepspeed", env={"DS_ACCELERATOR": "cpu"})
    print(f"\n[deepspeed_transients] {D} ranks x {len(runs)} runs: {out.wall_s:.1f} s")
    assert out.status == "ok" and len(out.ranks) == D, (out.status, out.error, out.log_tail)
    table = {r["name"]: [rank["runs"][i] for rank in out.ranks] for i, r in enumerate(runs)}
    table["plain"] = [rank["plain_drop"] for rank in out.ranks]
    return table


def _plan(name: str) -> dict:
    zero, gas, zo = RUNS[name]
    return transient_prediction(zero, gas, D, **zo)


def _flat(name: str) -> float:
    """The planner's allreduce_bucket flat copy: engine_buffers' backward term less the straddle and buckets."""
    plan = _plan(name)
    return plan["fwd_buffers"] - plan["straddle_bwd"] - plan["buckets"]


def _worst(measured, name: str, micro: int, phase: str, key=lambda x: x["peak_only"]["deepspeed"]) -> int:
    rows = [next(row for row in run["rows"] if row["micro"] == micro) for run in measured[name]]
    return max(key(row[phase]) for row in rows)


def test_planner_terms():
    """The planner's numbers compared below (bytes; straddle = rank 0's partition overhang, whole
    parameters: 2 x (83,072 - 79,008) = 8,128, tests/test_deepspeed_real.py)."""
    z2 = _plan("z2")
    assert (z2["grads"], z2["straddle_bwd"], z2["buckets"]) == (2 * P / D, 8128, 2 * BUCKET)
    assert _plan("z2-overlap")["buckets"] == 2 * 2 * BUCKET  # setup_buckets: a second buffer with overlap_comm
    assert _plan("z2-big-bucket")["buckets"] == 2 * 1_000_000  # reduce_bucket_size elements, not capped by the model
    assert _flat("z2") == _flat("z2-overlap") == 2 * BUCKET  # 2 B x a full 4,096-element bucket
    assert _flat("z2-mid-bucket") == 2 * MID  # 2 B x a full 40,000-element bucket
    assert _flat("z2-big-bucket") == 2 * P - 2 * P / D - STRADDLE0  # 2 B x P, less the partition it precedes
    assert _plan("z3")["zero3_live"] == 2 * P  # max_live/reuse 1e9 defaults: the whole model stays gathered
    # step: flattened 16-bit partition + its fp32 copy, 6 B x P/D (ZeRO-3: per sub-group of 1e9 > P/D)
    assert _plan("z2")["step_copies"] == _plan("z3")["step_copies"] == 6 * P / D


@pytest.mark.parametrize("name", ["z2", "z2-overlap", "z2-mid-bucket"])
def test_zero2_backward_transient(measured, name):
    """ZeRO-2, one micro-batch: what DeepSpeed allocates during forward + backward peaks at
    grads_in_partition (copy_grads_in_partition: whole parameters overlapping the partition) + the
    reduce bucket(s) (setup_buckets) + allreduce_bucket's flat copy (stage_1_and_2.py average_tensor
    -> allreduce_and_scatter -> allreduce_bucket: self.flatten of the slices of a bucket holding the
    partition edge, which go to both ranks; a one-slice bucket is a view) = planner grad_bytes +
    engine_buffers' backward term (straddle + buckets + flat). On 2 ranks the edge's bucket is reduced
    on rank 1 after its grads_in_partition exists (2 x 79,040 B), on rank 0 before its own (2 x 83,072):
    the worst rank is rank 1, below the planner's worst straddle (rank 0's) by 8,128 - 64 B.
    Measured (rank 1): 174,476 = 158,080 + 8,192 + 8,192 + 12 (4,096 bucket: layer 1's q_proj alone,
    straddling the edge); 318,102 = 158,080 + 80,000 + 80,000 + 22 (40,000 bucket)."""
    plan = _plan(name)
    got = _worst(measured, name, 0, "micro_step")
    expected = plan["grads"] + plan["fwd_buffers"]
    flat = {"z2": 2 * BUCKET, "z2-overlap": 2 * BUCKET, "z2-mid-bucket": 2 * MID}[name]  # 2 B x the full bucket
    buckets = 2 * RUNS[name][2]["reduce_bucket_size"] * (1 + ("overlap" in name))  # 2 B x bucket x buffers
    assert expected == 2 * P / D + STRADDLE0 + buckets + flat
    rank1 = 2 * P / D + STRADDLE1 + buckets + flat  # 158,080 + buckets + flat: the measured worst rank
    assert rank1 <= got <= expected + SCALARS
    # the whole transient (autograd temporaries, activations, gradients not yet in the bucket and
    # DeepSpeed's bytes) stays under the plain model's forward + backward peak (no DeepSpeed, every
    # gradient dropped as made) plus the planner's DeepSpeed terms: the two peaks do not coincide
    # (DeepSpeed's comes at the end of backward, when the activations are freed)
    total = _worst(measured, name, 0, "micro_step", key=lambda x: x["peak"])
    assert total <= max(p["peak"] for p in measured["plain"]) + expected + SCALARS


def test_zero2_accumulation_transient(measured):
    """gas 2: micro-step 0 as gas 1; micro-step 1 allocates a second grads_in_partition beside the
    accumulated one (all_grad_tensors, live before it): its transient is one partition + bucket +
    flat copy, i.e. the planner's gas-2 backward terms (two partitions, each with its straddle) less
    the accumulated one; the worst rank is rank 1, as in test_zero2_backward_transient."""
    plan, one = _plan("z2-gas2"), _plan("z2")
    assert plan["grads"] == 2 * one["grads"] and plan["straddle_bwd"] == 2 * one["straddle_bwd"]
    first = one["grads"] + one["fwd_buffers"]
    second = plan["grads"] + plan["fwd_buffers"] - (one["grads"] + one["straddle_bwd"])
    assert first == second == 2 * P / D + STRADDLE0 + 2 * BUCKET + FLAT == 182_528  # + bucket + its flat copy
    for micro in (0, 1):
        got = _worst(measured, "z2-gas2", micro, "micro_step")
        assert first - (STRADDLE0 - STRADDLE1) <= got <= first + SCALARS


def test_zero1_boundary_reduction_transient(measured):
    """ZeRO-1, gas 1: the micro-step's peak (everything, not only DeepSpeed's) is the boundary
    reduction: the full 16-bit gradient autograd made (2P), grads_in_partition (2P/D + straddle) and
    the bucket, the activations already freed: planner reduction_copy_bytes (490,368 B). Measured
    490,380 on rank 0 (rank 1, no straddle at its edge... 449,292: tests/test_deepspeed_real.py
    replays it)."""
    plan = _plan("z1")
    expected = plan["reduce_grads"] + plan["reduce_buffers"]
    assert expected == 2 * P + 2 * P / D + 8128 + 2 * BUCKET
    got = _worst(measured, "z1", 0, "micro_step", key=lambda x: x["peak"])
    assert expected <= got <= expected + SCALARS


def test_bf16_optimizer_boundary_cast(measured):
    """BF16_Optimizer at the accumulation boundary (DeepSpeed 0.19.8 engine.py allreduce_gradients ->
    buffered_allreduce_fallback -> allreduce_bucket): the param group's whole fp32 gradient buffer
    (get_grads_for_reduction) is flattened as itself (one tensor: no copy) and cast to the bf16
    communication_data_type, 2 B x P beside the gradients = planner reduction_copy_bytes' buffers.
    The micro-step's whole transient is then the 16-bit gradients autograd made (2P; with gas 2, in
    the first micro-step) + that cast (2P); the fp32 buffer (4P, planner grads) was allocated at init. Before the boundary only
    _update_hp_grad's fp32 copy of one 16-bit gradient shows (4 B x lm_head's 32,768 elements)."""
    plan = _plan("bf16opt")
    assert plan["reduce_buffers"] == 2 * P  # 316,032
    assert plan["reduce_grads"] == (2 + 4) * P  # bf16 param.grad + the fp32 accumulation buffer
    for name, boundary in (("bf16opt", 0), ("bf16opt-gas2", 1)):
        assert {run["optimizer"] for run in measured[name]} == {"BF16_Optimizer"}
        got = _worst(measured, name, boundary, "micro_step")
        assert plan["reduce_buffers"] <= got <= plan["reduce_buffers"] + SCALARS
        total = _worst(measured, name, boundary, "micro_step", key=lambda x: x["peak"])
        # gas 2: the 16-bit gradients of micro-step 0 were zeroed, not freed (_update_hp_grad: lp.grad.zero_())
        new = plan["reduce_grads"] - 4 * P - 2 * P * boundary + plan["reduce_buffers"]  # 2P + 2P = 632,064; 2P
        assert new <= total <= new + SCALARS
    assert _worst(measured, "bf16opt-gas2", 0, "micro_step") <= 4 * 32_768 + SCALARS < plan["reduce_buffers"]


@pytest.mark.parametrize("name,micro", [("z1", 0), ("z2", 0), ("z2-gas2", 1), ("z3", 0), ("z3-gas2", 1)])
def test_step_transient(measured, name, micro):
    """engine.step() at the boundary. DeepSpeed's own allocations peak at the flattened 16-bit
    gradient partition and its fp32 conversion, alive together (stage_1_and_2.py step:
    flatten(averaged_gradients).to(fp32); stage3.py _prepare_fp32_grad_for_sub_group, the same per
    sub-group): 6 B x P/D = 474,048 B above what was live (the held gradient partition, counted by the
    planner as grad_bytes(at_step) + the straddle at the step). Measured 474,056 (ZeRO-1/2) and
    474,072 (ZeRO-3); before this test the planner had 4 B x P/D for ZeRO-3 (the fp32 chunk alone).
    Not DeepSpeed's, not a planner term: torch AdamW(foreach=False)'s own temporaries (the sqrt and the
    division of exp_avg_sq, 2 x 4 B x P/D = 632,064 B, measured 632,076) after the 16-bit copy and
    the partition are freed."""
    plan = _plan(name)
    zero = RUNS[name][0]
    expected = plan["step_buffers"] - plan["straddle_step"]
    assert expected == plan["step_copies"] == 6 * P / D
    assert zero < 3 or plan["straddle_step"] == 0
    got = _worst(measured, name, micro, "step")
    assert expected <= got <= expected + SCALARS
    optimizer = _worst(measured, name, micro, "step", key=lambda x: x["peak_only"]["optimizer"])
    assert 2 * 4 * P / D <= optimizer <= 2 * 4 * P / D + SCALARS


LARGEST = 512 * 64  # elements of embed_tokens and of lm_head, the largest parameters


@pytest.mark.parametrize("name,low", [("z2-acc32", 0), ("z2-acc32-gas2", 0), ("z2-acc32-big-bucket", 0),
                                      ("z2-acc32-mid-bucket", 2 * MID - 65_664)])
def test_zero2_fp32_accumulation_backward(measured, name, low):
    """ZeRO-2 accumulating bf16 gradients in fp32 (DeepSpeed 0.19.8 stage_1_and_2.py
    _use_compact_grad_partition_buffer): DeepSpeed's allocations peak at the compact fp32 partition
    (4 B x P/D, no grads_in_partition, no straddle), the bf16 reduce bucket, and the fp32 cast of a
    reduced parameter's share of the partition (_add_to_grad_partition_buffer: source.to(fp32); 4 B x
    lm_head's 32,768 = 131,072) = planner grad_bytes + engine_buffers' backward term. The bucket's flat
    copy (allreduce_bucket) is live beside the cast where the parameter fits the bucket (1e6: 2 B x P,
    measured 2,763,144; 40,000: measured 65,664 of the 80,000 planned, a partial bucket); lm_head,
    larger than a 4,096 bucket, is reduced alone (measured 455,304). From the second micro-batch on the
    partition is already there. Before this test the planner booked a bf16 partition with its straddle
    and an accumulation copy (2 x (2P/D + 8,128)) and no cast."""
    plan = _plan(name)
    assert plan["grads"] == 4 * P / D and plan["straddle_bwd"] == 0
    bucket = RUNS[name][2]["reduce_bucket_size"]
    flat = 2 * bucket if bucket < P else 2 * P  # 2 B x a full bucket, or the whole model
    cast = max(flat + 4 * BUCKET, 4 * LARGEST) if bucket < LARGEST else flat + 4 * LARGEST
    assert plan["fwd_buffers"] == 2 * bucket + cast
    for micro in range(RUNS[name][1]):
        expected = plan["grads"] * (micro == 0) + plan["fwd_buffers"]
        got = _worst(measured, name, micro, "micro_step")
        # up to two buckets' fp32 casts (4 B x a bucket each) more on a rank: casts whose frees the
        # profiler's timestamps ordered after the next allocation (16,384 B once, 30,860 B once in
        # CI on 2 loaded cores, never in the planner's sense of held)
        assert expected - low <= got <= expected + 2 * 4 * BUCKET + SCALARS, micro


@pytest.mark.parametrize("name,micro,copies", [("z2-acc32", 0, 0), ("z2-acc32-gas2", 1, 0), ("z3-acc32-gas2", 1, 4),
                                               ("z2-fp32", 0, 4), ("z3-fp32", 0, 4)])
def test_step_transient_without_a_conversion(measured, name, micro, copies):
    """engine.step() where the gradients are fp32 already. ZeRO-2's compact fp32 partition is the fp32
    gradient as it is (stage_1_and_2.py step: _get_preflattened_grad_partition, .to(fp32) a no-op):
    DeepSpeed allocates nothing. ZeRO-3 accumulating in fp32, and either stage with fp32 weights,
    flatten the fp32 gradients and convert nothing: 4 B x P/D (measured 316,040-316,056). The planner
    had 6 and 8 B x P/D. Compared: DeepSpeed's bytes live at the step's peak (AdamW's temporaries). Its
    own allocations alone peak later, in the all-gather of the updated weights, whose output the gloo
    backend stages (deepspeed/comm/torch.py all_gather_into_tensor: 2 or 4 B x P), not a planner term."""
    plan = _plan(name)
    assert plan["step_copies"] == copies * P / D
    got = _worst(measured, name, micro, "step", key=lambda x: x["by"]["deepspeed"])
    assert plan["step_copies"] <= got <= plan["step_copies"] + SCALARS


NORMS = 8 * 21  # the 0-d fp64 norm kept per parameter of the partition (norm_for_param_grads)


OVERSIZED = 2 * LARGEST + 2 * 3 * 64 * 176  # elements of the tensors over a 4,096 bucket: embed_tokens, lm_head, MLP


@pytest.mark.parametrize("name,micro", [("z2-offload", 0), ("z2-offload-gas2", 1)])
def test_zero2_offload_reduction_transient(measured, name, micro):
    """ZeRO-2 with the optimizer on the CPU, at the accumulation boundary. DeepSpeed clones every
    gradient larger than the bucket (reduce_independent_p_g_buckets_and_remove_grads under
    _offload_gradient_safety_enabled), keeps its partition's clones to the end of the backward
    (copy_grads_in_partition's offload path leaves param.grad; the epilogue's _clear_param_grad_only),
    and takes each parameter's norm from an fp64 copy of its share of the partition
    (set_norm_for_param_grad_in_gpu: .to(float64).norm(2)): lm_head, 8 x 32,768 = 262,144 B; for
    Llama-3-70B's embedding 8.4 GB a GPU. Measured: the norm copy, the bucket and between one clone
    (2 x 32,768: 335,968 B) and most of them (446,560 B), run to run. Planned: the norm copy, the
    bucket and the clones of the tensors a partition overlaps at most (sharding.oversized_tensor_params,
    counted whole: 101,811 of the 133,120 oversized elements). The planner had 16,384 (bucket and flat copy)."""
    plan = _plan(name)
    assert 2 * LARGEST < plan["oversized"] < OVERSIZED
    assert plan["fwd_buffers"] == 2 * BUCKET + 8 * LARGEST + 2 * plan["oversized"]
    got = _worst(measured, name, micro, "micro_step")
    assert 2 * BUCKET + 8 * LARGEST + 2 * LARGEST <= got <= plan["fwd_buffers"] + NORMS + SCALARS
    if name.endswith("gas2"):  # no norm before the boundary: less
        assert _worst(measured, name, 0, "micro_step") < plan["fwd_buffers"]


def test_zero1_offload_norm_copy(measured):
    """ZeRO-1 offloading: the same fp64 norm copy (8 B x lm_head's 32,768) at the boundary reduction,
    beside the bucket; its clones of oversized gradients replace the full gradient it holds (planner
    grads). The whole micro-step peaks under grads + that (the gradients drain as they are copied
    to the host: 469,092 measured on the worse rank against 586,368 planned)."""
    plan = _plan("z1-offload")
    assert plan["fwd_buffers"] == 2 * BUCKET + 8 * LARGEST
    rows = [run["rows"][0]["micro_step"] for run in measured["z1-offload"]]
    assert any([8 * LARGEST, "stage_1_and_2.py(1886): set_norm_for_param_grad_in_gpu"] in r["live_deepspeed"] for r in rows)
    total = max(r["peak"] for r in rows)
    assert 8 * LARGEST + 2 * BUCKET < total <= plan["grads"] + plan["fwd_buffers"] + SCALARS


def test_zero3_offload_norm_chunk(measured):
    """ZeRO-3 offloading takes each gradient partition's norm from an fp64 copy, in chunks of at most
    2.5e8 elements (stage3.py _constant_buffered_norm2): lm_head's partition, 16,384 x 8 = 131,072 B,
    beside the gathered parameters (2P; the bucket was allocated at init) = planner engine_buffers'
    backward term less the bucket. Whether the two meet varies from run to run: measured 447,124 on one
    rank once (the planned + 20), 381,696 on both another time (the norm taken after some parameters
    were released; the peak then is test_zero3_gathered_parameters' reduce-scatter copy). So this bounds
    the planner from above only; the term is read from the code."""
    plan = _plan("z3-offload")
    planned = plan["fwd_buffers"] - plan["buckets"]
    assert planned == plan["zero3_live"] + 8 * LARGEST // D == 2 * P + 131_072
    got = _worst(measured, "z3-offload", 0, "micro_step")
    assert plan["zero3_live"] <= got <= planned + SMALL_BYTES


@pytest.mark.parametrize("name", ["z1-offload", "z2-offload", "z3-offload"])
def test_offload_step_allocates_nothing_on_the_gpu(measured, name):
    """engine.step() offloading: the step runs on the host's fp32 partition; DeepSpeed holds nothing
    at the step's peak (AdamW's temporaries, on the host on a GPU machine): planner step buffers 0."""
    assert _plan(name)["step_buffers"] == 0
    assert _worst(measured, name, 0, "step", key=lambda x: x["by"]["deepspeed"]) <= SCALARS


@pytest.mark.parametrize("name", ["z3", "z3-gas2", "z3-acc32-gas2"])
def test_zero3_gathered_parameters(measured, name):
    """ZeRO-3 forward + backward: at the micro-step's peak DeepSpeed holds the all-gathered 16-bit
    parameters, the whole model with the 1e9 max_live/reuse defaults = planner zero3_live_param_bytes
    (2P = 316,032 B; the reduce bucket was allocated at init, before). Measured 316,044.
    DeepSpeed's allocations alone peak higher, in backward, by the reduce-scatter of the largest
    gradient while everything is still gathered (measured +65,664 B: lm_head's 65,536-B gradient
    flattened by coalesced_collectives.py reduce_scatter_coalesced + scalars); once in CI 8,320 B
    more (+73,984 B: the size of another flattened gradient, not identified): bounded here by two of
    2 B x max(reduce_bucket_size, largest parameter), not a planner term."""
    plan = _plan(name)
    for micro in range(RUNS[name][1]):
        at_peak = _worst(measured, name, micro, "micro_step", key=lambda x: x["by"]["deepspeed"])
        # SMALL: 12-524 B more from run to run (small DeepSpeed allocations that are live or not at
        # the instant the profiler's timestamps order as the peak; not identified). On a loaded machine
        # the reduce-scatter's flattened copy of lm_head's gradient (2 B x 512 x 64) can be live at that
        # instant too (measured once in CI: +65,548 B): the same race, one gradient larger
        assert plan["zero3_live"] <= at_peak <= plan["zero3_live"] + 2 * 512 * 64 + SMALL_BYTES
        alone = _worst(measured, name, micro, "micro_step")
        assert plan["zero3_live"] <= alone <= plan["zero3_live"] + 2 * 2 * max(BUCKET, 512 * 64) + SMALL_BYTES


def test_zero2_bucket_larger_than_model(measured):
    """reduce_bucket_size 1e6 > P: setup_buckets still allocates the whole bucket (2 MB, as planned),
    and the single reduction of the whole model (in the epilogue) flattens the bucket's gradient
    slices (stage_1_and_2.py allreduce_bucket: self.flatten(bucket), 2 B x P = 316,032 B) before
    grads_in_partition exists: the planner books bucket + grads_in_partition + the flat copy's excess
    over it, 2P - (2P/D + straddle) = 149,888 B: 2,316,032 B. Measured 2,316,040."""
    plan = _plan("z2-big-bucket")
    planned = plan["grads"] + plan["fwd_buffers"]
    assert planned == 2 * 1_000_000 + 2 * P  # bucket + flat copy of the whole model: 2,316,032
    got = _worst(measured, "z2-big-bucket", 0, "micro_step")
    # in some runs the profiler's timestamps put a grads_in_partition (rank 0: 2 x 83,072 B) before the
    # flat copy's free (allocated and freed microseconds apart): at most that much more
    assert planned <= got <= planned + 2 * 83_072 + SCALARS


def test_zero1_boundary_reduction_on_four_ranks():
    """ZeRO-1 on 4 gloo ranks, a 20,000-element bucket (~P/8: buckets span partition edges, as 5e8 does
    on a large model): the whole micro-step's peak on the worst rank stays under the planner's
    reduction moment (full 16-bit gradient 2P + the new partition 2P/4 + the worst rank's straddle +
    the bucket = 448,192 B) by less than 3 %: the planner books the worst rank's straddle beside the
    whole gradient, which on the straddling ranks is already partly freed by then (measured: 437,964
    on rank 0). allreduce_bucket's flat copy shows among DeepSpeed's own allocations but is freed
    before that peak, as on 2 ranks."""
    from calibrate.harness.launch import launch

    zo = {"reduce_bucket_size": 20_000}
    run = {"name": "z1-mid4", "zero": 1, "gas": 1, "zero_optimization": zo}
    out = launch("calibrate.engines.deepspeed_transient_worker", [json.dumps({"runs": [run], "plain": False})], nproc=4,
                 timeout_s=300, launcher="deepspeed", env={"DS_ACCELERATOR": "cpu"})
    assert out.status == "ok" and len(out.ranks) == 4, (out.status, out.error, out.log_tail)
    plan = transient_prediction(1, 1, 4, **zo)
    expected = plan["reduce_grads"] + plan["reduce_buffers"]
    assert expected == 2 * P + 2 * P / 4 + 13_152 + 2 * 20_000  # straddle: rank 2's 2 x (46,080 - 39,504)
    worst = max(rank["runs"][0]["rows"][0]["micro_step"]["peak"] for rank in out.ranks)
    assert 0.97 * expected <= worst <= expected
