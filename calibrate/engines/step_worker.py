"""Worker: one end-to-end training run of a transformers Llama, launched as its users launch it, that
times whole optimizer steps and reads the allocator's peaks: the instrument for the planner's step
time and peak memory (calibrate/engines/step_cases.py holds the configurations and predictions).

engine "fsdp": PyTorch FSDP2 as torchtitan and the FSDP recipes wrap it (fully_shard per decoder
layer and at the root, MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)), torch AdamW with
its default implementation (foreach on CUDA). engine "deepspeed": DeepSpeed's engine with bf16,
the ZeRO stage asked for and DeepSpeed's own AdamW (FusedAdam on CUDA, JIT-built), as the planner's
exported ds_config names them; cfg["ds"] is merged into the config. "checkpointing" is Hugging
Face's gradient_checkpointing (one checkpoint per decoder layer, non-reentrant).

Each step is one micro-batch, loss.backward() and the optimizer step, timed between device
synchronizations; the result is the median of the steps after `warmup`. The allocator's peak
counters are reset after the first step (optimizer states exist from then on), so the peaks are the
steady state's. Usage: torchrun ... -m calibrate.engines.step_worker '{"engine": "fsdp", "llama": {...}, ...}'
"""

from __future__ import annotations

import os
import statistics
import time

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported

from calibrate.harness.worker_io import cuda_memory, device, write_result  # noqa: E402


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def build(cfg: dict, dev):
    """The transformers Llama of cfg["llama"], its parameters created on `dev` (fp32, as loaded)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**cfg["llama"], use_cache=False)
    config._attn_implementation = cfg.get("attention", "sdpa")
    with dev:
        model = transformers.LlamaForCausalLM(config)
    if cfg.get("checkpointing"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def fsdp_step(cfg: dict, model):
    """(forward, backward, optimizer step) of the FSDP2-wrapped model."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    reshard = cfg.get("zero", 3) == 3  # --zero 2 is reshard_after_forward=False
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mp_policy=mp, reshard_after_forward=reshard)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def optimizer_step():
        opt.step()
        opt.zero_grad(set_to_none=True)

    return (lambda ids: model(input_ids=ids, labels=ids).loss), (lambda loss: loss.backward()), optimizer_step


def deepspeed_step(cfg: dict, model):
    """(forward, backward, optimizer step) of DeepSpeed's engine around the model."""
    import deepspeed

    ds = {"train_micro_batch_size_per_gpu": cfg["mbs"], "gradient_accumulation_steps": 1,
          "bf16": {"enabled": True}, "steps_per_print": 10**9,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
          "zero_optimization": {"stage": cfg.get("zero", 1)}, **cfg.get("ds", {})}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)

    return (lambda ids: engine(input_ids=ids, labels=ids).loss), engine.backward, engine.step


def main(cfg: dict) -> None:
    dev = device()
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if cfg["engine"] == "deepspeed":
        import deepspeed

        deepspeed.init_distributed(dist_backend=backend)
    else:
        torch.distributed.init_process_group(backend)
    model = build(cfg, dev)
    params = sum(p.numel() for p in model.parameters())
    forward, backward, optimizer_step = (deepspeed_step if cfg["engine"] == "deepspeed" else fsdp_step)(cfg, model)
    ids = torch.randint(0, cfg["llama"]["vocab_size"], (cfg["mbs"], cfg["seq"]), device=dev)
    times = []
    for i in range(cfg.get("warmup", 3) + cfg.get("steps", 5)):
        _sync()
        start = time.perf_counter()
        backward(forward(ids))
        optimizer_step()
        _sync()
        times.append(time.perf_counter() - start)
        if i == 0 and torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()  # the steady state: optimizer states exist from here
    result = {"params": params, "step_s": statistics.median(times[cfg.get("warmup", 3):]), "step_s_all": times,
              **cuda_memory(), **allocator_stats()}
    phases = {"forward_s": [], "backward_s": [], "optimizer_s": []}
    for _ in range(3):  # after the timed steps: a synchronization between phases, for the breakdown only
        _sync()
        t0 = time.perf_counter()
        loss = forward(ids)
        _sync()
        t1 = time.perf_counter()
        backward(loss)
        _sync()
        t2 = time.perf_counter()
        optimizer_step()
        _sync()
        for key, seconds in zip(phases, (t1 - t0, t2 - t1, time.perf_counter() - t2)):
            phases[key].append(seconds)
    result.update({key: statistics.median(v) for key, v in phases.items()})
    if torch.cuda.is_available():
        result["kernel_s"] = kernel_seconds(lambda: (backward(forward(ids)), optimizer_step()), cfg.get("profiled", 2))
        # the optimizer step alone: FSDP2's foreach copy-in/out kernels (multi_tensor_apply) look like an
        # optimizer's by name, so the whole step's "optimizer" kind also holds the gathers' copies
        result["optimizer_kernel_s"] = kernel_seconds(optimizer_step, cfg.get("profiled", 2))
    write_result(result)


KERNEL_KINDS = (  # (kind, name fragments), the first match wins; lower-case kernel names of cuBLAS/CUTLASS,
    # FlashAttention/cuDNN, NCCL, torch's foreach/fused optimizer kernels (multi_tensor_apply) and the rest
    ("nccl", ("nccl",)),
    ("attention", ("flash", "fmha", "attention", "sdpa", "cudnn")),
    ("gemm", ("gemm", "nvjet", "xmma", "cutlass", "cublas", "matmul", "splitk")),
    ("optimizer", ("multi_tensor", "foreach", "adam")),
    ("memcpy", ("memcpy", "memset")),
)


def kernel_kind(name: str) -> str:
    """The kind of a GPU kernel by its name (KERNEL_KINDS), 'elementwise' for the rest (pointwise,
    reductions, copies the eager modules launch)."""
    low = name.lower()
    return next((kind for kind, parts in KERNEL_KINDS if any(p in low for p in parts)), "elementwise")


def kernel_seconds(step, steps: int) -> dict:
    """GPU seconds per step by kernel kind over `steps` profiled steps (torch.profiler's CUDA
    activity: each kernel's own duration), and the profiled steps' wall seconds per step: their
    difference is time the GPU waited for the host or for a collective."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        _sync()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        _sync()
        wall = (time.perf_counter() - start) / steps
    out = {"wall": wall}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kind = kernel_kind(e.name)
            out[kind] = out.get(kind, 0.0) + e.time_range.elapsed_us() * 1e-6 / steps
    return out


def allocator_stats() -> dict:
    """The caching allocator's fragmentation figures (torch.cuda.memory_stats), {} on a CPU."""
    if not torch.cuda.is_available():
        return {}
    stats = torch.cuda.memory_stats()
    return {"inactive_split_peak_bytes": stats.get("inactive_split_bytes.all.peak", 0),
            "alloc_retries": stats.get("num_alloc_retries", 0), "segments_peak": stats.get("segment.all.peak", 0)}


if __name__ == "__main__":
    from calibrate.engines.deepspeed_worker import run_and_leave

    run_and_leave(main)
