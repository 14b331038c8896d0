"""DeepSpeed's own step timing (DeepSpeed 0.19.8, and 0.3 for the 2021 runs): the copies each rank's
partition costs where ZeRO-3 gathers tensor by tensor, and the DeepSpeed optimizer step. Its
ZeRO-3 gathers per submodule are planner/dp_comm.py's, with FSDP2's. planner/timing.py assembles them."""

from __future__ import annotations

import numpy as np

from planner import compute as C
from planner.dp_comm import grad_reductions_per_step, partition_params, rank_tensors
from planner.layout import Layouts, Training
from planner.engines.deepspeed.memory import deepspeed_bf16_optimizer
from planner.model import ModelSpec
from planner.sharding import state_bytes
from planner.stage import Step


def zero3_rank_copies_s(model: ModelSpec, training: Training, lay: Layouts, c: dict, z3: dict) -> np.ndarray:
    """Host seconds a step spends on the per-rank slices of Engine.zero3_per_tensor_collectives, all
    of them exposed. Each gathered tensor in each of its gathers (the passes of zero3_gather_s's
    `z3`) and each gradient in each reduction is a call over zero_ranks ranks; for every rank
    DeepSpeed narrows a slice in Python and torch copies it through the collective's flat buffer
    (torch 1.8 ProcessGroupNCCL allgather/reduce_scatter of tensor lists: one copy_ per list entry),
    about one eager op of host time (eager_op_host_s; the narrow launches no kernel). The GPU
    waits: each gather follows a torch.cuda.synchronize() (DeepSpeed 0.3.13 partition_parameters.py
    _allgather_param; stage3.py fetch_sub_module -> _synchronize_communication) and precedes the
    submodule's kernels; the reductions run in backward hooks with at most that submodule's backward
    queued. Nothing for the other engines."""
    if not training.engine.zero3_per_tensor_collectives:
        return 0.0 * lay.tp
    gathered, every = rank_tensors(model, training, lay)
    calls = gathered * (z3["fwd"] + z3["bwd"] + z3["whole_step"]) + every * grad_reductions_per_step(training, lay)
    return np.where(lay.zero == 3, calls * lay.zero_ranks * c["eager_op_host_s"], 0.0)


def deepspeed_step_s(ctx: Step) -> np.ndarray:
    """DeepSpeed's ZeRO step (0.19.8 stage_1_and_2.py DeepSpeedZeroOptimizer.step, stage3.py) or BF16_Optimizer's
    (bf16_optimizer.py step) around FusedAdam, as counted on the real engine
    (data/references/engine_host_cpu.json, python -m calibrate.benches.engine_host). ZeRO's: per gradient
    tensor of the rank's partition an inf/NaN check (runtime/utils.py has_inf_or_nan) and an fp64
    norm (get_grad_norm_direct), ~22 operators a tensor, each launched from the host
    (eager_op_host_s), and 48 B a parameter of memory traffic (the fp32 flat gradient, the unscale,
    the copy back into the 16-bit weights); ZeRO-3's (stage3.py step): 10 and 44 B; BF16_Optimizer's:
    4 and 36 B. The host and the kernels run side by side until the norm's .item() waits for both;
    FusedAdam follows (r fp32 gradient, r+w master and moments). ZeRO-1/2 split one flat buffer
    evenly over the ranks: a rank's partition holds 1/zero_ranks of the tensors and one that
    straddles; a ZeRO-3 rank holds a slice of every tensor (stage3.py averaged_gradients: one
    partition view per parameter)."""
    model, cluster, training, lay, c = ctx
    from planner.data import catalog

    step = catalog("references/engine_host_cpu.json")["zero_step"]
    bf16_optimizer = deepspeed_bf16_optimizer(training, lay)

    def counted(key):  # the wrapper's count
        return np.select([bf16_optimizer, lay.zero == 3, lay.zero == 2],
                         [step["bf16_optimizer"][key], step["3"][key], step["2"][key]], step["1"][key])

    every = rank_tensors(model, training, lay)[1]
    tensors = np.where(lay.zero == 3, every, np.ceil(every / lay.zero_ranks) + (lay.zero_ranks > 1))
    host_s = (counted("ops_per_tensor") * tensors + counted("ops_fixed")) * c["eager_op_host_s"]
    partition, hbm = partition_params(model, training, lay), C.hbm_bytes_per_s(cluster, c)
    adam_bytes = 4.0 + 2.0 * state_bytes(training).optimizer
    return np.maximum(host_s, partition * counted("bytes_per_param") / hbm) + partition * adam_bytes / hbm
