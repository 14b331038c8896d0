"""Worker: PyTorch FSDP2 (fully_shard per decoder layer and at the root) on a small transformers
Llama, run under torchrun. Each rank counts by unique storage what the engine holds after an
optimizer step: the sharded parameters (DTensor local shards), the sharded gradients and AdamW's
states. With "gathers_for": [m, ...] it also counts, for a step of m micro-batches each, the
parameter all-gathers FSDP2 issues (calls of _fsdp_param_group.foreach_all_gather: one per unit
unshard). Usage: python -m torch.distributed.run --nproc_per_node 2 -m calibrate.engines.fsdp_worker
'{"mixed": true, "reshard_after_forward": true, ...}'; with '{"runs": [{...}, ...]}' each config runs in
turn in the same process group (a model, optimizer and counts of its own each) and the rank's result
is {"runs": [result, ...]}, one launch for many configs (tests/test_fsdp_real.py).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from calibrate.harness.worker_io import cuda_memory, device, write_result

LLAMA = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 176, "vocab_size": 512, "tie_word_embeddings": False, "max_position_embeddings": 64}


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (a view or alias is counted once)."""
    seen = {}
    for t in tensors:
        if t is None:
            continue
        s = _local(t).untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def main(cfg: dict) -> None:
    dev = device()
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    if "runs" in cfg:
        write_result({"runs": [run(c, dev) for c in cfg["runs"]]})
    else:
        write_result(run(cfg, dev))
    dist.destroy_process_group()


def run(cfg: dict, dev) -> dict:
    """One config's counts on this rank (the process group already up)."""
    import transformers

    if dev.type == "cuda":  # cuda_memory's peaks are this config's own
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**LLAMA, **cfg.get("llama", {})})).to(dev)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if cfg["mixed"] else MixedPrecisionPolicy()
    # torchtitan's enable_cpu_offload: CPUOffloadPolicy, parameters, gradients and states on the host
    kw = {"offload_policy": CPUOffloadPolicy(pin_memory=False)} if cfg.get("offload") else {}
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp, reshard_after_forward=cfg["reshard_after_forward"], **kw)
    fully_shard(model, mp_policy=mp, reshard_after_forward=cfg["reshard_after_forward"], **kw)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    ids = torch.randint(0, LLAMA["vocab_size"], (cfg["mbs"], cfg["seq"]), device=dev)

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)  # gradients stay allocated, as at the next backward

    step()  # optimizer states are created lazily at the first step
    params = [p for p in model.parameters()]
    gathers = {}
    if cfg.get("gathers_for"):
        import torch.distributed.fsdp._fully_shard._fsdp_param_group as group

        original, calls = group.foreach_all_gather, [0]

        def counted(*args, **kwargs):
            calls[0] += 1
            return original(*args, **kwargs)

        group.foreach_all_gather = counted
        for m in cfg["gathers_for"]:
            calls[0] = 0
            for _ in range(m):  # gradient accumulation: m forward/backward passes, one optimizer step
                model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
            gathers[str(m)] = calls[0]
        group.foreach_all_gather = original
    result = {
        "param_bytes": storage_bytes(params),
        "param_dtype": str(_local(params[0]).dtype),
        "grad_bytes": storage_bytes(p.grad for p in params),
        "optimizer_bytes": storage_bytes(v for st in opt.state.values() for v in st.values()
                                         if torch.is_tensor(v) and v.dim() > 0),
        "params": sum(p.numel() for p in params),
        "units": len(model.model.layers) + 1,  # fully_shard per decoder layer and at the root
        "gathers_per_step": gathers,
        **cuda_memory(),
    }
    return result


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
