"""The contexts the terms read: a memory term one pipeline stage's (Stage: the model, the training
setup, the candidate layouts and the stage, with the rank's parameters counted once for all of
them), a step-time term the step's (Step: the model or one block kind of it, the cluster, the
training setup, the layouts and the time coefficients)."""

from __future__ import annotations

from dataclasses import dataclass

from planner.hardware import Cluster
from planner.layout import Layouts, Training
from planner.model import ModelSpec


@dataclass(frozen=True, eq=False)
class Stage:
    """One pipeline stage of every candidate (a term's four inputs, unpacked as
    `model, training, lay, stage = s`); `memo` keeps what many terms read, such as
    sharding.rank_params, once per context."""

    model: ModelSpec
    """The model (a block kind of it where a term asks per block)."""
    training: Training
    """The training setup and its engine."""
    lay: Layouts
    """The candidate layouts, arrays over the candidates."""
    stage: object
    """The pipeline stage of each candidate: an int or an array (0 the first, lay.pp - 1 the last)."""

    def __iter__(self):
        return iter((self.model, self.training, self.lay, self.stage))

    def memo(self, name: str, compute):
        """compute() once per context and `name`."""
        cache = self.__dict__.setdefault("_memo", {})
        if name not in cache:
            cache[name] = compute()
        return cache[name]


@dataclass(frozen=True, eq=False)
class Step:
    """The step of every candidate as a step-time term reads it (unpacked as
    `model, cluster, training, lay, c = ctx`)."""

    model: ModelSpec
    """The model, or the one block kind a per-block term times."""
    cluster: Cluster
    """The GPUs and how they are wired."""
    training: Training
    """The training setup and its engine."""
    lay: Layouts
    """The candidate layouts, arrays over the candidates."""
    c: dict
    """The time coefficients (data/coefficients.json 'time', or a profile's fitted values)."""

    def __iter__(self):
        return iter((self.model, self.cluster, self.training, self.lay, self.c))
