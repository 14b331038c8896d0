"""The planner's per-rank model-state and buffer bytes against a real DeepSpeed engine.

Two gloo processes on CPU train a tiny Llama (transformers) with ZeRO 1, 2 and 3 (bf16, torch
AdamW passed in: no JIT build), one torchrun launch of calibrate/engines/deepspeed_exact.py
running, per stage, 2 steps with gradient_accumulation_steps 1 and then 2 steps with GAS = 4. Each
rank counts, by unique storage (data_ptr dedup, storage nbytes), the buffers the engine holds:

- gas 1: 16-bit weights, fp32 master partition, Adam exp_avg/exp_avg_sq, the 16-bit gradient
  partition, the reduce bucket(s) and the fp32 gradient live at the optimizer step;
- gas 4 (second step): the gradient bytes (p.grad and the optimizer's grads_in_partition,
  all_grad_tensors, averaged_gradients or grad_partitions_flat_buffer; reduce buckets apart) at
  fixed points of every micro-step (end of autograd, after each copy into the partition, before
  _release_ipg_buffers, after backward, at the optimizer step), and every collective of the
  DeepSpeed communication backend (deepspeed.comm's TorchBackend, the one object its collectives
  go through; torch.distributed is watched for direct calls) with its micro-step, phase, size,
  dtype and DeepSpeed call site, gradient reductions being those under the ipg-bucket reduction.

The parent compares them with `planner.memory` (weight/grad/optimizer bytes, engine_buffers,
deepspeed_straddle_bytes, reduction_copy_bytes) and `planner.timing.grad_reductions_per_step` for
`layout.single(dp=2, zero=S, gas=G)` and the same ZeroConfig. Two measurements made here changed the
planner: ZeRO-1's boundary reduction holds grads_in_partition beside the not-yet-reduced full
gradient (the "gradient reduction" moment), and ZeRO-2's second micro-step partition carries its own
straddling parameters.

DeepSpeed pads: ZeRO-1/2 pad the flat 16-bit buffer to a multiple of 2*D elements
(stage_1_and_2.py: alignment = nccl_start_alignment_factor(2) * D); ZeRO-3 pads every parameter
to a multiple of D (partition_numel = ceil(numel / D)). The expected values below add exactly that
padding, so the asserts are equalities, not tolerances.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before any deepspeed import

import pytest

from planner import hardware, layout, memory, states, sharding, timing
from planner.hf_config import from_hf_config
from planner.layout import Training, ZeroConfig

from calibrate.engines.deepspeed_exact import BUCKET, D, GAS, LLAMA, SEQ, STAGES, ZERO
from planner.stage import Stage, Step

pytestmark = pytest.mark.slow


# ---------------------------------------------------------------------------------------------
# parent side


@pytest.fixture(scope="module")
def hf_model():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))


@pytest.fixture(scope="module")
def twin(tmp_path_factory, hf_model):
    """The planner's ModelSpec read from the same config written as config.json."""
    path = tmp_path_factory.mktemp("twin") / "config.json"
    cfg = hf_model.config.to_dict()
    cfg["model_type"] = "llama"
    path.write_text(json.dumps(cfg))
    return from_hf_config(path)


@pytest.fixture(scope="module")
def spawned():
    """[rank0 dict, rank1 dict] of everything measured by D gloo ranks under torchrun."""
    try:
        import deepspeed  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure (not only ImportError) means no engine
        pytest.skip(f"deepspeed cannot be imported: {exc!r}")
    from calibrate.harness.launch import launch

    out = launch("calibrate.engines.deepspeed_exact", [], nproc=D, timeout_s=600, env={"DS_ACCELERATOR": "cpu"})
    print(f"\n[deepspeed_real] torchrun, {D} ranks x ZeRO {STAGES} x gas 1 and {GAS}: {out.wall_s:.1f} s")
    assert out.status == "ok" and len(out.ranks) == D, (out.status, out.error, out.log_tail)
    return out.ranks


@pytest.fixture(scope="module")
def engine(spawned):
    """{stage: [rank0 dict, rank1 dict]}, gradient_accumulation_steps 1."""
    out = {s: [spawned[r][str(s)] for r in range(D)] for s in STAGES}
    for s in STAGES:
        for r in range(D):
            print(f"  zero{s} rank{r}: {out[s][r]}")
    return out


@pytest.fixture(scope="module")
def engine_gas(spawned):
    """{stage: [rank0 dict, rank1 dict]}, gradient_accumulation_steps GAS (second step's micro-steps)."""
    out = {s: [spawned[r][f"{s}_gas{GAS}"] for r in range(D)] for s in STAGES}
    for s in STAGES:
        for r in range(D):
            got = out[s][r]
            for row in got["rows"]:  # probe: gradient total / bucket bytes
                probes = (f"{k} {v['total']}/{v['buckets']}" for k, v in row.items() if isinstance(v, dict))
                print(f"  zero{s} gas{GAS} rank{r} micro {row['micro']}: " + ", ".join(probes))
    return out


def _planner(twin, stage: int, zc: ZeroConfig = ZERO, gas: int = 1) -> dict:
    lay = layout.single(dp=D, zero=stage, gas=gas)
    training = Training(seq_len=SEQ, precision="bf16", engine="deepspeed", zero_config=zc)
    fwd, step = memory.engine_buffers(Stage(twin, training, lay, 0))
    out = {"params": float(states.weight_bytes(Stage(twin, training, lay, 0))[0]),
           "grads": float(states.grad_bytes(Stage(twin, training, lay, 0))[0]),
           "step_grads": float(states.grad_bytes(Stage(twin, training, lay, 0), at_step=True)[0]),
           "optimizer": float(states.optimizer_bytes(Stage(twin, training, lay, 0))[0]),
           "fwd_buffers": float(fwd[0]), "step_buffers": float(step[0]),
           "buckets": float(memory.deepspeed_reduce_buckets(training, lay)[0]),
           "reductions": float(timing.grad_reductions_per_step(training, lay)[0]),
           "all_reduce": stage in training.engine.all_reduce_stages}
    # ZeRO-1/2: bytes by which the worst rank's gradient partition exceeds 2*P/D (whole straddling
    # parameters); the planner books them under buffers where the gradient is that partition:
    # in backward for ZeRO-2 only (ZeRO-1 holds the full gradient there), at the step for both
    out["straddle"] = float(sharding.deepspeed_grad_partition_excess(Stage(twin, training, lay, 0))[0] * 2) if stage in (1, 2) else 0.0
    out["straddle_bwd"] = float(memory.deepspeed_straddle_bytes(Stage(twin, training, lay, 0), at_step=False)[0])
    out["straddle_step"] = float(memory.deepspeed_straddle_bytes(Stage(twin, training, lay, 0), at_step=True)[0])
    reduce_grads, reduce_buffers = memory.reduction_copy_bytes(Stage(twin, training, lay, 0))
    out["reduce_grads"], out["reduce_buffers"] = float(reduce_grads[0]), float(reduce_buffers[0])
    return out


def _numels(hf_model) -> list[int]:
    # DeepSpeed flattens the optimizer's param group in model.parameters() order
    # (round_robin_gradients defaults to false)
    return [p.numel() for p in hf_model.parameters()]


def _zero12_partition(hf_model) -> int:
    # stage_1_and_2.py: aligned_numel = ceil(P / (2*D)) * (2*D); partition_size = aligned_numel / D
    P = sum(_numels(hf_model))
    return math.ceil(P / (2 * D)) * (2 * D) // D


def _zero3_partition(hf_model) -> int:
    # partition_parameters.py: each parameter keeps ceil(numel / D) elements on every rank
    return sum(math.ceil(n / D) for n in _numels(hf_model))


def _zero12_grads_in_partition(hf_model, rank: int) -> int:
    """Elements of stage_1_and_2.py `grads_in_partition`: copy_grads_in_partition sizes it as the
    sum of the FULL numel of every parameter overlapping the rank's partition [r*S, (r+1)*S)."""
    S = _zero12_partition(hf_model)
    lo, hi, start, total = rank * S, (rank + 1) * S, 0, 0
    for n in _numels(hf_model):
        if start < hi and start + n > lo:
            total += n
        start += n
    return total


def test_planner_twin_has_the_same_parameter_count(hf_model, twin):
    assert twin.params == sum(_numels(hf_model)) == 158_016


@pytest.mark.parametrize("stage", STAGES)
def test_model_states_match_planner(engine, hf_model, twin, stage):
    plan = _planner(twin, stage)
    P = sum(_numels(hf_model))
    part = _zero12_partition(hf_model) if stage < 3 else _zero3_partition(hf_model)
    for r, got in enumerate(engine[stage]):
        print(f"zero{stage} rank{r}: engine weights/optimizer {got['weights']}/{got['master'] + got['states']} B, "
              f"planner {plan['params']:.0f}/{plan['optimizer']:.0f} B")
        assert got["optimizer_class"] == ("DeepSpeedZeroOptimizer" if stage < 3 else "DeepSpeedZeroOptimizer_Stage3")
        assert got["partition_numel"] == part
        # 16-bit weights: ZeRO-1/2 keep the whole padded flat buffer (D * part elements, 2 B);
        # ZeRO-3 only the padded ds_tensor partition. Planner: 2*P (stage<3) or 2*P/D.
        pad = (D * part - P) if stage < 3 else (part - P / D)  # padding elements over the planner's count
        assert got["weights"] == (2 * D * part if stage < 3 else 2 * part)
        assert got["weights"] == plan["params"] + 2 * pad
        # optimizer = fp32 master (4 B) + exp_avg + exp_avg_sq (4 + 4 B) over the padded partition;
        # planner: 12 * P / D
        assert got["n_states"] > 0, "Adam states are created lazily at the first step"
        assert got["master"] == 4 * part
        assert got["states"] == 8 * part
        pad_p = part - P / D
        assert got["master"] + got["states"] == plan["optimizer"] + 12 * pad_p


def test_zero3_grad_partition_matches_planner(engine, hf_model, twin):
    # stage3.py grad_partitions_flat_buffer: sum(p.partition_numel()) x 2 B, allocated at init
    plan = _planner(twin, 3)
    part = _zero3_partition(hf_model)
    P = sum(_numels(hf_model))
    for got in engine[3]:
        assert got["grad_partition"] == 2 * part == plan["grads"] + 2 * (part - P / D)


@pytest.mark.parametrize("stage", (1, 2))
def test_zero12_grad_partition_engine_value(engine, hf_model, stage):
    """ZeRO-1 holds the same 16-bit gradient partition as ZeRO-2 (contiguous_gradients installs the
    hooks for stage 1 too), sized by whole parameters overlapping the partition."""
    for r, got in enumerate(engine[stage]):
        assert got["params_in_partition_numel"] == _zero12_grads_in_partition(hf_model, r)
        assert got["grad_partition"] == 2 * _zero12_grads_in_partition(hf_model, r)
        assert got["grad_partition"] == engine[2][r]["grad_partition"]


@pytest.mark.parametrize("stage", (1, 2))
def test_zero12_grads_match_planner(engine, hf_model, twin, stage):
    plan = _planner(twin, stage)
    P = sum(_numels(hf_model))
    pad = _zero12_partition(hf_model) - P / D  # flat-buffer padding per rank, elements
    worst = max(got["grad_partition"] for got in engine[stage])
    # rank 0 here: 83,072 elements (embedding, block 0 and block 1's q projection, whole) vs P/D = 79,008
    assert plan["straddle"] == 2 * (83_072 - 79_008)
    # grads_in_partition becomes the step's averaged_gradients (views into it) on both stages:
    # planner grad_bytes(at_step) 2P/D + its straddle term at the step
    assert plan["straddle_step"] == plan["straddle"]
    assert worst == plan["step_grads"] + plan["straddle_step"] + 2 * pad
    if stage == 2:
        # ZeRO-2 holds it while backward runs too (hooks reduce in every backward): 2P/D + straddle
        assert plan["straddle_bwd"] == plan["straddle"]
        assert worst == plan["grads"] + plan["straddle_bwd"] + 2 * pad
    else:
        # ZeRO-1 backward: the planner books the full 16-bit gradient, 2 B/param, and no straddle
        # (measured in test_zero1_full_gradient_between_micro_steps with gas > 1)
        assert plan["grads"] == 2 * P and plan["straddle_bwd"] == 0


@pytest.mark.parametrize("stage", STAGES)
def test_reduce_buckets_match_planner(engine, twin, stage):
    # stage_1_and_2.py setup_buckets: reduce_bucket_size bf16 elements, a second with overlap_comm
    # (default false for 1/2); stage3.py __init__: one bucket. Planner fwd buffers are exactly the
    # bucket(s) for ZeRO-1/2; for ZeRO-3 they also hold gathered params, so isolate the bucket term
    # as the difference with contiguous_gradients off.
    plan = _planner(twin, stage)
    for got in engine[stage]:
        assert got["overlap_comm"] == (stage == 3)
        assert got["buckets"] == BUCKET * 2 * (1 + got["overlap_comm"] * (stage < 3))
        assert got["buckets"] == plan["buckets"]
        if stage < 3:
            # fwd buffers = bucket(s) + the straddle where the backward gradient is a partition (ZeRO-2)
            # + ZeRO-2's allreduce_bucket flat copy of a bucket, 2 B x BUCKET (measured in
            # tests/test_deepspeed_transients_real.py; this model is larger than the bucket)
            flat = 2 * BUCKET if stage == 2 else 0
            assert got["buckets"] + flat == plan["fwd_buffers"] - plan["straddle_bwd"]
        else:
            no_bucket = _planner(twin, 3, dataclasses.replace(ZERO, contiguous_gradients=False))
            assert got["buckets"] == plan["fwd_buffers"] - no_bucket["fwd_buffers"]


@pytest.mark.parametrize("stage", STAGES)
def test_step_gradient_buffers_match_planner(engine, hf_model, twin, stage):
    # At the optimizer step ZeRO-1/2 hold a flattened 16-bit copy of the grad partition and its fp32
    # conversion at once (stage_1_and_2.py step: flatten(...).to(float32)); ZeRO-3 an fp32 grad of
    # min(sub_group_size, partition) elements. Planner step buffers: partition*(2+4) or that*4.
    plan = _planner(twin, stage)
    P = sum(_numels(hf_model))
    part = _zero12_partition(hf_model) if stage < 3 else _zero3_partition(hf_model)
    for got in engine[stage]:
        assert got["step_fp32_grad"] == 4 * part
        if stage < 3:
            assert got["step_flat_bf16"] == 2 * part
        # ZeRO-3's flattened 16-bit copy (stage3.py _prepare_fp32_grad_for_sub_group: flatten(...).to(fp32))
        # is not probed here: 2 B x part, measured in tests/test_deepspeed_transients_real.py
        held = got["step_fp32_grad"] + (got["step_flat_bf16"] if stage < 3 else 2 * part)
        assert held == plan["step_buffers"] - plan["straddle_step"] + 6 * (part - P / D)



# ---------------------------------------------------------------------------------------------
# gradient accumulation: GAS micro-batches per optimizer step (rows are the second step's)

REDUCTIONS = {"all_reduce", "all_reduce_coalesced", "inference_all_reduce", "reduce", "reduce_scatter",
              "reduce_scatter_tensor"}


def _rows(engine_gas, stage: int, rank: int) -> list[dict]:
    rows = engine_gas[stage][rank]["rows"]
    assert [(row["micro"], row["boundary"]) for row in rows] == [(m, m == GAS - 1) for m in range(GAS)]
    return rows


def _zero1_boundary_reduction(hf_model, rank: int) -> tuple[int, int]:
    """(largest, final) gradient bytes of ZeRO-1's boundary reduction on `rank` at the probes of
    _run_gas (after each copy_grads_in_partition; before _release_ipg_buffers), replaying DeepSpeed
    0.19.8 stage_1_and_2.py: reduce_gradients walks the parameters in model order through
    reduce_independent_p_g_buckets_and_remove_grads. A gradient that fits the bucket is copied into it
    and its p.grad re-pointed there (own storage freed); a larger one is reduced alone, in place, keeping
    its storage. reduce_ipg_grads (when the next one would overflow the bucket, and in the epilogue)
    copies the rank's own parameters into grads_in_partition (allocated whole at the first copy), freeing
    theirs; other ranks' gradients are not cleared on stage 1 (only _clear_param_grad_only, after
    _release_ipg_buffers, drops them)."""
    sizes = _numels(hf_model)
    S = _zero12_partition(hf_model)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    mine = [st < (rank + 1) * S and st + n > rank * S for st, n in zip(starts, sizes)]
    partition = 2 * _zero12_grads_in_partition(hf_model, rank)
    own = {i: 2 * n for i, n in enumerate(sizes)}  # p.grad storages autograd made (full 16-bit gradient)
    bucket, largest, allocated = [], 0, False

    def reduce():
        nonlocal largest, allocated
        for j in bucket:
            if mine[j]:
                allocated = True
                own.pop(j, None)
                largest = max(largest, partition + sum(own.values()))
        bucket.clear()

    for i, n in enumerate(sizes):
        if sum(sizes[j] for j in bucket) + n > BUCKET:
            reduce()
        if n <= BUCKET:
            own.pop(i)
        bucket.append(i)
    reduce()
    assert allocated
    return largest, partition + sum(own.values())


def test_planner_accumulation_terms(hf_model, twin):
    """The planner's gas-4 terms the measurements below are compared with."""
    P = sum(_numels(hf_model))
    one = {s: _planner(twin, s) for s in STAGES}
    acc = {s: _planner(twin, s, gas=GAS) for s in STAGES}
    # ZeRO-1 backward: the full 16-bit gradient whatever the gas (1 not in grads_sharded_backward)
    assert acc[1]["grads"] == one[1]["grads"] == 2 * P
    # ZeRO-2 backward: a second 2/D partition from the second micro-batch on (accumulation_copy)
    assert acc[2]["grads"] == 2 * one[2]["grads"] == 2 * 2 * P / D
    # ZeRO-3 accumulates into the one flat partition
    assert acc[3]["grads"] == one[3]["grads"] == 2 * P / D
    # at the step every stage holds the 2/D partition (grads_sharded_step)
    assert {acc[s]["step_grads"] for s in STAGES} == {2 * P / D}
    # straddle (2 x (83,072 - 79,008) B): in backward for ZeRO-2 only (once per partition buffer: two
    # from the second micro-batch on), at the step for ZeRO-1/2
    assert [one[s]["straddle_bwd"] for s in STAGES] == [0, 2 * 4064, 0]
    assert [acc[s]["straddle_bwd"] for s in STAGES] == [0, 2 * 2 * 4064, 0]
    assert [acc[s]["straddle_step"] for s in STAGES] == [2 * 4064, 2 * 4064, 0]
    # reductions per step: every micro-batch for ZeRO-2/3, once for ZeRO-1; all-reduce for ZeRO-1/2
    assert [acc[s]["reductions"] for s in STAGES] == [1, GAS, GAS]
    assert [acc[s]["all_reduce"] for s in STAGES] == [True, True, False]


def _optimizer_class(stage: int) -> str:
    return "DeepSpeedZeroOptimizer" if stage < 3 else "DeepSpeedZeroOptimizer_Stage3"


def test_gas_run_is_gas_steps(engine_gas):
    for stage in STAGES:
        for r, got in enumerate(engine_gas[stage]):
            assert got["gas"] == GAS
            assert got["optimizer_class"] == _optimizer_class(stage)
            _rows(engine_gas, stage, r)


def test_zero1_full_gradient_between_micro_steps(engine_gas, hf_model, twin):
    """ZeRO-1 (overlap_comm off) reduces nothing before the boundary: its hooks only set up the bucket
    (stage_1_and_2.py process_gradients / reduce_ready_partitions_and_remove_grads), so p.grad is the
    full 16-bit gradient, accumulated by autograd, after every non-boundary backward."""
    plan = _planner(twin, 1, gas=GAS)
    P = sum(_numels(hf_model))
    for r in range(D):
        rows = _rows(engine_gas, 1, r)
        for row in rows[:-1]:
            for probe in ("autograd_done", "after_backward", "after_step"):
                got = row[probe]
                # p.grad of every parameter, 2 B each, and no partition buffer yet; planner
                # grad_bytes(gas 4, backward) = 2 B/param whole (1 not in grads_sharded_backward)
                assert got["total"] == got["p.grad"] == 2 * P == plan["grads"]
                assert got["grads_in_partition"] == got["all_grad_tensors"] == got["averaged_gradients"] == 0
                # setup_buckets ran at the first hook and _release_ipg_buffers only runs in the boundary
                # epilogue: the bucket (reduce_bucket_size x 2 B) stays across micro-steps
                assert got["buckets"] == BUCKET * 2 == plan["buckets"]
        # the boundary's backward too ends autograd with the whole gradient
        assert rows[-1]["autograd_done"]["total"] == 2 * P == plan["grads"]


def test_zero1_boundary_reduction_engine_value(engine_gas, hf_model):
    """At the boundary, reduce_gradients allocates grads_in_partition while most of the full p.grad is
    still alive; replayed exactly by _zero1_boundary_reduction."""
    for r in range(D):
        boundary = _rows(engine_gas, 1, r)[-1]
        largest, final = _zero1_boundary_reduction(hf_model, r)
        assert boundary["backward_peak"]["total"] == largest
        assert boundary["pre_release"]["total"] == final
        assert boundary["pre_release"]["grads_in_partition"] == 2 * _zero12_grads_in_partition(hf_model, r)
    # rank 0: grads_in_partition 2 x 83,072 B + every gradient but the embedding's (2 x (158,016 -
    # 32,768)); rank 1: 2 x 79,040 + all but block 0's attention, its norms and block 1's q (16,512)
    assert [_rows(engine_gas, 1, r)[-1]["backward_peak"]["total"] for r in range(D)] == [
        2 * 83_072 + 2 * (158_016 - 32_768), 2 * 79_040 + 2 * (158_016 - 16_512)]


def test_zero1_boundary_reduction_matches_planner(engine_gas, hf_model, twin):
    """The planner's gradient-reduction moment for ZeRO-1 (memory.reduction_copy_bytes): the full
    16-bit gradient, the new grads_in_partition (2P/D) with its straddling parameters, and the bucket.
    It is the worst rank's transient just after grads_in_partition is allocated, before the first
    full gradient is freed; the probes (after each copy) never exceed it."""
    plan = _planner(twin, 1, gas=GAS)
    P = sum(_numels(hf_model))
    # 2P + 2P/D gradients, straddle (2 x 4,064 on rank 0) + bucket in buffers
    assert plan["reduce_grads"] == 2 * P + 2 * P / D
    assert plan["reduce_buffers"] == plan["straddle_step"] + plan["buckets"]
    transient = max(2 * _zero12_grads_in_partition(hf_model, r) + 2 * P for r in range(D))
    assert transient == 2 * 83_072 + 2 * 158_016 == plan["reduce_grads"] + plan["straddle_step"]  # 482,176 B
    worst = max(_rows(engine_gas, 1, r)[-1]["backward_peak"]["total"] for r in range(D))
    assert worst <= plan["reduce_grads"] + plan["straddle_step"]  # measured 441,088 B on rank 1


def test_zero2_accumulation_copy_engine_value(engine_gas, hf_model):
    """ZeRO-2: the epilogue of micro-step 0 keeps the reduced partition as all_grad_tensors (views of that
    step's grads_in_partition, stage_1_and_2.py independent_gradient_partition_epilogue); every later
    micro-step's first reduction allocates a new grads_in_partition (copy_grads_in_partition, the old one
    was dropped by _release_ipg_buffers), added into the first before _release_ipg_buffers frees it."""
    for r in range(D):
        G = 2 * _zero12_grads_in_partition(hf_model, r)  # whole parameters overlapping the partition, 2 B
        rows = _rows(engine_gas, 2, r)
        assert rows[0]["pre_release"]["total"] == G
        for row in rows[1:]:
            # two whole grads_in_partition buffers, each with its straddling parameters: the new one and
            # the accumulated one (all_grad_tensors; at the boundary the epilogue has already handed it
            # over to averaged_gradients)
            accumulated = "averaged_gradients" if row["boundary"] else "all_grad_tensors"
            assert row["pre_release"]["total"] == 2 * G
            assert row["pre_release"]["grads_in_partition"] == row["pre_release"][accumulated] == G
        for row in rows[:-1]:
            # between micro-steps: only the accumulated partition; the bucket is released every backward
            assert row["after_backward"]["total"] == row["after_backward"]["all_grad_tensors"] == G
            assert row["after_backward"]["buckets"] == 0
    # worst rank 0: 2 x 2 x 83,072 B = 2 x (2P/D + straddle) = planner grad_bytes(gas 4) + 2 x straddle
    assert max(_rows(engine_gas, 2, r)[1]["pre_release"]["total"] for r in range(D)) == 2 * 2 * 83_072


def test_zero2_accumulation_copy_matches_planner(engine_gas, hf_model, twin):
    plan = _planner(twin, 2, gas=GAS)
    P = sum(_numels(hf_model))
    pad = _zero12_partition(hf_model) - P / D
    # planner: grad_bytes(gas 4) = 2 x 2P/D (test_planner_accumulation_terms) + the straddle of each
    # of the two partition buffers (measured 332,288 B = 2 x (2P/D + straddle)); padding per buffer
    worst = max(row["pre_release"]["total"] for r in range(D) for row in _rows(engine_gas, 2, r)[1:])
    assert worst == plan["grads"] + plan["straddle_bwd"] + 2 * 2 * pad


@pytest.mark.parametrize("stage", (1, 2))
def test_zero12_step_partition_with_accumulation(engine_gas, hf_model, twin, stage):
    """At the boundary's optimizer step both stages hold averaged_gradients: views of the (accumulated)
    grads_in_partition storage plus zero pads (stage_1_and_2.py get_flat_partition)."""
    plan = _planner(twin, stage, gas=GAS)
    P = sum(_numels(hf_model))
    pad = _zero12_partition(hf_model) - P / D
    for r in range(D):
        got = _rows(engine_gas, stage, r)[-1]["at_step"]
        assert got["total"] == got["averaged_gradients"] == 2 * _zero12_grads_in_partition(hf_model, r)
        assert got["p.grad"] == 0 and got["buckets"] == 0  # epilogue: _clear_param_grad_only, _release_ipg_buffers
        assert _rows(engine_gas, stage, r)[-1]["after_step"]["total"] == 0  # step drops averaged_gradients
    worst = max(_rows(engine_gas, stage, r)[-1]["at_step"]["total"] for r in range(D))
    # planner grad_bytes(at_step) 2P/D + straddle at the step (= 2 x (83,072 - 79,008) B) + padding
    assert worst == plan["step_grads"] + plan["straddle_step"] + 2 * pad == 2 * 83_072


def test_zero3_grad_partition_with_accumulation(engine_gas, hf_model, twin):
    """ZeRO-3 accumulates every micro-step's reduce-scattered partition into the same
    grad_partitions_flat_buffer (stage3.py partition_grads: copy_ at micro_step_id 0, add_ after): no
    second partition, matching the planner (3 not in accumulation_copy)."""
    plan = _planner(twin, 3, gas=GAS)
    P = sum(_numels(hf_model))
    part = _zero3_partition(hf_model)
    assert plan["grads"] == _planner(twin, 3)["grads"] == plan["step_grads"] == 2 * P / D
    for r in range(D):
        for row in _rows(engine_gas, 3, r):
            for probe in ("autograd_done", "pre_release", "after_backward", "after_step"):
                assert row[probe]["grad_partitions_flat_buffer"] == 2 * part
                assert row[probe]["buckets"] == BUCKET * 2 == plan["buckets"]  # one bucket, allocated at init
            # after the epilogue: the buffer alone (partition_grads set every p.grad to None); planner
            # grad_bytes(gas 4) 2P/D + ZeRO-3's per-parameter padding ceil(numel/D)
            assert row["pre_release"]["total"] == row["after_backward"]["total"] == plan["grads"] + 2 * (part - P / D)
        # at the step: averaged_gradients are views of the same buffer
        assert _rows(engine_gas, 3, r)[-1]["at_step"]["total"] == plan["step_grads"] + 2 * (part - P / D)


@pytest.mark.parametrize("stage", (2, 3))
def test_pending_large_gradient_at_end_of_autograd(engine_gas, hf_model, stage):
    """When autograd finishes, one gradient is still unreduced: the embedding's (first in model order,
    so produced last), larger than reduce_bucket_size, so kept in its own storage instead of the bucket
    (stage_1_and_2.py extra_large_param_to_reduce; stage3.py __add_grad_to_ipg_bucket copies only
    what fits) until the epilogue reduces it. Not a planner term: a transient of one parameter."""
    embedding = hf_model.model.embed_tokens.weight.numel()
    assert embedding > BUCKET
    for r in range(D):
        for row in _rows(engine_gas, stage, r):
            assert row["autograd_done"]["total"] - row["pre_release"]["total"] == 2 * embedding


def _grad_calls(engine_gas, stage: int, rank: int) -> list[list]:
    # (micro, phase, op, elements, dtype, is-gradient-reduction, innermost deepspeed/runtime caller)
    return [c for c in engine_gas[stage][rank]["collectives"] if c[5]]


@pytest.mark.parametrize("stage", STAGES)
def test_gradient_reductions_per_step_match_planner(engine_gas, twin, stage):
    plan = _planner(twin, stage, gas=GAS)
    for r in range(D):
        micro_steps = sorted({c[0] for c in _grad_calls(engine_gas, stage, r)})
        # engine.py allreduce_gradients: ZeRO-2/3 reduce in every backward, ZeRO-1 in the boundary's
        # (micro-step GAS - 1) only; planner timing.grad_reductions_per_step: gas = 4 or 1
        assert micro_steps == (list(range(GAS)) if stage >= 2 else [GAS - 1])
        assert len(micro_steps) == plan["reductions"] == (GAS if stage >= 2 else 1)
        assert {c[1] for c in _grad_calls(engine_gas, stage, r)} == {"backward"}


@pytest.mark.parametrize("stage", STAGES)
def test_gradient_reduction_kind_matches_planner(engine_gas, twin, stage):
    plan = _planner(twin, stage, gas=GAS)
    for r in range(D):
        ops = {c[2] for c in _grad_calls(engine_gas, stage, r)}
        # ZeRO-1/2: average_tensor -> allreduce_and_scatter -> allreduce_bucket -> dist.all_reduce
        # (use_multi_rank_bucket_allreduce default true); ZeRO-3: __avg_scatter_grads ->
        # reduce_scatter_coalesced -> dist.reduce_scatter_fn -> reduce_scatter_tensor.
        # planner: training.engine.all_reduce_stages == (0, 1, 2)
        assert ops == ({"all_reduce"} if plan["all_reduce"] else {"reduce_scatter_tensor"})
        assert ops == ({"all_reduce"} if stage < 3 else {"reduce_scatter_tensor"})
        # innermost deepspeed/runtime caller: stage_1_and_2.py allreduce_bucket; coalesced_collectives.py
        # _torch_reduce_scatter_fn (called by reduce_scatter_coalesced)
        sites = {c[6] for c in _grad_calls(engine_gas, stage, r)}
        assert sites == ({"allreduce_bucket"} if stage < 3 else {"_torch_reduce_scatter_fn"})


@pytest.mark.parametrize("stage", STAGES)
def test_gradient_reduction_volume(engine_gas, hf_model, stage):
    """Every reducing micro-step moves each gradient element once: ZeRO-1/2 all-reduce the P elements
    (the bucket's slices of every partition, allreduce_and_scatter), ZeRO-3 reduce-scatters D x
    ceil(numel/D) per parameter (reduce_scatter_coalesced pads each to a multiple of D)."""
    P = sum(_numels(hf_model))
    expected = P if stage < 3 else D * _zero3_partition(hf_model)
    for r in range(D):
        per_micro = {}
        for c in _grad_calls(engine_gas, stage, r):
            per_micro[c[0]] = per_micro.get(c[0], 0) + c[3]
        assert set(per_micro.values()) == {expected}
        calls = len(_grad_calls(engine_gas, stage, r)) / len(per_micro)
        print(f"zero{stage} rank{r}: {calls:.0f} gradient-reduction calls per reducing micro-step "
              f"(planner's ceil(P / reduce_bucket_size) = {math.ceil(P / BUCKET)})")


def test_zero3_backward_gathers_only_what_forward_released(engine_gas, twin):
    """ZeRO-3 gathers every parameter in each micro-step's forward; with the default
    stage3_max_reuse_distance (1e9) a model under it stays gathered into backward, which gathers
    nothing (0.19.8 partitioned_param_coordinator.py __params_to_release). The planner's backward
    passes are 1 - kept/gathered (engines/deepspeed/memory.py zero3_kept_params): 0 here; Llama-2-7B's 6.74e9 elements keep
    1e9 (test_timing.py)."""
    for r in range(D):
        gathers = [c for c in engine_gas[3][r]["collectives"] if c[2] == "all_gather_into_tensor"]
        per_micro = {m: sum(c[3] for c in gathers if c[0] == m and c[1] == "forward") for m in range(GAS)}
        backward = sum(c[3] for c in gathers if c[1] == "backward")
        assert backward == 0 and len(set(per_micro.values())) == 1 and per_micro[0] >= twin.params
    training = Training(seq_len=SEQ, precision="bf16", engine="deepspeed", zero_config=ZERO)
    z3 = timing.zero3_gather_s(Step(twin, hardware.Cluster(hardware.lookup_gpu("h100-sxm"), D, D), training, layout.single(dp=D, zero=3, gas=GAS), timing.coefficients("time")))
    assert z3["fwd"][0] == GAS and z3["bwd"][0] == 0


@pytest.mark.parametrize("stage", STAGES)
def test_gradient_reductions_are_separable(engine_gas, hf_model, stage):
    """The call-site classification (under reduce_ipg_grads / __reduce_and_partition_ipg_grads) agrees
    with a size one: gradient reductions are the 16-bit reductions of more than one element; the other
    reductions are the 1-element overflow and grad-norm all-reduces of step(); parameters move by
    all-gather (ZeRO-1/2: all_gather_dp_groups after the step; ZeRO-3: fetch in forward). All go through
    deepspeed.comm (nothing calls torch.distributed directly), and both ranks issue the same sequence."""
    P = sum(_numels(hf_model))
    for r in range(D):
        got = engine_gas[stage][r]
        assert got["bypass"] == []
        for micro, phase, op, numel, dtype, grad, site in got["collectives"]:
            assert grad == (op in REDUCTIONS and dtype == "bfloat16" and numel > 1), (micro, phase, op, numel, site)
            if op in REDUCTIONS and not grad:
                assert numel == 1 and phase == "step" and site in ("has_overflow", "get_grad_norm_direct")
            if not grad:
                assert op in REDUCTIONS or op == "all_gather_into_tensor"
        gathers = [c for c in got["collectives"] if c[2] == "all_gather_into_tensor"]
        if stage < 3:
            # one gather of the padded flat 16-bit buffer, after the boundary's step
            assert [(c[0], c[1], c[3]) for c in gathers] == [(GAS - 1, "step", D * _zero12_partition(hf_model))]
        else:
            assert {c[1] for c in gathers} == {"forward"} and {c[0] for c in gathers} == set(range(GAS))
    signature = [[tuple(c[:5]) for c in engine_gas[stage][r]["collectives"]] for r in range(D)]
    assert signature[0] == signature[1]
