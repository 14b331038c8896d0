"""The harness's launcher: real torchrun and DeepSpeed launcher runs whose failures are results.

Each case starts 2 gloo ranks of calibrate/_selftest_worker.py (an all-reduce, or a failure on rank
1 as told) the way users start training, and checks what comes back."""

from __future__ import annotations

import subprocess

import pytest

from calibrate.launch import launch

pytestmark = pytest.mark.slow


def _alive(pattern: str) -> list:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return out.stdout.split()


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_ranks_report_through_the_launcher(launcher):
    o = launch("calibrate._selftest_worker", ["ok"], nproc=2, timeout_s=120, launcher=launcher,
               env={"DS_ACCELERATOR": "cpu"})
    assert o.status == "ok" and o.returncode == 0, o.log_tail
    assert [r["rank"] for r in o.ranks] == [0, 1]
    assert o.ranks[0]["sum"] == [3.0] * 4  # all_reduce of rank+1 over 2 ranks: 1 + 2
    assert o.ranks[0]["pid"] != o.ranks[1]["pid"]


@pytest.mark.parametrize("mode, status", [("crash", "crash"), ("oom", "oom")])
def test_a_failing_rank_is_a_recorded_result(mode, status):
    o = launch("calibrate._selftest_worker", [mode], nproc=2, timeout_s=120)
    assert o.status == status and o.returncode not in (0, None)
    assert o.error == {"crash": "RuntimeError: rank 1 fails on purpose",
                       "oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1 GiB (simulated)"}[mode]
    assert not _alive(f"_selftest_worker {mode}")


def test_a_hung_rank_times_out_and_leaves_no_process():
    o = launch("calibrate._selftest_worker", ["hang"], nproc=2, timeout_s=20)
    assert o.status == "timeout" and o.returncode is None and o.ranks == []
    assert not _alive("_selftest_worker hang")  # launcher and both ranks are gone
