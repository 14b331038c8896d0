"""The data-parallel side of a step every engine shares: the tensors a rank reduces or gathers and
how many, a data-parallel collective's time on the topology, the parameters a rank holds and
steps, and how much of a collective its compute window hides. The engines' own timing
(planner/engines/*/timing.py) and planner/timing.py build on these."""

from __future__ import annotations

import numpy as np

from planner.collectives import group_collective_s
from planner.hardware import Cluster
from planner.layout import Layouts, Training, among
from planner.held import deferred_reduction
from planner.model import BLOCK, FIRST, LAST, ModelSpec, local_numel
from planner.options import RankOrder
from planner.pipeline import first_routed_stage, max_layers_on_stage
from planner.sharding import expert_dp, expert_folds, expert_tp, rank_params


def held_params(model: ModelSpec, training: Training, lay: Layouts) -> tuple:
    """(dense, expert) elements of a rank of the heavier end stage (first or last); experts of the
    first stage of routed blocks only where dense-first blocks leave the first with fewer."""
    d0, expert = rank_params(model, training, lay, 0 * lay.pp)
    if model.dense_layers:
        edge = training.pipeline_edge_layers
        expert = rank_params(model, training, lay, first_routed_stage(model.dense_layers, model.layers, lay.pp, edge))[1]
    return np.maximum(d0, rank_params(model, training, lay, lay.pp - 1)[0]), expert


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
