"""Collective and point-to-point communication time on the cluster's topology."""

from __future__ import annotations

import numpy as np

from planner.hardware import Cluster


def ring_time_s(nbytes, n, bus_bytes_per_s, kind="all_reduce", latency_s=0.0, count=1):
    """NCCL ring collective over n ranks (nccl-tests PERFORMANCE.md: busbw = algbw * 2(n-1)/n for
    all-reduce, (n-1)/n for all-gather/reduce-scatter): steps*latency per call + bytes*factor/busbw."""
    n = np.asarray(n, dtype=np.float64)
    steps = (2.0 if kind == "all_reduce" else 1.0) * (n - 1)
    time = count * steps * latency_s + nbytes * steps / np.maximum(n, 1) / bus_bytes_per_s
    return np.where((n > 1) & (np.asarray(nbytes) > 0), time, 0.0)


def intra_node_bus_bytes_per_s(cluster: Cluster, coef: dict) -> float:
    """NVLink bus bandwidth NCCL reaches inside a node (a calibrated fraction of the link)."""
    return cluster.gpu.intra_node_bytes_per_s * coef["bus_efficiency_intra_node"]


def group_bus_bytes_per_s(cluster: Cluster, stride, n, coef: dict) -> np.ndarray:
    """Achievable bus bandwidth of a group of n ranks spaced `stride` apart (Megatron rank order
    tp, cp, dp, pp: DP stride = t). Inside a node: NVLink busbw. Across nodes NCCL runs one ring per
    NIC (rail), so k members per node move k NICs' worth (hierarchical), capped by NVLink."""
    gpu, G = cluster.gpu, cluster.gpus_per_node
    intra = intra_node_bus_bytes_per_s(cluster, coef)
    members_per_node = np.clip(G // np.maximum(stride, 1), 1, np.maximum(n, 1))
    inter = members_per_node * gpu.inter_node_bytes_per_s * coef["bus_efficiency_inter_node"]
    return np.where(stride * n > G, np.minimum(intra, inter), intra)


def group_latency_s(cluster: Cluster, stride, n, coef: dict) -> np.ndarray:
    """Per-step ring latency: NVLink hop inside a node, network hop when the group spans nodes."""
    spans = stride * n > cluster.gpus_per_node
    return np.where(spans, coef["collective_latency_s"], coef["collective_latency_intra_node_s"])


def p2p_bytes_per_s(cluster: Cluster, crosses_nodes, coef: dict) -> np.ndarray:
    """One GPU's send bandwidth: its NVLink, or its own NIC when the peer is on another node."""
    gpu = cluster.gpu
    return np.where(crosses_nodes, gpu.inter_node_bytes_per_s * coef["bus_efficiency_inter_node"],
                    gpu.intra_node_bytes_per_s * coef["bus_efficiency_intra_node"])
