"""Megatron's loss on its vocab-parallel logits: the bytes per logit the planner books against the peak
megatron-core's own loss reaches on the CPU.

The reference, data/references/megatron_loss_cpu.json, is python -m calibrate.engines.megatron_loss:
megatron-core 0.16.1's fused (native) and unfused vocab-parallel cross entropy after a bf16 output-
layer GEMM, forward and backward, the peak of live bytes over the logits' count. The unfused one
holds the bf16 logits and their fp32 copy (2 + 4 B), which it turns into the saved softmax in place;
the fused one, which the planner's Megatron export runs (--cross-entropy-loss-fusion), 10 B.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner import memory
from planner.engines.megatron.export import megatron_args
from planner.export import normalise_row
from planner.layout import Training
from planner.model import lookup

REFERENCE = Path(__file__).resolve().parent.parent / "data" / "references" / "megatron_loss_cpu.json"
ROWS = json.loads(REFERENCE.read_text())["rows"]


def test_reference_is_megatron_cores_own_loss():
    assert json.loads(REFERENCE.read_text())["environment"]["megatron-core"] == "0.16.1"
    assert len(ROWS) == 2


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r["name"])
def test_the_booked_bytes_per_logit_are_the_fused_loss_peak(row):
    booked = memory.coefficients("memory")["logits_bytes_per_element"]
    assert booked == pytest.approx(row["fused_native_bytes_per_logit"], abs=0.05)  # 10.0 measured
    assert row["unfused_bytes_per_logit"] == pytest.approx(2 + 4, abs=0.05)  # what the export avoids


def test_the_megatron_export_runs_the_fused_loss():
    row = normalise_row({"tp": 1, "pp": 1, "dp": 8, "zero": 1, "mbs": 1, "gas": 1})
    args = megatron_args(lookup("llama-3-8b"), Training(engine="megatron", seq_len=4096), row)
    assert "--cross-entropy-loss-fusion" in args


@pytest.mark.slow
def test_megatron_core_loss_peaks_as_recorded():
    """The count itself, on the installed megatron-core (a test extra; one process, a few seconds)."""
    from calibrate.engines.megatron_loss import measure

    for got, want in zip(measure(), ROWS):
        for key in ("unfused_bytes_per_logit", "fused_native_bytes_per_logit"):
            assert got[key] == pytest.approx(want[key], abs=0.02), (want["name"], key)
