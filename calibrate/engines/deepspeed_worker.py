"""Worker: DeepSpeed on a small transformers Llama, run under torchrun or DeepSpeed's launcher
(DS_ACCELERATOR=cpu and gloo on a CPU). It trains `steps` optimizer steps of `gas` micro-batches
and counts by unique storage every tensor the engine holds (module parameters and their .grad, and
every tensor reachable from engine.optimizer's attributes and its inner optimizer's state) at two
moments of the last step: after the boundary micro-batch's backward (before step()) and after
step(). Usage: ... -m calibrate.engines.deepspeed_worker '{"zero": 1, "gas": 2, "ds": {...}}'; with
'{"runs": [{...}, ...]}' each config runs in turn in the same process group (an engine of its own each)
and the rank's result is {"runs": [result, ...]}, one launch for many configs.
"""

from __future__ import annotations

import json
import os
import sys

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported

from calibrate.harness.worker_io import cuda_memory, device, write_result  # noqa: E402

LLAMA = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 176, "vocab_size": 512, "tie_word_embeddings": False, "max_position_embeddings": 64}
BUCKET = 4096


def reachable_tensors(obj, depth: int = 3, seen=None):
    """Tensors held by `obj`'s attributes, lists, tuples and dicts, `depth` levels down."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth < 0:
        return
    seen.add(id(obj))
    if torch.is_tensor(obj):
        yield obj
        return
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        items = list(obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (torch.nn.Module, type)):
        items = list(vars(obj).values())
    else:
        return
    for item in items:
        yield from reachable_tensors(item, depth - 1, seen)


def held_bytes(engine) -> dict:
    """Bytes by dtype of the distinct storages the engine holds (parameters, grads, optimizer)."""
    tensors = list(engine.module.parameters()) + [p.grad for p in engine.module.parameters() if p.grad is not None]
    tensors += list(reachable_tensors(engine.optimizer))
    inner = getattr(engine.optimizer, "optimizer", None)
    if inner is not None:
        tensors += [v for st in inner.state.values() for v in st.values() if torch.is_tensor(v)]
    storages = {}
    for t in tensors:
        s = t.untyped_storage()
        if s.data_ptr() and s.nbytes():
            storages[s.data_ptr()] = (s.nbytes(), str(t.dtype).replace("torch.", ""))
    by_dtype = {}
    for nbytes, dtype in storages.values():
        by_dtype[dtype] = by_dtype.get(dtype, 0) + nbytes
    return {"total_bytes": sum(by_dtype.values()), "by_dtype": by_dtype}


def main(cfg: dict) -> None:
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl")
    write_result({"runs": [run(c) for c in cfg["runs"]]} if "runs" in cfg else run(cfg))


def run(cfg: dict) -> dict:
    """One config's counts on this rank (the process group already up)."""
    import deepspeed
    import transformers

    if torch.cuda.is_available():  # cuda_memory's peaks are this config's own
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": cfg["gas"], "bf16": {"enabled": True},
          "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
          "zero_optimization": {"stage": cfg["zero"], "reduce_bucket_size": BUCKET, "allgather_bucket_size": BUCKET,
                                "stage3_prefetch_bucket_size": BUCKET, "stage3_param_persistence_threshold": 10},
          **cfg.get("ds", {})}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=ds)
    ids = torch.randint(0, LLAMA["vocab_size"], (1, 16), device=device())
    before_step = None
    for _ in range(cfg.get("steps", 2)):
        for micro in range(cfg["gas"]):
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            if micro == cfg["gas"] - 1:
                before_step = held_bytes(engine)
            engine.step()
    return {"optimizer": type(engine.optimizer).__name__, "params": sum(p.numel() for p in model.parameters())
            if cfg["zero"] < 3 else sum(p.ds_numel for p in model.parameters()),
            "before_step": before_step, "after_step": held_bytes(engine), **cuda_memory()}


def run_and_leave(main) -> None:
    """Run `main` on the JSON config argument, then wait for every rank and leave.

    DeepSpeed's launcher passes --local_rank=N before the script's own arguments. A rank that leaves
    while the other is still in a collective, or an interpreter teardown with the process group's
    threads alive, ended a run as a crash now and then on a loaded host (CI: exit 250 after the
    results were written): wait for every rank, then leave without static destructors (as
    calibrate/engines/torch_tp_worker.py does)."""
    main(json.loads(next(a for a in sys.argv[1:] if not a.startswith("--local_rank"))))
    torch.distributed.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    run_and_leave(main)
