"""Worker: DeepSpeed ZeRO 1/2/3 on 2 gloo ranks, measured byte by byte (tests/test_deepspeed_real.py
compares it with the planner). Run under torchrun: `python -m torch.distributed.run --standalone
--nproc_per_node 2 -m calibrate.engines.deepspeed_exact`.

Each rank trains a tiny Llama (transformers) with ZeRO 1, 2 and 3 (bf16, torch AdamW passed in: no
JIT build), 2 steps with gradient_accumulation_steps 1 and then 2 steps with GAS = 4, and counts, by
unique storage (data_ptr dedup, storage nbytes), the buffers the engine holds, the gradient bytes at
fixed points of every micro-step, and every collective of DeepSpeed's communication backend with its
call site.
"""

from __future__ import annotations

import os

from calibrate.harness.worker_io import rank, write_result
from planner.layout import ZeroConfig

D = 2  # data-parallel ranks (processes)
STAGES = (1, 2, 3)
SEQ = 16
STEPS = 2
GAS = 4  # micro-batches per optimizer step of the accumulation run
BUCKET = 4096  # reduce/allgather/prefetch bucket elements (the 5e8 default is 1 GB of bf16)
PERSISTENCE = 10  # stage3_param_persistence_threshold: every tensor here (>= 64 elements) is partitioned
LLAMA = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 176, "vocab_size": 512, "tie_word_embeddings": False, "max_position_embeddings": 64}
ZERO = ZeroConfig(reduce_bucket_size=BUCKET, allgather_bucket_size=BUCKET, stage3_prefetch_bucket_size=BUCKET,
                  stage3_param_persistence_threshold=PERSISTENCE, contiguous_gradients=True, overlap_comm=None)


# ---------------------------------------------------------------------------------------------
# the rank's side


def _ds_config(stage: int, gas: int = 1) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": gas,
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


# ---- gradient accumulation (GAS micro-batches per optimizer step) ---------------------------

# DeepSpeed functions whose collectives are gradient reductions: the ipg-bucket reduction of
# stage_1_and_2.py (reduce_ipg_grads -> average_tensor -> allreduce_bucket) and of stage3.py
# (__reduce_and_partition_ipg_grads -> __avg_scatter_grads -> reduce_scatter_coalesced). Every
# other collective (parameter all-gathers, norm and overflow all-reduces) is something else.
GRAD_SITES = {"reduce_ipg_grads", "__reduce_and_partition_ipg_grads"}  # code names (not name-mangled)
# deepspeed/comm/torch.py TorchBackend: the one object every deepspeed.comm collective goes through
# (deepspeed.comm.comm.cdb); reduce_scatter_fn -> reduce_scatter_tensor lands here too
BACKEND_OPS = ("all_reduce", "all_reduce_coalesced", "inference_all_reduce", "reduce", "reduce_scatter",
               "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor", "all_gather_base",
               "all_gather_coalesced", "broadcast", "all_to_all_single", "all_to_all")
# the same collectives called on torch.distributed directly, i.e. bypassing deepspeed.comm
TORCH_OPS = ("all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter", "reduce_scatter_tensor",
             "all_gather", "all_gather_into_tensor", "broadcast", "all_to_all_single")


class _Collectives:
    """Records every collective of the DeepSpeed backend while `where` is set: (where, op, elements,
    dtype, is-gradient-reduction, innermost deepspeed/runtime function). Installed once per process."""

    def __init__(self):
        self.where, self.calls, self.bypass, self.depth = None, [], [], 0

    def install(self, cdb, tdist):
        for name in BACKEND_OPS:
            if hasattr(cdb, name):
                setattr(cdb, name, self._wrap(name, getattr(cdb, name), self.calls))
        for name in TORCH_OPS:
            if hasattr(tdist, name):
                setattr(tdist, name, self._wrap(name, getattr(tdist, name), self.bypass))

    def _wrap(self, name, fn, log):
        import sys

        import torch

        def wrapped(*args, **kwargs):
            if self.where is not None and self.depth == 0:
                tensors = [t for a in (*args, *kwargs.values())
                           for t in (a if isinstance(a, (list, tuple)) else [a]) if isinstance(t, torch.Tensor)]
                # the largest tensor: a reduce-scatter's input, an all-gather's output
                big = max(tensors, key=lambda t: t.numel()) if tensors else None
                frames, f = [], sys._getframe(1)
                while f is not None:  # deepspeed/runtime callers, innermost first (nvtx wrappers skipped)
                    if "/deepspeed/runtime/" in f.f_code.co_filename.replace(os.sep, "/") \
                            and f.f_code.co_name != "wrapped_fn":
                        frames.append(f.f_code.co_name)
                    f = f.f_back
                log.append([*self.where, name, int(big.numel()) if big is not None else 0,
                            str(big.dtype).removeprefix("torch.") if big is not None else None,
                            bool(GRAD_SITES.intersection(frames)), frames[0] if frames else None])
            self.depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth -= 1

        return wrapped


_COLLECTIVES = _Collectives()


def _grad_buffers(engine, opt, stage: int) -> dict:
    """Bytes of the gradient storages held now, by unique storage: p.grad and the optimizer's
    gradient buffers ("total": their union), the reduce bucket(s) apart ("buckets"), and each
    category alone (categories share storage: p.grad are views into the partition buffers)."""
    import torch

    def ptrs(tensors):
        out = {}
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes():
                out[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return out

    def flat(x):
        if isinstance(x, dict):
            x = list(x.values())
        if isinstance(x, (list, tuple)):
            return [t for v in x for t in flat(v)]
        return [x]

    cats = {"p.grad": ptrs(p.grad for p in engine.module.parameters())}
    if stage in (1, 2):
        buckets = ptrs(b for bk in opt.ipg_buckets.values() for b in bk.buffer)
        for name in ("grads_in_partition", "all_grad_tensors", "averaged_gradients"):
            cats[name] = ptrs(flat(getattr(opt, name, None)))
    else:
        buckets = ptrs(bk.buffer for bk in opt.ipg_buckets.values() if bk.buffer is not None)
        cats["grad_partitions_flat_buffer"] = ptrs([opt.grad_partitions_flat_buffer])
        cats["averaged_gradients"] = ptrs(flat(opt.averaged_gradients))
    union = {k: v for c in cats.values() for k, v in c.items() if k not in buckets}
    out = {name: sum(v for k, v in c.items() if k not in buckets) for name, c in cats.items()}
    return {"total": sum(union.values()), "buckets": sum(buckets.values()), **out}


def _run_gas(stage: int, rank: int) -> dict:
    """GAS micro-batches per step: gradient bytes (_grad_buffers) at fixed points of every micro-step
    of the second step, and every collective of that step by micro-step and phase (forward/backward/
    step). Probes: autograd_done (engine.allreduce_gradients entered: autograd finished, epilogue or
    boundary reduction not yet run), pre_release (ZeRO-1/2: _release_ipg_buffers entered, the end of
    the epilogue; ZeRO-3: epilogue returned), after_backward, at_step (optimizer step entered, boundary
    only), after_step, and backward_peak: the largest total among the backward's probes, which also
    read after every copy into the partition (copy_grads_in_partition / partition_grads) and every
    bucket reduction."""
    import deepspeed
    import torch
    import torch.distributed as tdist
    from deepspeed.comm import comm as ds_comm
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**LLAMA))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=_ds_config(stage, GAS))
    if not getattr(ds_comm.cdb, "_planner_recorded", False):
        _COLLECTIVES.install(ds_comm.cdb, tdist)
        ds_comm.cdb._planner_recorded = True
    rec = _COLLECTIVES
    probes = {}  # probe name -> snapshot, for the current micro-step
    peak = {"total": -1}

    def snap(name=None):
        s = _grad_buffers(engine, opt, stage)
        if name:
            probes[name] = s
        if rec.where and rec.where[2] == "backward" and s["total"] > peak["total"]:
            peak.update(s)

    def before(obj, attr, name=None):
        fn = getattr(obj, attr)

        def wrapped(*a, **k):
            snap(name)
            return fn(*a, **k)

        setattr(obj, attr, wrapped)

    def after(obj, attr, name=None):
        fn = getattr(obj, attr)

        def wrapped(*a, **k):
            out = fn(*a, **k)
            snap(name)
            return out

        setattr(obj, attr, wrapped)

    # end of autograd's backward, before the engine's epilogue/boundary reduction (engine.py _backward_epilogue)
    before(engine, "allreduce_gradients", "autograd_done")
    if stage in (1, 2):
        before(opt, "_release_ipg_buffers", "pre_release")  # end of the epilogue, buffers still held
        after(opt, "copy_grads_in_partition")  # every copy into grads_in_partition: peak candidates
        after(opt, "reduce_ipg_grads")
    else:
        after(opt, "independent_gradient_partition_epilogue", "pre_release")
        after(opt, "partition_grads")
        after(opt, "_DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads")
    before(opt, "step", "at_step")  # the boundary's optimizer step (engine.step -> _take_model_step)

    gen = torch.Generator().manual_seed(11 + rank)
    micro_rows, calls_step0 = [], 0
    for step in range(STEPS):
        for micro in range(GAS):
            ids = torch.randint(0, LLAMA["vocab_size"], (1, SEQ), generator=gen)
            probes.clear()
            peak.clear()
            peak["total"] = -1
            rec.where = (step, micro, "forward")
            loss = engine(input_ids=ids, labels=ids).loss
            boundary = bool(engine.is_gradient_accumulation_boundary())
            rec.where = (step, micro, "backward")
            engine.backward(loss)
            rec.where = None
            probes["after_backward"] = _grad_buffers(engine, opt, stage)
            probes["backward_peak"] = dict(peak)
            rec.where = (step, micro, "step")
            engine.step()
            rec.where = None
            probes["after_step"] = _grad_buffers(engine, opt, stage)
            if step == STEPS - 1:
                micro_rows.append({"micro": micro, "boundary": boundary, **{k: dict(v) for k, v in probes.items()}})
        if step == 0:
            calls_step0 = len(rec.calls)
    assert torch.isfinite(loss.detach().float()).item()
    out = {"optimizer_class": type(opt).__name__, "gas": int(engine.gradient_accumulation_steps()),
           "rows": micro_rows,
           "collectives": [c[1:] for c in rec.calls[calls_step0:]],  # (micro, phase, op, numel, dtype, grad, site)
           "bypass": [c[1:] for c in rec.bypass], "loss": float(loss.detach().float())}
    rec.calls.clear()
    rec.bypass.clear()
    if hasattr(engine, "destroy"):
        engine.destroy()
    return out


def main() -> None:
    """One rank under torchrun: every stage with gas 1 and GAS; the result to the launcher."""
    import importlib
    import signal

    import torch

    os.environ["DS_ACCELERATOR"] = "cpu"
    signal.alarm(300)  # a hung gloo collective kills the rank, and the launcher reports it
    torch.set_num_threads(1)
    # deepspeed/comm/torch.py builds its shared-memory all-reduce op with gcc+ninja at
    # init_distributed (~23 s cold); training all-reduce goes through torch.distributed, so skip it.
    # (`import deepspeed.comm.torch as m` would bind the torch package: deepspeed.comm imports torch.)
    ds_comm_torch = importlib.import_module("deepspeed.comm.torch")
    ds_comm_torch.build_shm_op = lambda: None
    results = {}
    for stage in STAGES:
        results[stage] = _run_stage(stage, rank())
        results[f"{stage}_gas{GAS}"] = _run_gas(stage, rank())
    write_result(results)


if __name__ == "__main__":
    main()
