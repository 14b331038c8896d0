"""The harness's launcher: real torchrun and DeepSpeed launcher runs whose failures are results.

Each case starts 2 gloo ranks of calibrate/harness/_selftest_worker.py (an all-reduce, or a failure on rank
1 as told) the way users start training, and checks what comes back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from calibrate.harness.launch import launch

pytestmark = pytest.mark.slow


def _alive(pattern: str) -> list:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return out.stdout.split()


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_ranks_report_through_the_launcher(launcher):
    o = launch("calibrate.harness._selftest_worker", ["ok"], nproc=2, timeout_s=120, launcher=launcher,
               env={"DS_ACCELERATOR": "cpu"})
    assert o.status == "ok" and o.returncode == 0, o.log_tail
    assert [r["rank"] for r in o.ranks] == [0, 1]
    assert o.ranks[0]["sum"] == [3.0] * 4  # all_reduce of rank+1 over 2 ranks: 1 + 2
    assert o.ranks[0]["pid"] != o.ranks[1]["pid"]


@pytest.mark.parametrize("mode, status", [("crash", "crash"), ("oom", "oom")])
def test_a_failing_rank_is_a_recorded_result(mode, status):
    o = launch("calibrate.harness._selftest_worker", [mode], nproc=2, timeout_s=120)
    assert o.status == status and o.returncode not in (0, None)
    assert o.error == {"crash": "RuntimeError: rank 1 fails on purpose",
                       "oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1 GiB (simulated)"}[mode]
    assert not _alive(f"_selftest_worker {mode}")


def test_a_hung_rank_times_out_and_leaves_no_process():
    o = launch("calibrate.harness._selftest_worker", ["hang"], nproc=2, timeout_s=8)  # timed out, started or not
    assert o.status == "timeout" and o.returncode is None and o.ranks == []
    assert not _alive("_selftest_worker hang")  # launcher and both ranks are gone


DRIVER = """import sys
from calibrate.harness import cli, record
# `calibrate run` whose one case is the self-test worker hanging under DeepSpeed's launcher
cli.collect = lambda *a: [record.Case("selftest/hang", "memory", {}, dict, lambda ranks: {},
    module="calibrate.harness._selftest_worker", args=["hang", sys.argv[2]], launcher="deepspeed", timeout_s=120)]
sys.exit(cli.main(["run", sys.argv[1], "--gpu", "cpu"]))
"""


def test_sigterm_to_calibrate_run_leaves_no_process(tmp_path):
    """SIGTERM (a scheduler's cancel, `timeout`) reaches only `calibrate run`: its handler kills the
    DeepSpeed launcher and both ranks, in a session of their own, and exits 128 + 15."""
    tag = f"sigterm-{os.getpid()}"  # ours alone, whatever else runs the self-test now
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, str(driver), str(tmp_path / "p.json"), tag], cwd=root, text=True,
                            env={**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(root)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while len(_alive(f"hang {tag}")) < 4:  # the runner, its launch.py, two ranks
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM and "calibrate: terminated" in err, err
    deadline = time.monotonic() + 5  # a rank signalled with its group may take a moment to exit
    while _alive(f"hang {tag}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(f"hang {tag}")
    assert not (tmp_path / "p.json").exists()  # the case never finished: nothing recorded
