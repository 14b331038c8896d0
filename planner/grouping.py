"""Evaluate a formula once per distinct combination of the layout fields it reads.

The search's candidates repeat each field value many times; a formula that reads only a few
fields (model states read tp, pp, dp, cp, ep, zero and offload, not the micro-batch) is
evaluated on one representative per distinct combination and gathered back. Elementwise
formulas give identical values either way (tests/test_search.py checks row by row).
"""

from __future__ import annotations

import numpy as np

from planner.layout import FIELDS, Layouts


class FieldCodes:
    """Layouts fields as small integer codes for grouping, computed once per field: the value itself
    when small, else its rank among the field's distinct values."""

    def __init__(self, lay):
        self.lay, self.cache, self.groups = lay, {}, {}

    def __call__(self, name: str, compress: bool = False) -> tuple[np.ndarray, int]:
        if (name, compress) not in self.cache:
            col = getattr(self.lay, name).ravel()
            low, high = int(col.min()), int(col.max())
            if not compress and 0 <= low and high < 64:
                code = (col, high + 1)
            elif high - low < 1 << 20:
                present = np.zeros(high - low + 1, dtype=bool)
                shifted = col - low if low else col
                present[shifted] = True
                code = (np.take(np.cumsum(present) - 1, shifted), int(present.sum()))
            else:
                distinct, inverse = np.unique(col, return_inverse=True)
                code = (inverse.ravel(), distinct.size)
            self.cache[name, compress] = code
        return self.cache[name, compress]


def grouped(codes: FieldCodes, names: tuple, fn) -> dict:
    """fn(sub-Layouts) evaluated once per distinct combination of fields `names`, gathered back to the full
    shape; fn must depend on those fields only (elementwise formulas give identical values)."""
    lay = codes.lay
    if lay.size <= 64:  # too few to be worth grouping: evaluate directly
        return {k: np.maximum(np.broadcast_to(v, lay.tp.shape), 0.0) for k, v in fn(lay).items()}
    if names not in codes.groups:
        codes.groups[names] = _group(codes, names)
    first, inverse = codes.groups[names]
    sub = Layouts(**{name: getattr(lay, name).ravel()[first] for name in FIELDS})
    return {k: np.take(np.maximum(np.broadcast_to(v, sub.tp.shape), 0.0), inverse).reshape(lay.tp.shape)
            for k, v in fn(sub).items()}


def _group(codes: FieldCodes, names: tuple) -> tuple:
    """(index of one representative per distinct combination of `names`, each row's combination)."""
    lay = codes.lay
    limit = max(1 << 22, 4 * lay.size)
    compress = np.prod([float(codes(name)[1]) for name in names]) > limit
    key, space = codes(names[0], compress)[0].astype(np.int64), codes(names[0], compress)[1]
    for name in names[1:]:  # mixed-radix code
        code, span = codes(name, compress)
        key *= span
        key += code
        space *= span
    if space <= limit:  # dense table: O(N), no sort
        rep = np.full(space, -1, dtype=np.int64)
        rep[key] = np.arange(key.size)
        distinct = np.flatnonzero(rep >= 0)
        slot = np.empty(space, dtype=np.int64)
        slot[distinct] = np.arange(distinct.size)
        first, inverse = rep[distinct], np.take(slot, key)
    else:
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        inverse = inverse.ravel()
    return first, inverse
