"""DeepSpeed's step timing (DeepSpeed 0.19.8): ZeRO-3's parameter all-gathers per submodule (forward,
backward and the recompute's), the copies each rank's partition costs, what compute hides of them,
and the DeepSpeed optimizer step. planner/timing.py assembles them."""

from __future__ import annotations

import numpy as np

from planner import compute as C
from planner.activations import recomputed_layers
from planner.dp_comm import (dp_collective_s, grad_reductions_per_step, held_params, overlapped_exposed_s,
                             partition_params, rank_tensors)
from planner.hardware import Cluster
from planner.layout import Layouts, Training
from planner.engines.deepspeed.memory import deepspeed_bf16_optimizer, zero3_kept_params
from planner.held import deferred_reduction, gathered_param_bytes
from planner.model import ModelSpec
from planner.pipeline import max_layers_on_stage
from planner.sharding import block_fetches, recompute_fetches, state_bytes


def zero3_gathers_per_step(training: Training, lay: Layouts) -> np.ndarray:
    """Times each sharded parameter is all-gathered in a step: forward and again backward every
    micro-batch under ZeRO-3 (ZeRO paper section 7); the forward only under --zero 2 where the
    engine reshards after every backward (Engine.reshards_after_backward); once where a pipeline
    keeps its stage gathered across the micro-batches; else none (ZeRO-1/2 gather after the step:
    param_gather_s)."""
    regather = (lay.zero == 2) & training.engine.reshards_after_backward
    per_microbatch = np.select([lay.zero == 3, regather], [2.0, 1.0], 0.0)
    return np.where(deferred_reduction(training, lay) & (per_microbatch > 0), 1.0, per_microbatch * lay.gas)


def zero3_gather_s(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts, c: dict) -> dict:
    """Parameter all-gathers of sharded parameters (zero3_gathers_per_step): one coalesced call per
    submodule (DeepSpeed 0.19 partitioned_param_coordinator.py fetch_sub_module ->
    __all_gather_params) or per block (FSDP2 unit). {"one": seconds of one pass's gathers, "calls"
    a pass, "fwd"/"bwd": passes a step under forward/backward compute, "whole_step": the one
    gather a pipeline keeps for the step, "prefetch": whether the next call is issued under the
    current one's compute, "ahead_fwd": the share of the forward's calls so issued}. DeepSpeed prefetches the next parameters of its trace after waiting
    for the current ones, up to stage3_prefetch_bucket_size elements and while fewer than
    stage3_max_live_parameters are gathered (fetch_sub_module: max_params_to_prefetch, at least
    one parameter once positive): none with a bucket of 0 or a live limit under a submodule. FSDP2
    issues the next unit's all-gather one ahead in forward (implicit) and backward
    (backward_prefetch)."""
    dense, expert = held_params(model, training, lay)
    w = gathered_param_bytes(model, training)
    n_layers = max_layers_on_stage(model.layers, lay.pp, training.pipeline_edge_layers)
    # DeepSpeed fetches per module: Megatron's fused GEMM modules, or Hugging Face ones (sharding.block_fetches)
    per_block = 1 if training.engine.zero3_fetch_per_block else (
        len(model.gemms(True)) if training.engine.fused_gemms else block_fetches(model, training))
    calls = n_layers * per_block + 2
    if training.engine.zero3_per_tensor_collectives:
        calls = rank_tensors(model, training, lay)[0]
    one = dp_collective_s(cluster, training, lay, c, "all_gather", dense * w / calls, expert * w / calls, calls)
    per_step = zero3_gathers_per_step(training, lay)
    whole_step = deferred_reduction(training, lay) & (per_step > 0)
    passes = np.where(whole_step, 0.0, per_step / np.where(lay.zero == 3, 2.0, 1.0))
    zc = training.zero_config
    submodule_elements = (dense + expert) * lay.zero_ranks / calls  # unsharded, as ds_numel counts them
    prefetch = training.engine.zero3_fetch_per_block | ((zc.stage3_prefetch_bucket_size > 0)
                                                       & (zc.stage3_max_live_parameters > submodule_elements))
    # DeepSpeed's backward gathers only what its forward released (zero3_kept_params); FSDP2 reshards
    # every unit after forward (--zero 3) and gathers it all again
    kept, rank = zero3_kept_params(model, training, lay, 0 * lay.pp)
    again = 1.0 if training.engine.zero3_fetch_per_block else 1.0 - kept / np.maximum(rank, 1.0)
    # and a recomputed block's modules that its recompute released before their backward use, again
    recomputed = recomputed_layers(lay, n_layers, lay.vpp) / np.maximum(n_layers, 1)
    again = again + recomputed * recompute_fetches(model, training, lay)["regather"] / np.maximum(rank, 1.0)
    # the forward's last min(rank, reuse / 2) elements stay gathered for their backward use
    # (engines/deepspeed/memory.py zero3_ahead_params); where they fill stage3_max_live_parameters the prefetcher has no
    # budget left (max_params_to_prefetch <= 0) and that share of the forward gathers on demand
    # (measured, tests/test_deepspeed_zero3_live.py: max_live 3e5 with reuse 1e9 over 2.5e6 elements,
    # 24 of 30 forward fetches; none with the two knobs equal)
    reused = np.minimum(rank, zc.stage3_max_reuse_distance / 2.0)
    starved = np.clip((reused - zc.stage3_max_live_parameters) / np.maximum(rank, 1.0), 0.0, 1.0)
    ahead_fwd = prefetch * np.where(training.engine.zero3_fetch_per_block, 1.0, 1.0 - starved)
    return {"one": one, "calls": calls + 0.0 * one, "fwd": passes, "bwd": np.where(lay.zero == 3, passes * again, 0.0),
            "whole_step": whole_step, "prefetch": prefetch, "ahead_fwd": ahead_fwd}


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


def zero3_exposed_s(z3, fwd_window_s, bwd_window_s, step_window_s):
    """Exposed seconds of the zero3_gather_s gathers of a step, each call one ahead of the compute
    it feeds (overlapped_exposed_s): a pass's gathers under that pass's compute, a pipeline's one
    gather under the whole step's; without prefetch every call shows."""
    on = np.where(z3["prefetch"], 1.0, 0.0)
    ahead = z3["ahead_fwd"]  # the forward's share gathered ahead; the rest shows whole
    fwd = ahead * overlapped_exposed_s(z3["one"], z3["calls"], fwd_window_s) + (1.0 - ahead) * z3["one"]
    per_pass = z3["fwd"] * fwd + z3["bwd"] * overlapped_exposed_s(z3["one"], z3["calls"], on * bwd_window_s)
    return per_pass + np.where(z3["whole_step"], overlapped_exposed_s(z3["one"], z3["calls"], on * step_window_s), 0.0)


def zero3_gather_total_s(z3) -> np.ndarray:
    """All of a step's zero3_gather_s gathers."""
    return z3["one"] * (z3["fwd"] + z3["bwd"] + z3["whole_step"])


def deepspeed_step_s(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts, c: dict) -> np.ndarray:
    """DeepSpeed's ZeRO step (0.19.8 stage_1_and_2.py DeepSpeedZeroOptimizer.step, stage3.py) or BF16_Optimizer's
    (bf16_optimizer.py step) around FusedAdam, as counted on the real engine
    (data/references/engine_host_cpu.json, python -m calibrate.engine_host). ZeRO's: per gradient
    tensor of the rank's partition an inf/NaN check (runtime/utils.py has_inf_or_nan) and an fp64
    norm (get_grad_norm_direct), ~22 operators a tensor, each launched from the host
    (eager_op_host_s), and 48 B a parameter of memory traffic (the fp32 flat gradient, the unscale,
    the copy back into the 16-bit weights); ZeRO-3's (stage3.py step): 10 and 44 B; BF16_Optimizer's:
    4 and 36 B. The host and the kernels run side by side until the norm's .item() waits for both;
    FusedAdam follows (r fp32 gradient, r+w master and moments). ZeRO-1/2 split one flat buffer
    evenly over the ranks: a rank's partition holds 1/zero_ranks of the tensors and one that
    straddles; a ZeRO-3 rank holds a slice of every tensor (stage3.py averaged_gradients: one
    partition view per parameter)."""
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
