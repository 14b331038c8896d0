"""Evaluate a formula once per distinct combination of the layout fields it reads.

The search's candidates repeat each field value many times; a formula that reads only a few
fields (model states read tp, pp, dp, cp, ep, zero and offload, not the micro-batch) is
evaluated on one representative per distinct combination and gathered back. Elementwise
formulas give identical values either way (tests/test_search.py checks row by row).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, is_dataclass

import numpy as np

from planner.layout import FIELDS, Layouts


DERIVED = {"accumulates": lambda lay: (lay.gas > 1).astype(np.int64)}
"""Codes computed from a field, for formulas that read it only so: `accumulates` is gas > 1 (a step of
more than one micro-batch), all the model states read of gas."""


class FieldCodes:
    """Layouts fields as small integer codes for grouping, computed once per field: the value itself
    when small, else its rank among the field's distinct values."""

    def __init__(self, lay):
        self.lay, self.cache, self.groups = lay, {}, {}

    def __call__(self, name: str, compress: bool = False) -> tuple[np.ndarray, int]:
        if (name, compress) not in self.cache:
            col = DERIVED[name](self.lay).ravel() if name in DERIVED else getattr(self.lay, name).ravel()
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


class Grouped:
    """A formula's outputs per distinct combination of the fields it reads, and each candidate's
    combination: `g[key]` gathers one output for every candidate (cached), `g.at(key, i)` reads one
    candidate's value without gathering."""

    def __init__(self, values: dict, inverse, shape: tuple):
        self.values, self.inverse, self.shape, self.cache = values, inverse, shape, {}

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self.cache:
            v = self.values[key]
            self.cache[key] = v.reshape(self.shape) if self.inverse is None else np.take(v, self.inverse).reshape(self.shape)
        return self.cache[key]

    def at(self, key: str, i: int) -> float:
        v = self.values[key]
        return v.flat[i] if self.inverse is None else v[self.inverse[i]]


def codes_of(lay: Layouts) -> FieldCodes:
    """Per-field grouping codes of `lay`, computed once per Layouts and shared by memory and timing."""
    if "_codes" not in lay.__dict__:
        lay.__dict__["_codes"] = FieldCodes(lay)
    return lay.__dict__["_codes"]


def grouped(codes, names: tuple, fn, lay=None) -> Grouped:
    """fn(sub-Layouts) evaluated once per distinct combination of fields `names` (negative values
    clipped to 0); fn must depend on those fields only (elementwise formulas give identical values).
    With `codes` None, or few candidates, fn runs on `lay` itself."""
    lay = lay if codes is None else codes.lay
    if codes is None or lay.size <= 64:  # too few to be worth grouping: evaluate directly
        values = {k: _nonnegative(v, lay.shape).ravel() for k, v in fn(lay).items()}
        return Grouped(values, None, lay.shape)
    sub, inverse = _representatives(codes, names)
    values = {k: _nonnegative(v, sub.shape) for k, v in fn(sub).items()}
    return Grouped(values, inverse, lay.shape)


def _representatives(codes: FieldCodes, names: tuple) -> tuple:
    """(one candidate per distinct combination of `names` as flat Layouts, each candidate's combination)."""
    if names not in codes.groups:
        codes.groups[names] = _group(codes, names)
    first, inverse = codes.groups[names]
    return Layouts(**{name: getattr(codes.lay, name).ravel()[first] for name in FIELDS}), inverse


def grouped_stages(codes, names: tuple, fn, lay, stages_of) -> list:
    """grouped() of fn(sub, stage) for several pipeline stages in one evaluation, one Grouped per
    stage: the representatives repeated once for each stage array stages_of(sub) gives, so a term's
    fixed cost per call is paid once rather than once a stage (formulas elementwise, as grouped's)."""
    lay = lay if codes is None else codes.lay
    if codes is None or lay.size <= 64:  # too few to be worth grouping: every candidate its own
        sub, inverse = Layouts(**{name: getattr(lay, name).ravel() for name in FIELDS}), None
    else:
        sub, inverse = _representatives(codes, names)
    stages = [np.broadcast_to(stage, sub.shape).ravel() for stage in stages_of(sub)]
    n, k = sub.size, len(stages)
    every = sub if k == 1 else Layouts(**{name: np.concatenate((getattr(sub, name),) * k) for name in FIELDS})
    values = {key: _nonnegative(v, every.shape) for key, v in fn(every, np.concatenate(stages)).items()}
    return [Grouped({key: v[j * n:(j + 1) * n] for key, v in values.items()}, inverse, lay.shape) for j in range(k)]


def _nonnegative(v, shape: tuple) -> np.ndarray:
    """max(v, 0) over the candidates' shape, as a new array (broadcast only where v is not already
    of that shape: the search calls this per term and evaluation)."""
    return np.maximum(v, 0.0) if np.shape(v) == shape else np.maximum(np.broadcast_to(v, shape), 0.0)


class Lazy(Mapping):
    """Named arrays over candidates, each computed on first use: `lazy[key]` for all candidates,
    `lazy.at(key, i)` for one. Built from functions f(index) -> array (index None) or scalar."""

    def __init__(self, makers: dict):
        self.makers, self.cache = makers, {}

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self.cache:
            self.cache[key] = self.makers[key](None)
        return self.cache[key]

    def at(self, key: str, i: int) -> float:
        if key in self.cache:
            return self.cache[key].flat[i]
        return self.makers[key](i)

    def __iter__(self):
        return iter(self.makers)

    def __len__(self) -> int:
        return len(self.makers)


def _group(codes: FieldCodes, names: tuple) -> tuple:
    """(index of one representative per distinct combination of `names`, each row's combination)."""
    lay = codes.lay
    limit = max(1 << 12, 4 * lay.size)  # a dense table costs O(space): only where it is not much larger than N
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


def picked(sources: list, sizes: list, which: np.ndarray, index: np.ndarray):
    """Evaluations (search.Evaluation: dataclasses of nested dicts of arrays and Lazy mappings)
    combined row by row without evaluating again: row r is row index[r] of sources[which[r]], a
    source of sizes[which[r]] rows. Every term is elementwise, so a row's values do not depend on
    the rows beside it."""
    first = sources[0]
    if is_dataclass(first):
        return type(first)(**{f.name: picked([getattr(s, f.name) for s in sources], sizes, which, index)
                              for f in fields(first)})
    if isinstance(first, dict):
        return {k: picked([s[k] for s in sources], sizes, which, index) for k in first}
    if isinstance(first, Lazy):
        def maker(key):
            return lambda i: _gathered([s[key] for s in sources], sizes, which, index) if i is None \
                else sources[which[i]].at(key, int(index[i]))
        return Lazy({key: maker(key) for key in first})
    return _gathered(sources, sizes, which, index)


def _gathered(arrays: list, sizes: list, which: np.ndarray, index: np.ndarray) -> np.ndarray:
    out = np.empty(which.shape, dtype=np.result_type(*arrays))
    for k, (a, n) in enumerate(zip(arrays, sizes)):
        rows = which == k
        out[rows] = np.broadcast_to(np.asarray(a), (n,))[index[rows]] if np.ndim(a) == 0 else np.ravel(a)[index[rows]]
    return out
