"""A saved tensor: what one transformer block keeps for its backward, per token, and how it divides
over the tensor-parallel ranks (planner/saved/__init__.py registers each implementation's list)."""

from __future__ import annotations

from dataclasses import dataclass


# how a saved tensor divides over the TP ranks
TP, SP, WHOLE, ROWS = "tp", "sp", "whole", "rows"
"""TP: split by t (inside the tensor-parallel region); SP: split by t only under sequence
parallelism (the 'replicated' LayerNorm/dropout region, Korthikanti section 4.2.2); WHOLE: every
TP rank keeps all of it (a DTensor linear's input, all-gathered before the matmul saves it); ROWS:
routed expert rows, full width, split by t / etp (the TP ranks holding other experts share the rows;
the expert-TP ranks of one expert each keep all of its rows)."""


@dataclass(frozen=True)
class Saved:
    """One tensor a block keeps for its backward, per token of one micro-batch."""

    name: str
    bytes_per_token: float
    """Bytes per token before any TP split (an array over the layouts where the micro-batch size
    changes it: hf_gpt_neox_saved's eager v)."""
    split: str
    """TP or SP."""
    core: bool = False
    """Attention-core internals that selective recompute drops (Korthikanti section 5)."""
    dropped_by: tuple = ()
    """Megatron's --recompute-modules that leave it unsaved (Training.recompute_modules): the
    module's internals under its checkpoint, or an output-discarding checkpoint's output; the
    attention core's internals are `core`."""
    gemm_input: str = ""
    """A block linear layer's input, which Transformer Engine's FP8 layers keep as FP8
    (planner/fp8.py saved_input_scale): 'own' where the linear layer alone keeps it, 'shared' where
    another op keeps the same 16-bit tensor too."""
