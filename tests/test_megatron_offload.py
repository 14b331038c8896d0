"""Megatron-Core's optimizer offload (--optimizer-cpu-offload): megatron-core 0.16.1's own
HybridDeviceOptimizer, run on CPU tensors that it takes for GPU shards, counted against the planner.

HybridDeviceOptimizer (optimizer/cpu_offloading/hybrid_optimizer.py) offloads the parameters it
sees as `is_cuda` and moves data with CUDA streams and pinned buffers. Here the 16-bit shards are
CPU tensors that report is_cuda (and so does what is computed from them, but for .cpu()), the
streams are no-ops and pinning is a plain copy: the optimizer's own code decides every tensor it
keeps, on which side, and every copy it makes.
"""
import contextlib
import warnings
from unittest import mock

import pytest

from planner import api
from planner.errors import InputError

torch = pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed"
    hybrid = pytest.importorskip("megatron.core.optimizer.cpu_offloading.hybrid_optimizer")
    mcore_optimizer = pytest.importorskip("megatron.core.optimizer")

LLAMA3_70B = 70_553_706_496  # meta-llama/Meta-Llama-3-70B, transformers' num_parameters()
GPUS, PER_NODE = 16, 8


class _OnGpu(torch.Tensor):
    """A tensor the optimizer takes for a GPU one; what is computed from it is one too, but for .cpu()."""

    @property
    def is_cuda(self):
        return True

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        return out.as_subclass(torch.Tensor) if func is torch.Tensor.cpu else out


class _Stream:
    def wait_stream(self, other):
        pass

    def record_event(self):
        return mock.Mock()


def _run_hybrid_optimizer(sizes, fraction=1.0):
    """One step of HybridDeviceOptimizer over bf16 shards of `sizes` elements with fp32 main-gradient
    shards (decoupled_grad, as DistributedOptimizer sets them under --use-precision-aware-optimizer),
    built as megatron-core's _get_megatron_optimizer_based_on_param_groups builds it for Adam.
    Returns (optimizer, shards, [(source dtype, elements) of each asynchronous copy])."""
    shards = [torch.randn(n, dtype=torch.bfloat16).as_subclass(_OnGpu).requires_grad_() for n in sizes]
    copies, inside = [], []
    real_copy = torch.Tensor.copy_

    def copy_(self, src, non_blocking=False):
        if non_blocking and not inside:  # the optimizer's device-host transfers (the others block)
            copies.append((src.dtype, src.numel()))
        inside.append(1)  # a copy into a _OnGpu tensor comes back through __torch_function__
        try:
            return real_copy(self, src, non_blocking)
        finally:
            inside.pop()

    stream = _Stream()
    with mock.patch.object(torch.cuda, "current_stream", lambda: stream), \
            mock.patch.object(torch.cuda, "stream", lambda s: contextlib.nullcontext()), \
            mock.patch.object(torch.Tensor, "pin_memory", lambda self, *a, **k: self.clone().as_subclass(torch.Tensor)), \
            mock.patch.object(hybrid.torch, "empty", lambda *a, pin_memory=False, **k: torch.zeros(*a, **k)):
        opt = hybrid.HybridDeviceOptimizer(
            shards, offload_fraction=fraction, cpu_optimizer_cls=mcore_optimizer.CPUAdam,
            gpu_optimizer_cls=torch.optim.AdamW, param_update_in_fp32=True, overlap_cpu_optimizer_d2h_h2d=False,
            lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8, bias_correction=True, fused=True)
        for p in shards:
            p.decoupled_grad = torch.randn(p.shape, dtype=torch.float32)
        with mock.patch.object(torch.Tensor, "copy_", copy_):
            opt.step()
    return opt, shards, copies


def _held_bytes(opt) -> dict:
    """{"host": bytes, "gpu": bytes} of the tensors the optimizer holds beside the 16-bit shards (fp32
    masters, states, gradient buffers), each storage once."""
    storages = {}
    for sub in opt.sub_optimizers:
        held = [p for g in sub.param_groups for p in g["params"]]
        held += [v for p in held for v in sub.state[p].values()]
        for t in held + list(opt.cpu_copy_map_grad.values()):
            if isinstance(t, torch.Tensor) and t.numel() > 1:  # not Adam's scalar step count
                storages[t.untyped_storage().data_ptr()] = ("gpu" if t.is_cuda else "host", t.untyped_storage().nbytes())
    return {side: sum(n for s, n in storages.values() if s == side) for side in ("host", "gpu")}


def _megatron_offload(layout_extra=None, training_extra=None):
    layout = {"tp": 1, "pp": 1, "dp": GPUS, "zero": 1, "offload_optimizer": "cpu", "mbs": 1, **(layout_extra or {})}
    return api.estimate("llama-3-70b", {"gpu": "h100-sxm", "gpus": GPUS},
                        {"engine": "megatron", "gbs": GPUS, **(training_extra or {})}, layout)


def test_hybrid_optimizer_keeps_16_bytes_a_parameter_on_the_host_and_none_on_the_gpu():
    sizes = (1000, 3000, 24)
    opt, shards, _ = _run_hybrid_optimizer(sizes)
    assert opt.gpu_optimizer is None  # offload_fraction 1: every state on the host
    held = _held_bytes(opt)
    per_param = held["host"] / sum(sizes)
    assert per_param == 16 and held["gpu"] == 0  # fp32 master, exp_avg, exp_avg_sq, pinned fp32 gradient
    assert all(p.dtype is torch.bfloat16 for p in shards)  # the GPU keeps only the 16-bit shard

    est = _megatron_offload()
    assert est.model.params == LLAMA3_70B
    rec = est.record
    # 8 ranks a node x 16 B x the rank's 1/16 of 70,553,706,496 parameters = 564.4 GB
    assert rec["memory"]["cpu_bytes_per_node"] == pytest.approx(PER_NODE * per_param * LLAMA3_70B / GPUS, rel=1e-6)
    parts = rec["memory"]["breakdown"]
    assert parts["optimizer"] == 0
    # Megatron's own bf16 weights and fp32 main_grad buffer stay: 2 + 4 B a parameter
    assert parts["params"] == pytest.approx(2 * LLAMA3_70B, rel=1e-6)


def test_hybrid_optimizer_moves_4_bytes_down_and_4_up_a_parameter_in_the_step():
    sizes = (1000, 3000, 24)
    _, _, copies = _run_hybrid_optimizer(sizes)
    down, up = copies[:len(sizes)], copies[len(sizes):]
    assert [n for _, n in down] == list(sizes) and [n for _, n in up] == list(sizes)
    assert {dtype for dtype, _ in copies} == {torch.float32}  # fp32 gradients down, fp32 masters up

    rec = _megatron_offload().record
    # (4 + 4) B x 70,553,706,496 / 16 over PCIe Gen5's 50 GB/s (data/gpus.json h100-sxm): 0.706 s,
    # none of it under backward (step() runs after it)
    assert rec["time"]["breakdown"]["offload"] == pytest.approx(8 * LLAMA3_70B / GPUS / 50e9, rel=1e-6)


def test_exported_flags_are_megatron_cores_and_pass_its_checks():
    from dataclasses import fields

    row = api.recommend("llama-3-70b", {"gpu": "h100-sxm", "gpus": GPUS}, {"engine": "megatron"}, top=1,
                        pinned={"offload_optimizer": "cpu"}).layouts[0]["layout"]
    from planner.export import megatron_args
    from planner.layout import Training
    from planner.model import lookup

    args = megatron_args(lookup("llama-3-70b"), Training(engine="megatron"), row)
    flags = {a.split()[0]: (a.split() + [True])[1] for a in args}
    names = {f.name for f in fields(mcore_optimizer.OptimizerConfig)}
    config = {}
    for flag in ("--optimizer-cpu-offload", "--optimizer-offload-fraction", "--use-precision-aware-optimizer"):
        field = flag[2:].replace("-", "_")
        assert field in names
        config[field] = float(flags[flag]) if flag == "--optimizer-offload-fraction" else flags[flag]
    assert "--use-distributed-optimizer" in flags
    from megatron.core.optimizer import optimizer_config

    # __post_init__ asks for Transformer Engine >= 2.1 (which GPU images carry) before its offload return
    with mock.patch.object(optimizer_config, "is_te_min_version", lambda *a, **k: True):
        mcore_optimizer.OptimizerConfig(optimizer="adam", use_distributed_optimizer=True, **config)  # passes
        with pytest.raises(AssertionError, match="only supported with adam"):
            mcore_optimizer.OptimizerConfig(optimizer="sgd", use_distributed_optimizer=True, **config)
        with pytest.raises(AssertionError, match="only supported with distributed optimizer"):
            mcore_optimizer.OptimizerConfig(optimizer="adam", use_distributed_optimizer=False, **config)
    with pytest.raises(InputError, match="--offload-optimizer: --engine megatron offloads AdamW only"):
        _megatron_offload(training_extra={"optimizer": "sgd"})


def test_a_fraction_offloads_that_share_and_steps_the_rest_on_the_gpu():
    # 8 equal shards at offload_fraction 0.25: the first 2 go to the host (hybrid_optimizer.py
    # _get_sub_optimizer_param_groups offloads in order while under 0.25 of the elements)
    opt, _, copies = _run_hybrid_optimizer([500] * 8, fraction=0.25)
    held = _held_bytes(opt)
    assert held["host"] == 16 * 2 * 500  # master, two moments, pinned gradient of the offloaded 1,000
    assert held["gpu"] == 12 * 6 * 500  # fp32 master clone and two moments of the 3,000 stepping on the GPU
    assert sum(n for _, n in copies) == 2 * 2 * 500  # down and up, the offloaded share only

    whole, part = _megatron_offload().record, _megatron_offload(training_extra={"optimizer_offload_fraction": 0.25}).record
    # host: 0.25 x 8 ranks x 16 B x 70,553,706,496 / 16; GPU optimizer: 0.75 x 12 B x 70,553,706,496 / 16
    assert part["memory"]["cpu_bytes_per_node"] == pytest.approx(0.25 * 16 * 2 * 500 / 1000 * PER_NODE * LLAMA3_70B / GPUS,
                                                                 rel=1e-6)
    assert part["memory"]["breakdown"]["optimizer"] == pytest.approx(12 * 6 * 500 / 3000 * 0.75 * LLAMA3_70B / GPUS,
                                                                      rel=1e-6)
    assert part["time"]["breakdown"]["offload"] == pytest.approx(0.25 * whole["time"]["breakdown"]["offload"], rel=1e-9)
    # the host steps a quarter while the GPU steps the rest beside it
    assert part["time"]["breakdown"]["optimizer"] == pytest.approx(0.25 * whole["time"]["breakdown"]["optimizer"], rel=1e-9)
    with pytest.raises(InputError, match="--optimizer-offload-fraction: --engine deepspeed offloads the whole"):
        api.estimate("llama-3-70b", {"gpus": GPUS}, {"engine": "deepspeed", "optimizer_offload_fraction": 0.5})


def test_recommend_offloads_the_least_share_that_keeps_its_fastest_layout_fitting():
    # Llama 3.1 405B on 96 H100 under Megatron: the fastest layout offloads its optimizer; recommend
    # keeps as much of it on the GPU as still fits (a grid of 0.05), which is faster
    rec = api.recommend("llama-3.1-405b", {"gpu": "h100-sxm", "gpus": 96}, {"engine": "megatron"}, top=1)
    share = rec.defaults["optimizer_offload_fraction"]
    assert 0 < share < 1 and rec.training.optimizer_offload_fraction == share
    best = rec.layouts[0]
    assert best["layout"]["offload_optimizer"] == "cpu"
    fields = {k: v for k, v in best["layout"].items() if k not in ("gas", "gbs") and v is not None}

    def at(f):
        return api.estimate("llama-3.1-405b", {"gpu": "h100-sxm", "gpus": 96},
                            {"engine": "megatron", "gbs": best["layout"]["gbs"], "optimizer_offload_fraction": f,
                             "pipeline_edge_layers": rec.training.pipeline_edge_layers,
                             "tp_comm_overlap": rec.training.tp_comm_overlap}, fields).record

    chosen, whole, less = at(share), at(1.0), at(round(share - 0.05, 6))
    assert chosen["time"]["step_s"] == pytest.approx(best["time"]["step_s"], rel=1e-9)
    usable = chosen["memory"]["capacity_bytes"] * (1 - rec.defaults["memory_headroom"])  # recommend's fit
    assert chosen["memory"]["required_bytes"] <= usable < less["memory"]["required_bytes"]
    assert chosen["time"]["step_s"] < whole["time"]["step_s"]
    from planner.export import megatron_args

    assert f"--optimizer-offload-fraction {share!r}" in megatron_args(rec.model, rec.training, best["layout"])
