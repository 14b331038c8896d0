"""The pipeline: how layers split over stages, and what each schedule keeps in flight and idles.

Memory reads the split and the in-flight micro-batches; step time reads the split, the bubble
and the point-to-point slots. One module, so the two can never disagree on a schedule.
"""

from __future__ import annotations

import numpy as np

from planner.engines import Modules
from planner.options import Schedule


def layers_on_stage(layers: int, pp, stage, edge_layers: int = 0) -> np.ndarray:
    """Transformer blocks on pipeline stage `stage`: the first L mod p stages take one extra
    (DeepSpeed PipelineModule partition_method='uniform' balances blocks this way; Megatron-core
    takes uneven stages through --decoder-first/last-pipeline-num-layers). With `edge_layers` the
    embedding and the output layer count as that many blocks each, and the first and last stage
    give them up (torchtitan pipeline_parallel.py _generate_llm_fqn_per_model_part:
    pipeline_parallel_first/last_stage_less_layers = 1; 32 layers on 4 stages: 8, 9, 8, 7)."""
    effective = layers + 2 * edge_layers
    n = effective // pp + (stage < effective % pp)
    # counted as integers: numpy adds two booleans as a logical or, which gave one stage (pp 1) L + 1 blocks
    ends = np.asarray(stage == 0, dtype=np.int64) + np.asarray(stage == pp - 1, dtype=np.int64)
    return n - edge_layers * ends


def interleaved_layers(model, training) -> int:
    """Layer slots an interleaved split divides over p x v chunks: the blocks, plus one each for the
    embedding and the loss where Megatron counts them (Megatron-LM 0.19.2 training/arguments.py
    --account-for-embedding/loss-in-pipeline-split: num_layers += 1 each before the division);
    torchtitan cuts its stages by weight instead (rules.py vpp_stages_by_weight)."""
    return model.layers + 2 * training.pipeline_edge_layers * (training.engine.modules is Modules.MEGATRON)


def max_layers_on_stage(layers: int, pp, edge_layers: int = 0) -> np.ndarray:
    """Blocks on the most loaded stage: the first, or with edge layers the second or the last."""
    first = layers_on_stage(layers, pp, 0, edge_layers)
    if not edge_layers:
        return first
    second = np.where(pp > 2, layers_on_stage(layers, pp, 1, edge_layers), 0)
    return np.maximum(np.maximum(first, second), layers_on_stage(layers, pp, pp - 1, edge_layers))


def first_layer_on_stage(layers: int, pp, stage, edge_layers: int = 0) -> np.ndarray:
    """Index of the first block of `stage` in its contiguous split (layers_on_stage of the stages
    before it; the embedding's edge slots hold none)."""
    effective = layers + 2 * edge_layers
    start = stage * (effective // pp) + np.minimum(stage, effective % pp)
    return np.maximum(start - edge_layers, 0)


def dense_layers_on_stage(model, pp, chunks, stage, edge_layers: int = 0) -> np.ndarray:
    """Of a stage's blocks, the model's dense ones (ModelSpec.dense_layers first, then all but every
    moe_layer_step-th: ModelSpec.routed_before). Contiguous stages: those in the stage's range.
    `chunks` > 1 interleaved model chunks of c = L/(p v) blocks, chunk i on stage i mod p
    (Megatron-core get_transformer_layer_offset with a virtual pipeline): those in each of its
    chunks."""
    layers = model.layers
    n = layers_on_stage(layers, pp, stage, edge_layers)
    if model.moe_layers == layers:
        return 0 * n
    start = first_layer_on_stage(layers, pp, stage, edge_layers)
    contiguous = n - (model.routed_before(start + n) - model.routed_before(start))
    interleaved = 0 * n
    for j in range(int(np.max(chunks, initial=1))):  # the stage's j-th chunk, the embedding's edge slots first
        slot, size = chunk_slots(layers + 2 * edge_layers, pp * chunks, stage + j * pp)
        first, end = np.maximum(slot - edge_layers, 0), np.minimum(slot + size - edge_layers, layers)
        interleaved = interleaved + np.where(j < chunks, (end - first) - (model.routed_before(end) - model.routed_before(first)), 0)
    return np.where(chunks > 1, np.minimum(interleaved, n), contiguous)


def chunk_slots(slots: int, chunks, i) -> tuple:
    """(first slot, slot count) of model chunk i of `chunks` over `slots` layer slots, chunk i on
    stage i mod p: equal chunks of slots / chunks where they divide (megatron-core
    get_transformer_layer_offset with a virtual pipeline), else the first slots mod chunks of them
    one longer (Engine.pipeline_layout), whose stage totals are layers_on_stage's."""
    c, r = slots // np.maximum(chunks, 1), slots % np.maximum(chunks, 1)
    return c * i + np.minimum(i, r), c + (i < r)


def blocks_on_stage(model, lay, stage, edge_layers: int = 0) -> list[tuple]:
    """(block, count) pairs of one rank of `stage`: the model's own (routed-expert) blocks and, where
    it mixes in dense ones, `model.dense_block` with its count (what per-block formulas sum over);
    the last stage also runs the MTP depths' blocks (ModelSpec.mtp_layers)."""
    n = layers_on_stage(model.layers, lay.pp, stage, edge_layers)
    mtp = model.mtp_layers * (np.asarray(stage) == lay.pp - 1) if model.mtp_layers else 0
    if model.moe_layers == model.layers:
        return [(model, n + mtp)]
    dense = dense_layers_on_stage(model, lay.pp, chunks_per_stage(lay.vpp, lay.schedule), stage, edge_layers)
    routed_mtp = mtp if model.mtp_block is model else 0
    return [(model, n - dense + routed_mtp), (model.dense_block, dense + mtp - routed_mtp)]


def first_routed_stage(dense_layers: int, layers: int, pp, edge_layers: int = 0) -> np.ndarray:
    """The first stage whose blocks are all routed-expert blocks (the last stage if none is): with
    dense-first blocks, the stage holding the most expert parameters, which may be neither the first
    nor the last (DeepSeek-V3 on 16 stages: stage 0 has 3 dense blocks and 1 routed, stage 1 four
    routed)."""
    effective, k = layers + 2 * edge_layers, dense_layers + edge_layers
    q, r = effective // pp, effective % pp
    # smallest s with first_layer_on_stage(s) >= k: s (q + 1) >= k while s <= r, else s q + r >= k
    s = np.where(-(-k // (q + 1)) <= r, -(-k // (q + 1)), -(-(k - r) // np.maximum(q, 1)))
    return np.minimum(s, pp - 1)


def microbatches_in_flight(pp, vpp, gas, schedule, stage) -> np.ndarray:
    """Micro-batches whose activations a stage holds at its peak, in units of that stage's layers.

    1F1B: min(p - i, m) (Narayanan et al. 2021 section 2.2.1; Megatron-core schedules.py
    forward_backward_pipelining_without_interleaving: num_warmup_microbatches = p - i - 1, plus
    the one in its backward). Interleaved with v chunks: min(v p + p - 2i - 1, v m) chunks of
    L/(p v) layers (schedules.py get_pp_rank_microbatches: 2(p - i - 1) + (v - 1) p warm-up
    micro-batches plus one; stage 0 matches Korthikanti et al. 2022's factor 1 + (p-1)/(p v)).
    GPipe: all m (Huang et al. 2019). ZB-H1 keeps 1F1B's p in flight (Qi et al. 2023 Table 1:
    peak memory p M_B for both)."""
    one_f_one_b = np.minimum(pp - stage, gas)
    interleaved = np.minimum(vpp * pp + pp - 2 * stage - 1, vpp * gas) / vpp
    return np.select([schedule == Schedule.INTERLEAVED, schedule == Schedule.GPIPE], [interleaved, gas], one_f_one_b)


def p2p_buffers(pp, vpp, gas, schedule, stage) -> np.ndarray:
    """Receive buffers (one micro-batch's stage-boundary hidden states each) a rank of `stage` keeps
    for the engine's life under torch.distributed.pipelining (Engine.pipeline_p2p_buffers): per
    model chunk, m for activations unless the chunk is the first stage of the whole pipeline and m
    for their gradients unless it is the last (torch 2.13 stage.py PipelineStage
    _setup_forward_recv_info and _create_grad_recv_info: one _make_tensor_from_meta buffer per
    micro-batch, made at the first step; counted on the engine's own stages in
    tests/test_torch_pipelining_real.py)."""
    v = chunks_per_stage(vpp, schedule)
    return np.where(pp > 1, gas * ((v - (stage == 0)) + (v - (stage == pp - 1))), 0)


def chunks_per_stage(vpp, schedule) -> np.ndarray:
    """Model chunks per pipeline rank the schedule interleaves (1 unless interleaved)."""
    return np.where(schedule == Schedule.INTERLEAVED, vpp, 1)


def interleaved_groups(micro_batches, pp) -> tuple:
    """(first, last): micro-batches of the first and of the last group a model chunk runs in a row
    under Megatron's interleaved schedule (megatron-core 0.16.1 schedules.py get_schedule_table:
    groups of microbatch_group_size_per_vp_stage, the pipeline size by default, each run through
    every chunk in turn; the last group takes the rest, so a chunk's last backward comes j x last
    chunk passes before the end for chunk j, and its first forward j x first after the start)."""
    m = np.asarray(micro_batches)
    return np.minimum(pp, m), m - pp * ((m - 1) // pp)


def bubble_slots(pp, vpp, schedule) -> np.ndarray:
    """Idle time of a step in units of one micro-batch's forward + backward on one stage:
    (p - 1) for 1F1B and GPipe, (p - 1)/v interleaved (Narayanan et al. 2021 sections 2.2.1-2.2.2:
    bubble fraction (p - 1)/m and (p - 1)/(v m) of the m slots)."""
    return (pp - 1) / chunks_per_stage(vpp, schedule)


def bubble_s(pp, vpp, schedule, slot_s, weight_grad_s) -> np.ndarray:
    """Idle seconds of the slowest stage in a step, given one micro-batch's work on it (`slot_s`)
    and the weight-gradient part of its backward (`weight_grad_s`): bubble_slots x slot, except
    ZB-H1, which fills the drain with the deferred weight gradients: (p - 1)(T_F + T_B - T_W) =
    (p - 1)(slot - 2 T_W) (Qi et al. 2023 section 3.1, Table 1; a third of 1F1B's when
    T_F = T_B = T_W)."""
    zero_bubble = (pp - 1) * np.maximum(slot_s - 2.0 * weight_grad_s, 0.0)
    return np.where(schedule == Schedule.ZB_H1, zero_bubble, bubble_slots(pp, vpp, schedule) * slot_s)


def p2p_transfers(pp, vpp, gas, schedule) -> np.ndarray:
    """Sends of activations (forward) plus their gradients (backward) on the critical path of one
    step: 2 (v m + p - 1) for p > 1, since every one of the v m chunk-micro-batches crosses a
    stage boundary and the pipeline fill and drain add p - 1 (Narayanan et al. 2021 section 2.2)."""
    v = chunks_per_stage(vpp, schedule)
    return np.where(pp > 1, 2.0 * (v * gas + pp - 1), 0.0)
