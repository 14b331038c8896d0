"""Worker: PyTorch's own pipelining (torch.distributed.pipelining PipelineStage with ScheduleGPipe,
Schedule1F1B and ScheduleInterleaved1F1B, 2 model chunks per rank) on 2 ranks, pp = 2, training a
stack of MLP blocks whose activations dwarf everything else a stage holds.

Each rank measures, for every schedule and micro-batch count m:
  unit_bytes   what ONE micro-batch leaves on this rank's layers: calibrate.benches.saved.counting() over a
               forward of each local chunk (parameters and the chunk's input excluded: the input is
               the user's batch or the stage's persistent receive buffer) plus the chunk's output,
               which the stage keeps in its fwd_cache until that micro-batch's backward;
  peak_bytes   the peak, above what was live before, of the bytes allocated during one full
               schedule.step() (second step, so the receive buffers already exist): on a CPU
               calibrate.benches.saved.transient_peak_bytes, on a GPU torch.cuda.max_memory_allocated;
  p2p_bytes    what the stages keep for point-to-point transfers after the step: receive
               buffers per micro-batch and any gradient on them (p2p_buffer_bytes);
  held_max     the most micro-batches the engine itself keeps: after every forward_one_chunk /
               backward_one_chunk, the entries of each local stage's fwd_cache (forwards whose
               backward has not run) times that chunk's share of the rank's layers.
GPipe with m = 1 is run too: it holds one micro-batch plus the same per-block backward transient,
so peak(s) - peak(GPipe, m=1) cancels that transient.
Usage: python -m torch.distributed.run --nproc_per_node 2 -m calibrate.engines.torch_pipe_worker '{"ms": [4, 8]}'
"""

from __future__ import annotations

import gc
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from calibrate.benches.saved import counting, transient_peak_bytes
from calibrate.harness.worker_io import device, write_result

# 16 blocks: 8 per rank; interleaved, 4 chunks of 4 blocks, chunks r and r + 2 on rank r. Per token a
# block saves its input (W) and the ReLU output (128 W; the down projection saves the same storage),
# so one micro-batch leaves 8 x 129 W = 1032 W per token on a rank, against W for a tensor at a stage
# boundary (received input, its gradient, the output sent on): 1/1032 of a micro-batch each.
WIDTH, EXPAND, BLOCKS, TOKENS, PP, VPP = 32, 128, 16, 64, 2, 2
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B}


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(WIDTH, EXPAND * WIDTH), torch.nn.Linear(EXPAND * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


def chunk_bytes(module: torch.nn.Module, first: bool, dev) -> int:
    """Bytes one micro-batch leaves held by `module` (see the module docstring)."""
    x = torch.randn(TOKENS, WIDTH, device=dev, requires_grad=not first)
    with counting([*module.parameters(), x]) as c:
        out = module(x)
    ptr = out.untyped_storage().data_ptr()
    return c.total_bytes + (0 if ptr in c.saved else out.untyped_storage().nbytes())


def peak_above_start(fn, dev) -> int:
    if dev.type != "cuda":
        return transient_peak_bytes(fn)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - start


def run(name: str, m: int, dev) -> dict:
    rank = dist.get_rank()
    v = VPP if name == "interleaved" else 1
    per_chunk = BLOCKS // (PP * v)
    torch.manual_seed(0)
    blocks = [Block() for _ in range(BLOCKS)]  # same weights on every rank; each keeps its own
    indices = [rank + k * PP for k in range(v)]  # stage indices on this rank (torch's looped placement)
    stages = [PipelineStage(torch.nn.Sequential(*blocks[i * per_chunk:(i + 1) * per_chunk]).to(dev), i, PP * v, dev)
              for i in indices]
    unit = sum(chunk_bytes(s.submod, s.is_first, dev) for s in stages)
    loss = lambda out, target: torch.nn.functional.mse_loss(out, target)  # noqa: E731
    sched = SCHEDULES[name](stages if v > 1 else stages[0], n_microbatches=m, loss_fn=loss)
    held_max = [0.0]

    def record():
        held_max[0] = max(held_max[0], sum(len(s.fwd_cache) for s in stages) / v)  # 1/v of the layers each

    for s in stages:
        for method in ("forward_one_chunk", "backward_one_chunk"):
            inner = getattr(s, method)

            def wrapped(*a, _inner=inner, **k):
                out = _inner(*a, **k)
                record()
                return out
            setattr(s, method, wrapped)
    torch.manual_seed(1)
    x = torch.randn(m * TOKENS, WIDTH, device=dev)
    y = torch.randn(m * TOKENS, WIDTH, device=dev)
    args = (x,) if any(s.is_first for s in stages) else ()
    kwargs = {"target": y} if any(s.is_last for s in stages) else {}

    def step():
        sched.step(*args, return_outputs=False, **kwargs)

    step()  # first step: metadata, receive buffers, parameter .grad
    for s in stages:
        s.clear_runtime_states()  # frees the input buffers' .grad of step 1 before the measured step
    held_max[0] = 0.0
    dist.barrier()
    peak = peak_above_start(step, dev)
    held = held_max[0]
    p2p = p2p_buffer_bytes(stages)
    for s in stages:
        s.clear_runtime_states()
    dist.barrier()
    return {"schedule": name, "m": m, "stages": indices, "unit_bytes": unit, "peak_bytes": peak,
            "held_max": held, "p2p_bytes": p2p, "boundary_bytes": TOKENS * WIDTH * 4}


def p2p_buffer_bytes(stages) -> int:
    """Bytes of what the stages keep for point-to-point transfers at the end of a step, walked on
    the engine's own objects (distinct storages): the activation receive buffers and their .grad
    (the received inputs' gradients) per micro-batch, and the gradient receive buffers."""
    from calibrate.engines.fsdp_worker import storage_bytes

    tensors = []
    for s in stages:
        for infos in (*s.args_recv_info.values(), *s.grad_recv_info.values()):
            for info in infos:
                if getattr(info, "buffer", None) is not None:
                    tensors += [info.buffer, info.buffer.grad]
    return storage_bytes(tensors)


def main(cfg: dict) -> None:
    dev = device()
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    runs = [run("gpipe", 1, dev)]
    for m in cfg.get("ms", [4, 8]):
        for name in SCHEDULES:
            runs.append(run(name, m, dev))
            gc.collect()
    write_result({"rank": dist.get_rank(), "pp": PP, "vpp": VPP, "blocks": BLOCKS, "runs": runs})
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})
