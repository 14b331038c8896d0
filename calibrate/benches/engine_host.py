"""Host-side work of the sharding engines, DeepSpeed ZeRO and PyTorch FSDP2, counted and timed on
the real engines (one gloo rank, DS_ACCELERATOR=cpu, tiny transformers Llamas of a few layers: the
difference between two depths is one layer's). planner/timing.py reads the results from
data/references/engine_host_cpu.json.

zero_step: what the ZeRO-1/2 optimizer step (runtime/zero/stage_1_and_2.py DeepSpeedZeroOptimizer.
step), ZeRO-3's (stage3.py) and BF16_Optimizer's (runtime/bf16_optimizer.py, bf16 with fp32 gradient
accumulation) dispatch around the inner optimizer, per gradient tensor and fixed, and the bytes per
parameter its non-view operators read and write (planner/engines/deepspeed/timing.py deepspeed_step_s). The step checks every
gradient tensor of the rank's partition for inf/NaN (has_overflow_partitioned_grads_serial ->
runtime/utils.py has_inf_or_nan: abs, ne, eq, mul, amax, amin, ...), takes each one's norm in fp64
(get_grad_norm_direct: g.to(get_norm_dtype()) then linalg.vector_norm), flattens the partition into
an fp32 gradient, unscales or clips it, runs the inner optimizer (not counted: torch AdamW here,
FusedAdam on a GPU), and copies the fp32 master into the 16-bit weights. On a GPU each operator is
a kernel launched from the host: with ~20 a tensor the host can take longer than the kernels.

zero3_fetch: what ZeRO-3's per-submodule parameter fetch and release cost the host in forward and
backward (runtime/zero/partitioned_param_coordinator.py fetch_sub_module / release_sub_module under
the hooks of parameter_offload.py), beyond ZeRO-2's time for the same steps; fsdp_unit: what FSDP2's
per-unit hooks (torch 2.13 distributed/fsdp/_fully_shard/_fsdp_state.py _pre_forward /
_post_forward, _fsdp_param_group.py pre_backward / post_backward: unshard, copy-in and copy-out,
reshard, reduce-scatter) cost per decoder-layer unit and pass beyond the same model without FSDP
(fully_shard per layer and at the root, MixedPrecisionPolicy bf16/fp32, as torchtitan and the FSDP
recipes wrap it). Each is split into the operators the hooks dispatch (counted) and the Python
around them (the timed seconds less the operators at this CPU's seconds per operator of the
baseline): timing.param_fetch_s prices the operators at eager_op_host_s, the host's with CUDA
launches, and keeps the Python. Timed on this CPU, where the 1-rank collectives cost nearly
nothing; the step suite's DeepSpeed ZeRO-3 cases will show a GPU host's.

    python -m calibrate.benches.engine_host [--out data/references/engine_host_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "data" / "references" / "engine_host_cpu.json"
LLAMA = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 176,
         "vocab_size": 512, "tie_word_embeddings": False, "max_position_embeddings": 64}


def _counter():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Count(TorchDispatchMode):
        """Operators dispatched (all of them, as calibrate.benches.eager_ops counts a layer's) and the bytes
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


STEP_VARIANTS = {"1": {"stage": 1}, "2": {"stage": 2}, "3": {"stage": 3},
                 # bf16 with fp32 gradient accumulation: engine.py _do_optimizer_sanity_check picks BF16_Optimizer
                 "bf16_optimizer": {"stage": 1, "data_types": {"grad_accum_dtype": "fp32"}}}
"""The optimizer wrappers counted: ZeRO-1 and ZeRO-2 (DeepSpeedZeroOptimizer), ZeRO-3
(DeepSpeedZeroOptimizer_Stage3), BF16_Optimizer."""


def _one(variant: dict, layers: int) -> dict:
    """Parameters, tensors, operators and bytes of the third step of a `layers`-layer Llama."""
    import deepspeed
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(num_hidden_layers=layers, **LLAMA))
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
              "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
              "zero_optimization": {"stage": variant["stage"]},  # gradient_clipping at its default, as the H200 steps
              **({"data_types": variant["data_types"]} if "data_types" in variant else {})}
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


FETCH_LAYERS = (2, 10)  # depths of the fetch timing: their difference is 8 layers
FETCH_LLAMA = {**LLAMA, "hidden_size": 32, "intermediate_size": 64, "vocab_size": 128}  # host-bound shapes


def _fetch_time(stage: int, layers: int, repeats: int = 12) -> dict:
    """Median seconds of a forward + backward at host-bound shapes, and the submodule fetches in it."""
    import statistics
    import time

    import deepspeed
    import torch
    import transformers
    from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator as Coordinator

    fetches = [0]
    if not getattr(Coordinator, "_planner_counted", False):
        fetch = Coordinator.fetch_sub_module

        def counted(self, *a, **k):
            fetches[0] += 1
            return fetch(self, *a, **k)

        Coordinator.fetch_sub_module, Coordinator._planner_counted = counted, True
        Coordinator._planner_fetches = fetches
    fetches = Coordinator._planner_fetches
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(num_hidden_layers=layers, **FETCH_LLAMA))
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
              "zero_allow_untested_optimizer": True, "steps_per_print": 10**9, "zero_optimization": {"stage": stage}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                                      config=config)
    ids = torch.randint(0, FETCH_LLAMA["vocab_size"], (1, 8))
    times, counts = [], []
    for _ in range(repeats):
        before = fetches[0]
        start = time.perf_counter()
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        times.append(time.perf_counter() - start)
        counts.append(fetches[0] - before)
    count = _counter()
    with count:  # the operators of one more step, untimed
        engine.backward(engine(input_ids=ids, labels=ids).loss)
    if hasattr(engine, "destroy"):
        engine.destroy()
    return {"s": statistics.median(times[4:]), "fetches": counts[-1], "ops": count.ops}


def _fsdp_time(layers: int, fsdp: bool, repeats: int = 12) -> dict:
    """Median forward and backward seconds at host-bound shapes, with FSDP2 per layer or without."""
    import statistics
    import time

    import torch
    import transformers
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(num_hidden_layers=layers, **FETCH_LLAMA))
    if fsdp:
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
    else:
        model = model.to(torch.bfloat16)
    ids = torch.randint(0, FETCH_LLAMA["vocab_size"], (1, 8))
    fwd, bwd = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        middle = time.perf_counter()
        loss.backward()
        fwd.append(middle - start)
        bwd.append(time.perf_counter() - middle)
        model.zero_grad(set_to_none=True)
    forward, backward = _counter(), _counter()  # the operators of one more step, untimed
    with forward:
        loss = model(input_ids=ids, labels=ids).loss
    with backward:
        loss.backward()
    return {"forward_s": statistics.median(fwd[4:]), "backward_s": statistics.median(bwd[4:]),
            "forward_ops": forward.ops, "backward_ops": backward.ops}


def main_rank() -> None:
    """Under the launcher (one rank): each STEP_VARIANTS step at 1 and 2 layers; ZeRO-2 and ZeRO-3
    fetch timings; FSDP2 and plain timings (FSDP2 uses the process group deepspeed.init_distributed made)."""
    import importlib

    import deepspeed
    import torch

    from calibrate.harness.worker_io import write_result

    torch.set_num_threads(1)
    # deepspeed/comm/torch.py builds a shared-memory all-reduce op at init_distributed (~23 s cold); skip it
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    write_result({"zero_step": {name: [_one(v, n) for n in (1, 2)] for name, v in STEP_VARIANTS.items()},
                  "zero3_fetch": {str(s): [_fetch_time(s, n) for n in FETCH_LAYERS] for s in (2, 3)},
                  "fsdp_unit": {str(f): [_fsdp_time(n, f) for n in FETCH_LAYERS] for f in (False, True)}})


def per_tensor(runs: list) -> dict:
    """{ops_per_tensor, ops_fixed, bytes_per_param} from the 1- and 2-layer runs of one variant."""
    one, two = runs
    ops_per_tensor = (two["ops"] - one["ops"]) / (two["tensors"] - one["tensors"])
    return {"optimizer": two["optimizer"], "ops_per_tensor": ops_per_tensor,
            "ops_fixed": one["ops"] - ops_per_tensor * one["tensors"],
            "bytes_per_param": (two["bytes"] - one["bytes"]) / (two["params"] - one["params"])}


def _host_split(extra_s: float, extra_ops: float, base_s: float, base_ops: float) -> dict:
    """Host seconds beyond the baseline, split into the operators it dispatches (priced at this CPU's
    seconds per operator of the baseline itself) and the Python around them: on a GPU host the
    operators cost eager_op_host_s each, the rest stays."""
    cpu_s_per_op = base_s / base_ops
    return {"ops": extra_ops, "host_s": extra_s, "cpu_s_per_op": cpu_s_per_op,
            "python_s": max(extra_s - extra_ops * cpu_s_per_op, 0.0)}


def per_fetch(runs: dict) -> dict:
    """One Llama layer's ZeRO-3 fetches (26: 13 submodules, forward and backward) and, per
    parameter-owning submodule and pass (9 a layer: q, k, v, o, gate, up, down and the two norms; the
    fetches of the layer, self_attn, mlp and act_fn come with them), what ZeRO-3 adds over ZeRO-2:
    operators, host seconds, and the Python part (_host_split)."""
    layers, passes = FETCH_LAYERS[1] - FETCH_LAYERS[0], 2 * 9
    (z2a, z2b), (z3a, z3b) = runs["2"], runs["3"]
    per_layer = {k: ((z3b[k] - z3a[k]) - (z2b[k] - z2a[k])) / layers for k in ("s", "ops")}
    base = {k: (z2b[k] - z2a[k]) / layers for k in ("s", "ops")}
    return {"fetches_per_layer": (z3b["fetches"] - z3a["fetches"]) / layers, "param_modules_per_layer": 9,
            **_host_split(per_layer["s"] / passes, per_layer["ops"] / passes, base["s"], base["ops"])}


def per_unit(runs: dict) -> dict:
    """What FSDP2 adds per decoder-layer unit in forward and in backward over the model without it
    (per layer of the 10-layer model less the 2-layer one): operators, host seconds, and the Python
    part (_host_split)."""
    layers = FETCH_LAYERS[1] - FETCH_LAYERS[0]
    (plain_a, plain_b), (fsdp_a, fsdp_b) = runs["False"], runs["True"]

    def layer(run_a, run_b, key):
        return (run_b[key] - run_a[key]) / layers

    out = {}
    for p in ("forward", "backward"):
        base_s, base_ops = layer(plain_a, plain_b, f"{p}_s"), layer(plain_a, plain_b, f"{p}_ops")
        out[p] = _host_split(layer(fsdp_a, fsdp_b, f"{p}_s") - base_s, layer(fsdp_a, fsdp_b, f"{p}_ops") - base_ops,
                             base_s, base_ops)
    return out


def measure() -> dict:
    """Launch one rank and reduce its counts and timings (per_tensor, per_fetch, per_unit)."""
    from calibrate.harness.launch import launch

    out = launch("calibrate.benches.engine_host", [], nproc=1, timeout_s=600, env={"DS_ACCELERATOR": "cpu"})
    if out.status != "ok" or not out.ranks:
        raise RuntimeError(f"engine_host: {out.status}: {out.error}\n{out.log_tail}")
    got = out.ranks[0]
    return {"zero_step": {stage: per_tensor(runs) for stage, runs in got["zero_step"].items()},
            "zero3_fetch": per_fetch(got["zero3_fetch"]), "fsdp_unit": per_unit(got["fsdp_unit"])}


def main() -> None:
    import platform

    import deepspeed
    import torch
    import transformers

    from planner.data import atomic_write

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    out = parser.parse_args().out
    record = {
        "source": "python -m calibrate.benches.engine_host: zero_step: operators DeepSpeed's ZeRO-1/2 step "
                  "(stage_1_and_2.py DeepSpeedZeroOptimizer.step, bf16), ZeRO-3's (stage3.py) and BF16_Optimizer's "
                  "(bf16_optimizer.py, fp32 gradient accumulation) dispatch beside the inner optimizer, per "
                  "gradient tensor and fixed, and the bytes its non-view operators read and write per parameter "
                  "(TorchDispatchMode; 2-layer Llama less 1-layer); zero3_fetch: ZeRO-3's submodule fetches per layer "
                  "and their host seconds beyond ZeRO-2's (forward + backward at hidden 32, 8 tokens; 10-layer Llama "
                  "less 2-layer; median of 8 steps); fsdp_unit: FSDP2's host seconds per decoder-layer unit in "
                  "forward and in backward beyond the model without it (same shapes and method); each with the "
                  "operators dispatched (counted in one more step) and the Python left (python_s: host_s less ops "
                  "at the baseline's seconds per operator, cpu_s_per_op); one gloo rank, DS_ACCELERATOR=cpu, "
                  "on this CPU",
        "versions": {"deepspeed": deepspeed.__version__, "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "cpu": platform.processor() or platform.machine(),
        **measure(),
    }
    atomic_write(out, json.dumps(record, indent=1) + "\n", flag="--out")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    if "CALIBRATE_OUT" in os.environ:  # a rank started by calibrate.harness.launch
        main_rank()
    else:
        main()
