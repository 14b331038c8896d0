"""Megatron-Core's optimizer offload (--optimizer-cpu-offload): megatron-core 0.16.1's own
HybridDeviceOptimizer, run on CPU tensors that it takes for GPU shards, counted against the planner.

HybridDeviceOptimizer (optimizer/cpu_offloading/hybrid_optimizer.py) offloads the parameters it
sees as `is_cuda` and moves data with CUDA streams and pinned buffers. Here the 16-bit shards are
CPU Parameters that report is_cuda, the streams are no-ops and pinning is a plain copy: the
optimizer's own code decides every tensor it keeps and every copy it makes.
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


class _ShardOnGpu(torch.nn.Parameter):
    """A 16-bit distributed-optimizer shard that the optimizer takes for a GPU tensor."""

    @property
    def is_cuda(self):
        return True


class _Stream:
    def wait_stream(self, other):
        pass

    def record_event(self):
        return mock.Mock()


def _run_hybrid_optimizer(sizes):
    """One step of HybridDeviceOptimizer over bf16 shards of `sizes` elements with fp32 main-gradient
    shards (decoupled_grad, as DistributedOptimizer sets them under --use-precision-aware-optimizer),
    built as megatron-core's _get_megatron_optimizer_based_on_param_groups builds it for Adam.
    Returns (optimizer, shards, [(source dtype, elements) of each asynchronous copy])."""
    shards = [_ShardOnGpu(torch.randn(n, dtype=torch.bfloat16)) for n in sizes]
    copies = []
    real_copy = torch.Tensor.copy_

    def copy_(self, src, non_blocking=False):
        if non_blocking:  # the optimizer's device-host transfers (every other copy_ is blocking)
            copies.append((src.dtype, src.numel()))
        return real_copy(self, src, non_blocking)

    stream = _Stream()
    with mock.patch.object(torch.cuda, "current_stream", lambda: stream), \
            mock.patch.object(torch.cuda, "stream", lambda s: contextlib.nullcontext()), \
            mock.patch.object(torch.Tensor, "pin_memory", lambda self, *a, **k: self.clone()), \
            mock.patch.object(hybrid.torch, "empty", lambda *a, pin_memory=False, **k: torch.zeros(*a, **k)):
        opt = hybrid.HybridDeviceOptimizer(
            shards, offload_fraction=1.0, cpu_optimizer_cls=mcore_optimizer.CPUAdam,
            gpu_optimizer_cls=torch.optim.AdamW, param_update_in_fp32=True, overlap_cpu_optimizer_d2h_h2d=False,
            lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8, bias_correction=True, fused=True)
        for p in shards:
            p.decoupled_grad = torch.randn(p.shape, dtype=torch.float32)
        with mock.patch.object(torch.Tensor, "copy_", copy_):
            opt.step()
    return opt, shards, copies


def _host_bytes(opt) -> int:
    """Bytes of the tensors the optimizer holds on the host (masters, states, gradient buffers),
    each storage once."""
    storages = {}
    for sub in opt.cpu_optimizers:
        held = [p for g in sub.param_groups for p in g["params"]]
        held += [v for p in held for v in sub.state[p].values()]
        for t in held + list(opt.cpu_copy_map_grad.values()):
            if isinstance(t, torch.Tensor) and t.numel() > 1:  # not Adam's scalar step count
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def _megatron_offload(layout_extra=None, training_extra=None):
    layout = {"tp": 1, "pp": 1, "dp": GPUS, "zero": 1, "offload_optimizer": "cpu", "mbs": 1, **(layout_extra or {})}
    return api.estimate("llama-3-70b", {"gpu": "h100-sxm", "gpus": GPUS},
                        {"engine": "megatron", "gbs": GPUS, **(training_extra or {})}, layout)


def test_hybrid_optimizer_keeps_16_bytes_a_parameter_on_the_host_and_none_on_the_gpu():
    sizes = (1000, 3000, 24)
    opt, shards, _ = _run_hybrid_optimizer(sizes)
    assert opt.gpu_optimizer is None  # offload_fraction 1: every state on the host
    per_param = _host_bytes(opt) / sum(sizes)
    assert per_param == 16  # fp32 master, exp_avg, exp_avg_sq, pinned fp32 gradient
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
