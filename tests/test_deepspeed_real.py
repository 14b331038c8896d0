"""The planner's per-rank model-state and buffer bytes against a real DeepSpeed engine.

Two gloo processes on CPU train a tiny Llama (transformers) for 2 steps with ZeRO 1, 2 and 3
(bf16, torch AdamW passed in: no JIT build), one spawn running the three stages in turn. Each
rank counts, by unique storage (data_ptr dedup, storage nbytes), the buffers the engine holds
(shared/reference/deepspeed-behaviour.md): 16-bit weights, fp32 master partition, Adam
exp_avg/exp_avg_sq, the 16-bit gradient partition, the reduce bucket(s) and the fp32 gradient
live at the optimizer step. The parent compares them with `planner.memory.model_states` and
`engine_buffers` for `layout.single(dp=2, zero=S)` and the same ZeroConfig.

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
import socket
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before any deepspeed import

import pytest

from planner import layout, memory
from planner.hardware import Cluster, lookup_gpu
from planner.layout import Training, ZeroConfig
from planner.model import from_hf_config

D = 2  # data-parallel ranks (processes)
STAGES = (1, 2, 3)
SEQ = 16
STEPS = 2
BUCKET = 4096  # reduce/allgather/prefetch bucket elements (the 5e8 default is 1 GB of bf16)
PERSISTENCE = 10  # stage3_param_persistence_threshold: every tensor here (>= 64 elements) is partitioned
LLAMA = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 176, "vocab_size": 512, "tie_word_embeddings": False, "max_position_embeddings": 64}
ZERO = ZeroConfig(reduce_bucket_size=BUCKET, allgather_bucket_size=BUCKET, stage3_prefetch_bucket_size=BUCKET,
                  stage3_param_persistence_threshold=PERSISTENCE, contiguous_gradients=True, overlap_comm=None)

pytestmark = pytest.mark.slow


# ---------------------------------------------------------------------------------------------
# worker (runs in the spawned processes; imports this module by name)


def _ds_config(stage: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_allow_untested_optimizer": True,  # torch.optim.AdamW is not on ZeRO's tested list
        "steps_per_print": 10**9,
        "zero_optimization": {
            "stage": stage,
            "reduce_bucket_size": ZERO.reduce_bucket_size,
            "allgather_bucket_size": ZERO.allgather_bucket_size,
            "stage3_prefetch_bucket_size": ZERO.stage3_prefetch_bucket_size,
            "stage3_param_persistence_threshold": ZERO.stage3_param_persistence_threshold,
            "contiguous_gradients": ZERO.contiguous_gradients,
            # overlap_comm left at its default (None: true for stage 3, false for 1/2)
        },
    }


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (views of one buffer count once)."""
    seen = {}
    for t in tensors:
        if t is None or t.device.type == "meta":
            continue
        s = t.untyped_storage()
        if s.nbytes():
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def _run_stage(stage: int, rank: int) -> dict:
    import deepspeed
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)  # same initial weights on both ranks
    model = LlamaForCausalLM(LlamaConfig(**LLAMA))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=_ds_config(stage))
    seen = {"grad_partition": [], "buckets": [], "step_fp32_grad": [], "step_flat_bf16": []}

    if stage in (1, 2):
        # The 16-bit gradient partition and the reduce bucket(s) live from the first gradient hook to
        # the end of backward, where _release_ipg_buffers drops them: record them just before.
        release = opt._release_ipg_buffers

        def _release():
            gip = opt.grads_in_partition
            seen["grad_partition"].append(_storage_bytes([gip]) if gip is not None else 0)
            seen["buckets"].append(_storage_bytes([b for bk in opt.ipg_buckets.values() for b in bk.buffer]))
            release()

        opt._release_ipg_buffers = _release

        # stage_1_and_2.py step(): flat_grad_partition = flatten(...) (16-bit copy) is alive while
        # .to(float32) makes the fp32 grad partition; record the flattened copy's size.
        for name in ("flatten", "flatten_dense_tensors_aligned"):
            fn = getattr(opt, name)

            def _flat(*a, _fn=fn, **k):
                out = _fn(*a, **k)
                if in_step:
                    seen["step_flat_bf16"].append(out.numel() * out.element_size())
                return out

            setattr(opt, name, _flat)

        outer_step, in_step = opt.step, False

        def _step(*a, **k):
            nonlocal in_step
            in_step = True
            try:
                return outer_step(*a, **k)
            finally:
                in_step = False

        opt.step = _step

    inner_step = opt.optimizer.step

    def _inner_step(*a, **k):  # fp32 gradient the inner optimizer reads
        seen["step_fp32_grad"].append(_storage_bytes(p.grad for g in opt.optimizer.param_groups for p in g["params"]))
        return inner_step(*a, **k)

    opt.optimizer.step = _inner_step

    gen = torch.Generator().manual_seed(1 + rank)
    for _ in range(STEPS):
        ids = torch.randint(0, LLAMA["vocab_size"], (1, SEQ), generator=gen)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
    assert torch.isfinite(loss.detach().float()).item()

    states = [t for st in opt.optimizer.state.values() for k, t in st.items() if k in ("exp_avg", "exp_avg_sq")]
    params = list(engine.module.parameters())
    if stage in (1, 2):
        weights = _storage_bytes([*opt.bit16_groups_flat, *(p.data for p in params)])
        master = _storage_bytes(opt.single_partition_of_fp32_groups)
        partition_numel = sum(int(t.numel()) for t in opt.single_partition_of_fp32_groups)
        grad_partition = seen["grad_partition"][-1]
        buckets = seen["buckets"][-1]
        in_partition = sum(int(p.numel()) for grp in opt.params_in_partition for p in grp)
    else:
        # ds_tensor partitions (views into lp_param_buffer) and any still-gathered full params
        weights = _storage_bytes([*(p.ds_tensor for p in params), *(p.data for p in params),
                                  *opt.fp16_partitioned_groups_flat, getattr(opt, "lp_param_buffer", None)])
        master = _storage_bytes(opt.fp32_partitioned_groups_flat)
        partition_numel = sum(int(t.numel()) for t in opt.fp32_partitioned_groups_flat)
        grad_partition = _storage_bytes([opt.grad_partitions_flat_buffer])
        buckets = _storage_bytes([bk.buffer for bk in opt.ipg_buckets.values() if bk.buffer is not None])
        in_partition = None
    out = {
        "optimizer_class": type(opt).__name__,
        "overlap_comm": bool(engine.zero_overlap_comm()),
        "weights": weights,
        "master": master,
        "states": _storage_bytes(states),
        "n_states": len(states),
        "grad_partition": grad_partition,
        "buckets": buckets,
        "partition_numel": partition_numel,
        "params_in_partition_numel": in_partition,
        "step_fp32_grad": seen["step_fp32_grad"][-1],
        "step_flat_bf16": seen["step_flat_bf16"][-1] if seen["step_flat_bf16"] else None,
        "loss": float(loss.detach().float()),
    }
    if hasattr(engine, "destroy"):
        engine.destroy()
    return out


def _worker(rank: int, port: int, outdir: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(D), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), DS_ACCELERATOR="cpu")
    import importlib
    import signal

    import torch

    signal.alarm(300)  # a hung gloo collective kills the worker, and mp.spawn reports it
    torch.set_num_threads(1)
    # deepspeed/comm/torch.py builds its shared-memory all-reduce op with gcc+ninja at
    # init_distributed (~23 s cold); training all-reduce goes through torch.distributed, so skip it.
    # (`import deepspeed.comm.torch as m` would bind the torch package: deepspeed.comm imports torch.)
    ds_comm_torch = importlib.import_module("deepspeed.comm.torch")
    ds_comm_torch.build_shm_op = lambda: None
    results = {}
    for stage in STAGES:
        results[stage] = _run_stage(stage, rank)
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


# ---------------------------------------------------------------------------------------------
# parent side


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
def engine(tmp_path_factory):
    """{stage: [rank0 dict, rank1 dict]} measured in one spawn of D gloo processes."""
    try:
        import deepspeed  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure (not only ImportError) means no engine
        pytest.skip(f"deepspeed cannot be imported: {exc!r}")
    import torch.multiprocessing as mp

    outdir = tmp_path_factory.mktemp("ds_real")
    t0 = time.perf_counter()
    mp.spawn(_worker, args=(_free_port(), str(outdir)), nprocs=D, join=True)
    wall = time.perf_counter() - t0
    ranks = [json.loads((outdir / f"rank{r}.json").read_text()) for r in range(D)]
    out = {s: [ranks[r][str(s)] for r in range(D)] for s in STAGES}
    print(f"\n[deepspeed_real] spawn of {D} ranks x ZeRO {STAGES}: {wall:.1f} s")
    for s in STAGES:
        for r in range(D):
            print(f"  zero{s} rank{r}: {out[s][r]}")
    return out


def _planner(twin, stage: int, zc: ZeroConfig = ZERO) -> dict:
    lay = layout.single(dp=D, zero=stage)
    training = Training(seq_len=SEQ, precision="bf16", engine="deepspeed", zero_config=zc)
    cluster = Cluster(lookup_gpu("h100-sxm"), D, D)
    states = memory.model_states(twin, cluster, training, lay, 0)
    fwd, step = memory.engine_buffers(twin, training, lay, states, 0)
    out = {k: float(states[k][0]) for k in ("params", "grads", "optimizer")}
    out.update(fwd_buffers=float(fwd[0]), step_buffers=float(step[0]))
    # ZeRO-1/2: bytes by which the worst rank's gradient partition exceeds 2*P/D (whole straddling
    # parameters); the planner books them under buffers, in both phases
    straddle = memory.deepspeed_grad_partition_excess(twin, lay, 0)[0] * 2 if stage in (1, 2) else 0.0
    out["straddle"] = float(straddle)
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
    assert worst == plan["grads"] + plan["straddle"] + 2 * pad


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
        if stage < 3:
            assert got["buckets"] == plan["fwd_buffers"] - plan["straddle"]
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
        held = got["step_fp32_grad"] + (got["step_flat_bf16"] if stage < 3 else 0)
        if stage < 3:
            assert got["step_flat_bf16"] == 2 * part
        assert held == plan["step_buffers"] - plan["straddle"] + (6 if stage < 3 else 4) * (part - P / D)
