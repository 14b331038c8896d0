"""ZeRO-Offload's bytes on the GPU and on the host against DeepSpeed's own engine.

The reference, data/references/deepspeed_offload_cpu.json, is python -m calibrate.engines.deepspeed_offload:
DeepSpeed 0.19.8 on 2 gloo ranks, the 2-layer Llama of calibrate/engines/deepspeed_worker.py (158,016
parameters: 79,008 a rank; its largest tensors, embed_tokens and lm_head, 512 x 64 = 32,768), bf16,
reduce bucket 4,096, the optimizer offloaded to the CPU (torch's AdamW, not DeepSpeedCPUAdam: the same
fp32 states), and two rows without offload (ZeRO-2/3 accumulating in fp32, "-gpu"). Each rank counted every distinct storage the engine holds, by the attribute it is
held under, after each micro-batch's backward of the second step and after its step().

On the CPU accelerator the GPU and the host are one memory, so each attribute is sorted by where
DeepSpeed 0.19.8 allocates it (calibrate/engines/deepspeed_offload.py DEVICE, BUCKETS, HOST, each with the
line of DeepSpeed's source that decides); an attribute of more than a few bytes that is in none of
them fails the test, so a new buffer is noticed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate.engines.deepspeed_offload import prediction, split
from planner import layout, memory, states
from planner.stage import Stage

REFERENCE = Path(__file__).resolve().parent.parent / "data" / "references" / "deepspeed_offload_cpu.json"
ROWS = {row["name"]: row for row in json.loads(REFERENCE.read_text())["rows"]}
PARAMS, RANKS, LARGEST = 158_016, 2, 512 * 64

SCALAR_BYTES = 64  # step counters, the global norm, the inf/NaN flag
# a 0-d fp64 norm per parameter of the partition (stage_1_and_2.py set_norm_for_param_grad_in_gpu):
# at most 8 x the model's 21 tensors
NORMS, NORMS_BYTES = "optimizer.norm_for_param_grads[]", 8 * 21


def _split(row: dict, held: dict) -> dict:
    parts = split(held, row["offload_param"], row["offload_optimizer"])
    for key, nbytes in parts.pop("unknown").items():
        limit = NORMS_BYTES if key.rsplit(":", 1)[0] == NORMS else SCALAR_BYTES
        assert nbytes <= limit, \
            f"{row['name']}: {key} ({nbytes} B) is held nowhere calibrate/engines/deepspeed_offload.py knows"
    return parts


def _measured(row: dict) -> dict:
    """{moment: {device, buckets, host}}, the larger rank's bytes of each."""
    moments = [m["moment"] for m in row["ranks"][0]]
    return {name: {k: max(_split(row, rank[i]["held"])[k] for rank in row["ranks"]) for k in ("device", "buckets", "host")}
            for i, name in enumerate(moments)}


def _planned(row: dict) -> dict:
    from planner.hf_config import from_hf_config
    from calibrate.engines.deepspeed_worker import LLAMA

    assert from_hf_config({**LLAMA, "model_type": "llama"}).params == PARAMS
    fp32 = row["ds"].get("data_types", {}).get("grad_accum_dtype") == "fp32"
    return prediction(row["zero"], row["gas"], row["offload_param"], fp32, RANKS, row["offload_optimizer"])


def test_reference_is_deepspeeds_own_engine_with_the_offload_asked_for():
    doc = json.loads(REFERENCE.read_text())
    assert doc["environment"]["deepspeed"] == "0.19.8"
    for row in ROWS.values():
        assert row["params"] == PARAMS
        assert row["engine_offload"] == {"optimizer": row["offload_optimizer"], "params": row["offload_param"]}, row["name"]
        assert row["optimizer"] == ("DeepSpeedZeroOptimizer_Stage3" if row["zero"] == 3 else "DeepSpeedZeroOptimizer")


@pytest.mark.parametrize("name", list(ROWS))
def test_host_bytes_are_what_deepspeed_keeps_on_the_cpu(name):
    # e.g. ZeRO-2, gas 2: fp32 partition, its gradient, exp_avg, exp_avg_sq 4 x 4 x 79,008 = 1,264,128,
    # + the 16-bit partition copy 2 x 79,008 + the host staging buffer 2 x 32,768 = 1,487,680,
    # + accumulated_grads_in_cpu, every parameter overlapping the partition whole in 16 bits: 166,144
    row = ROWS[name]
    host = {moment: m["host"] for moment, m in _measured(row).items()}
    assert set(host.values()) == {_planned(row)["host_bytes"]}, host


@pytest.mark.parametrize("name", list(ROWS))
def test_device_bytes_are_what_deepspeed_keeps_on_the_gpu(name):
    row = ROWS[name]
    measured, planned = _measured(row), _planned(row)
    *backward, after = list(measured)
    # between micro-batches: the 16-bit weights (ZeRO-3: their partition), the 65,536-byte staging
    # buffer of ZeRO-1/2 (2 x 32,768), and the gradients (ZeRO-1 whole, ZeRO-2 fp32-accumulating its
    # fp32 partition)
    for moment in backward[:-1]:
        assert measured[moment]["device"] == planned["held_bytes"] + planned["grad_bytes"], moment
    # at the accumulation boundary the gradients the step reads; after the step none, but ZeRO-3's
    # gradient partitions on the GPU: one flat buffer, kept (stage3.py grad_partitions_flat_buffer)
    kept = planned["step_grad_bytes"] if row["zero"] == 3 and not row["offload_optimizer"] else 0
    assert measured[backward[-1]]["device"] - measured[after]["device"] == planned["step_grad_bytes"] - kept or \
        row["name"] == "zero1-gas2-fp32-accum"  # + the grad_accum of params outside the partition, below
    assert measured[after]["device"] == planned["held_bytes"] + kept


@pytest.mark.parametrize("name", ["zero2-gas2-fp32-accum-gpu", "zero3-gas2-fp32-accum-gpu"])
def test_fp32_accumulation_without_offload_keeps_fp32_gradient_partitions(name):
    # bf16 weights, grad_accum_dtype fp32, ZeRO's own optimizer on the GPU: ZeRO-2 its compact fp32
    # partition (averaged_gradients, from the first micro-batch), ZeRO-3 its grad_partitions_flat_buffer
    # in fp32: 4 x 79,008 = 316,032 B, where the planner booked the bf16 partition (2 x, ZeRO-2 twice
    # with its straddle while accumulating)
    row = ROWS[name]
    for moment in row["ranks"][0][:-1]:
        fp32 = {k: v for k, v in moment["held"].items() if k.rsplit(":", 1)[0] in
                ("optimizer.averaged_gradients[][]", "optimizer.grad_partitions_flat_buffer")}
        assert list(fp32.values()) == [4 * PARAMS // RANKS] and all(":float32@" in k for k in fp32), fp32
    assert _planned(row)["grad_bytes"] == 4 * PARAMS / RANKS
    assert _planned(row)["host_bytes"] == 0


def test_staging_buffer_is_the_largest_parameter_on_each_side():
    row = ROWS["zero2-gas1"]
    held = row["ranks"][0][-1]["held"]
    assert held["optimizer.temp_grad_buffer_for_gpu_offload:bfloat16@cpu"] == 2 * LARGEST == 65_536
    assert held["optimizer.temp_grad_buffer_for_cpu_offload:bfloat16@cpu"] == 2 * LARGEST
    assert not any("temp_grad_buffer" in key for key in ROWS["zero3-gas2"]["ranks"][0][-1]["held"])


def test_reduce_buckets_where_the_probe_sees_them():
    # ZeRO-1 keeps its bucket until the accumulation boundary; ZeRO-3 always (stage3.py __init__);
    # with fp32 accumulation ZeRO-1's bucket is fp32: 4,096 x 4
    for name, nbytes in (("zero1-gas2", 4096 * 2), ("zero1-gas2-fp32-accum", 4096 * 4), ("zero3-gas2", 4096 * 2)):
        first = _measured(ROWS[name])["backward 0"]["buckets"]
        assert first == nbytes == _planned(ROWS[name])["bucket_bytes"], name


def test_zero1_fp32_accumulation_leaves_grad_accum_of_other_ranks_parameters_at_the_boundary():
    # not planned: at the boundary ZeRO-1 keeps the fp32 grad_accum of parameters outside the
    # partition (70,656 elements on rank 0) beside averaged_gradients; the moment between micro-batches,
    # with every grad_accum (4 x 158,016), is larger, and it is the one planned
    m = _measured(ROWS["zero1-gas2-fp32-accum"])
    assert m["backward 1"]["device"] < m["backward 0"]["device"] == _planned(ROWS["zero1-gas2-fp32-accum"])["held_bytes"] + 4 * PARAMS


def test_llama_3_70b_zero2_offload_keeps_the_embedding_twice():
    # Llama-3-70B (config.json: vocab 128,256, hidden 8,192, untied): the largest tensor is the
    # embedding, 128,256 x 8,192 = 1,050,673,152 elements, 2.10 GB in bf16 on the GPU and again on the host
    from planner.model import lookup

    model, training = lookup("llama-3-70b"), layout.Training(seq_len=4096, engine="deepspeed")
    lay = layout.single(dp=16, zero=2, offload_optimizer="cpu")
    assert states.optimizer_bytes(Stage(model, training, lay, 0))[0] == 2 * 1_050_673_152
    on_gpu = layout.single(dp=16, zero=2)
    host = states.host_bytes(Stage(model, training, lay, 0))[0]
    # 16 B/param sharded (Ren et al. 2021) + 2 B/param sharded + the staging buffer, ZeRO-2 at gas 1
    expected = (16 + 2) * model.params / 16 + 2 * 1_050_673_152
    assert host == pytest.approx(expected, rel=1e-6)
    assert states.optimizer_bytes(Stage(model, training, on_gpu, 0))[0] == pytest.approx(12 * model.params / 16, rel=1e-6)


def test_llama_3_70b_zero2_offload_reduction_copies_the_embedding_in_fp64():
    # ZeRO-2 offloading reduces the embedding (1,050,673,152 elements, over the 5e8 bucket) alone, from
    # a 16-bit clone kept to the end of backward, and takes its norm from an fp64 copy of its share of
    # the partition (4.4e9 elements on 16 ranks: all of it); measured on the 2-layer Llama with lm_head:
    # tests/test_deepspeed_transients_real.py test_zero2_offload_reduction_transient
    from planner.model import lookup

    model, training = lookup("llama-3-70b"), layout.Training(seq_len=4096, engine="deepspeed")
    lay = layout.single(dp=16, zero=2, offload_optimizer="cpu")
    fwd, step = memory.engine_buffers(Stage(model, training, lay, 0))
    # bucket 2 x 5e8 + fp64 copy 8 x embedding + its clone 2 x embedding (no block tensor exceeds 5e8)
    assert fwd[0] == 2 * 500_000_000 + 8 * 1_050_673_152 + 2 * 1_050_673_152
    assert step[0] == 0


@pytest.mark.slow
def test_deepspeed_holds_what_the_reference_says(tmp_path):
    """The count itself, on the installed DeepSpeed under its launcher (about 25 s)."""
    from recording import rerecord

    rows = rerecord("calibrate.engines.deepspeed_offload", tmp_path / "offload.json", timeout_s=900)
    assert [r["name"] for r in rows] == list(ROWS)
    for row in rows:
        assert row["ranks"] == ROWS[row["name"]]["ranks"], row["name"]
