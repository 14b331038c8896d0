"""DeepSpeed's own ZeRO model-state memory estimators, reproduced to the byte in numpy.

These are *DeepSpeed's* rule-of-thumb constants, not the planner's per-rank memory model:

* ZeRO-2 (no offload): GPU = 2Ψ + 18Ψ/N   (2 = fp16 params; 18 = fp16 + fp32 grads,
  fp32 master params, Adam momentum + variance), CPU = 4Ψ·gpus_per_node·buffer_factor.
* ZeRO-3 (no offload): GPU = 4·largest_layer + 18Ψ/N, etc.

Ψ = total params, N = num_nodes·num_gpus_per_node. Every argument may be a numpy array
or a scalar; all broadcast together. Results are int64 arrays ``(gpu_bytes, cpu_bytes)``
(note: DeepSpeed itself returns ``(cpu, gpu)``, in that order). Arithmetic follows
DeepSpeed's Python evaluation order (left-to-right products, true division, ``int()``
truncation on the same sub-expressions), so results match exactly for Ψ < 2**53 / 18.
DeepSpeed prints these as ``bytes / 2**30`` with a "GB" suffix (i.e. GiB), see
``format_gb``. Importing this module never imports torch or deepspeed.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "zero2_model_states_bytes",
    "zero3_model_states_bytes",
    "format_gb",
    "estimator_table",
]


def _int(x) -> np.ndarray:
    """Python ``int()`` of a non-negative value: truncation toward zero, as int64."""
    return np.trunc(np.asarray(x)).astype(np.int64)


def zero2_model_states_bytes(total_params, num_gpus_per_node=1, num_nodes=1,
                             cpu_offload=True, additional_buffer_factor=1.5):
    """ZeRO-2 params+grads+optimizer-state bytes -> (gpu_bytes, cpu_bytes), int64 arrays."""
    params = np.asarray(total_params)
    gpus_per_node = np.asarray(num_gpus_per_node)
    total_gpus = np.asarray(num_nodes) * gpus_per_node
    offload = np.asarray(cpu_offload, dtype=bool)
    abf = np.asarray(additional_buffer_factor)
    # deepspeed stage_1_and_2.estimate_zero2_model_states_mem_needs (cpu_offload): 2Ψ
    gpu_offload_bytes = _int(2 * params)
    # deepspeed stage_1_and_2.estimate_zero2_model_states_mem_needs (cpu_offload): Ψ·max(4N,16)·abf
    cpu_offload_bytes = _int(params * np.maximum(4 * total_gpus, 16) * abf)
    # deepspeed stage_1_and_2.estimate_zero2_model_states_mem_needs (no offload): 2Ψ + int(18Ψ/N)
    gpu_plain_bytes = _int(2 * params) + _int(18 * params / total_gpus)
    # deepspeed stage_1_and_2.estimate_zero2_model_states_mem_needs (no offload): Ψ·4·gpn·abf
    cpu_plain_bytes = _int(params * 4 * gpus_per_node * abf)
    gpu_bytes = np.where(offload, gpu_offload_bytes, gpu_plain_bytes)
    cpu_bytes = np.where(offload, cpu_offload_bytes, cpu_plain_bytes)
    return gpu_bytes.astype(np.int64), cpu_bytes.astype(np.int64)


def zero3_model_states_bytes(total_params, largest_layer_params, num_gpus_per_node=1,
                             num_nodes=1, cpu_offload=True, cpu_offload_params=True,
                             zero_init=True, additional_buffer_factor=1.5):
    """ZeRO-3 params+grads+optimizer-state bytes -> (gpu_bytes, cpu_bytes), int64 arrays.

    ``cpu_offload_params`` only matters when ``cpu_offload`` is true (as in DeepSpeed).
    """
    params = np.asarray(total_params)
    largest = np.asarray(largest_layer_params)
    gpus_per_node = np.asarray(num_gpus_per_node)
    nodes = np.asarray(num_nodes)
    total_gpus = nodes * gpus_per_node
    gpus_factor = 1 / nodes
    offload = np.asarray(cpu_offload, dtype=bool)
    offload_params = np.asarray(cpu_offload_params, dtype=bool)
    init = np.asarray(zero_init, dtype=bool)
    abf = np.asarray(additional_buffer_factor)
    # deepspeed stage3.estimate_zero3_model_states_mem_needs: largest_layer_memory = 4·L
    largest_layer_bytes = _int(4 * largest)

    # deepspeed stage3.estimate_zero3_model_states_mem_needs (offload optimizer+params): 4L
    gpu_opt_par_bytes = largest_layer_bytes
    # deepspeed stage3.estimate_zero3_model_states_mem_needs (offload optimizer+params): Ψ·18/nodes·abf | Ψ·max(4gpn,18/nodes)·abf
    cpu_opt_par_bytes = np.where(init, _int(params * 18 * gpus_factor * abf),
                                 _int(params * np.maximum(4 * gpus_per_node, 18 * gpus_factor) * abf))
    # deepspeed stage3.estimate_zero3_model_states_mem_needs (offload optimizer only): 4L + int(2Ψ/N)
    gpu_opt_bytes = largest_layer_bytes + _int(2 * params / total_gpus)
    # deepspeed stage3.estimate_zero3_model_states_mem_needs (offload optimizer only): Ψ·16/nodes·abf | Ψ·max(4gpn,16/nodes)·abf
    cpu_opt_bytes = np.where(init, _int(params * 16 * gpus_factor * abf),
                             _int(params * np.maximum(4 * gpus_per_node, 16 * gpus_factor) * abf))
    # deepspeed stage3.estimate_zero3_model_states_mem_needs (no offload): 4L + int(18Ψ/N)
    gpu_plain_bytes = largest_layer_bytes + _int(18 * params / total_gpus)
    # deepspeed stage3.estimate_zero3_model_states_mem_needs (no offload): L·4·gpn·abf | Ψ·4·gpn·abf
    cpu_plain_bytes = np.where(init, _int(largest * 4 * gpus_per_node * abf),
                               _int(params * 4 * gpus_per_node * abf))

    gpu_bytes = np.where(offload, np.where(offload_params, gpu_opt_par_bytes, gpu_opt_bytes), gpu_plain_bytes)
    cpu_bytes = np.where(offload, np.where(offload_params, cpu_opt_par_bytes, cpu_opt_bytes), cpu_plain_bytes)
    return gpu_bytes.astype(np.int64), cpu_bytes.astype(np.int64)


def format_gb(num_bytes) -> str:
    """Format bytes the way DeepSpeed's ``*_all_cold`` tables do: ``f"{b/2**30:.2f}GB"`` (GiB)."""
    return f"{int(num_bytes) / 2**30:.2f}GB"


def estimator_table(total_params, largest_layer_params, num_gpus_per_node=1, num_nodes=1,
                    additional_buffer_factor=1.5):
    """Rows of DeepSpeed's ``*_all_cold`` tables, in DeepSpeed's printed order.

    Returns a list of dicts ``{stage, cpu_offload, cpu_offload_params, zero_init,
    gpu_bytes, cpu_bytes}`` (scalar inputs only).
    """
    rows = []
    for offload in (True, False):  # deepspeed stage_1_and_2.estimate_zero2_model_states_mem_needs_all_cold loop
        gpu, cpu = zero2_model_states_bytes(total_params, num_gpus_per_node, num_nodes, offload,
                                            additional_buffer_factor)
        rows.append(dict(stage=2, cpu_offload=offload, cpu_offload_params=False, zero_init=False,
                         gpu_bytes=int(gpu), cpu_bytes=int(cpu)))
    # deepspeed stage3.estimate_zero3_model_states_mem_needs_all_cold loop (skips params-only offload)
    for offload, offload_params in ((True, True), (True, False), (False, False)):
        for init in (True, False):
            gpu, cpu = zero3_model_states_bytes(total_params, largest_layer_params, num_gpus_per_node,
                                                num_nodes, offload, offload_params, init,
                                                additional_buffer_factor)
            rows.append(dict(stage=3, cpu_offload=offload, cpu_offload_params=offload_params,
                             zero_init=init, gpu_bytes=int(gpu), cpu_bytes=int(cpu)))
    return rows
