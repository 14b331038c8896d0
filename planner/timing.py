"""Step time, FLOPs and throughput of candidate layouts, vectorized over `Layouts`.

The step is the slowest pipeline stage's m micro-batches (Narayanan et al. 2021, sections 2-3)
plus per-step communication, offload and the optimizer update:

    step = m*(compute + recompute + exposed TP/EP/CP) + bubble + PP p2p + stragglers
           + DP not overlapped + overlapped DP beyond the compute it runs under + offload + optimizer + other

Each term below is one mechanism with its source. Overlapped data-parallel collectives are priced
against the compute they really run under (overlapped_dp_s: one micro-batch's backward for a
gradient reduction, the next forward for Megatron's parameter gather, bucket by bucket). Every
breakdown part is non-negative and they sum to step_s.
"""

from __future__ import annotations

import numpy as np

from planner import compute as C, fp8
from planner.moe import routed_per_token
from planner.activations import recomputed_layers
from planner.collectives import p2p_bytes_per_s, p2p_message_s, p2p_pod_share
from planner.compute import flops_per_step, peak_flops_per_s, tokens_per_microbatch
from planner.engines import GradBuckets, Modules, SelectivePolicy
from planner.grouping import Lazy, codes_of, grouped
from planner.hardware import Cluster
from planner.layout import Layouts, Training, among
from planner.engines.deepspeed.memory import deepspeed_bf16_optimizer
from planner.held import deferred_reduction
from planner.memory import ACTIVATION_FIELDS, coefficients
from planner.model import ModelSpec
from planner.modules import block_modules
from planner.options import Recompute
from planner.pipeline import (blocks_on_stage, bubble_s, chunks_per_stage, first_routed_stage, interleaved_groups,
                              max_layers_on_stage, p2p_transfers)
from planner.sharding import block_params, state_bytes
from planner.stragglers import straggler_s
from planner.dp_comm import (dp_collective_s, grad_reductions_per_step, held_params, overlapped_exposed_s,
                             rank_tensors, zero3_exposed_s, zero3_gather_s, zero3_gather_total_s)
from planner.engines.deepspeed.timing import zero3_rank_copies_s
from planner.engines.fsdp.timing import fsdp_copies_s
from planner.engines.megatron.recompute import recompute_s as megatron_recompute_s
from planner.engines.megatron.timing import chunked_sync_exposed_s
from planner.mp_comm import (checkpoint_restore_s, cp_ring_exposed_s, ep_all_to_all_s, moe_count_sync_s,
                              tp_all_reduce_s, tp_pass_exposed_s, tp_pass_units)
from planner.optimizer_time import offload_s, optimizer_s
from planner.stage import Step

BREAKDOWN_KEYS = ("compute", "recompute", "tp_comm", "dp_comm", "pp_comm", "pp_bubble", "stragglers", "offload", "optimizer",
                  "other")
MEGATRON_DDP_BUCKET = 40_000_000  # megatron.core DistributedDataParallelConfig: bucket_size = max(40M, 1M * dp)


# ---------------------------------------------------------------------------------------------
# per block, per micro-batch: communication inside the layer


def block_s(ctx: Step) -> dict:
    """Seconds of one block of this kind in one micro-batch on one rank: its forward and backward
    kernels (for eager modules no shorter than the host's dispatch of them), weight-gradient GEMMs,
    exposed TP/EP/CP communication, selective recompute and the checkpoint restore of a fully
    recomputed block (Korthikanti Table 4 times them so)."""
    block, cluster, training, lay, c = ctx
    gemm = C.gemm_fwd_s(ctx)
    core_fwd, core_bwd = C.attention_core_s(ctx)
    tp_ar, units = tp_all_reduce_s(ctx), tp_pass_units(block, training, lay)
    # eager Hugging Face modules: the GPU waits where the host dispatches the block's kernels slower
    hf = block_modules(block, training) is Modules.HUGGING_FACE
    host_fwd, host_bwd = C.eager_host_s(block, training, c) if hf else (0.0, 0.0)
    cast_fwd, cast_bwd = C.autocast_weight_traffic_s(ctx)
    q_fwd, q_bwd = fp8.cast_s(block, training, lay, routed_per_token(block, training, lay, tokens_per_microbatch(training, lay)),
                              C.hbm_bytes_per_s(cluster, c))  # FP8 quantize kernels
    gpu_fwd = gemm + core_fwd + C.elementwise_fwd_s(ctx) + cast_fwd + q_fwd
    gpu_bwd = 2.0 * gemm + core_bwd + C.elementwise_bwd_s(ctx) + cast_bwd + q_bwd  # dgrad + wgrad
    out = {"fwd": np.maximum(gpu_fwd, host_fwd), "bwd": np.maximum(gpu_bwd, host_bwd),
           "gpu_fwd": gpu_fwd, "gpu_bwd": gpu_bwd, "host_fwd": host_fwd + 0.0 * gpu_fwd, "host_bwd": host_bwd + 0.0 * gpu_bwd,
           "gemm": gemm, "tp_fwd": tp_pass_exposed_s(ctx, tp_ar, units),
           "tp_bwd": tp_pass_exposed_s(ctx, tp_ar, units, backward=True),
           "a2a": ep_all_to_all_s(ctx),  # 2 in the forward, 2 in the backward
           "counts": moe_count_sync_s(ctx),  # once a forward
           "restore": checkpoint_restore_s(ctx)}
    out["comm"] = out["tp_fwd"] + out["tp_bwd"] + 4.0 * out["a2a"] + out["counts"] + \
        cp_ring_exposed_s(ctx, core_fwd, core_bwd)
    if training.engine.selective_policy is SelectivePolicy.OP_SAC:  # every op but attention and kept matmuls
        out["sel"], out["sel_comm"] = C.op_sac_recompute_s(ctx), out["tp_fwd"] / 2.0
    else:  # Megatron: the attention core, and the --recompute-modules beside it
        out["sel"], out["sel_comm"] = megatron_recompute_s(ctx, core_fwd, out["a2a"], out["counts"])
    return out


def _slowest_stage_blocks(model: ModelSpec, training: Training, lay: Layouts) -> list[list[tuple]]:
    """(block kind, count) lists of the stages that can be slowest: the most loaded one; with
    dense-first blocks also the first, second and last, the one where they end and its neighbours
    (stages after it hold only routed blocks, as many as it or fewer; planner/pipeline.py); with MTP
    depths also the last, which runs them."""
    edge = training.pipeline_edge_layers
    if model.moe_layers == model.layers:
        most = [[(model, max_layers_on_stage(model.layers, lay.pp, edge))]]
        return most + [blocks_on_stage(model, lay, lay.pp - 1, edge)] if model.mtp_layers else most
    end = first_routed_stage(model.dense_layers, model.layers, lay.pp, edge)
    return [blocks_on_stage(model, lay, np.clip(stage, 0, lay.pp - 1), edge)
            for stage in (0 * lay.pp, 1 + 0 * lay.pp, lay.pp - 1, end - 1, end, end + 1)]


def microbatch_s(ctx: Step) -> dict:
    """Seconds of one micro-batch on one rank of the slowest stage: compute, recompute and the
    exposed TP/EP/CP communication of its blocks (each block kind with its own times), plus the
    per-block times of a routed block (Korthikanti Table 4)."""
    model, cluster, training, lay, c = ctx
    full, selective = lay.recompute == Recompute.FULL, lay.recompute == Recompute.SELECTIVE
    per = {id(model): block_s(ctx)}
    if model.moe_layers != model.layers:
        per[id(model.dense_block)] = block_s(Step(model.dense_block, cluster, training, lay, c))
    head = C.head_s(ctx)
    candidates = []
    for blocks in _slowest_stage_blocks(model, training, lay):
        rerun_left = recomputed_layers(lay, sum(n for _, n in blocks), lay.vpp)  # blocks whose whole forward runs again
        out = {"compute": head, "fwd_mb": head / 3.0, "weight_grad_s": head / 3.0, "recompute": 0.0, "tp_comm": 0.0,
               "restore": 0.0,
               # each pass's block kernels and their host dispatch apart (param_fetch_exposed_s adds to the host)
               "gpu_fwd_mb": 0.0, "host_fwd_mb": 0.0, "gpu_bwd_mb": 0.0, "host_bwd_mb": 0.0, "blocks": 0.0, "reruns": 0.0}
        # the head's backward is twice its forward (dgrad + wgrad: Narayanan 2021 eq. 3's 3x); each
        # GEMM's wgrad has its forward's FLOPs (what ZB-H1 defers); a stage's first blocks (the
        # dense-first ones) are the first recomputed
        for block, n in reversed(blocks):
            b, rerun = per[id(block)], np.minimum(rerun_left, n)
            rerun_left = rerun_left - rerun
            out["compute"] = out["compute"] + n * (b["fwd"] + b["bwd"])
            out["fwd_mb"] = out["fwd_mb"] + n * b["fwd"]
            out["weight_grad_s"] = out["weight_grad_s"] + n * b["gemm"]
            out["gpu_fwd_mb"] = out["gpu_fwd_mb"] + n * b["gpu_fwd"]
            out["host_fwd_mb"] = out["host_fwd_mb"] + n * b["host_fwd"]
            out["gpu_bwd_mb"] = out["gpu_bwd_mb"] + n * b["gpu_bwd"] + rerun * b["gpu_fwd"]
            out["host_bwd_mb"] = out["host_bwd_mb"] + n * b["host_bwd"] + rerun * b["host_fwd"]
            out["blocks"], out["reruns"] = out["blocks"] + n, out["reruns"] + rerun
            out["recompute"] = out["recompute"] + rerun * (b["fwd"] + b["restore"]) + np.where(selective, n * b["sel"], 0.0)
            out["restore"] = out["restore"] + rerun * b["restore"]
            out["tp_comm"] = out["tp_comm"] + n * b["comm"] + rerun * (b["tp_fwd"] + 2.0 * b["a2a"] + b["counts"]) \
                + np.where(selective, n * b["sel_comm"], 0.0)
        out["slot"] = out["compute"] + out["recompute"] + out["tp_comm"]
        candidates.append(out)
    out = candidates[0]
    if len(candidates) > 1:
        slowest = np.argmax(np.stack(np.broadcast_arrays(*[o["slot"] for o in candidates])), axis=0)
        out = {k: np.choose(slowest, np.broadcast_arrays(*[o[k] for o in candidates])) for k in out}
    # one block with its exposed TP all-reduces, as Korthikanti 2022 Table 4 times them
    b = per[id(model)]
    out.update(fwd_s=b["fwd"] + b["tp_fwd"], bwd_s=b["bwd"] + b["tp_bwd"],
               recompute_s=np.select([full, selective], [b["fwd"] + b["tp_fwd"], b["sel"] + b["sel_comm"]], 0.0))
    return out


def time_coefficients(cluster: Cluster) -> dict:
    """data/coefficients.json's time section, a profile's fitted values and the GPU's own measured
    figures in their place (compute.gpu_time_coefficients)."""
    return C.gpu_time_coefficients(cluster, coefficients("time", cluster.calibration))


def layer_times(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts) -> dict:
    """Forward, backward and recompute seconds of one transformer block per micro-batch on one rank."""
    mb = microbatch_s(Step(model, cluster, training, lay, time_coefficients(cluster)))
    return {k: mb[k] for k in ("fwd_s", "bwd_s", "recompute_s")}


# ---------------------------------------------------------------------------------------------
# per step: the pipeline


def pipeline_bubble_s(lay: Layouts, slot_s, weight_grad_s=0.0) -> np.ndarray:
    """Idle time of the slowest stage (planner/pipeline.py bubble_s)."""
    return bubble_s(lay.pp, lay.vpp, lay.schedule, slot_s, weight_grad_s)


def pipeline_p2p_s(ctx: Step, fwd_chunk_s=0.0, bwd_chunk_s=0.0) -> np.ndarray:
    """Point-to-point sends on the critical path: T*h activations (or their gradients) per transfer,
    split over t under SP or Megatron's scatter/gather over the TP ranks' NICs (Narayanan 2021
    section 4.1), through the GPU's NIC when the pipeline spans nodes. 2 (v m + p - 1) of them
    (pipeline.p2p_transfers); where the engine overlaps them with the interleaved schedule
    (Engine.p2p_overlaps_interleaved), the fill and drain's 2 (p - 1) still wait, and each of the
    v m forward and v m backward ones shows only by what it takes beyond a chunk's forward
    (`fwd_chunk_s`) or backward (`bwd_chunk_s`) compute that carries it."""
    model, cluster, training, lay, c = ctx
    split = (lay.sequence_parallel > 0) | training.engine.p2p_split_over_tp
    nbytes = tokens_per_microbatch(training, lay) * model.hidden * training.precision.element_bytes
    nbytes = nbytes / np.where(split, lay.tp, 1)
    # the slowest stage boundary (one at a node's or a pod's edge) paces the chain
    share = p2p_pod_share(cluster, lay.pp_stride, lay.pp)
    one = p2p_message_s(nbytes, p2p_bytes_per_s(cluster, lay.pp_stride * lay.pp > cluster.gpus_per_node, c, share), c)
    transfers = p2p_transfers(lay.pp, lay.vpp, lay.gas, lay.schedule)
    v = chunks_per_stage(lay.vpp, lay.schedule)
    overlaps = training.engine.p2p_overlaps_interleaved & training.overlap_p2p & (v > 1) & (lay.pp > 1)
    f = c["dp_overlap_fraction_with_overlap"]
    steady = v * lay.gas * (np.maximum(one - f * fwd_chunk_s, 0.0) + np.maximum(one - f * bwd_chunk_s, 0.0))
    return np.where(overlaps, 2.0 * (lay.pp - 1) * one + steady, transfers * one)


# ---------------------------------------------------------------------------------------------
# per step: data parallelism and ZeRO


def grad_bucket_elements(model: ModelSpec, training: Training, lay: Layouts) -> np.ndarray:
    """Elements per gradient-reduction call: DeepSpeed reduce_bucket_size; FSDP one unit per block;
    Megatron-core max(40M, 1M x dp) (distributed_data_parallel.py)."""
    kind = training.engine.grad_buckets
    if kind is GradBuckets.REDUCE_BUCKET:
        return training.zero_config.reduce_bucket_size + 0 * lay.tp
    if kind is GradBuckets.PER_BLOCK:
        return block_params(model, training, lay)
    return np.maximum(MEGATRON_DDP_BUCKET, 1_000_000 * lay.zero_ranks)


def grad_overlaps(training: Training, lay: Layouts) -> np.ndarray:
    """Whether the gradient reduction runs under backward: the engine's default (DeepSpeed
    overlap_comm None -> stage 3; FSDP always; Megatron as the planner launches it) or the user's
    --overlap-comm; never where a pipeline engine reduces after its schedule (DeepSpeed
    pipe/engine.py _exec_reduce_grads), nor under DeepSpeed's BF16_Optimizer, which has no
    gradient hooks (0.19.8 engine.py allreduce_gradients: buffered_allreduce_fallback at the
    accumulation boundary, after backward)."""
    return training.overlaps_grad_reduce(lay.zero) & ~deferred_reduction(training, lay) \
        & ~deepspeed_bf16_optimizer(training, lay)


def grad_reduce_s(ctx: Step) -> tuple:
    """(seconds of one gradient reduction, its buckets, reductions per step): buckets dense over
    dp*cp, experts over dp*cp/ep; an all-reduce where the engine all-reduces (no ZeRO; DeepSpeed
    ZeRO-1/2 too), else a reduce-scatter."""
    model, cluster, training, lay, c = ctx
    dense, expert = held_params(model, training, lay)
    g = state_bytes(training).grads
    # BF16_Optimizer hands the engine each param group's whole flat gradient buffer (0.19.8
    # bf16_optimizer.py get_grads_for_reduction -> fp32_groups_gradients_flat): one all-reduce per
    # group, in communication_data_type (bf16 unless set: engine.py communication_data_type); one
    # group taken (the no-decay group of norms and biases is a small second call)
    bucket = np.where(deepspeed_bf16_optimizer(training, lay), np.maximum(dense + expert, 1.0),
                      grad_bucket_elements(model, training, lay))
    if training.engine.zero3_per_tensor_collectives:  # one reduce-scatter per tensor, their mean size
        bucket = np.where(lay.zero == 3, (dense + expert) / rank_tensors(model, training, lay)[1], bucket)
    all_reduce = among(lay.zero, training.engine.all_reduce_stages) | deepspeed_bf16_optimizer(training, lay)

    def reduce(kind):  # whole buckets; dense and expert gradients in separate buckets
        calls_dense, calls_expert = np.ceil(dense / bucket), np.ceil(expert / bucket)
        return (dp_collective_s(cluster, training, lay, c, kind, dense / np.maximum(calls_dense, 1) * g, 0.0, calls_dense)
                + dp_collective_s(cluster, training, lay, c, kind, 0.0, expert / np.maximum(calls_expert, 1) * g, calls_expert))

    one = np.where(all_reduce, reduce("all_reduce"), reduce("reduce_scatter"))
    return one, np.maximum(np.ceil((dense + expert) / bucket), 1.0), grad_reductions_per_step(training, lay)


def param_gather_s(ctx: Step) -> tuple:
    """(seconds, buckets) of the ZeRO-1/2 (and Megatron distributed optimizer) all-gather of the
    updated 16-bit parameters after the step; DeepSpeed 0.19 runtime/utils.py all_gather_dp_groups
    makes one call per parameter group, Megatron one per DDP bucket."""
    model, cluster, training, lay, c = ctx
    dense, expert = held_params(model, training, lay)
    # FP8 parameters (Megatron --fp8-param-gather) gather 1 B each; the few 16-bit ones (embedding,
    # norms) are counted at that rate too
    w = np.where(fp8.param_gather(training, lay), 1.0, state_bytes(training).weights)
    calls = np.ceil((dense + expert) / grad_bucket_elements(model, training, lay)) \
        if training.engine.param_gather_per_bucket else 1.0
    gather = dp_collective_s(cluster, training, lay, c, "all_gather", dense * w / calls, expert * w / calls, calls)
    after_step = (lay.zero == 1) | ((lay.zero == 2) & (not training.engine.reshards_after_backward))
    return np.where(after_step, gather, 0.0), np.maximum(calls, 1.0) + 0 * lay.tp


def param_fetch_s(model: ModelSpec, training: Training, lay: Layouts, c: dict) -> np.ndarray:
    """Host seconds per block and pass that fetching sharded parameters costs, as counted and timed
    on the real engines beyond the same step without it (data/references/engine_host_cpu.json,
    python -m calibrate.benches.engine_host): the operators the hooks dispatch, at eager_op_host_s each, and
    the Python around them. DeepSpeed ZeRO-3: its hooks fetch and release each parameter-owning
    submodule one by one (0.19.8 partitioned_param_coordinator.py fetch_sub_module,
    release_sub_module): one per GEMM as the engine runs it (per local expert of an expert GEMM) and
    per other module with parameters (norms, router). FSDP2 (--zero 2/3): one unit a block whose hooks
    unshard, copy in and out, reshard and reduce-scatter (torch 2.13 _fully_shard/_fsdp_state.py,
    _fsdp_param_group.py); its forward and backward costs averaged into one a pass."""
    from planner.data import catalog

    counted = catalog("references/engine_host_cpu.json")

    def host_s(part):  # one counted fetch: operators on this host, Python as timed
        return part["ops"] * c["eager_op_host_s"] + part["python_s"]

    if training.engine.zero3_fetch_per_block:
        unit = counted["fsdp_unit"]
        return np.where(lay.zero >= 2, (host_s(unit["forward"]) + host_s(unit["backward"])) / 2.0, 0.0)
    local_experts = np.maximum(model.experts // lay.ep, 1)
    modules = sum(np.where(g.expert, local_experts, 1) for g in model.gemms(training.engine.fused_gemms)) \
        + len({t.module for t in model.block_tensors() if t.gemm is None})
    return np.where(lay.zero == 3, modules * host_s(counted["zero3_fetch"]), 0.0)


def param_fetch_exposed_s(step, pipe) -> np.ndarray:
    """What fetching sharded parameters (param_fetch_s) adds to a step: the host dispatches a pass's
    kernels and fetches its parameters in turn, and the pass takes the longer of that and its
    kernels; every micro-batch's forward and backward (which fetches again for a recomputed
    block's forward)."""
    f = step["fetch_s"]
    fwd = np.maximum(pipe["gpu_fwd_mb"], pipe["host_fwd_mb"] + pipe["blocks"] * f) \
        - np.maximum(pipe["gpu_fwd_mb"], pipe["host_fwd_mb"])
    bwd = np.maximum(pipe["gpu_bwd_mb"], pipe["host_bwd_mb"] + (pipe["blocks"] + pipe["reruns"]) * f) \
        - np.maximum(pipe["gpu_bwd_mb"], pipe["host_bwd_mb"])
    return pipe["micro_batches"] * (fwd + bwd)


# ---------------------------------------------------------------------------------------------
# the step


PIPE_FIELDS = ACTIVATION_FIELDS  # the same grouping as memory's (computed once per candidate set)
# the states' fields with the micro-batch count itself (reductions and offload transfers per micro-batch)
# and zero3_gather_s' recomputed share
STEP_FIELDS = ("tp", "pp", "dp", "cp", "ep", "etp", "gas", "zero", "offload_optimizer", "offload_params", "rank_order",
               "recompute", "recompute_layers", "recompute_method", "vpp")
Z3_KEYS = ("one", "calls", "fwd", "bwd", "whole_step", "prefetch", "ahead_fwd")  # zero3_gather_s
FETCH_PIPE_KEYS = ("gpu_fwd_mb", "host_fwd_mb", "gpu_bwd_mb", "host_bwd_mb", "blocks", "reruns")  # param_fetch_exposed_s


def _pipeline_terms(ctx: Step) -> dict:
    """m micro-batches of the slowest stage, the bubble, the p2p sends and the FLOPs."""
    model, cluster, training, lay, c = ctx
    m = lay.gas.astype(np.float64)
    mb = microbatch_s(ctx)
    flops = flops_per_step(model, training, lay)
    bwd_mb, v = mb["compute"] - mb["fwd_mb"] + mb["recompute"], chunks_per_stage(lay.vpp, lay.schedule)
    out = {"compute": m * mb["compute"], "recompute": m * mb["recompute"], "tp_comm": m * mb["tp_comm"],
           "fwd_mb": mb["fwd_mb"], "bwd_mb": bwd_mb, "pp_bubble": pipeline_bubble_s(lay, mb["slot"], mb["weight_grad_s"]),
           **{k: mb[k] for k in FETCH_PIPE_KEYS}, "micro_batches": m,
           "pp_comm": pipeline_p2p_s(ctx, mb["fwd_mb"] / v, bwd_mb / v),
           # how the rank's data-parallel sync splits over its interleaved chunks (overlapped_dp_s)
           "sync_chunks": np.where(training.engine.dp_sync_per_chunk, v, 1).astype(np.float64),
           **dict(zip(("fwd_group", "bwd_group"), interleaved_groups(m, lay.pp))),
           "model_flops_per_gpu": flops["model_flops"] / lay.world,
           "hardware_flops_per_gpu": flops["hardware_flops"] / lay.world}
    out["busy"] = out["compute"] + out["recompute"]  # what overlapped communication can hide behind
    # what the GPU's speed paces: the busy time but the checkpoints' PCIe copies, and the bubble
    out["paced"] = out["busy"] - m * mb["restore"] + out["pp_bubble"]
    out["total"] = out["busy"] + out["tp_comm"] + out["pp_bubble"] + out["pp_comm"]
    return out


def _step_terms(ctx: Step) -> dict:
    """Data-parallel communication, offload and the optimizer update of one step: what is exposed
    whatever the compute ("dp_fixed"), and the overlapped collectives with what they need to be
    priced against the compute that hides them (overlapped_dp_s)."""
    model, cluster, training, lay, c = ctx
    grad_one, grad_buckets, reductions = grad_reduce_s(ctx)
    z3 = zero3_gather_s(ctx)
    pg, pg_buckets = param_gather_s(ctx)
    grad_overlap = grad_overlaps(training, lay)
    pg_overlap = grad_overlap & training.engine.param_gather_overlaps_forward
    out = {"dp_fixed": np.where(grad_overlap, 0.0, reductions * grad_one) + np.where(pg_overlap, 0.0, pg)
           + fsdp_copies_s(ctx) + zero3_rank_copies_s(model, training, lay, c, z3),
           "grad_one": np.where(grad_overlap, grad_one, 0.0), "grad_buckets": grad_buckets, "reductions": reductions,
           "pg": np.where(pg_overlap, pg, 0.0), "pg_buckets": pg_buckets,
           **{"z3_" + k: v for k, v in z3.items()}, "fetch_s": param_fetch_s(model, training, lay, c),
           "offload": offload_s(ctx), "optimizer": optimizer_s(ctx)}
    out["total"] = out["dp_fixed"] + out["offload"] + out["optimizer"]
    return out


def overlapped_dp_s(step, pipe, c: dict):
    """Exposed seconds of the overlapped data-parallel collectives: each reduction under one micro-
    batch's backward (the one whose gradients it carries: Megatron reduces in the last micro-batch,
    distributed_data_parallel.py no_sync; DeepSpeed ZeRO-2 in every one), the parameter gather under
    the next step's first forward, ZeRO-3 gathers under their pass (zero3_exposed_s). Compute carrying
    communication slows by contention for SMs and memory: it hides dp_overlap_fraction_with_overlap
    of its length. `step` and `pipe` map term names to arrays or to one candidate's values."""
    f = c["dp_overlap_fraction_with_overlap"]
    v = pipe["sync_chunks"]
    chunked = v > 1  # interleaved chunks that sync each on its own (chunked_sync_exposed_s)
    fwd_chunk, bwd_chunk = f * pipe["fwd_mb"] / v, f * pipe["bwd_mb"] / v
    grads = step["reductions"] * np.where(
        chunked, chunked_sync_exposed_s(step["grad_one"], step["grad_one"] / v, v, pipe["bwd_group"], bwd_chunk),
        overlapped_exposed_s(step["grad_one"], step["grad_buckets"], f * pipe["bwd_mb"]))
    # a chunk's parameter buckets are waited for one by one under its first forward (finish_param_sync)
    per_chunk = np.maximum(step["pg_buckets"] / v, 1.0)
    first = overlapped_exposed_s(step["pg"] / v, per_chunk, fwd_chunk)
    params = np.where(chunked, chunked_sync_exposed_s(step["pg"], first, v, pipe["fwd_group"], fwd_chunk,
                                                      fwd_chunk * (per_chunk - 1.0) / per_chunk),
                      overlapped_exposed_s(step["pg"], step["pg_buckets"], f * pipe["fwd_mb"]))
    z3 = {k: step["z3_" + k] for k in Z3_KEYS}
    each = grads + params + zero3_exposed_s(z3, f * pipe["fwd_mb"], f * pipe["bwd_mb"], f * pipe["busy"])
    # they share the rank's links: together they cannot hide more than the step's compute
    together = step["reductions"] * step["grad_one"] + step["pg"] + zero3_gather_total_s(z3) - pipe["busy"]
    return np.maximum(each, together) + param_fetch_exposed_s(step, pipe)


def step_time(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts) -> dict:
    """{'step_s': array, 'breakdown': {BREAKDOWN_KEYS: exposed seconds}, 'throughput': {...}} per
    candidate; each group of terms is evaluated once per distinct combination of the fields it
    reads, and the breakdown and throughput parts are gathered when read (planner/grouping.py Lazy):

        step_s = pipeline work + the slowest rank's delay to it (planner/stragglers.py)
                 + exposed DP, offload and optimizer
                 + max(hideable DP - the compute it hides behind, 0) + fixed overhead"""
    c = time_coefficients(cluster)
    codes = codes_of(lay) if lay.size > 64 else None
    pipe = grouped(codes, PIPE_FIELDS, lambda sub: _pipeline_terms(Step(model, cluster, training, sub, c)), lay)
    step = grouped(codes, STEP_FIELDS, lambda sub: _step_terms(Step(model, cluster, training, sub, c)), lay)
    other = max(float(c["step_overhead_s"]), 0.0)
    overlapped = overlapped_dp_s(step, pipe, c)
    slowest = straggler_s(lay.world, pipe["paced"], float(c["rank_speed_cv"]))
    step_s = pipe["total"] + slowest + step["total"] + overlapped + other

    def part(src, key):
        return lambda i: src[key] if i is None else src.at(key, i)

    def dp_comm(i):
        if i is None:
            return step["dp_fixed"] + overlapped
        one_step = {k: step.at(k, i) for k in ("reductions", "grad_one", "grad_buckets", "pg", "pg_buckets",
                                               "fetch_s", *("z3_" + k for k in Z3_KEYS))}
        one_pipe = {k: pipe.at(k, i) for k in ("bwd_mb", "fwd_mb", "busy", "micro_batches", "sync_chunks", "fwd_group",
                                               "bwd_group",
                                               *FETCH_PIPE_KEYS)}
        return step.at("dp_fixed", i) + float(overlapped_dp_s(one_step, one_pipe, c))

    breakdown = Lazy({"compute": part(pipe, "compute"), "recompute": part(pipe, "recompute"),
                      "tp_comm": part(pipe, "tp_comm"), "dp_comm": dp_comm, "pp_comm": part(pipe, "pp_comm"),
                      "pp_bubble": part(pipe, "pp_bubble"),
                      "stragglers": lambda i: slowest if i is None else slowest.flat[i],
                      "offload": part(step, "offload"),
                      "optimizer": part(step, "optimizer"),
                      "other": lambda i: np.full(lay.shape, other) if i is None else other})
    return {"step_s": step_s, "breakdown": breakdown, "throughput": _rates(cluster, training, lay, step_s, pipe)}


def _rates(cluster: Cluster, training: Training, lay: Layouts, step_s, pipe) -> Lazy:
    """Tokens/s for every candidate; samples/s, per-GPU model and hardware TFLOP/s, MFU and HFU when
    read. MFU excludes the recompute FLOPs, HFU includes them (Korthikanti 2022 s.6.3); peak of the
    GEMM dtype."""
    peak = peak_flops_per_s(cluster, training)
    tokens_per_s = lay.gbs * training.seq_len / step_s

    def rate(flops_key, scale):
        return lambda i: (pipe[flops_key] / step_s if i is None else pipe.at(flops_key, i) / step_s.flat[i]) * scale

    return Lazy({"tokens_per_s": lambda i: tokens_per_s if i is None else tokens_per_s.flat[i],
                 "samples_per_s": lambda i: (tokens_per_s if i is None else tokens_per_s.flat[i]) / training.seq_len,
                 "model_tflops_per_gpu": rate("model_flops_per_gpu", 1e-12),
                 "hardware_tflops_per_gpu": rate("hardware_flops_per_gpu", 1e-12),
                 "mfu": rate("model_flops_per_gpu", 1.0 / peak), "hfu": rate("hardware_flops_per_gpu", 1.0 / peak)})


def time_to_train(step_s, tokens_per_step, tokens, num_gpus, price_per_gpu_hour=None) -> dict:
    """Days, GPU-hours and (with a price) cost of training on `tokens` tokens."""
    seconds = np.asarray(step_s, dtype=np.float64) * (np.asarray(tokens, dtype=np.float64) / tokens_per_step)
    gpu_hours = seconds * num_gpus / 3600.0
    return {"days": seconds / 86400.0, "gpu_hours": gpu_hours,
            "cost": None if price_per_gpu_hour is None else gpu_hours * price_per_gpu_hour}
