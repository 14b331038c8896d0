"""The launch files `--emit` writes start their engine: launch.sh run as a user runs it, on 2 CPU
ranks with gloo, with tests/launch_stub/train.py as the training script. What each rank's engine
reports about itself (DeepSpeed's engine, Accelerate's state) is compared with the layout the
planner wrote, so a launcher line, a ds_config.json or an Accelerate YAML that the engine reads
otherwise fails here."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from planner import cli

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
STUB = ROOT / "tests" / "launch_stub" / "train.py"


def emit(tmp_path: Path, *argv) -> dict:
    out = io.StringIO()
    assert cli.main(["estimate", "--params", "1e8", "--gpus", "2", *argv, "--emit", str(tmp_path / "out"), "--json"],
                    out=out) == 0
    return json.loads(out.getvalue())


def launch(tmp_path: Path, launcher: str) -> list[dict]:
    """bash launch.sh with LAUNCHER and TRAIN_SCRIPT set, as its usage line says; each rank's report."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    reports = tmp_path / "reports"
    reports.mkdir()
    bindir = str(Path(sys.executable).parent)  # the deepspeed / accelerate console scripts of this Python
    env = {**os.environ, "LAUNCHER": launcher, "TRAIN_SCRIPT": str(STUB), "MASTER_PORT": str(port),
           "STUB_OUT": str(reports), "DS_ACCELERATOR": "cpu", "PATH": bindir + os.pathsep + os.environ["PATH"],
           "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", str(tmp_path / "out" / "launch.sh")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    return [json.loads((reports / f"rank{r}.json").read_text()) for r in range(2)]


def test_deepspeed_launcher_starts_the_zero_layout_as_planned(tmp_path):
    d = emit(tmp_path, "--engine", "deepspeed", "--zero", "2", "--mbs", "1", "--gbs", "4")
    lay = d["layout"]
    assert (lay["dp"], lay["zero"], lay["mbs"], lay["gas"]) == (2, 2, 1, 2)
    for rank in launch(tmp_path, "deepspeed"):
        # DeepSpeedEngine's own accessors: 2 ranks, ZeRO-2, 1 x 2 micro-batches of 4 a step, bf16
        assert rank["world"] == 2 and rank["engine"] == "DeepSpeedEngine" and rank["zero"] == 2 and rank["bf16"]
        assert (rank["micro_batch"], rank["gas"], rank["train_batch"]) == (1, 2, 4)
        assert rank["steps"] == 1


def test_deepspeed_launcher_starts_the_pipeline_layout_as_planned(tmp_path):
    d = emit(tmp_path, "--engine", "deepspeed", "--pp", "2", "--zero", "1", "--mbs", "1", "--gbs", "4")
    lay = d["layout"]
    assert (lay["pp"], lay["dp"], lay["gas"]) == (2, 1, 4)
    for rank in launch(tmp_path, "deepspeed"):
        # PipelineEngine: 2 stages of one rank each, 4 micro-batches of 1 a step, ZeRO-1 over DP 1
        assert rank["world"] == 2 and rank["engine"] == "PipelineEngine" and rank["stages"] == 2
        assert (rank["micro_batch"], rank["gas"], rank["train_batch"], rank["zero"]) == (1, 4, 4, 1)
        assert rank["steps"] == 1


def test_accelerate_starts_two_fsdp2_ranks_with_the_planned_settings(tmp_path):
    emit(tmp_path, "--engine", "fsdp", "--zero", "3", "--mbs", "1", "--gbs", "2")
    for rank in launch(tmp_path, "accelerate"):
        env = rank["env"]
        # what Accelerate 1.16's FullyShardedDataParallelPlugin reads in the rank: FSDP2, FULL_SHARD
        # (ZeRO-3) resharding after forward, bf16 autocast
        assert rank["world"] == 2 and env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
        assert env["FSDP_SHARDING_STRATEGY"] == "FULL_SHARD" and env["FSDP_RESHARD_AFTER_FORWARD"] == "true"
        assert env["ACCELERATE_MIXED_PRECISION"] == "bf16" and env["FSDP_OFFLOAD_PARAMS"] == "false"


def test_accelerate_starts_two_deepspeed_ranks_with_the_emitted_config(tmp_path):
    emit(tmp_path, "--engine", "deepspeed", "--zero", "3", "--mbs", "1", "--gbs", "4")
    ds_config = tmp_path / "out" / "ds_config.json"
    for rank in launch(tmp_path, "accelerate"):
        env = rank["env"]
        # DeepSpeedPlugin reads the config file named here; zero.Init for ZeRO-3 (zero3_init_flag)
        assert rank["world"] == 2 and env["ACCELERATE_USE_DEEPSPEED"] == "true"
        assert Path(env["ACCELERATE_DEEPSPEED_CONFIG_FILE"]) == ds_config
        assert env["ACCELERATE_DEEPSPEED_ZERO3_INIT"] == "true"
