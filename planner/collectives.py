"""Collective and point-to-point communication time on the cluster's topology.

A collective's time is NCCL's own cost model (src/graph/tuning.cc ncclTopoTuneModel, NCCL 2.32.3):
for each algorithm (ring; double binary tree for all-reduce) and protocol (LL, LL128, Simple) a
latency (a base plus one hop latency per ring step or tree level, NVLink/PCIe hops inside a node,
network hops between nodes) plus the bytes over that pair's bus bandwidth; NCCL runs the pair its
model finds fastest for the message size (enqueue.cc topoGetAlgoInfo), and so does the planner.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from planner.hardware import Cluster

PROTOCOLS = ("LL", "LL128", "Simple")
# NCCL 2.32.3 src/graph/tuning.cc baseLat[algorithm][protocol] and hwLat[NVLINK|PCI|NET][algorithm]
# [protocol], microseconds (the same since NCCL 2.12; read from libnccl.so.2 of the nvidia-nccl-cu12
# 2.32.3 wheel, where they sit as doubles in .rodata)
BASE_LATENCY_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4)}
HOP_LATENCY_US = {"nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4)},
                  "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7)},
                  "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0)}}
NET_OVERHEAD_US = 1.0  # tuning.cc getNetOverhead: x86 Intel hosts (2 on AMD), x3 for Simple


def _by_protocol(values, nd: int) -> np.ndarray:
    """Per-protocol values (LL, LL128, Simple; scalars or arrays) stacked on a leading axis that
    broadcasts against nd-d operands."""
    if all(isinstance(v, float) for v in values):  # a table's constants, made once
        return _constants(tuple(values), nd)
    if all(np.ndim(v) == 0 for v in values):  # one group's: no broadcasting to do
        return np.array([float(v) for v in values]).reshape((len(PROTOCOLS),) + (1,) * nd)
    shape = np.broadcast_shapes(*(np.shape(v) for v in values))
    out = np.empty((len(PROTOCOLS),) + shape)
    for j, v in enumerate(values):
        out[j] = v
    return out.reshape((len(PROTOCOLS),) + (1,) * (nd - len(shape)) + shape)


@lru_cache(maxsize=None)
def _constants(values: tuple, nd: int) -> np.ndarray:
    return np.array(values).reshape((len(PROTOCOLS),) + (1,) * nd)


def _ring_bus_factor(kind: str, nodes, per_node, nd: int) -> np.ndarray:
    # tuning.cc "various model refinements": LL moves 8 B lines of 4 B data + 4 B flag; LL128 120 of 128 B
    return _by_protocol((np.where((nodes > 1) | (kind == "all_reduce"), 1.0 / 4.0, 1.0 / 3.0),
                         np.where(per_node < 2, 0.7, 0.92), 1.0), nd)


def _tree_bus_factor(nodes, nd: int) -> np.ndarray:
    # tuning.cc: busBw*.92 for Tree, then /3.8 for LL, x (nNodes == 1 ? 7/9 : 120/128) for LL128
    return _by_protocol((0.92 / 3.8, 0.92 * np.where(nodes == 1, 7.0 / 9.0, 120.0 / 128.0), 0.92), nd)


def ring_latency_us(steps, inter_steps, nodes, intra_hop_us, nd: int) -> np.ndarray:
    """tuning.cc ncclTopoTuneModel, ring, for each protocol (a leading axis): baseLat + the steps
    inside nodes at max(intra hop, net overhead once the ring leaves the node) + the steps between
    nodes at the network hop."""
    overhead = np.where(nodes > 1, NET_OVERHEAD_US * _by_protocol((1.0, 1.0, 3.0), nd), 0.0)  # x3 for Simple
    return (_by_protocol(BASE_LATENCY_US["ring"], nd) + np.maximum(steps - inter_steps, 0.0)
            * np.maximum(_by_protocol(intra_hop_us["ring"], nd), overhead)
            + inter_steps * _by_protocol(HOP_LATENCY_US["net"]["ring"], nd))


def tree_latency_us(per_node, nodes, intra_hop_us, nd: int) -> np.ndarray:
    """tuning.cc ncclTopoTuneModel, tree (all-reduce), for each protocol (a leading axis): baseLat +
    up and down a chain of per_node ranks inside the node and floor(log2 nodes) network levels."""
    return _by_protocol(BASE_LATENCY_US["tree"], nd) + 2.0 * (
        (per_node - 1) * _by_protocol(intra_hop_us["tree"], nd)
        + np.floor(np.log2(np.maximum(nodes, 1.0))) * _by_protocol(HOP_LATENCY_US["net"]["tree"], nd))


def nccl_time_s(nbytes, n, per_node, bus_bytes_per_s, kind, c: dict, count=1, nvlink=True):
    """Seconds of `count` NCCL collectives of `nbytes` each (all-reduce: the buffer; all-gather and
    reduce-scatter: the whole gathered buffer, as nccl-tests counts it) over n ranks, `per_node` of
    them on each node, at the group's ring bus bandwidth (nccl-tests PERFORMANCE.md: busbw = algbw x
    2(n-1)/n for all-reduce, (n-1)/n for all-gather/reduce-scatter). NCCL's latency model
    (tuning.cc ncclTopoTuneModel), scaled by the calibrated collective_latency_scale:
    ring: base + intra steps x max(intra hop, net overhead) + inter steps x net hop, with
    2(n-1) steps of which 2 x nodes cross nodes for an all-reduce, n-1 and nodes-1 otherwise;
    tree (all-reduce only): base + 2((per_node - 1) intra hop + floor(log2 nodes) net hop).
    Every protocol is evaluated at once on a leading axis and the fastest kept, as NCCL does."""
    n = np.asarray(n, dtype=np.float64)
    per_node = np.minimum(np.asarray(per_node, dtype=np.float64), np.maximum(n, 1.0))
    nodes = np.ceil(n / np.maximum(per_node, 1.0))
    nd = max(np.ndim(nbytes), nodes.ndim, np.ndim(bus_bytes_per_s))
    scale = c["collective_latency_scale"] * 1e-6
    intra = HOP_LATENCY_US["nvlink" if nvlink else "pci"]
    steps = (2.0 if kind == "all_reduce" else 1.0) * (n - 1)
    inter_steps = np.where(nodes > 1, 2.0 * nodes, 0.0) if kind == "all_reduce" else nodes - 1
    per_rank = nbytes * steps / np.maximum(n, 1.0)
    best = (ring_latency_us(steps, inter_steps, nodes, intra, nd) * scale
            + per_rank / (bus_bytes_per_s * _ring_bus_factor(kind, nodes, per_node, nd))).min(axis=0)
    if kind == "all_reduce":  # tree: algbw = busbw / 2 (tuning.cc ratio .5)
        tree = tree_latency_us(per_node, nodes, intra, nd) * scale + 2.0 * nbytes / (
            bus_bytes_per_s * _tree_bus_factor(nodes, nd))
        best = np.minimum(best, tree.min(axis=0))
    return np.where((n > 1) & (np.asarray(nbytes) > 0), count * best, 0.0)


def has_nvlink(cluster: Cluster) -> bool:
    """Whether GPUs of a node talk over NVLink/xGMI (NCCL's NVLINK hop latencies) or PCIe (its PCI
    ones): a GPU-GPU link faster than the host link."""
    return cluster.gpu.intra_node_bytes_per_s > cluster.gpu.pcie_bytes_per_s


def ranks_per_node(cluster: Cluster, stride, n):
    """Members of a group of n ranks spaced `stride` apart that share a node (ranks fill nodes in order)."""
    return np.minimum(np.maximum(cluster.gpus_per_node // np.maximum(stride, 1), 1), np.maximum(n, 1))  # np.clip, without its dtype checks


def group_collective_s(cluster: Cluster, c: dict, kind: str, nbytes, n, stride=1, count=1, bus_bytes_per_s=None):
    """nccl_time_s for a group of n ranks `stride` apart at its bus bandwidth (group_bus_bytes_per_s)."""
    if not np.any(np.asarray(nbytes) > 0):  # nothing to move (a dense model's expert group): nccl_time_s's zeros
        return np.zeros(np.broadcast_shapes(np.shape(nbytes), np.shape(n), np.shape(stride), np.shape(count),
                                            np.shape(bus_bytes_per_s) if bus_bytes_per_s is not None else ()))
    bus = group_bus_bytes_per_s(cluster, stride, n, c) if bus_bytes_per_s is None else bus_bytes_per_s
    return nccl_time_s(nbytes, n, ranks_per_node(cluster, stride, n), bus, kind, c, count, has_nvlink(cluster))


def intra_node_bus_bytes_per_s(cluster: Cluster, coef: dict) -> float:
    """NVLink bus bandwidth NCCL reaches inside a node (a calibrated fraction of the link)."""
    return cluster.gpu.intra_node_bytes_per_s * coef["bus_efficiency_intra_node"]


def group_bus_bytes_per_s(cluster: Cluster, stride, n, coef: dict) -> np.ndarray:
    """Achievable bus bandwidth of a group of n ranks spaced `stride` apart (Megatron rank order
    tp, cp, dp, pp: DP stride = t). Inside a node: NVLink busbw. Across nodes NCCL runs one ring per
    NIC (rail), so k members per node move k NICs' worth (hierarchical), capped by NVLink, and by
    the uplinks above a pod where the group leaves it (ring_pod_share)."""
    gpu = cluster.gpu
    intra = intra_node_bus_bytes_per_s(cluster, coef)
    inter = ranks_per_node(cluster, stride, n) * gpu.inter_node_bytes_per_s * coef["bus_efficiency_inter_node"]
    inter = inter * ring_pod_share(cluster, stride, n)
    return np.where(stride * n > cluster.gpus_per_node, np.minimum(intra, inter), intra)


def members_per_pod(cluster: Cluster, stride, n) -> np.ndarray:
    """Members of a group of n ranks `stride` apart inside one pod (ranks fill pods in order)."""
    n = np.asarray(n, dtype=np.float64)
    if not cluster.pod_gpus:
        return n
    return np.clip(cluster.pod_gpus // np.maximum(stride, 1), 1, np.maximum(n, 1.0))


def ring_pod_share(cluster: Cluster, stride, n) -> np.ndarray:
    """Share of its NICs' rate a ring keeps on its edges between pods when every group of its kind
    runs the collective at once (the data-parallel groups of a step do). NCCL's rings go through
    the nodes in rank order (src/graph/connect.cpp connectRings), so a group with k members per
    node and m per pod leaves a pod by one edge per rail ring: the pod's G/m groups send G k/m
    flows out through uplinks worth G/r NICs (a fat tree's capacity at that level, Leiserson 1985
    'Fat-trees'; r the oversubscription): min(1, m / (k r)). 1 for a group inside one pod. NCCL's
    trees cross a pod by a few edges more (src/graph/trees.cc); priced as the ring."""
    m, k = members_per_pod(cluster, stride, n), ranks_per_node(cluster, stride, n)
    leaves = np.asarray(n) > m
    return np.where(leaves, np.minimum(1.0, m / (k * cluster.oversubscription)), 1.0)


def p2p_pod_share(cluster: Cluster, stride, n) -> np.ndarray:
    """Share of its NIC's rate a send to the next of n ranks `stride` apart keeps (pipeline stages:
    every rank of a stage sends to its peer at once). Where the chain leaves a pod, the min(G,
    stride) ranks of a pod next to a stage boundary at its edge send out of it through uplinks
    worth G/r NICs: min(1, G / (r min(G, stride))) (fat-tree capacity as in ring_pod_share)."""
    if not cluster.pod_gpus:
        return np.ones_like(np.asarray(stride, dtype=np.float64))
    G = float(cluster.pod_gpus)
    leaves = np.asarray(stride) * np.asarray(n) > G
    return np.where(leaves, np.minimum(1.0, G / (cluster.oversubscription * np.minimum(G, stride))), 1.0)


def p2p_message_s(nbytes, bytes_per_s, coef: dict):
    """Seconds of one send/recv of `nbytes` at `bytes_per_s` (p2p_bytes_per_s): NCCL's per-message
    latency (p2p_latency_s, which calibrate's send/recv ping-pong fits) plus the bytes."""
    return coef["p2p_latency_s"] + nbytes / bytes_per_s


def p2p_bytes_per_s(cluster: Cluster, crosses_nodes, coef: dict, pod_share=1.0) -> np.ndarray:
    """One GPU's send bandwidth: its NVLink, or its own NIC (times its `pod_share` where the peer
    sits beyond an oversubscribed pod) when the peer is on another node."""
    gpu = cluster.gpu
    return np.where(crosses_nodes, gpu.inter_node_bytes_per_s * coef["bus_efficiency_inter_node"] * pod_share,
                    gpu.intra_node_bytes_per_s * coef["bus_efficiency_intra_node"])
