"""Worker: DeepSpeed ZeRO-Offload and ZeRO-Infinity (parameters to the CPU; optimizer and parameters
to NVMe through DeepSpeed's aio op, swap files in a scratch folder) on a small transformers Llama,
run under DeepSpeed's launcher (DS_ACCELERATOR=cpu and gloo on a CPU).

On the CPU accelerator the engine's device and host tensors are both CPU tensors, so this worker
counts every storage the engine holds by *where the engine keeps it*: the attribute path it was
found under (`optimizer.single_partition_of_fp32_groups`, `param.grad`, ...), deduplicated by
storage, first path wins (module parameters first). calibrate/engines/deepspeed_offload.py sorts the paths
into device and host from DeepSpeed 0.19.8's own code, which says for each buffer whether it is
allocated on `get_accelerator().current_device_name()` or on the offload device.

Each run trains `steps` optimizer steps of `gas` micro-batches and counts after every micro-batch's
backward of the last step and after its step(). Usage (calibrate/engines/deepspeed_offload.py launches it):
... -m calibrate.engines.deepspeed_offload_worker \
    '{"runs": [{"name": "z2", "zero": 2, "gas": 2, "offload_optimizer": true}]}'
"""

from __future__ import annotations

import os
import shutil
import tempfile

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported

from calibrate.engines.deepspeed_worker import BUCKET, LLAMA, run_and_leave  # noqa: E402
from calibrate.harness.worker_io import device, write_result  # noqa: E402

SEQ = 16


def _children(obj):
    """(name, child) pairs of a container or a plain object's attributes (modules excluded: their
    parameters are walked apart)."""
    if isinstance(obj, dict):
        return [(f".{k}" if isinstance(k, str) else "[]", v) for k, v in obj.items()]
    if isinstance(obj, (list, tuple)):
        return [("[]", v) for v in obj]
    if hasattr(obj, "__dict__") and not isinstance(obj, (torch.nn.Module, type, torch.Tensor)):
        return [(f".{k}", v) for k, v in vars(obj).items()]
    return []


def _walk(obj, path: str, depth: int, seen: set, out: dict) -> None:
    """Tensors are told apart by storage (`out`), containers by id (`seen`: they must stay alive)."""
    if torch.is_tensor(obj):
        s = obj.untyped_storage()
        if s.data_ptr() and s.nbytes() and s.data_ptr() not in out:
            out[s.data_ptr()] = (path, s.nbytes(), str(obj.dtype).replace("torch.", ""), obj.device.type)
        grad = getattr(obj, "grad", None)
        if grad is not None:
            _walk(grad, path + ".grad", depth, seen, out)
        return
    if id(obj) in seen or depth < 0:
        return
    seen.add(id(obj))
    for name, child in _children(obj):
        _walk(child, path + name, depth - 1, seen, out)


def held_by_path(engine) -> dict:
    """{"path:dtype@device": bytes} of the distinct storages the engine holds: the model's parameters
    (data, grad, ZeRO-3's ds_tensor partition), then everything reachable from the ZeRO optimizer,
    its inner optimizer's state, and ZeRO-3's parameter-offload helper."""
    out, seen = {}, set()
    for p in engine.module.parameters():
        _walk(p.data, "param.data", 0, seen, out)
        for attr in ("grad", "grad_accum"):  # grad_accum: stage_1_and_2.py use_grad_accum_attribute
            if getattr(p, attr, None) is not None:
                _walk(getattr(p, attr), f"param.{attr}", 0, seen, out)
        if hasattr(p, "ds_tensor"):
            _walk(p.ds_tensor, "param.ds_tensor", 0, seen, out)
    # ZeRO-Infinity's parameter swapper (partition_parameters.py Init: param.nvme_swapper, one for all)
    swapper = next((p.nvme_swapper for p in engine.module.parameters() if getattr(p, "nvme_swapper", None)), None)
    if swapper is not None:
        _walk(vars(swapper), "swapper", 3, seen, out)
    opt = engine.optimizer
    inner = getattr(opt, "optimizer", None)
    states = list(inner.state.values()) if inner is not None else []  # kept alive: `seen` holds ids
    _walk(states, "inner.state", 3, seen, out)
    # the inner optimizer's param_groups are the fp32 partitions: named by the ZeRO optimizer's own attributes
    attrs = {k: v for k, v in vars(opt).items() if k != "optimizer"}
    _walk(attrs, "optimizer", 6, seen, out)
    by_path = {}
    for path, nbytes, dtype, where in out.values():
        key = f"{path}:{dtype}@{where}"
        by_path[key] = by_path.get(key, 0) + nbytes
    return by_path


def _one_run(run: dict) -> dict:
    import deepspeed
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**LLAMA, **run.get("llama", {})}))
    zero = {"stage": run["zero"], "reduce_bucket_size": BUCKET, "allgather_bucket_size": BUCKET,
            "stage3_prefetch_bucket_size": BUCKET, "stage3_param_persistence_threshold": 10, **run.get("zero_extra", {})}
    nvme_path = None
    for part in ("optimizer", "param"):
        target = run.get(f"offload_{part}")
        if target == "nvme":  # ZeRO-Infinity: swap files in a scratch folder, through DeepSpeed's aio op
            nvme_path = nvme_path or tempfile.mkdtemp(prefix="ds-nvme-")
            zero[f"offload_{part}"] = {"device": "nvme", "nvme_path": nvme_path, "pin_memory": False,
                                       **run.get(f"nvme_{part}", {})}
        elif target:
            zero[f"offload_{part}"] = {"device": "cpu", "pin_memory": False}
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": run["gas"], "bf16": {"enabled": True},
          "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False, "steps_per_print": 10**9,
          "zero_optimization": zero, **run.get("ds", {})}
    # torch's AdamW, not DeepSpeedCPUAdam: no JIT build; the states it keeps are the same fp32 pair
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=ds)
    ids = torch.randint(0, LLAMA["vocab_size"], (1, SEQ), device=device())
    rows = []
    for _ in range(run.get("steps", 2)):
        rows = []
        for micro in range(run["gas"]):
            engine.backward(engine(input_ids=ids, labels=ids).loss)
            rows.append({"moment": f"backward {micro}", "held": held_by_path(engine)})
            engine.step()
        rows.append({"moment": "after step", "held": held_by_path(engine)})
    zopt = engine.optimizer  # the engine's own offload switches: the config took effect
    offload = {"optimizer": bool(getattr(zopt, "cpu_offload", getattr(zopt, "offload_optimizer", False))),
               "params": bool(getattr(zopt, "offload_param", False))}
    out = {"name": run["name"], "optimizer": type(zopt).__name__, "offload": offload, "moments": rows,
           "params": sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())}
    engine.destroy()
    if nvme_path:
        shutil.rmtree(nvme_path, ignore_errors=True)
    return out


def main(cfg: dict) -> None:
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl")
    write_result({"runs": [_one_run(run) for run in cfg["runs"]]})


if __name__ == "__main__":
    run_and_leave(main)
