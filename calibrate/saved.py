"""Count what a module saves for backward: torch.autograd.graph.saved_tensors_hooks over a forward.

Saved tensors are deduplicated by storage (a view of a tensor already kept costs nothing more) and
the module's parameters are left out (a saved weight is not an activation). The bytes are those
of each storage's live extent, the way the caching allocator would hold them.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


class SavedCounter:
    """Collects (storage pointer -> bytes, shape, dtype, creator) of every tensor saved in the block."""

    def __init__(self, exclude=()):
        self.exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self.saved = {}

    def pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr and ptr not in self.exclude and ptr not in self.saved:
            self.saved[ptr] = (storage.nbytes(), tuple(t.shape), str(t.dtype).replace("torch.", ""),
                               type(t.grad_fn).__name__ if t.grad_fn is not None else "leaf")
        return t

    @staticmethod
    def unpack(t):
        return t

    @property
    def total_bytes(self) -> int:
        return sum(v[0] for v in self.saved.values())

    def table(self) -> list:
        return sorted(self.saved.values(), key=lambda v: -v[0])


@contextmanager
def counting(exclude=()):
    """`with counting(model.parameters()) as c: loss = model(x)` -> c.total_bytes saved for backward."""
    c = SavedCounter(exclude)
    with torch.autograd.graph.saved_tensors_hooks(c.pack, c.unpack):
        yield c
