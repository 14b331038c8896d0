"""Worker: what DeepSpeed's PipelineEngine itself keeps of the stage boundary (pipe_buffers, the
receive buffer and the gradient buffer), on 2 gloo ranks (pp 2, one rank a stage) or 4 (pp 2 x tp 2:
PipeModelDataParallelTopology with a model-parallel axis, so the engine partitions its p2p over it,
runtime/pipe/engine.py is_pipe_partitioned), run under torchrun. The stages are an embedding and a
stack of bf16 MLP blocks (no tensor parallelism of their own: the partitioning is the engine's).
After every instruction of the schedule each rank counts, by distinct storage, the floating-point
tensors the engine holds in pipe_buffers['inputs'], ['outputs'] and ['output_tensors'], pipe_recv_buf
and grad_layer, and keeps the largest sum over two steps (and each part at that moment).
Usage: ... -m calibrate.engines.deepspeed_pipe_buffers_worker '{"gas": 4, "tp": 1}'
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported

from calibrate.engines.deepspeed_pipe_worker import WIDTH, Block  # noqa: E402  the same residual MLP block
from calibrate.engines.deepspeed_worker import run_and_leave  # noqa: E402
from calibrate.harness.worker_io import write_result  # noqa: E402

VOCAB, SEQ, MBS, BLOCKS = 32, 8, 2, 4


class Embed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, WIDTH)

    def forward(self, ids):
        return self.wte(ids)


def _floating(obj, out: dict) -> None:
    """Distinct floating-point storages reachable through tuples and lists of `obj`."""
    if torch.is_tensor(obj):
        if obj.is_floating_point():
            s = obj.untyped_storage()
            if s.data_ptr() and s.nbytes():
                out[s.data_ptr()] = s.nbytes()
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            _floating(x, out)


def held(engine) -> dict:
    parts = {}
    for key in ("inputs", "outputs", "output_tensors"):
        found = {}
        _floating(engine.pipe_buffers.get(key, []), found)
        parts[key] = found
    found = {}
    _floating(engine.pipe_recv_buf, found)
    parts["pipe_recv_buf"] = found
    found = {}
    _floating(engine.grad_layer, found)
    parts["grad_layer"] = found
    every = {}
    for found in parts.values():
        every.update(found)
    return {**{k: sum(v.values()) for k, v in parts.items()}, "total": sum(every.values())}


def main(cfg: dict) -> None:
    import deepspeed
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe import schedule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl")
    torch.manual_seed(0)
    tp = cfg.get("tp", 1)
    topo = PipeModelDataParallelTopology(num_pp=2, num_mp=tp, num_dp=1)
    model = PipelineModule(layers=[Embed()] + [Block() for _ in range(BLOCKS)], topology=topo,
                           partition_method="type:Block",
                           loss_fn=lambda out, target: ((out.float() - target.float()) ** 2).mean())
    ds = {"train_micro_batch_size_per_gpu": MBS, "gradient_accumulation_steps": cfg["gas"], "bf16": {"enabled": True},
          "zero_allow_untested_optimizer": True, "steps_per_print": 10**9, "zero_optimization": {"stage": 0}}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, foreach=False)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=ds)
    peak = {"total": -1}

    def counted(instruction):
        run = engine._INSTRUCTION_MAP[instruction]

        def wrapped(self, *args, **kwargs):
            out = run(self, *args, **kwargs)
            now = held(self)
            if now["total"] > peak["total"]:
                peak.clear()
                peak.update(now)
            return out
        return wrapped

    # pipe/engine.py _exec_schedule binds each instruction from the class's _INSTRUCTION_MAP
    kinds = (schedule.ForwardPass, schedule.BackwardPass, schedule.RecvActivation, schedule.RecvGrad,
             schedule.SendActivation, schedule.SendGrad, schedule.LoadMicroBatch)
    engine._INSTRUCTION_MAP = {**engine._INSTRUCTION_MAP, **{k: counted(k) for k in kinds}}
    if tp > 1:
        # BF16_Optimizer.step fails on the gloo CPU ranks with a model-parallel axis (utils.py
        # get_global_norm_of_tensors: "stack expects a non-empty TensorList"); the step touches no pipe buffer
        engine._INSTRUCTION_MAP[schedule.OptimizerStep] = lambda self, *args, **kwargs: None
    # whether the stage's first module runs on a storage the engine keeps in pipe_buffers['inputs'] (the
    # received tensor itself) or on another one (_exec_forward_pass's .clone() of it)
    shares = []
    first = next(m for m in engine.module.forward_funcs if isinstance(m, torch.nn.Module))

    def pre_hook(module, args):
        kept = {}
        _floating(engine.pipe_buffers["inputs"], kept)
        if torch.is_tensor(args[0]) and args[0].is_floating_point():
            shares.append(args[0].untyped_storage().data_ptr() in kept)

    first.register_forward_pre_hook(pre_hook)
    g = torch.Generator().manual_seed(0)
    data = [(torch.randint(0, VOCAB, (MBS, SEQ), generator=g), torch.randn(MBS, SEQ, WIDTH, generator=g).bfloat16())
            for _ in range(cfg["gas"])]
    for _ in range(2):
        engine.train_batch(data_iter=iter(data))
    write_result({"stage": engine.stage_id, "stages": engine.num_stages, "partitioned": bool(engine.is_pipe_partitioned),
                  "num_pipe_buffers": engine.num_pipe_buffers, "boundary_bytes": MBS * SEQ * WIDTH * 2, "peak": peak,
                  "first_input_is_kept_buffer": sorted(set(shares))})


if __name__ == "__main__":
    run_and_leave(main)
