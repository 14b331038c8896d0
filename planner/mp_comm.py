"""The model-parallel communication inside a block: TP's all-reduces or all-gather/reduce-scatter
pairs and what of them each GEMM hides, the restore of partitioned activation checkpoints, EP's
token all-to-alls and its count exchange, and CP's ring of K/V. planner/timing.py adds them to
each block's time (block_s)."""

from __future__ import annotations

import numpy as np

from planner import fp8
from planner.activations import checkpoint_copies_block, checkpoint_partitions
from planner.collectives import group_collective_s, members_per_pod, p2p_bytes_per_s, ranks_per_node, ring_pod_share
from planner.compute import tokens_per_microbatch
from planner.engines import ExpertTP, Modules, MoeCounts
from planner.layout import Layouts, Training
from planner.model import ModelSpec
from planner.options import Recompute
from planner.sharding import expert_folds, expert_tp
from planner.engines.megatron.timing import ub_pass_exposed_s
from planner.stage import Step


def tp_all_reduce_s(ctx: Step, scale: float = 1.0) -> np.ndarray:
    """One TP all-reduce of a block's T*h activations over NVLink (Megatron: 2 in forward, 2 in
    backward; Shoeybi et al. 2019 section 3; with SP a reduce-scatter + all-gather move the same
    bytes, Korthikanti 2022 section 4.2.2), of `scale` times their 16-bit bytes."""
    model, cluster, training, lay, c = ctx
    nbytes = tokens_per_microbatch(training, lay) * model.hidden * training.precision.element_bytes * scale
    return group_collective_s(cluster, c, "all_reduce", nbytes, lay.tp)


def checkpoint_restore_s(ctx: Step) -> np.ndarray:
    """Per fully recomputed block under deepspeed.checkpointing (DeepSpeed 0.19 runtime/
    activation_checkpointing/checkpointing.py): its partitioned input all-gathered over the TP
    ranks before the rerun (gather_partitioned_activations), and under cpu_checkpointing copied to
    the host in forward and back in backward where the copies hold up compute (activations.
    checkpoint_copies_block; transformers' offload likewise, one part)."""
    model, cluster, training, lay, c = ctx
    nbytes = tokens_per_microbatch(training, lay) * model.hidden * training.precision.element_bytes
    nbytes = nbytes / np.where(lay.sequence_parallel > 0, lay.tp, 1)
    parts = checkpoint_partitions(training, lay)
    gather = group_collective_s(cluster, c, "all_gather", nbytes, parts)
    blocking = checkpoint_copies_block(training, lay)
    copies = np.where(blocking, 2.0 * nbytes / parts / cluster.gpu.pcie_bytes_per_s, 0.0)
    return gather + copies


def tp_pass_exposed_s(ctx: Step, tp_ar, units=(2.0, 0.0), backward: bool = False) -> np.ndarray:
    """Exposed TP communication of one pass (forward or backward) through a block, in all-reduce
    equivalents of its T h activations (tp_pass_units): the linear layers' (2 for a dense block)
    and the MoE token dispatcher's of routed rows. With --tp-comm-overlap and SP, the linear
    layers' all-gathers and reduce-scatters (half an all-reduce each) run inside TransformerEngine's
    userbuffers GEMMs instead (ub_pass_exposed_s). Under SP with Transformer Engine's FP8 the
    all-gathers move FP8 (fp8.tp_gather_scale), the reduce-scatters 16 bits. The dispatcher's
    collectives are not among them."""
    block, cluster, training, lay, c = ctx
    linear, routed = units
    sp = lay.sequence_parallel > 0
    scale = fp8.tp_gather_scale(training)
    gather_ar = tp_ar if scale == 1.0 else tp_all_reduce_s(ctx, scale)
    overlap = training.tp_comm_overlap & sp & (lay.tp > 1) & (block.kv_lora_rank == 0)
    plain = linear * np.where(sp, (gather_ar + tp_ar) / 2.0, tp_ar)
    if np.any(overlap):
        plain = np.where(overlap, ub_pass_exposed_s(ctx, gather_ar / 2.0, linear, backward,
                                                    scatter_s=tp_ar / 2.0), plain)
    return plain + routed * tp_ar


def tp_pass_units(block: ModelSpec, training: Training, lay: Layouts) -> tuple:
    """(linear layers, routed rows) TP all-reduce equivalents of T h per pass through a block.
    Dense: attention and MLP, one each (Shoeybi et al. 2019 section 3). MoE with experts split
    over TP (megatron-core 0.16.1 moe/token_dispatcher.py MoEAlltoAllTokenDispatcher:
    dispatch_postprocess all-gathers the routed rows over the expert-TP group after the
    all-to-all, combine_preprocess reduce-scatters them, one all-reduce of R T h for R routed rows
    per token, planner/moe.py), plus a shared expert's own (SharedExpertMLP is a TP MLP). Experts
    whole on every TP rank (DeepSpeed 0.19 moe/sharded_moe.py MOELayer.forward): gather_tokens
    all-gathers the expert outputs after the second all-to-all, and in backward drop_tokens'
    gradient gathers again: one all-gather, half an all-reduce, of R T h per pass."""
    if block.experts == 1:
        return 2.0, 0.0
    from planner.moe import routed_per_token

    rows = routed_per_token(block, training, lay, tokens_per_microbatch(training, lay))
    if training.engine.expert_tp is ExpertTP.WHOLE:
        return 1.0, rows / 2.0
    # experts not split over TP (etp 1, EP folded over the TP ranks): no gather of routed rows
    return 1.0 + (block.shared_expert_ffn > 0), np.where(expert_tp(training, lay) > 1, rows, 0.0)


def ep_all_to_all_s(ctx: Step) -> np.ndarray:
    """One expert-parallel all-to-all (dispatch or combine) of the T*k routed tokens: each rank
    sends (ep-1)/ep of them (GShard section 3; Megatron-core MoE token dispatcher). Padded to an
    expert capacity it moves all E x capacity rows, padding included (DeepSpeed 0.19.8
    moe/sharded_moe.py MOELayer.forward: _AllToAll of the [E, C, M] dispatched_input). Under
    Megatron's modules each TP rank sends only its 1/t of them: its sequence-parallel shard
    (megatron-core 0.16.1 moe/token_dispatcher.py MoEAlltoAllTokenDispatcher.token_dispatch, the
    all_to_all before the tp all-gather of dispatch_postprocess; moe_layer.py requires SP with TP
    in training) or, under DeepSpeed-MoE, what drop_tokens leaves it of the duplicated tokens.
    The all-to-all is a send to every peer (NCCL: grouped ncclSend/ncclRecv; torch
    all_to_all_single): the 1/ep shares for the group's members on the rank's own node go over
    NVLink, the others through its NIC, at the same time, so the slower side sets the time."""
    model, cluster, training, lay, c = ctx
    from planner.moe import routed_per_token

    if model.experts == 1:
        return 0.0 * lay.tp
    ep, T = lay.ep.astype(np.float64), tokens_per_microbatch(training, lay)
    rows = routed_per_token(model, training, lay, T)  # per token: k dropless, E capacity / T padded (planner/moe.py)
    # the EP group's ranks: etp apart where EP folds over TP (megatron-core, torchtitan), else the
    # data-parallel ranks, tp x cp apart; those sharing a node with this rank
    stride = np.where(expert_folds(training), expert_tp(training, lay), lay.tp * lay.cp)
    on_node = ranks_per_node(cluster, stride, ep)
    per_rank = np.where(training.engine.modules is Modules.MEGATRON, lay.tp, 1).astype(np.float64)
    nbytes = T / per_rank * rows * model.hidden * training.precision.element_bytes
    intra = nbytes * (on_node - 1) / ep / p2p_bytes_per_s(cluster, False, c)
    inter = nbytes * (ep - on_node) / ep / p2p_bytes_per_s(cluster, True, c)
    # the shares for members beyond the rank's pod: every rank of the pod sends them at once through
    # uplinks worth 1/r of its NICs (fat-tree capacity; collectives.ring_pod_share)
    beyond_pod = nbytes * (ep - members_per_pod(cluster, stride, ep)) / ep * cluster.oversubscription
    inter = np.maximum(inter, beyond_pod / p2p_bytes_per_s(cluster, True, c))
    return np.where(ep > 1, (ep - 1) * c["p2p_latency_s"] + np.maximum(intra, inter), 0.0)


def moe_count_sync_s(ctx: Step) -> np.ndarray:
    """Seconds one forward of a routed block stalls while its dispatcher learns the rows' counts
    (Engine.moe_counts): the exchange of each rank's E int64 counts, a message small enough that
    only the collective's latency shows, then the host's wait for them, which drains the GPU's queue
    until the host launches the next kernel (one eager operator's host time, eager_op_host_s).
    The backward reuses the counts; a recomputed forward waits again."""
    model, cluster, training, lay, c = ctx
    kind = training.engine.moe_counts
    if model.experts == 1 or kind is MoeCounts.NONE or training.moe_pad_to_capacity:
        return 0.0 * lay.tp
    if kind is MoeCounts.TP_EP_ALL_GATHER:
        # the expert-TP x EP group: consecutive ranks (megatron-core's expert order etp, ep, edp, pp);
        # the gathered buffer is [etp x ep, E] int64
        n = expert_tp(training, lay) * lay.ep
        return group_collective_s(cluster, c, "all_gather", n * model.experts * 8.0, n) + c["eager_op_host_s"]
    # EP_ALL_TO_ALL: a send to every EP peer, priced like the routed rows' (ep_all_to_all_s), its bytes nil
    return np.where(lay.ep > 1, (lay.ep - 1) * c["p2p_latency_s"] + c["eager_op_host_s"], 0.0)


def cp_ring_exposed_s(ctx: Step, core_fwd, core_bwd) -> np.ndarray:
    """Ring attention (Liu et al. 2023; Megatron-core context parallel, cp_comm_type p2p): cp-1
    K/V chunk passes per forward, K/V and dK/dV in backward, overlapped with the attention core;
    only the excess shows (forward again under recompute). Where the engine all-gathers K and V
    instead (Engine.cp_gathers_kv), both all-gathers and, in backward, the two reduce-scatters of
    their gradients block: all of them show (the all-gathers again wherever the forward reruns:
    torchtitan's op-level save list keeps no all-gather output)."""
    model, cluster, training, lay, c = ctx
    T, t, e = tokens_per_microbatch(training, lay), lay.tp.astype(np.float64), training.precision.element_bytes
    if training.engine.cp_gathers_kv:
        whole = lay.cp * T * (model.kv_width + model.v_width) / t * e  # K and V of the whole sequence
        gather = group_collective_s(cluster, c, "all_gather", whole, lay.cp, lay.tp, count=2)
        return gather * (1.0 + (lay.recompute != Recompute.NONE)) + group_collective_s(
            cluster, c, "reduce_scatter", whole, lay.cp, lay.tp, count=2)
    bw = p2p_bytes_per_s(cluster, lay.tp * lay.cp > cluster.gpus_per_node, c, ring_pod_share(cluster, lay.tp, lay.cp))
    kv_pass = (lay.cp - 1) * (c["p2p_latency_s"] + T * (model.kv_width + model.v_width) / t * e / bw)
    recomputed = lay.recompute != Recompute.NONE
    return np.maximum(kv_pass - core_fwd, 0.0) * (1.0 + recomputed) + np.maximum(2.0 * kv_pass - core_bwd, 0.0)
