"""Stragglers: a synchronous step runs at the pace of its slowest rank.

GPUs of one SKU in one cluster do not run equally fast: manufacturing spread and each chip's power
management make a compute-bound kernel 8 % (at most 22 %) slower on the slowest GPU of a cluster
than on the fastest, on average over five clusters and their applications (Sinha et al., "Not All
GPUs Are Created Equal: Characterizing Variability in Large-Scale, Accelerator-Rich Systems", SC22,
abstract). A training step
synchronizes every rank (each data-parallel step's gradient collectives, each pipeline stage's
sends, each tensor-parallel layer's all-reduce), so every rank waits for the slowest one: with n
ranks whose compute speeds spread with relative standard deviation cv, the compute-paced part of the
step takes

    (1 + cv * E[max of n standard normals])

times as long as on a typical rank. The expected maximum grows like sqrt(2 ln n) (0.56 for 2 ranks,
3.24 for 1,000, 3.85 for 10,000): the efficiency a job loses as it grows and nothing else changes.
cv is the coefficient `rank_speed_cv`, which calibrate's `rank_speed` bench measures on a machine
with several GPUs.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np

_X = np.linspace(-12.0, 12.0, 9601)
"""Quadrature grid over standard-normal values: the maximum of 10^9 ranks lies near 6.1."""


@cache
def _log_cdf_and_density() -> tuple:
    """log Phi(x) (from the lower tail below 0, the upper tail above, so neither rounds to 0 or 1)
    and the standard normal density on _X."""
    half = 1.0 / math.sqrt(2.0)
    lower = np.array([math.log(0.5 * math.erfc(-x * half)) for x in _X[_X < 0]])
    upper = np.log1p(-0.5 * np.array([math.erfc(x * half) for x in _X[_X >= 0]]))
    return np.concatenate([lower, upper]), np.exp(-0.5 * _X**2) / math.sqrt(2.0 * math.pi)


def expected_max_of_normals(n) -> np.ndarray:
    """E[max of n independent standard normals] per element of n (n >= 1; 0 for n = 1), by
    quadrature of x times the maximum's density n phi(x) Phi(x)^(n-1) (David & Nagaraja, Order
    Statistics, 3rd ed. 2003, eq. 2.1.1 with r = n). Each distinct n is integrated once."""
    n = np.asarray(n)
    if n.size and np.issubdtype(n.dtype, np.integer) and 1 <= n.min() and n.max() <= 1 << 24:
        table = np.zeros(int(n.max()) + 1)  # rank counts are small integers: a lookup, not a sort
        values = np.flatnonzero(np.bincount(n.ravel()))
        table[values] = _expected_max(values.astype(np.float64))
        return table[n]
    values, inverse = np.unique(n.astype(np.float64), return_inverse=True)
    return _expected_max(values)[inverse].reshape(n.shape)


def _expected_max(values: np.ndarray) -> np.ndarray:
    assert values.size == 0 or values[0] >= 1, values
    log_cdf, density = _log_cdf_and_density()
    count = values[:, None]
    maximum_density = count * density * np.exp((count - 1.0) * log_cdf)
    step = _X[1] - _X[0]
    return np.where(values > 1, maximum_density @ _X * step, 0.0)  # one rank waits for no one: exactly 0


def straggler_s(ranks, paced_s, rank_speed_cv: float) -> np.ndarray:
    """Seconds the slowest of `ranks` synchronized ranks adds to `paced_s`, the seconds of a step
    that its compute paces (kernels, recompute and the pipeline bubble they set); communication and
    host work are not scaled."""
    return rank_speed_cv * expected_max_of_normals(ranks) * np.asarray(paced_s, dtype=np.float64)
