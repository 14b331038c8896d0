"""The data-parallel side of a step every engine shares: the tensors a rank reduces or gathers and
how many, a data-parallel collective's time on the topology, the parameters a rank holds and
steps, how much of a collective its compute window hides, and the all-gathers of sharded
parameters (DeepSpeed ZeRO-3 per submodule, FSDP2 per unit). The engines' own timing
(planner/engines/*/timing.py) and planner/timing.py build on these."""

from __future__ import annotations

import numpy as np

from planner.activations import recomputed_layers
from planner.collectives import group_collective_s
from planner.engines.deepspeed.memory import zero3_kept_params
from planner.hardware import Cluster
from planner.held import deferred_reduction, gathered_param_bytes
from planner.layout import Layouts, Training, among
from planner.model import ModelSpec
from planner.options import RankOrder
from planner.pipeline import first_routed_stage, max_layers_on_stage
from planner.sharding import block_fetches, expert_dp, expert_folds, expert_tp, rank_params, recompute_fetches
from planner.tensors import BLOCK, FIRST, LAST, local_numel
from planner.stage import Stage, Step


def held_params(model: ModelSpec, training: Training, lay: Layouts) -> tuple:
    """(dense, expert) elements of a rank of the heavier end stage (first or last); experts of the
    first stage of routed blocks only where dense-first blocks leave the first with fewer."""
    d0, expert = rank_params(Stage(model, training, lay, 0 * lay.pp))
    if model.dense_layers:
        edge = training.pipeline_edge_layers
        expert = rank_params(Stage(model, training, lay, first_routed_stage(model.dense_layers, model.layers, lay.pp, edge)))[1]
    return np.maximum(d0, rank_params(Stage(model, training, lay, lay.pp - 1))[0]), expert


def dp_collective_s(cluster: Cluster, training: Training, lay: Layouts, c: dict, kind: str, dense_bytes,
                    expert_bytes, count=1) -> np.ndarray:
    """One collective over the dense data-parallel group (Layouts.dp_stride apart) and one over the
    expert-data-parallel group: its ranks are spaced etp x ep apart where EP folds over TP
    (megatron-core's expert rank order etp, ep, edp, pp; etp, ep, pp, edp with the pipeline inner),
    tp x ep otherwise, times pp with the pipeline inner."""
    pipeline_inner = np.where(lay.rank_order == RankOrder.PP_INNER, lay.pp, 1)
    stride = np.where(expert_folds(training), expert_tp(training, lay), lay.tp) * lay.ep * pipeline_inner
    return (group_collective_s(cluster, c, kind, dense_bytes, lay.zero_ranks, lay.dp_stride, count)
            + group_collective_s(cluster, c, kind, expert_bytes, expert_dp(training, lay), stride, count))


def rank_tensors(model: ModelSpec, training: Training, lay: Layouts, per_expert: bool = True) -> tuple:
    """(gathered, all): parameter tensors a rank of the heavier end stage holds (one per local expert
    of an expert tensor, or the one stacked tensor with `per_expert` False), and those ZeRO-3
    gathers: a tensor of fewer local elements than stage3_param_persistence_threshold stays whole
    (DeepSpeed 0.3.13 stage3.py __init__: param.ds_persist when ds_numel < the threshold). Each is one call of
    Engine.zero3_per_tensor_collectives, and each of ZeRO-1/2's partition a share of its step's
    per-tensor operators (deepspeed_step_s)."""
    threshold = training.zero_config.stage3_param_persistence_threshold
    local_experts = np.maximum(model.experts // lay.ep, 1).astype(np.float64)

    def count(place):
        gathered = every = 0.0 * lay.tp
        for t in (t for t in model.tensors_at(place) if not t.tied):
            copies = local_experts if t.expert and per_expert else 1.0
            every = every + copies
            gathered = gathered + np.where(local_numel(t, lay.tp, model.experts, lay.ep) / copies >= threshold, copies, 0.0)
        return gathered, every

    n_layers = max_layers_on_stage(model.layers, lay.pp, training.pipeline_edge_layers)
    (g_block, a_block), (g_first, a_first), (g_last, a_last) = count(BLOCK), count(FIRST), count(LAST)
    whole = lay.pp == 1  # one stage holds both ends; otherwise the heavier end
    return (n_layers * g_block + np.where(whole, g_first + g_last, np.maximum(g_first, g_last)),
            n_layers * a_block + np.where(whole, a_first + a_last, np.maximum(a_first, a_last)))


def grad_reductions_per_step(training: Training, lay: Layouts) -> np.ndarray:
    """How often gradients are reduced per step: every micro-batch for the ZeRO stages the engine
    reduces in its backward hooks (DeepSpeed engine.py allreduce_gradients: "ZeRO stage >= 2
    communicates during non gradient accumulation boundaries as well"), else once (also when a
    pipeline defers the reduction to after its schedule)."""
    every = among(lay.zero, training.engine.reduce_every_micro_step) & ~deferred_reduction(training, lay)
    return np.where(every, lay.gas, 1).astype(np.float64)


def overlapped_exposed_s(total_s, buckets, window_s):
    """Exposed seconds of `buckets` equal collectives on one communication stream under `window_s`
    of compute: each is issued as its share of the compute completes (a gradient bucket when its
    last gradient is ready: megatron-core 0.16.1 distributed_data_parallel.py
    _make_backward_post_hook -> register_grad_ready -> start_grad_sync; DeepSpeed stage_1_and_2.py
    reduce_independent_p_g_buckets_and_remove_grads on its reduction stream) or one bucket ahead
    of it (a parameter bucket's gather: param_and_grad_buffer.py finish_param_sync dispatches the
    next; a TP chunk of --tp-comm-overlap likewise). One bucket always shows (the last gradients,
    the first parameters); each other shows by what it takes beyond its share of the compute."""
    per = total_s / buckets
    return per + (buckets - 1.0) * np.maximum(per - window_s / buckets, 0.0)


def partition_params(model: ModelSpec, training: Training, lay: Layouts) -> np.ndarray:
    """Parameters of the optimizer partition a rank updates (all it holds without ZeRO)."""
    dense, expert = held_params(model, training, lay)
    return np.where(lay.zero >= 1, dense / lay.zero_ranks + expert / expert_dp(training, lay), dense + expert)


def zero3_gathers_per_step(training: Training, lay: Layouts) -> np.ndarray:
    """Times each sharded parameter is all-gathered in a step: forward and again backward every
    micro-batch under ZeRO-3 (ZeRO paper section 7); the forward only under --zero 2 where the
    engine reshards after every backward (Engine.reshards_after_backward); once where a pipeline
    keeps its stage gathered across the micro-batches; else none (ZeRO-1/2 gather after the step:
    param_gather_s)."""
    regather = (lay.zero == 2) & training.engine.reshards_after_backward
    per_microbatch = np.select([lay.zero == 3, regather], [2.0, 1.0], 0.0)
    return np.where(deferred_reduction(training, lay) & (per_microbatch > 0), 1.0, per_microbatch * lay.gas)


def zero3_gather_s(ctx: Step) -> dict:
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
    model, cluster, training, lay, c = ctx
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
    kept, rank = zero3_kept_params(Stage(model, training, lay, 0 * lay.pp))
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
