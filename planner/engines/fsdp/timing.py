"""FSDP2's own step timing (torch 2.13 fully_shard): the copy-in/copy-out of each unit's all-gather
and reduce-scatter buffers. planner/timing.py assembles it."""

from __future__ import annotations

import numpy as np

from planner import compute as C
from planner.dp_comm import held_params
from planner.engines import Buffers
from planner.sharding import state_bytes
from planner.stage import Step


def fsdp_copies_s(ctx: Step) -> np.ndarray:
    """Seconds a step spends in FSDP2's own copies around its collectives, at HBM bandwidth (torch
    2.13 _fully_shard/_fsdp_collectives.py), over every unit of the rank's heavier end stage, in
    every micro-batch: all_gather_copy_in's _foreach_copy_ of the fp32 shards into the all-gather
    input (r 4, w w per shard element) and foreach_all_gather_copy_out's split_with_sizes_copy into
    the unsharded parameters (r w, w w) on the compute stream, once a micro-batch, twice when the
    unit reshards after forward (--zero 3); foreach_reduce's _chunk_cat of the gradients into the
    reduce_dtype reduce-scatter input (r w, w g) and the division of the reduced shard (r g, w g).
    Nothing for the other engines or unsharded."""
    model, cluster, training, lay, c = ctx
    if training.engine.buffers is not Buffers.FSDP:
        return 0.0 * lay.tp
    b = state_bytes(training)
    params = sum(held_params(model, training, lay))
    shards = lay.zero_ranks.astype(np.float64)
    gather = params * ((4.0 + b.weights) / shards + 2.0 * b.weights)
    reduce = params * ((b.weights + b.grads) + 2.0 * b.grads / shards)
    per_micro_batch = gather * (1.0 + (lay.zero == 3)) + reduce
    return np.where(lay.zero >= 2, lay.gas * per_micro_batch, 0.0) / C.hbm_bytes_per_s(cluster, c)
