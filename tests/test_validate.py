"""`planner validate` against the published runs in data/references (sources on every record).

Bounds are what the model holds today with the priors of data/coefficients.json, no per-case
tuning; a change that worsens them fails here. The figures are quoted in docs/accuracy.md."""

import io

import numpy as np
import pytest

from planner import cli, validate

ROWS = validate.compare()


def errors(prefix, id_part=""):
    return np.array([r["error"] for r in ROWS if r["metric"].startswith(prefix) and id_part in r["id"]])


def test_every_comparable_record_is_compared():
    # 22 Narayanan TFLOP/s figures, 8 Korthikanti Table 5 iteration times, 8 Figure 1 activation sizes
    assert len(errors("TFLOP/s")) == 22 and len(errors("iteration")) == 8 and len(errors("activation")) == 8


def test_megatron_ptd_throughput_mape():
    ptd = np.concatenate([errors("TFLOP/s", "-t1-"), errors("TFLOP/s", "-ptd-"), errors("iteration")])
    # 5.7 % today (-7.7 % to +10.8 %); 8.5 %, every case optimistic, before the slowest rank's delay
    # (planner/stragglers.py: +1.7 % of the compute on 8 GPUs, +3.9 % on 1,000)
    assert np.mean(np.abs(ptd)) < 0.08
    assert np.max(np.abs(ptd)) < 0.13


def test_activation_memory_mape():
    assert np.mean(np.abs(errors("activation"))) < 0.04  # 2.4% vs Korthikanti 2022 Figure 1


def test_zero3_of_2021_falls_with_scale_as_measured():
    # Narayanan Table 2 (DeepSpeed ZeRO-3 of spring 2021, engine megatron-deepspeed-0.3): 144 > 88 > 44
    # TFLOP/s as GPUs double at a fixed batch, 3.3x from 384 to 1536 GPUs. The fall comes from one
    # tensor-list collective per parameter whose per-rank copies the host issues after a device sync
    # (timing.zero3_rank_copies_s): with them 10x too cheap the fall is 1.6x, 10x too dear the 1536-GPU
    # case is off by -86 %; without them (the engine of today) the six rows were +129 % optimistic.
    z = {r["id"]: r["predicted"] for r in ROWS if "zero3" in r["id"]}
    fall = z["narayanan2021-t2-zero3-174.6B-384gpu"] / z["narayanan2021-t2-zero3-174.6B-1536gpu"]
    assert 2.5 < fall < 4.5  # published 144 / 44 = 3.27; predicted 4.0 today
    err = errors("TFLOP/s", "zero3")
    # 19.7 % today (175B: +11/+11/-10 %, 530B: +29/+30/+28 %); 28.7 % before the recompute's second
    # gathers (sharding.recompute_fetches: 2/3 of a 530B layer's parameters, 0.67 of a pass more)
    assert np.mean(np.abs(err)) < 0.25
    assert np.max(np.abs(err)) < 0.50


def test_overall_mape_and_cli():
    assert validate.mape(ROWS) < 0.10  # 7.2% over all 38 figures today (the six ZeRO-3 rows: 19.7%)
    out = io.StringIO()
    assert cli.main(["validate"], out=out) == 0
    assert "MAPE all 38 figures" in out.getvalue()


def test_groups_say_which_way_they_lean():
    rows = [{"source": "S", "engine": "megatron", "metric": "iteration time s", "error": e} for e in (-0.10, -0.02)]
    rows += [{"source": "S", "engine": "megatron", "metric": "TFLOP/s per GPU (hardware)", "error": e} for e in (-0.2, 0.1)]
    rows += [{"source": "S", "engine": "megatron", "metric": "activation GiB (first stage)", "error": 0.04}]
    got = {g["metric"]: g for g in validate.by_group(rows)}
    # time under the measurement promises speed: optimistic; mean -6 %, |.| mean 6 %
    assert got["iteration time s"]["leaning"] == "optimistic"
    assert got["iteration time s"]["mean_error"] == pytest.approx(-0.06) and got["iteration time s"]["cases"] == 2
    # throughput below the measurement on average (-5 %): pessimistic, though one case is over; MAPE (0.2+0.1)/2
    assert got["TFLOP/s per GPU (hardware)"]["leaning"] == "pessimistic"
    assert got["TFLOP/s per GPU (hardware)"]["mape"] == pytest.approx(0.15)
    assert got["activation GiB (first stage)"]["leaning"] == "pessimistic"  # more memory than measured: safe side


def test_megatron_core_h100_strong_scaling_falls_as_published():
    """megatron-core 0.16.1's README (its sdist; "Strong Scaling Results"): GPT-3 175B with a 131,072
    vocabulary, 4,096-token sequences and a batch of 1,152 throughout, the DP, TP and PP overlaps on,
    from 96 to 4,608 H100s: MFU 47 % -> 42 % (x0.894), "communication becomes more exposed". Its
    layouts are in an image the sdist lacks, so this takes the planner's fastest Megatron layout at
    each size with --tp-comm-overlap on, as published: 56.0 % -> 50.8 % (x0.907). The fall is the
    mechanisms' (the bubble of 24 micro-batches, the DP collectives each interleaved chunk starts on
    its own, the slowest of 4,608 ranks); the level is ~20 % optimistic (docs/accuracy.md). Without the
    chunks' own DP windows (timing.chunked_sync_exposed_s) the fall was x0.80."""
    from planner import api

    model = {"layers": 96, "hidden": 12288, "heads": 96, "kv_heads": 96, "ffn": 49152, "ffn_kind": "gelu",
             "vocab": 131072}
    training = {"gbs": 1152, "seq_len": 4096, "engine": "megatron", "tp_comm_overlap": True}
    mfu = [api.recommend(model, {"gpu": "h100-sxm", "gpus": gpus}, training, top=1).layouts[0]["throughput"]["mfu"]
           for gpus in (96, 4608)]
    assert mfu[1] / mfu[0] == pytest.approx(42 / 47, rel=0.04)


def test_nemotron4_340b_iteration_time_follows_its_batch_ramp():
    """Nemotron-4 340B (NVIDIA 2024, arXiv:2406.11704, Table 2; not in published_runs.json): tp 8 x
    pp 12 on H100s, 4,096-token sequences, dp 16 / 32 / 64 with batches of 768 / 1,536 / 2,304:
    10.3, 10.3 and 8.0 s an iteration. Doubling both the GPUs and the batch keeps the time (the
    same micro-batches per pipeline, one more DP level); the third stage's 36 micro-batches a
    pipeline instead of 48 and the DP collectives over 64 ranks give 8.0 / 10.3 = 0.777. The
    report gives no interleaving depth: with vpp 2 the planner's ratios are 1.005 and 0.790. Its
    level (within the +-25 % step band at vpp 1 and 2) is in docs/accuracy.md: +7 % at vpp 1, -5 % at 2."""
    from planner import api

    model = {"layers": 96, "hidden": 18432, "heads": 96, "kv_heads": 8, "ffn": 73728, "ffn_kind": "gelu",
             "vocab": 256000}  # squared ReLU: two matrices, as gelu's

    def step_s(gpus, dp, gbs, vpp):
        r = api.estimate(model, {"gpu": "h100-sxm", "gpus": gpus}, {"gbs": gbs, "seq_len": 4096, "engine": "megatron"},
                         {"tp": 8, "pp": 12, "dp": dp, "vpp": vpp, "zero": 1, "mbs": 1, "sequence_parallel": True})
        return r.record["time"]["step_s"]

    for vpp in (1, 2):
        t = [step_s(1536, 16, 768, vpp), step_s(3072, 32, 1536, vpp), step_s(6144, 64, 2304, vpp)]
        assert t[1] / t[0] == pytest.approx(10.3 / 10.3, rel=0.02)
        assert t[2] / t[0] == pytest.approx(8.0 / 10.3, rel=0.06)
        for got, published in zip(t, (10.3, 10.3, 8.0)):
            assert abs(got / published - 1) < 0.25
