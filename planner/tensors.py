"""One parameter tensor as Hugging Face registers it, one forward GEMM of a block, what one rank
holds of a tensor under TP/EP, and the element sums of a tensor list by place and TP/EP treatment."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

FIRST, BLOCK, LAST = "first", "block", "last"


@dataclass(frozen=True)
class Tensor:
    """One parameter tensor as the Hugging Face model registers it."""

    name: str
    """Registration name; block tensors carry '{i}' where the layer index goes."""
    shape: tuple
    """Shape as in the Hugging Face module (Conv1D keeps (in, out))."""
    tp_dim: int | None
    """Dimension Megatron TP splits (column-parallel: outputs, row-parallel: inputs, embedding:
    vocab; Shoeybi et al. 2019 section 3); None when every TP rank keeps it whole."""
    expert: bool = False
    """A routed expert's tensor (experts stacked on dim 0; expert parallelism splits them)."""
    place: str = BLOCK
    """'first' (embeddings), 'block' (one per layer) or 'last' (final norm, output layer)."""
    gemm: str | None = None
    """For weight matrices: the GEMM group ('qkv', 'o', 'fc1', 'fc2', 'router', 'logits');
    Megatron fuses the tensors of one group into one GEMM."""
    tied: bool = False
    """The output layer sharing the input embedding (counted once; a second copy when pp > 1)."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def module(self) -> str:
        """The owning module's name (what DeepSpeed calls a layer)."""
        return self.name.rsplit(".", 1)[0]


@dataclass(frozen=True)
class Gemm:
    """One forward matrix multiply of a block (or the output layer) as an engine runs it."""

    name: str
    flops_per_token: float
    """Forward FLOPs per token routed through it, before any TP split (2 x weight elements)."""
    tp_split: bool
    """Split over TP ranks (column or row parallel); the router runs whole on every rank."""
    expert: bool
    """One routed expert's GEMM: runs once per local expert, on the tokens routed to it."""


def local_numel(t: Tensor, tp, experts: int = 1, ep=1):
    """Elements of `t` one rank holds: split by tp along tp_dim, routed experts split by ep."""
    n = t.numel / tp if t.tp_dim is not None else t.numel
    return n * (np.maximum(experts // ep, 1) / experts) if t.expert else n


@dataclass(frozen=True)
class ParamSums:
    """Element sums of the tensor list, grouped the way TP, EP and PP treat them."""

    block_split: int
    """Dense block tensors split by TP."""
    block_replicated: int
    """Dense block tensors every TP rank holds whole (norms, row-parallel biases, router)."""
    expert_split: int
    """Routed experts' tensors split by (expert) TP, all experts of one block."""
    expert_replicated: int
    """Routed experts' tensors not split by TP (row-parallel biases), all experts."""
    first_split: int
    """First-stage tensors split by TP (vocab-parallel embedding)."""
    first_replicated: int
    """First-stage tensors kept whole (learned position embedding)."""
    last_replicated: int
    """Final norm."""
    output: int
    """Output layer V*h, vocab-parallel (0 counted in totals when tied)."""
    tied: bool

    @classmethod
    def of(cls, tensors) -> "ParamSums":
        def total(place, split, expert=False):
            return sum(t.numel for t in tensors if t.place == place and (t.tp_dim is not None) == split
                       and t.expert == expert and t.gemm != "logits")

        out = [t for t in tensors if t.gemm == "logits"]
        return cls(block_split=total(BLOCK, True), block_replicated=total(BLOCK, False),
                   expert_split=total(BLOCK, True, True), expert_replicated=total(BLOCK, False, True),
                   first_split=total(FIRST, True), first_replicated=total(FIRST, False),
                   last_replicated=total(LAST, False), output=out[0].numel if out else 0,
                   tied=bool(out and out[0].tied))

    @property
    def block_total(self) -> int:
        return self.block_split + self.block_replicated + self.expert_split + self.expert_replicated

    @property
    def first_total(self) -> int:
        return self.first_split + self.first_replicated

    @property
    def last_total(self) -> int:
        return self.last_replicated + (0 if self.tied else self.output)
