"""pytest plugin for benchmarks/mutants.py: wraps one planner function as PLANNER_MUTANT says.

PLANNER_MUTANT = "module:function:transform", transform one of
  xF       multiply every number the function returns by F (arrays, tuples, dicts, StateBytes)
  field=F  multiply one field of a returned dataclass by F
  ones     return ones of the same shape (e.g. 'reduce once per step')
Every planner module that imported the function by name gets the wrapped one too.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys

import numpy as np


def _scale(value, factor):
    if isinstance(value, tuple):
        return tuple(_scale(v, factor) for v in value)
    if isinstance(value, dict):
        return {k: _scale(v, factor) for k, v in value.items()}
    if dataclasses.is_dataclass(value):
        return dataclasses.replace(value, **{f.name: getattr(value, f.name) * factor for f in dataclasses.fields(value)
                                             if isinstance(getattr(value, f.name), (int, float))})
    return value * factor


def _wrap(fn, transform):
    if transform == "ones":
        return lambda *a, **k: np.ones_like(np.asarray(fn(*a, **k), dtype=np.float64))
    if "=" in transform:
        field, factor = transform.split("=")
        return lambda *a, **k: dataclasses.replace(out := fn(*a, **k), **{field: getattr(out, field) * float(factor)})
    factor = float(transform.lstrip("x"))
    return lambda *a, **k: _scale(fn(*a, **k), factor)


def pytest_configure(config):
    spec = os.environ.get("PLANNER_MUTANT")
    if not spec:
        return
    module_name, name, transform = spec.split(":")
    for every in ("planner.api", "planner.cli", "planner.export", "planner.validate"):
        importlib.import_module(every)  # load the package so every copy of the function is patched
    module = importlib.import_module(module_name)
    original = getattr(module, name)
    wrapped = _wrap(original, transform)

    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("planner"):
            for attr, value in list(vars(mod).items()):
                if value is original:
                    setattr(mod, attr, wrapped)
