"""DeepSpeed's bf16 optimizer wrappers on 2 gloo ranks, started by DeepSpeed's own launcher
(calibrate/engines/deepspeed_worker.py: the first two below, in one launch) and by torchrun
(calibrate/engines/deepspeed_pipe_worker.py: the third), against the planner. P = 158,016 parameters, D = 2.

- bf16 + ZeRO-1 + data_types.grad_accum_dtype fp32 -> BF16_Optimizer (engine.py
  _do_optimizer_sanity_check): bf16 weights 2, bf16 param.grad 2, the full fp32 accumulation buffer
  4, fp32 master and Adam states partitioned 12/D: 14 B/param before step() at D = 2, where ZeRO-1's
  own optimizer holds 2 + 2 + 12/D = 10.
- bf16 + ZeRO disabled under the pipeline engine (2 stages, one rank each, 4 micro-batches) ->
  BF16_Optimizer accumulating in bf16: after every backward of the schedule 2 (weights) + 2
  (param.grad) + 2 (accumulation buffer) + 12 (master and states, D = 1) = 18 B per stage parameter.
- bf16 + ZeRO disabled, no pipeline -> FP16_UnfusedOptimizer over bf16 (DDP_BFLOAT16): bf16 weights
  and grads 2 + 2, fp32 master and states whole 12: 16 B/param.
"""

from __future__ import annotations

import io
import os

import pytest

from calibrate.engines.deepspeed_cases import SCALARS_BYTES, cases
from calibrate.harness.record import run_case, run_together
from planner import cli

pytestmark = pytest.mark.slow
P, D = 158_016, 2
BF16, UNFUSED, PIPE = ("deepspeed/bf16-optimizer/zero1-fp32-accum", "deepspeed/fp16-unfused/zero0-bf16",
                       "deepspeed/pipe/bf16-optimizer-zero0")


def _why(record) -> str:
    """A failed run's status, error and the end of its log (pytest truncates the outcome's repr)."""
    out = record["outcome"]
    return f"{out['status']} (returncode {out.get('returncode')}): {out.get('error', '')}\n{out.get('log_tail', '')[-3000:]}"


@pytest.fixture(scope="module")
def records():
    """The harness's cases of these three (calibrate/engines/deepspeed_cases.py, its predictions and
    reductions; its two offload cases are tests/test_deepspeed_offload_real.py's rows): the two of
    deepspeed_worker.py one after the other in one launch (an engine of its own each), the pipeline's alone."""
    harness = {c.name: c for c in cases("cpu")}
    return {r["name"]: r for r in run_together([harness[BF16], harness[UNFUSED]]) + [run_case(harness[PIPE])]}


def test_bf16_optimizer_with_fp32_accumulation(records):
    r = records[BF16]
    assert r["outcome"]["status"] == "ok", _why(r)
    m = r["measurement"]
    assert m["optimizer_class"] == "BF16_Optimizer"
    assert 0 <= m["model_state_bytes"] - (2 + 2 + 4 + 12 / D) * P <= SCALARS_BYTES  # 14 P
    assert r["prediction"]["model_state_bytes"] == (2 + 2 + 4 + 12 / D) * P


def test_zero_disabled_bf16_keeps_whole_fp32_master(records):
    r = records[UNFUSED]
    assert r["outcome"]["status"] == "ok", _why(r)
    m = r["measurement"]
    assert m["optimizer_class"] == "FP16_UnfusedOptimizer"
    assert 0 <= m["model_state_bytes"] - 16 * P <= SCALARS_BYTES
    assert r["prediction"]["model_state_bytes"] == 16 * P


def test_pipeline_without_zero_holds_bf16_optimizer_gradients_through_the_schedule(records):
    r = records[PIPE]
    assert r["outcome"]["status"] == "ok", _why(r)
    m = r["measurement"]
    assert m["optimizer_class"] == "BF16_Optimizer"
    assert m["model_state_bytes_per_param"] == pytest.approx(18.0, abs=1e-3)  # 0-d scalars apart
    assert r["prediction"]["model_state_bytes_per_param"] == pytest.approx(18.0, rel=1e-12)


_INIT_ONE_RANK = """
import os, socket, sys, torch, deepspeed
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
deepspeed.init_distributed(dist_backend="gloo")
for zero in map(int, sys.argv[1:]):  # a fresh model and engine each
    model = torch.nn.Linear(8, 8)
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
           "data_types": {"grad_accum_dtype": "fp32"}, "zero_optimization": {"stage": zero}}
    try:
        deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()), config=cfg)
        print("ACCEPTED", zero, flush=True)
    except NotImplementedError as exc:
        print("REFUSED", zero, exc, flush=True)
"""


@pytest.fixture(scope="module")
def deepspeed_says():
    """{ZeRO stage: DeepSpeed's verdict} from one process of one rank: stage 0 first, where nothing else
    was initialized, then stage 1 with a model and engine of its own."""
    import subprocess
    import sys

    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    run = subprocess.run([sys.executable, "-c", _INIT_ONE_RANK, "0", "1"], capture_output=True, text=True,
                         timeout=300, env=env)
    verdicts = {int(line.split()[1]): line.split()[0] for line in run.stdout.splitlines()
                if line.split()[:1] in (["ACCEPTED"], ["REFUSED"])}
    assert sorted(verdicts) == [0, 1], (run.stdout[-3000:], run.stderr[-3000:])
    return verdicts


@pytest.mark.parametrize("zero", [0, 1])
def test_fp32_accumulation_without_zero_is_refused_like_deepspeed_refuses_it(deepspeed_says, zero):
    import sys

    out, err = io.StringIO(), io.StringIO()
    old, sys.stderr = sys.stderr, err
    try:
        code = cli.main(["estimate", "--model", "llama-3-8b", "--gpus", "8", "--zero", str(zero), "--fp32-grad-accum"],
                        out=out)
    finally:
        sys.stderr = old
    # DeepSpeed 0.19: ZeRO off -> NotImplementedError("unsupported mix ..."); ZeRO-1 -> BF16_Optimizer
    assert deepspeed_says[zero] == ("REFUSED" if zero == 0 else "ACCEPTED")
    assert code == (2 if zero == 0 else 0)
    if zero == 0:
        assert err.getvalue().startswith("planner: error: --fp32-grad-accum")
