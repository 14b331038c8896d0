"""The limits of physical reason for every number a user can give, stated once.

Each input is checked where it enters (flags, config.json fields, API arguments, dataclass
construction): finite, of the right kind, and inside these ranges, so that no later formula
overflows, allocates per GPU, or runs for long. --help and every error quote the same range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.errors import InputError


@dataclass(frozen=True)
class Bound:
    """Allowed range of one input."""

    low: float
    """Smallest allowed value (inclusive unless `open_low`)."""
    high: float
    """Largest allowed value (inclusive)."""
    integer: bool = True
    """Whole numbers only."""
    open_low: bool = False
    """`low` itself is excluded (for quantities that must be > 0)."""
    why: str = ""
    """What the upper limit stands for."""

    def text(self) -> str:
        low = f"> {_fmt(self.low)}" if self.open_low else f">= {_fmt(self.low)}"
        kind = "an integer" if self.integer else "a number"
        return f"{kind} {low} and <= {_fmt(self.high)}"


def _fmt(x: float) -> str:
    if x == int(x) and abs(x) < 1e7:
        return f"{int(x):,}".replace(",", "_") if abs(x) >= 1e5 else str(int(x))
    return f"{x:g}"


_GPUS = 2**20
_MODEL = Bound(1, 2**20, why="model dimensions")
BOUNDS: dict[str, Bound] = {
    # cluster
    "gpus": Bound(1, _GPUS, why="a million GPUs, ~5x the largest cluster built"),
    "gpus_per_node": Bound(1, 1024, why="NVLink domain (NVL72 racks have 72)"),
    "pod_gpus": Bound(0, _GPUS, why="GPUs under one non-blocking switch domain; 0: the whole network"),
    "oversubscription": Bound(1, 1024, integer=False, why="bandwidth into the pod's switches over that out of them"),
    # capacities and rates from 1/1000 of the unit up (1 MiB, 1 GB/s / 1000, 1 GFLOP/s): smaller ones
    # round device memory to 0 bytes or overflow step times to infinity
    "gpu_memory_gib": Bound(0.001, 65536, integer=False),
    "peak_tflops": Bound(0.001, 1e6, integer=False),
    "hbm_gb_per_s": Bound(0.001, 1e6, integer=False),
    "intra_node_gb_per_s": Bound(0.001, 1e6, integer=False),
    "inter_node_gb_per_s": Bound(0.001, 1e6, integer=False),
    "pcie_gb_per_s": Bound(0.001, 1e6, integer=False),
    "host_ram_gib": Bound(0.001, 2**30, integer=False),
    "nvme_gb_per_s": Bound(0.001, 1e6, integer=False),
    # model
    "params": Bound(1e6, 1e14, integer=False, why="100 trillion parameters"),
    "layers": Bound(1, 16384),
    "hidden": _MODEL,
    "heads": Bound(1, 65536),
    "kv_heads": Bound(1, 65536),
    "ffn": Bound(1, 2**22),
    "vocab": Bound(1, 2**24),
    "head_dim": Bound(0, 65536),
    "max_positions": Bound(0, 2**26),
    "experts": Bound(1, 65536),
    "experts_per_token": Bound(1, 65536),
    "shared_expert_ffn": Bound(0, 2**22),
    "dense_layers": Bound(0, 16384),
    "dense_ffn": Bound(0, 2**22),
    "moe_layer_step": Bound(1, 16384),
    "kv_lora_rank": Bound(0, 2**20),
    "q_lora_rank": Bound(0, 2**20),
    "qk_rope_head_dim": Bound(0, 65536),
    "v_head_dim": Bound(0, 65536),
    "mtp_layers": Bound(0, 16),
    # training
    "seq_len": Bound(1, 2**26, why="64 Mi tokens per sequence"),
    "gbs": Bound(1, 2**30),
    "tokens_per_step": Bound(1, 2**46, integer=False),
    "tokens": Bound(1, 1e18, integer=False),
    "price_per_gpu_hour": Bound(0, 1e6, integer=False, open_low=True),
    # an expert capacity factor past E/k only pads further (every expert already takes every token)
    "moe_capacity_factor": Bound(0, 65536, integer=False, open_low=True, why="the largest expert count"),
    "optimizer_offload_fraction": Bound(0, 1, integer=False, open_low=True, why="all of the optimizer"),
    # layout
    "tp": Bound(1, _GPUS), "pp": Bound(1, _GPUS), "dp": Bound(1, _GPUS), "cp": Bound(1, _GPUS),
    "ep": Bound(1, _GPUS), "etp": Bound(1, _GPUS), "vpp": Bound(1, 16384),
    "mbs": Bound(1, 2**20),
    "recompute_layers": Bound(1, 16384),
    "gas": Bound(1, 2**30),
    # search
    "top": Bound(1, 10000),
    "max_mbs": Bound(1, 4096),
    "memory_headroom": Bound(0, 1, integer=False),
    # DeepSpeed zero_optimization element counts
    "reduce_bucket_size": Bound(1, 1e13),
    "allgather_bucket_size": Bound(1, 1e13),
    "stage3_prefetch_bucket_size": Bound(0, 1e15),
    "stage3_max_live_parameters": Bound(0, 1e15),
    "stage3_max_reuse_distance": Bound(0, 1e15),
    "stage3_param_persistence_threshold": Bound(0, 1e15),
    "sub_group_size": Bound(1, 1e15),
    # their offload_optimizer / offload_param NVMe buffers
    "nvme_optimizer_buffer_count": Bound(0, 1e6),
    "nvme_param_buffer_count": Bound(0, 1e6),
    "nvme_param_buffer_size": Bound(0, 1e15),
    "nvme_params_in_cpu": Bound(0, 1e15),
}


def flag_name(key: str) -> str:
    return "--" + key.replace("_", "-")


def check(key: str, value, flag: str | None = None):
    """`value` if it is a finite number of the right kind inside BOUNDS[key]; else InputError
    naming the flag and the range. Integers come back as int."""
    bound, flag = BOUNDS[key], flag or flag_name(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            import numpy as np

            if not isinstance(value, (np.integer, np.floating)):
                raise TypeError
        except TypeError:
            raise InputError(f"{flag}: must be {bound.text()}, got {value!r}") from None
    try:
        number = float(value)
    except OverflowError:
        raise InputError(f"{flag}: must be {bound.text()}, got an overflowing number") from None
    if not math.isfinite(number):
        raise InputError(f"{flag}: must be {bound.text()}, got {value!r}")
    too_low = number <= bound.low if bound.open_low else number < bound.low
    if too_low or number > bound.high or (bound.integer and number != int(number)):
        raise InputError(f"{flag}: must be {bound.text()}, got {_short(value)}")
    if key == "memory_headroom" and number >= 1:
        raise InputError(f"{flag}: must be a number >= 0 and < 1, got {_short(value)}")
    return int(number) if bound.integer else number


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def help_text(key: str) -> str:
    """The range as --help prints it."""
    return f"[{BOUNDS[key].text()}]"
