"""The slowest rank's delay to a synchronous step (planner/stragglers.py), against the expected maxima
of normal samples: exact for 2 and 3 (1/sqrt(pi) and 3/(2 sqrt(pi))), Harter 1961 (Biometrika 48,
"Expected values of normal order statistics", Table 1) for 8, 10, 100 and 1,000; and the prior
against its source (Sinha et al. SC22: 8 % between a cluster's slowest and fastest GPU)."""

import math

import pytest

from planner import hardware, layout, memory, stragglers, timing
from planner.model import lookup

C = memory.coefficients("time")
E_MAX_8, E_MAX_1000 = 1.42360, 3.24144  # Harter 1961 Table 1


def test_expected_maximum_of_normals_matches_the_tables():
    got = stragglers.expected_max_of_normals([1, 2, 3, 8, 10, 100, 1000])
    want = [0.0, 1 / math.sqrt(math.pi), 3 / (2 * math.sqrt(math.pi)), E_MAX_8, 1.53875, 2.50759, E_MAX_1000]
    assert got == pytest.approx(want, abs=2e-5)
    assert stragglers.expected_max_of_normals([[1000, 1], [2, 1000]])[1, 1] == pytest.approx(E_MAX_1000, abs=2e-5)


def test_the_prior_is_its_sources_range():
    # 8 % from slowest to fastest over ~1,000 GPUs: 2 x 3.24144 standard deviations
    assert C["rank_speed_cv"] == pytest.approx(0.08 / (2 * E_MAX_1000), rel=0.05)


def _breakdown(gpus: int, **kw):
    model = lookup("llama-2-70b")
    cluster = hardware.Cluster(hardware.lookup_gpu("h100-sxm"), gpus, 8)
    training = layout.Training(seq_len=4096, engine="megatron")
    return timing.step_time(model, cluster, training, layout.single(**kw))["breakdown"]


@pytest.mark.parametrize("kw, ranks_e_max", [
    (dict(tp=8, pp=5, dp=25, mbs=1, gas=16, recompute="full", sequence_parallel=True), E_MAX_1000),  # 8*5*25 = 1000
    (dict(tp=8, pp=1, dp=1, mbs=1, gas=4, recompute="selective", sequence_parallel=True), E_MAX_8),  # one node
])
def test_a_step_waits_for_the_slowest_of_its_ranks(kw, ranks_e_max):
    """The compute-paced seconds (kernels, recompute, the bubble) grow by cv x E[max of the ranks]:
    0.012 x 3.24144 = 3.9 % on 1,000 GPUs, 0.012 x 1.42360 = 1.7 % on 8."""
    b = _breakdown(kw["tp"] * kw["pp"] * kw["dp"], **kw)
    paced = b["compute"][0] + b["recompute"][0] + b["pp_bubble"][0]
    assert b["stragglers"][0] / paced == pytest.approx(C["rank_speed_cv"] * ranks_e_max, rel=1e-4)


def test_one_rank_waits_for_no_one():
    assert _breakdown(1, mbs=1, gas=1, zero=3, recompute="full")["stragglers"][0] == 0.0
