"""DeepSpeed's `zero_optimization` and activation-checkpointing settings that size its buffers, as
Training.zero_config carries them (read from a ds_config by planner/ds_config.py, written by the
export)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from planner.bounds import check
from planner.errors import InputError


@dataclass(frozen=True)
class ZeroConfig:
    """DeepSpeed `zero_optimization` fields that size buffers (defaults: DeepSpeed 0.19
    runtime/zero/config.py DeepSpeedZeroConfig)."""

    reduce_bucket_size: int = 500_000_000
    """Elements per gradient reduce bucket."""
    allgather_bucket_size: int = 500_000_000
    """Elements per ZeRO-1/2 parameter all-gather bucket."""
    overlap_comm: bool | None = None
    """None resolves to True for stage 3, False otherwise (overlap_comm_valid)."""
    contiguous_gradients: bool = True
    """Copy gradients into a contiguous partition buffer as produced (also installs ZeRO-1 hooks)."""
    stage3_prefetch_bucket_size: int = 50_000_000
    """Elements of parameters prefetched ahead of use (ZeRO-3)."""
    stage3_max_live_parameters: int = 1_000_000_000
    """Upper bound on gathered parameters kept alive (ZeRO-3)."""
    stage3_max_reuse_distance: int = 1_000_000_000
    """Gathered parameters reused within this many elements are kept (ZeRO-3)."""
    stage3_param_persistence_threshold: int = 100_000
    """Parameters smaller than this stay whole on every rank (ZeRO-3)."""
    sub_group_size: int = 1_000_000_000
    """Elements per optimizer sub-group step (ZeRO-3 fp32 gradient chunk)."""
    nvme_optimizer_buffer_count: int = 4
    """offload_optimizer.buffer_count: the NVMe swapper's pinned fp32 buffers of a sub-group
    (DeepSpeed 0.19.8 runtime/zero/offload_config.py DeepSpeedZeroOffloadOptimizerConfig)."""
    nvme_param_buffer_count: int = 5
    """offload_param.buffer_count: the NVMe parameter swapper's pinned buffers (DeepSpeedZeroOffloadParamConfig)."""
    nvme_param_buffer_size: int = 100_000_000
    """offload_param.buffer_size: elements of each of those buffers."""
    nvme_params_in_cpu: int = 1_000_000_000
    """offload_param.max_in_cpu: elements of the partition kept in host memory beside NVMe."""
    fp32_grad_accum: bool = False
    """data_types.grad_accum_dtype "fp32": with bf16 and ZeRO-1 DeepSpeed then runs BF16_Optimizer
    (engine.py _do_optimizer_sanity_check), which accumulates gradients in a full fp32 buffer."""
    partition_activations: bool = False
    """activation_checkpointing.partition_activations: deepspeed.checkpointing keeps each
    checkpointed layer input split over the TP ranks. Off by default, as DeepSpeed's config
    (runtime/activation_checkpointing/config.py) and Megatron-DeepSpeed's --partition-activations
    (a store_true flag that deepspeed.checkpointing.configure applies over the config's key) leave it."""
    cpu_checkpointing: bool = False
    """activation_checkpointing.cpu_checkpointing: the checkpointed layer inputs wait in host memory."""

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("overlap_comm", "contiguous_gradients", "fp32_grad_accum", "partition_activations",
                          "cpu_checkpointing"):
                if value is not None and not isinstance(value, bool):
                    raise InputError(f"--{f.name.replace('_', '-')}: must be true or false, got {value!r}")
            else:
                check(f.name, value)
