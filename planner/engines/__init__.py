"""Training engines as data: one frozen record per engine (planner/engines/base.py Engine), each
field read from the engine's code, each engine in its own room (planner/engines/<engine>/).

Formulas never compare engine names: they read these fields. The search's engine rules are
generated from the same records (planner/rules.py), so adding an engine is adding a room and
registering its record here. Versions read: DeepSpeed 0.19.8, Megatron-Core / Megatron-LM 0.19.2
(megatron-core wheel), PyTorch 2.13 (FSDP2 `fully_shard`, `torch.distributed.pipelining`),
torchtitan 0.3.0.
"""

from __future__ import annotations

from planner.engines.base import (Buffers, Engine, ExpertTP, GradBuckets, Launcher, Modules, MoeCapacity, MoeCounts,
                                  SelectivePolicy)
from planner.engines.deepspeed import DEEPSPEED
from planner.engines.fsdp import FSDP
from planner.engines.megatron import MEGATRON, MEGATRON_DEEPSPEED, MEGATRON_DEEPSPEED_0_3
from planner.engines.torchtitan import TORCHTITAN

ENGINES: dict[str, Engine] = {e.name: e for e in (DEEPSPEED, MEGATRON_DEEPSPEED, MEGATRON, FSDP, TORCHTITAN)}
ARCHIVED: dict[str, Engine] = {e.name: e for e in (MEGATRON_DEEPSPEED_0_3,)}
"""Past engine versions that published runs were measured on (planner/validate.py)."""
NAMES = tuple(ENGINES)


def lookup(name: str | Engine) -> Engine:
    """The engine record for a --engine word (InputError listing the engines otherwise)."""
    from planner.errors import InputError

    if isinstance(name, Engine):
        return name
    key = str(name).strip().lower()
    if key not in ENGINES:
        raise InputError(f"--engine: must be one of {', '.join(NAMES)}, got {name!r}")
    return ENGINES[key]


__all__ = ["Buffers", "Engine", "ExpertTP", "GradBuckets", "Launcher", "Modules", "MoeCapacity", "MoeCounts",
           "SelectivePolicy", "DEEPSPEED", "MEGATRON_DEEPSPEED", "MEGATRON", "FSDP", "TORCHTITAN",
           "MEGATRON_DEEPSPEED_0_3", "ENGINES", "ARCHIVED", "NAMES", "lookup"]
