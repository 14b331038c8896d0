"""Megatron's own step timing (Megatron-Core 0.16.1 with Transformer Engine): the TP collectives
Userbuffers pipelines with its GEMMs (--tp-comm-overlap), and the interleaved schedule's gradient
sync per model chunk. planner/timing.py assembles them."""

from __future__ import annotations

import numpy as np

from planner import compute as C
from planner.compute import tokens_per_microbatch
from planner.dp_comm import overlapped_exposed_s
from planner.stage import Step


# TransformerEngine 2.20.2 pytorch/module/base.py initialize_ub (get_default_config): the userbuffers
# megatron-core 0.16.1 creates under --tp-comm-overlap with no --tp-comm-overlap-cfg file
UB_COMM_SMS = 16  # "pipeline" and "bulk": num_sm 16 with set_sm_margin, the GEMM beside them gets the rest


UB_PIPELINE_SPLITS = 4  # "pipeline": num_splits 4 ("ring_exchange": num_splits = tp, on copy engines, num_sm 1)


# the buffers' linear pairs, column- then row-parallel (megatron-core attention.py linear_qkv/linear_proj,
# mlp.py linear_fc1/linear_fc2; moe/shared_experts.py SharedExpertMLP is an MLP)
UB_PAIRS = (("qkv", "o"), ("fc1", "fc2"), ("shared_fc1", "shared_fc2"))


def ub_pass_exposed_s(ctx: Step, gather_s, linear: float, backward: bool, scatter_s=None) -> np.ndarray:
    """Seconds one pass through a block loses to its TP collectives (`gather_s` each all-gather,
    `scatter_s` each reduce-scatter of T h; the same but under FP8, mp_comm.tp_pass_exposed_s) under
    TransformerEngine's userbuffers, as megatron-core 0.16.1 sets them (extensions/transformer_engine.py:
    ub_overlap_ag, ub_overlap_rs, ub_bulk_dgrad and ub_bulk_wgrad on; TE 2.20.2 defaults, UB_* above).
    Per linear pair:
    - forward: the column GEMM (qkv, fc1) all-gathers its input by "ring_exchange", t chunks on the
      copy engines, each chunk's GEMM beside the next chunk's transfer; the row GEMM (proj, fc2)
      reduce-scatters its output by "pipeline": 4 chunks, each one's reduce-scatter beside the next
      chunk's GEMM, the last one's after it, on 16 SMs the GEMM gives up;
    - backward: the row GEMM's dgrad all-gathers the output gradient by "ring_exchange"; the column
      GEMM's dgrad runs beside the "bulk" all-gather of its input (for the wgrad) and its wgrad
      beside the "bulk" reduce-scatter of the input gradient, both on 16 SMs.
    What shows: transfers longer than the GEMM work beside them, the last pipelined chunk, the
    slower GEMMs on fewer SMs and the small-matrix cost of the chunks (compute.gemm_s). Not
    modelled: HBM contention between the copies and the GEMMs. MLA's projections (buffers TE lacks)
    switch Megatron's overlap off: tp_pass_exposed_s."""
    block, cluster, training, lay, c = ctx
    (peak, c), t = C.block_gemm_rate(cluster, training, c), lay.tp.astype(np.float64)
    sms = cluster.gpu.sm_count
    fewer_sms = sms / (sms - UB_COMM_SMS) if sms > UB_COMM_SMS else 1.0  # same work on the SMs left
    T = tokens_per_microbatch(training, lay)
    flops = {g.name: T * g.flops_per_token / t for g in block.gemms(fused=True) if g.tp_split and not g.expert}

    scatter_s = gather_s if scatter_s is None else scatter_s

    def ring(f):  # t chunks, the local one first: t - 1 transfers, each beside a chunk's GEMM (t - 1 of t)
        chunks = C.gemm_s(f, peak, c, count=t)
        return chunks - C.gemm_s(f, peak, c) + np.maximum(gather_s - (t - 1.0) / t * chunks, 0.0)

    def pipeline(f):  # chunks on fewer SMs, each one's reduce-scatter beside the next (overlapped_exposed_s)
        chunks = C.gemm_s(f, peak, c, count=UB_PIPELINE_SPLITS) * fewer_sms
        return chunks - C.gemm_s(f, peak, c) + overlapped_exposed_s(scatter_s, UB_PIPELINE_SPLITS, chunks)

    def bulk(f, collective_s):  # one GEMM on fewer SMs beside one whole collective
        whole = C.gemm_s(f, peak, c)
        return whole * (fewer_sms - 1.0) + np.maximum(collective_s - whole * fewer_sms, 0.0)

    exposed, pairs = 0.0, 0
    for column, row in UB_PAIRS:
        if column in flops:
            pairs += 1
            exposed = exposed + (ring(flops[row]) + bulk(flops[column], gather_s) + bulk(flops[column], scatter_s)
                                 if backward else ring(flops[column]) + pipeline(flops[row]))
    assert pairs == linear, (pairs, linear)  # tp_pass_units counts the same linear pairs
    return exposed


def chunked_sync_exposed_s(total_s, first_chunk_s, chunks, group, chunk_window_s, own_window_s=0.0):
    """Exposed seconds of a collective split over a rank's interleaved model chunks, each chunk's
    share started on its own (Engine.dp_sync_per_chunk): the first chunk's share shows as
    `first_chunk_s`, and each of the other chunks has `group` chunk passes of `chunk_window_s` each
    to hide behind before the chunk after it. Megatron's interleaved schedule runs a chunk's
    micro-batches in groups (pipeline.interleaved_groups), so chunk j's last backward comes j x the
    last group's chunk passes before the end (the backward's chunk 0 is last: its reduction shows
    whole, launched after it by grad_sync_func), and chunk j's first forward a first group after
    chunk j - 1's, at which its parameter all-gather is launched. On one stream the chunks queue:
    the last finishes max(first, total - (chunks - 1) x group x window - own) after the window ends
    (each chunk's share total / chunks, the windows linear in the chunk's index; `own_window_s` the
    part of the last chunk's own pass that runs beside its collective: the parameter buckets are
    waited for one by one as its first forward reaches them). Equal to an event-by-event run of
    megatron-core's schedule table (tests/test_timing.py)."""
    return np.maximum(first_chunk_s, total_s - (chunks - 1.0) * group * chunk_window_s - own_window_s)
