"""Peak memory of whole training steps: the optimizer's own step temporaries (measured here on the
CPU) and the planner's allocated peak against end-to-end steps measured on an NVIDIA H200
(data/calibration/h200.json, `python -m calibrate run h200`: calibrate/engines/step_cases.py ran
calibrate/engines/step_worker.py, FSDP2 and DeepSpeed ZeRO-1 on transformers Llamas of published shapes,
torch.cuda.max_memory_allocated after the first step)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from calibrate.engines.deepspeed_worker import LLAMA
from planner.stage import Stage

PROFILE = Path(__file__).resolve().parent.parent / "data" / "calibration" / "h200.json"
GiB = 2**30


def _llama_params():
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    params = list(model.parameters())
    for p in params:
        p.grad = torch.ones_like(p)
    return params


@pytest.mark.parametrize("foreach,fused", [(True, False), (False, True)])
def test_adamw_step_temporary(foreach, fused):
    """torch AdamW's step beyond its states (torch.profiler allocation events, states created by a
    first step): foreach, CUDA's default, allocates sqrt(exp_avg_sq) of every parameter at once
    (optim/adam.py _multi_tensor_adam: torch._foreach_sqrt), 4 B x all parameters; fused none. The
    planner books the first for FSDP (torch.optim.AdamW as its recipes build it) and nothing for
    torchtitan (fused by default) or DeepSpeed (FusedAdam)."""
    from calibrate.benches.saved import transient_peak_bytes
    from planner import layout, states
    from planner.hf_config import from_hf_config

    params = _llama_params()
    n = sum(p.numel() for p in params)  # 158,016: the real module's parameters
    opt = torch.optim.AdamW(params, lr=1e-3, foreach=foreach, fused=fused)
    opt.step()
    peak = transient_peak_bytes(opt.step)
    scalars = 64  # 0-d bias-correction and step tensors (12 B measured)
    model = from_hf_config({**LLAMA, "model_type": "llama"})
    engine = "fsdp" if foreach else "torchtitan"
    planned = states.optimizer_step_copy_bytes(Stage(model, layout.Training(seq_len=16, engine=engine), layout.single(dp=1, zero=3), 0))[0]
    if foreach:
        assert 4 * n <= peak <= 4 * n + scalars  # 4 x 158,016 = 632,064
        assert planned == 4 * n
    else:
        assert peak <= scalars
        assert planned == 0


def _step_runs():
    doc = json.loads(PROFILE.read_text())
    return {r["name"]: r for r in doc["runs"] if r["kind"] == "step_time" and r["outcome"]["status"] == "ok"}


def _predicted(record: dict) -> dict:
    from calibrate.engines.step_cases import prediction

    c = record["config"]
    return prediction(c["engine"], c["llama"], c["zero"], c["mbs"], c["seq"], c["checkpointing"], c["layout"]["dp"],
                      c["gpu"])


def test_h200_profile_has_the_end_to_end_runs():
    names = set(_step_runs())
    assert {"step/fsdp/tinyllama-1.1b/mbs4-seq2048", "step/fsdp/tinyllama-1.1b/mbs4-seq2048-checkpointed",
            "step/fsdp/smollm-135m/mbs1-seq1024", "step/deepspeed/tinyllama-1.1b/zero1-mbs4-seq2048"} <= names


def test_fsdp_backward_starts_without_gradients():
    """TinyLlama-1.1B, FSDP2 on one H200, mbs 4 x 2048, no checkpointing: measured allocated peak
    32.52 GB (30.29 GiB). The step's zero_grad(set_to_none=True) freed the gradients, so backward
    starts with every activation (14.76 GiB) and the logits' fp32 (2.93 GiB) and no gradient: 12.29
    GiB fp32 master + Adam, 0.78 GiB of FSDP buffers, + 17.69 = 30.76 GiB. Holding the 4.10 GiB of
    fp32 gradients beside them as well (the planner before) read 34.86 GiB, 15 % over."""
    run = _step_runs()["step/fsdp/tinyllama-1.1b/mbs4-seq2048"]
    measured, predicted = run["measurement"]["allocated_peak_bytes"], _predicted(run)["allocated_peak_bytes"]
    assert 30.0 * GiB < measured < 30.6 * GiB
    assert abs(predicted / measured - 1) < 0.03


def test_fsdp_checkpointed_peak_is_the_foreach_step():
    """Same model with Hugging Face gradient checkpointing: measured 22.07 GB (20.55 GiB), at the
    optimizer step: master + Adam 12.29 GiB, fp32 gradients 4.10, foreach AdamW's sqrt(exp_avg_sq)
    4.10 = 20.49 GiB. Without the foreach temporary the peak would be 16.39 GiB (20 % under)."""
    run = _step_runs()["step/fsdp/tinyllama-1.1b/mbs4-seq2048-checkpointed"]
    measured, predicted = run["measurement"]["allocated_peak_bytes"], _predicted(run)["allocated_peak_bytes"]
    assert abs(predicted / measured - 1) < 0.03


@pytest.mark.parametrize("name", ["step/fsdp/smollm-135m/mbs1-seq1024",
                                  "step/deepspeed/tinyllama-1.1b/zero1-mbs4-seq2048"])
def test_allocated_peak_of_the_other_steps(name):
    """SmolLM-135M under FSDP2 (3.15 GB measured) and TinyLlama under DeepSpeed ZeRO-1 (34.46 GB,
    32.09 GiB; zero_grad frees its 16-bit gradients after the step too, and _release_ipg_buffers its
    reduce buckets: 2.05 GiB and 5e8 x 2 B = 0.93 GiB not held at backward's start, which the
    planner booked before, 35.01 GiB)."""
    run = _step_runs()[name]
    assert abs(_predicted(run)["allocated_peak_bytes"] / run["measurement"]["allocated_peak_bytes"] - 1) < 0.02


def test_h200_reserve_fitted_on_the_steps():
    """The caching allocator's reserve on real steps is far above the 5 % it was first assumed to be:
    reserved/allocated measured 1.17-1.22 (38.42 / 32.52 GB, 25.89 / 22.07, 3.84 / 3.15, 41.25 /
    34.46). The profile's fit takes it from these runs and predicts each held-out one within 5 %."""
    doc = json.loads(PROFILE.read_text())
    fit = doc["fit"]
    assert 0.15 < fit["coefficients"]["memory"]["allocator_fragmentation"]["value"] < 0.25
    err = fit["error"]["step_time.reserved_peak_bytes"]
    assert err["after_max"] < 0.05
    for run in _step_runs().values():
        m = run["measurement"]
        assert 1.15 < m["reserved_peak_bytes"] / m["allocated_peak_bytes"] < 1.25


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["fsdp", "deepspeed"])
def test_step_worker_runs_on_cpu(engine):
    """The end-to-end instrument (calibrate/engines/step_worker.py) under its own launcher on one gloo rank:
    it builds the real module (158,016 parameters: the tiny Llama of calibrate/engines/deepspeed_worker.py),
    times steps and the three phases. On a CPU there is no allocator peak to read (a GPU profile's)."""
    from calibrate.harness.launch import launch

    cfg = {"engine": engine, "llama": LLAMA, "zero": 3 if engine == "fsdp" else 1, "mbs": 2, "seq": 16,
           "checkpointing": True, "warmup": 1, "steps": 2}
    if engine == "deepspeed":  # torch's AdamW: DeepSpeed's CPU Adam would be compiled first
        cfg["ds"] = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}}
    out = launch("calibrate.engines.step_worker", [json.dumps(cfg)], 1, 240,
                 "deepspeed" if engine == "deepspeed" else "torchrun", env={"DS_ACCELERATOR": "cpu"} if engine == "deepspeed" else {})
    assert out.status == "ok", out.error
    (rank,) = out.ranks
    assert rank["params"] == 158_016
    assert len(rank["step_s_all"]) == 3 and rank["step_s"] > 0
    assert all(rank[k] > 0 for k in ("forward_s", "backward_s", "optimizer_s"))
    assert "allocated_peak_bytes" not in rank
