"""Worker: FSDP2 under PyTorch's pipelining schedule, as torchtitan composes them, on 2 gloo ranks.

torch.distributed.pipelining runs an FSDP2 stage's backward through
stage.py backward_maybe_with_nosync (set_requires_gradient_sync(False),
set_reshard_after_backward(False) for every micro-batch) and reduces only in perform_reduce_grad
after the schedule's last backward. This worker builds one pipeline stage per rank (num_stages 1,
a process group of its own: the pipeline has nothing to send) around a small transformers Llama
sharded by fully_shard over both ranks (per decoder layer and at the root, MixedPrecisionPolicy bf16
parameters and fp32 reduction, reshard_after_forward False: torchtitan's default with a pipeline,
parallelize.py apply_fsdp), runs Schedule1F1B or ScheduleGPipe with m micro-batches and an AdamW
step, and counts every FSDPParam's tensors by attribute (distinct storages) after each
micro-batch's backward, just before and after perform_reduce_grad, and after the optimizer step
(the second step's: AdamW's states exist from the first).
Usage: python -m torch.distributed.run --nproc_per_node 2 -m calibrate.engines.fsdp_pipe_worker '{"m": 4}';
with '{"runs": [{"m": 4, "schedule": "1f1b"}, ...]}' each runs in turn in the same process groups (a model,
stage, schedule and optimizer of its own each) and the rank's result is {"runs": [result, ...]}.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from calibrate.engines.fsdp_worker import LLAMA, _local
from calibrate.harness.worker_io import device, write_result

SEQ = 16


def fsdp_held(model, opt) -> dict:
    """{attribute: bytes} of the distinct storages of every FSDPParam of `model` (DTensors by their
    local shard; a storage resized to nothing, a resharded parameter, holds none) and of `opt`'s
    states."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    seen, out = set(), {}

    def add(name, t):
        if t is None:
            return
        s = _local(t).untyped_storage()
        if s.data_ptr() and s.nbytes() and s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            key = f"{name}:{str(_local(t).dtype).replace('torch.', '')}"
            out[key] = out.get(key, 0) + s.nbytes()

    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        group = fully_shard.state(module)._fsdp_param_group
        for fp in group.fsdp_params if group is not None else []:
            add("sharded_param", fp._sharded_param_data)
            add("sharded_grad", fp.sharded_param.grad)
            unsharded = getattr(fp, "_unsharded_param", None)
            add("unsharded_param", unsharded)
            add("unsharded_grad", None if unsharded is None else unsharded.grad)
            add("unsharded_accumulated_grad", fp.unsharded_accumulated_grad)
            for t in getattr(fp, "all_gather_outputs", []) or []:
                add("all_gather_outputs", t)
    for state in opt.state.values():
        for name, t in state.items():
            if torch.is_tensor(t) and t.dim() > 0:  # the 0-d step counters apart
                add(f"optimizer.{name}", t)
    return out


class CausalLM(torch.nn.Module):
    """transformers' LlamaForCausalLM returning its logits (a pipeline stage's output)."""

    def __init__(self):
        super().__init__()
        import transformers

        self.lm = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))

    def forward(self, ids):
        return self.lm(input_ids=ids).logits


def main(cfg: dict) -> None:
    dev = device()
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    rank = dist.get_rank()
    own = [dist.new_group([r]) for r in range(dist.get_world_size())][rank]  # each rank its own pipeline
    write_result({"runs": [run(c, dev, own) for c in cfg["runs"]]} if "runs" in cfg else run(cfg, dev, own))
    dist.barrier()
    dist.destroy_process_group()


def run(cfg: dict, dev, own) -> dict:
    """One config's moments on this rank (`own`: the rank's one-rank pipeline group)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    torch.manual_seed(0)
    model = CausalLM().to(dev)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.lm.model.layers:
        fully_shard(layer, mp_policy=mp, reshard_after_forward=False)
    fully_shard(model, mp_policy=mp, reshard_after_forward=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    m = cfg["m"]
    stage = PipelineStage(model, 0, 1, dev, group=own)

    def loss_fn(logits, target):
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), target.flatten())

    kind = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}[cfg.get("schedule", "1f1b")]
    schedule = kind(stage, n_microbatches=m, loss_fn=loss_fn)
    ids = torch.randint(0, LLAMA["vocab_size"], (m, SEQ), device=dev)
    moments = []
    original_bwd, original_reduce = stage.backward_maybe_with_nosync, stage.perform_reduce_grad

    def bwd(*args, **kwargs):
        out = original_bwd(*args, **kwargs)
        moments.append({"moment": f"backward {len(moments)}", "held": fsdp_held(model, opt)})
        return out

    def reduce(*args, **kwargs):
        moments.append({"moment": "before reduce", "held": fsdp_held(model, opt)})
        out = original_reduce(*args, **kwargs)
        moments.append({"moment": "after reduce", "held": fsdp_held(model, opt)})
        return out

    stage.backward_maybe_with_nosync, stage.perform_reduce_grad = bwd, reduce
    for _ in range(2):  # the optimizer's states exist from the first step on
        moments.clear()
        schedule.step(ids, target=ids)
        opt.step()
        opt.zero_grad()
    moments.append({"moment": "after step", "held": fsdp_held(model, opt)})
    return {"m": m, "params": sum(p.numel() for p in model.parameters()), "moments": moments}


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
