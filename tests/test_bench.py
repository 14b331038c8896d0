"""Micro-benchmarks (calibrate/benches/bench.py): units and conventions checked by hand, and the fit of the
planner's GEMM curve and collective model to this machine's real measurements."""

from __future__ import annotations

import pytest

from calibrate.benches import bench
from calibrate.harness.fit import BOUNDS, fit
from calibrate.harness.record import expand_rows, run_case


def test_bus_bandwidth_follows_nccl_tests():
    # nccl-tests doc/PERFORMANCE.md: 1 GB all-reduce over 8 ranks in 10 ms -> algbw 100 GB/s,
    # busbw = 100 x 2 x 7/8 = 175 GB/s; all-gather of the same: 100 x 7/8 = 87.5 GB/s
    assert bench.bus_bytes_per_s("all_reduce", 1e9, 8, 0.01) == pytest.approx(175e9)
    assert bench.bus_bytes_per_s("all_gather", 1e9, 8, 0.01) == pytest.approx(87.5e9)
    assert bench.bus_bytes_per_s("reduce_scatter", 1e9, 2, 0.01) == pytest.approx(50e9)
    assert bench.bus_bytes_per_s("send_recv", 1e9, 2, 0.01) == pytest.approx(100e9)  # one message, one way


def test_attention_bench_counts_the_causal_matmuls():
    # FlashAttention-2 (Dao 2023, s.4.1's FLOP count): 4 seqlen^2 head_dim heads forward, halved
    # causal: 4 x 64^2 x 16 x 2 / 2 = 262,144 (on this CPU SDPA's math kernel runs it; no kernel_s)
    a = bench.attention_run(1, 2, 64, 16, repeats=2)
    assert a["flops_fwd"] == 262_144 and a["attention_s"] > 0 and "kernel_s" not in a
    # the GPU cases: one per shape, predicted at the catalog's 35 % for H100 (FlashAttention-3's
    # abstract on FlashAttention-2): 3.5 x 4 x 32 x 4096^2 x 128 / 2 / (989.4e12 x 0.35) = 1.389 ms
    cases = {c.name: c for c in bench.cases("gpu", "h100-sxm") if c.kind == "attention"}
    assert sorted(cases) == sorted(f"bench/attention/{b}x{h}x{n}x{d}" for b, h, n, d in bench.ATTENTION_SHAPES)
    got = cases["bench/attention/1x32x4096x128"].predict()["kernel_s"]
    assert got == pytest.approx(3.5 * 4 * 32 * 4096**2 * 128 / 2 / (989.4e12 * 0.35), rel=1e-12)


def test_gemm_and_adam_measure_what_they_say():
    g = bench.gemm_run(128, "float32", repeats=3)
    assert g["flops"] == 2 * 128**3  # 2 m n k
    assert g["flops_per_s"] == pytest.approx(g["flops"] / g["gemm_s"])
    a = bench.adam_run(2**16, "torch", repeats=2)
    assert a["adam_params_per_s"] == pytest.approx(2**16 / a["adam_step_s"])
    assert a["implementation"] == "torch"


@pytest.mark.slow
def test_fit_to_this_machine_lowers_held_out_error():
    records = [rec for case in bench.cases("cpu") for rec in expand_rows(run_case(case))]
    assert all(r["outcome"]["status"] == "ok" for r in records), [r["outcome"] for r in records]
    collectives = [r for r in records if r["kind"] == "collective" and r["measurement"]["op"] != "send_recv"]
    assert {r["measurement"]["op"] for r in collectives} == {"all_reduce", "all_gather", "reduce_scatter"}
    assert all(r["measurement"]["ranks"] == 2 and r["measurement"]["collective_s"] > 0 for r in collectives)
    pings = [r["measurement"] for r in records if r["kind"] == "collective" and r["measurement"]["op"] == "send_recv"]
    assert [m["bytes"] for m in pings] == list(bench.P2P_BYTES) and all(m["collective_s"] > 0 for m in pings)
    gemms = [r["measurement"] for r in records if r["kind"] == "gemm"]
    ref = {"peak_flops_per_s": max(m["flops_per_s"] for m in gemms),
           "link_bytes_per_s": max(r["measurement"]["bus_bytes_per_s"] for r in collectives)}
    result = fit(records, ref, k=3)
    # the GEMM prior (F_half = 2 GFLOP, sized for H100 kernels) predicts a 2 x 64^3 = 0.5 MFLOP CPU
    # GEMM 4000x too slow on an idle machine; fitted to this CPU, held-out GEMMs come within a factor
    # of 2 there. The times are wall-clock, which a loaded machine scatters (small GEMMs waiting on
    # busy cores took 1000x longer beside the other test worker: the prior then looked only 3x off,
    # the fit 0.2), so only the fall is asserted
    e = result["error"]["gemm.gemm_s"]
    assert e["after_mean"] < e["before_mean"] / 2, e
    c = result["coefficients"]["time"]
    # gloo on one host: NCCL's 2-rank latency (tuning.cc, LL ring: 6.6 + 2 x 0.6 = 7.8 us) scaled to
    # between 0.8 us and 78 ms a call, a bus efficiency of the best measured bandwidth between 1 % and
    # 100 % (single calls vary too much on 2 shared cores to assert a held-out error here)
    assert 0.1 < c["collective_latency_scale"]["value"] < 1e4
    assert 0.01 < c["bus_efficiency_intra_node"]["value"] <= 1.0
    # a gloo message between two processes of one host: between 1 us and 10 ms one way (TCP loopback)
    assert 1e-6 < c["p2p_latency_s"]["value"] < 1e-2
    # the host optimizers: DeepSpeedCPUAdam and torch's fused AdamW make one pass over the states,
    # torch's single-tensor loop a pass per operator; ZeRO-Offload (Ren et al. 2021 s.6) measured the
    # former 5-7x faster, this CPU 7.5x (2^24 parameters, 1.95e9 against 0.26e9 params/s)
    fused, unfused = c["cpu_adam_params_per_s"]["value"], c["cpu_adam_unfused_params_per_s"]["value"]
    assert fused > 3 * unfused, (fused, unfused)
    # one rate a kind across sizes, within 2x on these 2 shared cores: torch's fused AdamW ran at
    # 1.3-1.9e9 params/s here, DeepSpeedCPUAdam at 2.0e9 (held-out 27 % and, in a CI run, 61 %), the
    # single-tensor loop at 0.28-0.30e9 (2^24 and 2^26 parameters)
    # (wall-clock on shared cores: only a rate within a factor of 4 of its held-out steps is asserted)
    for name in ("cpu_adam.fused_step_s", "cpu_adam.unfused_step_s"):
        assert result["error"][name]["after_mean"] < 3.0, result["error"][name]
    # DTensor's dispatch in an optimizer step: 15-22 us a tensor measured here idle, 113 us beside the
    # other test worker (wall-clock): only a fit strictly inside its bounds (not pinned at one) is asserted;
    # on a loaded machine the DTensor slope can come out no larger than the plain one, a measurement
    # fit.usable drops, and then the prior must stand
    extra = [r["measurement"]["extra_s_per_tensor"] for r in records if r["kind"] == "dtensor_step"]
    if any(x > 0 for x in extra):
        lo, hi = BOUNDS[("time", "dtensor_step_host_s_per_tensor")]
        assert lo < c["dtensor_step_host_s_per_tensor"]["value"] < hi
    else:
        assert "dtensor_step_host_s_per_tensor" not in c
