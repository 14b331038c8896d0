"""planner.pipeline.microbatches_in_flight against PyTorch's own pipelining engine, measured.

One torchrun launch of calibrate/engines/torch_pipe_worker.py on 2 gloo ranks (pp = 2) runs ScheduleGPipe,
Schedule1F1B and ScheduleInterleaved1F1B (2 chunks per rank) with m = 4 and 8 micro-batches over 16
MLP blocks, and each rank reports (see the worker's docstring):
  held_max    the engine's own count: the most fwd_cache entries (forwards awaiting their backward)
              its stages held at once, each chunk weighted by its share of the rank's layers;
  peak_bytes  the allocator's peak during one schedule.step(), and unit_bytes, what one micro-batch
              leaves on the rank's layers (saved tensors + the chunk output the stage keeps).
In flight from memory = (peak - peak of GPipe with m = 1) / unit + 1: the m = 1 run holds one
micro-batch plus the same backward transient (two 128 W-per-token gradients of one block), which
the difference cancels.

Tolerance: the memory count exceeds the micro-batch count only by tensors at stage boundaries, each
TOKENS x W, 1/1032 of a micro-batch (the worker's 8 blocks x 129 W per token): the received input's
gradient, which stays in the receive buffer's .grad until the next step (stage.py
clear_runtime_states), the output sent on (ScheduleInterleaved1F1B's runtime waits for its sends at
the end of the step) and the last stage's loss temporaries; at most 3 per chunk and micro-batch,
3 x 2 x 8 / 1032 = 0.047 at m = 8, interleaved. Measured excess: at most 0.025 (rank 1, interleaved,
m = 8). ABS = 0.05 micro-batch; any term 10x wrong misses by at least 1.
Run: DS_ACCELERATOR=cpu python -m pytest -q -p no:cacheprovider tests/test_torch_pipelining_real.py
"""

from __future__ import annotations

import json

import pytest

from calibrate.harness.launch import launch
from planner.options import Schedule
from planner.pipeline import microbatches_in_flight, p2p_buffers

pytestmark = pytest.mark.slow
ABS = 0.05  # micro-batches; derivation in the module docstring
SCHEDULES = {"gpipe": Schedule.GPIPE, "1f1b": Schedule.ONE_F_ONE_B, "interleaved": Schedule.INTERLEAVED}


@pytest.fixture(scope="module")
def measured_runs():
    """{(schedule, m, stage): the worker's record} for both ranks, from one torchrun launch."""
    out = launch("calibrate.engines.torch_pipe_worker", [json.dumps({"ms": [4, 8]})], nproc=2, timeout_s=240)
    assert out.status == "ok" and len(out.ranks) == 2, out.to_json()
    return {(x["schedule"], x["m"], r["rank"]): x for r in out.ranks for x in r["runs"]}


@pytest.fixture(scope="module")
def measured(measured_runs):
    """{(schedule, m, stage): (held_max, in flight from memory)} for both ranks."""
    table = {}
    for stage in (0, 1):
        ref = measured_runs["gpipe", 1, stage]
        assert ref["held_max"] == 1.0
        for (schedule, m, rank), x in measured_runs.items():
            if rank == stage:
                table[schedule, m, rank] = (x["held_max"], (x["peak_bytes"] - ref["peak_bytes"]) / x["unit_bytes"] + 1)
    return table


def planner(schedule: str, m: int, stage: int) -> float:
    vpp = 2 if schedule == "interleaved" else 1
    return float(microbatches_in_flight(2, vpp, m, SCHEDULES[schedule], stage))


# What the engine did (torch 2.13), memory-derived value in parentheses:
#   GPipe         stage 0: 4 (4.000), 8 (8.000)   stage 1: 4 (4.003), 8 (8.007)   all m forwards first
#   1F1B          stage 0: 2 (2.001), 2 (2.001)   stage 1: 1 (1.004), 1 (1.008)
#                 Schedule1F1B._step_microbatches: warmup_chunks = min(m, num_stages - stage_index)
#                 forwards, then backward-then-forward, so the peak is p - i
#   interleaved   stage 0: 2.5 (2.505, 2.517)     stage 1: 1.5 (1.510, 1.525)  in the rank's layers:
#                 5 and 3 chunks of half of them; ScheduleInterleaved1F1B._calculate_single_rank_operations
#                 with _get_warmup_ops: (v - 1) x microbatches_per_round + 2 (p - 1 - i) = 2 + 2 (1 - i)
#                 = 4, 2 warm-up forwards (microbatches_per_round = m // (m // p) = 2 for m = 4 and 8),
#                 then _get_1f1b_rank_ops appends each 1F1B step's forward before its backward: 5, 3.
@pytest.mark.parametrize("m", [4, 8])
@pytest.mark.parametrize("stage", [0, 1])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_in_flight_matches_engine(measured, schedule, m, stage):
    held, from_memory = measured[schedule, m, stage]
    # the engine's count and the allocator agree: its fwd_cache entries are what memory holds
    assert from_memory == pytest.approx(held, abs=ABS)
    assert planner(schedule, m, stage) == pytest.approx(from_memory, abs=ABS)
    assert planner(schedule, m, stage) == held  # e.g. interleaved stage 0: 5 chunks / 2 = 2.5


@pytest.mark.parametrize("m", [4, 8])
@pytest.mark.parametrize("stage", [0, 1])
def test_schedule_differences(measured, m, stage):
    """Differences between schedules on one rank, where every constant transient cancels."""
    gpipe, one_f, inter = (measured[s, m, stage][1] for s in SCHEDULES)
    # m = 4: stage 0 GPipe 4 - 1F1B 2 = 2, stage 1 4 - 1 = 3; m = 8: 8 - 2 = 6, 8 - 1 = 7
    assert planner("gpipe", m, stage) - planner("1f1b", m, stage) == pytest.approx(gpipe - one_f, abs=ABS)
    # interleaved - 1F1B: stage 0 2.5 - 2 = 0.5, stage 1 1.5 - 1 = 0.5 (half a micro-batch more)
    assert planner("interleaved", m, stage) - planner("1f1b", m, stage) == pytest.approx(inter - one_f, abs=ABS)


@pytest.mark.parametrize("m", [4, 8])
@pytest.mark.parametrize("stage", [0, 1])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_p2p_buffers_match_engine(measured_runs, schedule, m, stage):
    """What the stages keep for point-to-point transfers after a step, walked on their own receive
    infos (buffers and any .grad on them), in stage-boundary tensors (TOKENS x W fp32 = 8 KiB
    each). GPipe and 1F1B: stage 0 only receives gradients, m; stage 1 only activations, m.
    Interleaved (chunks 0 and 2 on rank 0, 1 and 3 on rank 1): rank 0 m gradient buffers for chunk
    0 and 2m for chunk 2, 3m; rank 1 2m for chunk 1 and m activation buffers for chunk 3, 3m. The
    received inputs carry no .grad after the step (the engine's backward does not accumulate into
    them), so nothing more is held."""
    x = measured_runs[schedule, m, stage]
    counted = x["p2p_bytes"] / x["boundary_bytes"]
    vpp = 2 if schedule == "interleaved" else 1
    assert counted == (3 * m if schedule == "interleaved" else m)  # 12 / 24 interleaved, 4 / 8 otherwise
    assert float(p2p_buffers(2, vpp, m, SCHEDULES[schedule], stage)) == counted
