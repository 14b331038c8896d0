"""What DeepSpeed's ZeRO-1/2 optimizer step dispatches around the inner optimizer: operators per
gradient tensor and bytes per parameter, counted on the real engine (DeepSpeedZeroOptimizer,
runtime/zero/stage_1_and_2.py step). planner/timing.py deepspeed_step_s reads the result from
data/references/deepspeed_step_cpu.json.

The step checks every gradient tensor of the rank's partition for inf/NaN (has_overflow_partitioned_
grads_serial -> runtime/utils.py has_inf_or_nan: abs, ne, eq, mul, amax, amin, ...), takes each one's
norm in fp64 (get_grad_norm_direct: g.to(get_norm_dtype()) then linalg.vector_norm), flattens the
partition into an fp32 gradient, unscales or clips it, runs the inner optimizer, and copies the
fp32 master back into the 16-bit weights (_update_model_bit16_weights). On a GPU each operator is
a kernel launched from the host, one after the other: with ~20 operators a tensor the host can take
longer than the kernels.

One rank on gloo (DS_ACCELERATOR=cpu), tiny transformers Llamas of 1 and 2 layers: the difference
gives the operators per tensor and the bytes per parameter (every tensor argument and result of
each non-view operator, once), the 1-layer model the fixed rest. The inner optimizer's own
operators are not counted (torch AdamW here; DeepSpeed's FusedAdam on a GPU).

    python -m calibrate.deepspeed_step_ops [--out data/references/deepspeed_step_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "data" / "references" / "deepspeed_step_cpu.json"
STAGES = (1, 2)
LLAMA = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 176,
         "vocab_size": 512, "tie_word_embeddings": False, "max_position_embeddings": 64}


def _counter():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Count(TorchDispatchMode):
        """Operators dispatched (all of them, as calibrate.eager_ops counts a layer's) and the bytes
        the non-view ones read and write, while not paused."""

        def __init__(self):
            super().__init__()
            self.ops, self.bytes, self.paused = 0, 0, False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not self.paused:
                self.ops += 1
                if not func.is_view:
                    self.bytes += sum(t.numel() * t.element_size() for t in tree_leaves((args, kwargs, out))
                                      if isinstance(t, torch.Tensor))
            return out

    return Count()


def _one(stage: int, layers: int) -> dict:
    """Parameters, tensors, operators and bytes of the third step of a `layers`-layer Llama."""
    import deepspeed
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(num_hidden_layers=layers, **LLAMA))
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
              "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
              "zero_optimization": {"stage": stage}}  # gradient_clipping left at its default, as the H200 step runs
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                                      config=config)
    count, inner = _counter(), engine.optimizer.optimizer
    inner_step = inner.step

    def step(*a, **k):  # the inner optimizer is counted by the planner on its own (FusedAdam's bytes)
        count.paused = True
        try:
            return inner_step(*a, **k)
        finally:
            count.paused = False

    inner.step = step
    ids = torch.randint(0, LLAMA["vocab_size"], (1, 16))
    for i in range(3):
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        if i == 2:
            with count:
                engine.step()
        else:
            engine.step()
    return {"params": sum(p.numel() for p in model.parameters()), "tensors": len(list(model.parameters())),
            "ops": count.ops, "bytes": count.bytes, "optimizer": type(engine.optimizer).__name__}


def main_rank() -> None:
    """Under the launcher (one rank): both stages, 1 and 2 layers each."""
    import importlib

    import deepspeed
    import torch

    from calibrate.worker_io import write_result

    torch.set_num_threads(1)
    # deepspeed/comm/torch.py builds a shared-memory all-reduce op at init_distributed (~23 s cold); skip it
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    write_result({str(s): [_one(s, n) for n in (1, 2)] for s in STAGES})


def per_tensor(runs: list) -> dict:
    """{ops_per_tensor, ops_fixed, bytes_per_param} from the 1- and 2-layer runs of one stage."""
    one, two = runs
    ops_per_tensor = (two["ops"] - one["ops"]) / (two["tensors"] - one["tensors"])
    return {"optimizer": two["optimizer"], "ops_per_tensor": ops_per_tensor,
            "ops_fixed": one["ops"] - ops_per_tensor * one["tensors"],
            "bytes_per_param": (two["bytes"] - one["bytes"]) / (two["params"] - one["params"])}


def measure() -> dict:
    """Launch one rank and reduce its counts (per_tensor)."""
    from calibrate.launch import launch

    out = launch("calibrate.deepspeed_step_ops", [], nproc=1, timeout_s=600, env={"DS_ACCELERATOR": "cpu"})
    if out.status != "ok" or not out.ranks:
        raise RuntimeError(f"deepspeed_step_ops: {out.status}: {out.error}\n{out.log_tail}")
    return {stage: per_tensor(runs) for stage, runs in out.ranks[0].items()}


def main() -> None:
    import deepspeed
    import torch
    import transformers

    from planner.data import atomic_write

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    out = parser.parse_args().out
    record = {
        "source": "python -m calibrate.deepspeed_step_ops: operators DeepSpeed's ZeRO-1/2 step (stage_1_and_2.py "
                  "DeepSpeedZeroOptimizer.step, bf16) dispatches beside the inner optimizer, per gradient tensor and "
                  "fixed, and the bytes its non-view operators read and write per parameter (TorchDispatchMode; "
                  "2-layer Llama less 1-layer, one gloo rank, DS_ACCELERATOR=cpu)",
        "versions": {"deepspeed": deepspeed.__version__, "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "zero_step": measure(),
    }
    atomic_write(out, json.dumps(record, indent=1) + "\n", flag="--out")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    if "CALIBRATE_OUT" in os.environ:  # a rank started by calibrate.launch
        main_rank()
    else:
        main()
