"""planner.saved.torchtitan_llama_saved per TP rank against PyTorch's own tensor parallelism.

One torchrun launch of calibrate/engines/torch_tp_worker.py on 2 gloo ranks (tp = 2) builds torchtitan
0.3.0's Llama3 block in plain torch (separate wq / wk / wv, see the worker's docstring), applies
torchtitan's TP plan with parallelize_module (ColwiseParallel / RowwiseParallel / SequenceParallel /
PrepareModuleInput), with sequence parallelism off and on, at 6 shapes that move h, the heads, the
kv heads, f and the tokens one at a time, and counts by storage what one bf16 forward saves for
backward on each rank (saved DTensors by their local tensor; parameters, the RoPE cache buffer and
the block's input left out).

What DTensor keeps (torch 2.13), per token on one rank (t = 2, sp = t under SP else 1):
  - wq/wk/wv input and w1/w3 input, the norm output: 2h each, WHOLE with and without SP. Under SP,
    PrepareModuleInput._prepare_input_arg (torch/distributed/tensor/parallel/style.py) turns the
    Shard(1) norm output into Replicate with DTensor.redistribute, an all-gather
    (torch/distributed/tensor/_redistribute.py Redistribute.forward, which saves no tensor, only
    the specs); the linear's mm then saves its DTensor(Replicate) input, whose local tensor is the
    gathered [b s, h]. (Megatron instead saves the SP shard and re-gathers in backward.)
  - q after RoPE, k after RoPE, v, the attention output (wo's input: .contiguous() of it is a
    view): 2q/t, 2kv/t, 2kv/t, 2q/t; SDPA's CPU flash log-sum-exp 4a/t (fp32, nothing else: no
    philox tensors on the CPU);
  - w1 output, w3 output, silu output, w2 input (DTensor Shard(-1) from_local): 2f/t each;
  - per RMSNorm on the CPU (rms_norm decomposed): the fp32 upcast of its input 4h, the fp32
    normalized input 4h and the fp32 rstd 4, all divided by sp (SequenceParallel runs the norm on
    the Shard(1) DTensor).
Translation to what the planner models (CUDA, FlexAttention): CUDA's fused rms_norm keeps the bf16
input and the rstd, 6h bytes less per norm, divided by sp (tests/test_activations_real.py
torchtitan_cuda_equivalent, validated at tp 1); FlexAttention keeps the fp32 max_scores per head
beside the log-sum-exp, 4a/t more. The planner must then equal the count to the byte: every term
is checked exactly, so any one 10x wrong fails.
Run: DS_ACCELERATOR=cpu python -m pytest -q -p no:cacheprovider tests/test_torch_tp_real.py
"""

from __future__ import annotations

import json

import pytest

from calibrate.harness.launch import launch
from planner import activations, layout
from planner.model import ModelSpec

pytestmark = pytest.mark.slow
TP = 2
SHAPES = [  # (hidden, heads, kv_heads, ffn, seq, batch)
    (256, 8, 8, 768, 64, 2),
    (128, 8, 8, 768, 64, 2),  # h alone (head_dim 16)
    (256, 16, 16, 768, 64, 2),  # heads alone (head_dim 16): the 4a log-sum-exp
    (256, 8, 2, 768, 64, 2),  # kv heads alone (GQA): k and v narrow
    (256, 8, 8, 1536, 64, 2),  # f alone
    (256, 8, 8, 768, 128, 2),  # tokens alone
]
R, S1 = "DTensor(R,)", "DTensor(S(1),)"  # the saved tensor's placements, as the worker names them


@pytest.fixture(scope="module")
def measured():
    """{(shape, sp, rank): the worker's record}, from one torchrun launch."""
    out = launch("calibrate.engines.torch_tp_worker", [json.dumps({"shapes": SHAPES, "sp": [False, True]})], nproc=TP,
                 timeout_s=240)
    assert out.status == "ok" and len(out.ranks) == TP, out.to_json()
    runs = {}
    for r in out.ranks:
        for x in r["runs"]:
            shape = (x["dim"], x["heads"], x["kv_heads"], x["ffn"], x["seq"], x["batch"])
            runs[shape, x["sp"], x["rank"]] = x
    assert len(runs) == len(SHAPES) * 2 * TP
    return runs


def per_token_table(x) -> list:
    """[(bytes a token, shape, dtype, grad_fn, placement)] of one rank's saved tensors."""
    tokens = x["seq"] * x["batch"]
    return [(nbytes / tokens, tuple(shape), dtype, fn, kind) for nbytes, shape, dtype, fn, kind in x["table"]]


def expected_table(shape, sp: bool) -> dict:
    """{name: (bytes a token on one rank, dtype, grad_fn, placement)}: what DTensor TP keeps on the CPU,
    written from the block's code (module docstring), not from the planner."""
    h, a, g, f, s, b = shape
    d = h // a
    q, kv, p = a * d, g * d, TP if sp else 1
    norm = "DTensor(S(1),)" if sp else "plain"
    out = {}
    for where in ("attention", "ffn"):
        out[f"{where} norm input upcast (fp32)"] = (4 * h / p, "float32", "ToCopyBackward0", norm)
        out[f"{where} norm normalized input (fp32)"] = (4 * h / p, "float32", "MulBackward0", norm)
        out[f"{where} norm rstd (fp32)"] = (4 / p, "float32", "RsqrtBackward0", norm)
    out |= {
        "wq/wk/wv input (norm output, gathered)": (2 * h, "bfloat16", "ViewBackward0", R),
        "w1/w3 input (norm output, gathered)": (2 * h, "bfloat16", "ViewBackward0", R),
        "q after rotary": (2 * q / TP, "bfloat16", "TransposeBackward0", "plain"),
        "k after rotary": (2 * kv / TP, "bfloat16", "TransposeBackward0", "plain"),
        "v": (2 * kv / TP, "bfloat16", "TransposeBackward0", "plain"),
        "attention output (wo input)": (2 * q / TP, "bfloat16", "ScaledDotProductFlashAttentionForCpuBackward0",
                                        "plain"),
        "flash log-sum-exp (fp32)": (4 * a / TP, "float32", "leaf", "plain"),
        "w1 output": (2 * f / TP, "bfloat16", "_ToTorchTensorBackward", "plain"),
        "w3 output": (2 * f / TP, "bfloat16", "_ToTorchTensorBackward", "plain"),
        "silu output": (2 * f / TP, "bfloat16", "SiluBackward0", "plain"),
        "w2 input": (2 * f / TP, "bfloat16", "ViewBackward0", S1),
    }
    return out


def cuda_flex_equivalent(x) -> float:
    """The CPU count of one rank, translated to CUDA and FlexAttention (module docstring): two fused
    RMSNorms keep 6h a token less each (split by t under SP); flex's max_scores adds 4a/t."""
    tokens, h, a = x["seq"] * x["batch"], x["dim"], x["heads"]
    p = TP if x["sp"] else 1
    return x["saved_bytes"] - tokens * 2 * 6 * h / p + tokens * 4 * a / TP


def planner_bytes(shape, sp: bool) -> float:
    h, a, g, f, s, b = shape
    spec = ModelSpec(layers=4, hidden=h, heads=a, kv_heads=g, ffn=f, vocab=2048)
    training = layout.Training(seq_len=s, precision="bf16", engine="torchtitan")
    return float(activations.kept_per_layer(spec, training, layout.single(mbs=b, tp=TP, sequence_parallel=sp))[0])


@pytest.mark.parametrize("sp", [False, True], ids=["no-sp", "sp"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "h{}a{}g{}f{}s{}b{}".format(*s))
def test_tp_block_is_the_unsharded_block(measured, shape, sp):
    """The plan is right (each rank owns whole heads): every rank's output equals an unsharded copy
    of the block with the same weights, to bf16 rounding (measured at most 0.5 % of the largest
    output; a rank mixing heads would be off by O(1))."""
    for rank in range(TP):
        x = measured[shape, sp, rank]
        assert x["max_abs_err"] <= 0.02 * x["ref_max_abs"], x["max_abs_err"]


@pytest.mark.parametrize("sp", [False, True], ids=["no-sp", "sp"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "h{}a{}g{}f{}s{}b{}".format(*s))
def test_saved_tensors_named(measured, shape, sp):
    """Each rank saves exactly the tensors of expected_table: name by name, bytes a token, dtype,
    creator and placement. E.g. h256 a8 g8 f768 s64 b2 tp2, bytes a token:
      no SP: norms 2 x (1024 + 1024 + 4) + colwise inputs 2 x 512 (whole) + q/k/v/out 4 x 256 +
             lse 16 + MLP 4 x 768 = 4104 + 1024 + 1040 + 3072 = 9240;
      SP:    norms 2 x (512 + 512 + 2) + colwise inputs 2 x 512 (still whole) + 1040 + 3072 = 7188."""
    expected = expected_table(shape, sp)
    for rank in range(TP):
        x = measured[shape, sp, rank]
        got = sorted((row[0], row[2], row[3], row[4]) for row in per_token_table(x))
        assert got == sorted(expected.values()), (rank, got)
        assert x["saved_bytes"] / (x["seq"] * x["batch"]) == sum(v[0] for v in expected.values())
    if shape == SHAPES[0]:
        base = sum(v[0] for v in expected.values())
        assert base == (7188 if sp else 9240)


@pytest.mark.parametrize("sp", [False, True], ids=["no-sp", "sp"])
def test_colwise_inputs_saved_whole(measured, sp):
    """The two column-parallel inputs each rank keeps are the norm output of ALL b s tokens ([b s, h]
    local tensors of Replicate DTensors), with SP too, where the rank's own input is only s / t
    of them: DTensor's all-gather output, not Megatron's SP shard."""
    h, a, g, f, s, b = SHAPES[0]
    for rank in range(TP):
        x = measured[SHAPES[0], sp, rank]
        whole = [row for row in x["table"] if row[4] == R]
        assert [tuple(row[1]) for row in whole] == [(b * s, h)] * 2  # (128, 256) each: 65,536 B, not 32,768
        assert sum(row[0] for row in whole) == 2 * b * s * 2 * h


@pytest.mark.parametrize("sp", [False, True], ids=["no-sp", "sp"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "h{}a{}g{}f{}s{}b{}".format(*s))
def test_planner_matches_tp_rank(measured, shape, sp):
    """kept_per_layer per rank (torchtitan, tp 2, recompute none) equals the translated count, to
    the byte. h256 a8 g8 f768 s64 b2 (128 tokens), bytes a token:
      no SP: 9240 - 2 x 6 x 256 + 4 x 8 / 2 = 6184 = norms 2 x (512 + 4) + whole 2 x 512 +
             (4q + 4kv + 8a + 8f) / 2 = 1032 + 1024 + (1024 + 1024 + 64 + 6144) / 2;
      SP:    7188 - 2 x 6 x 256 / 2 + 16 = 5668 = 1032 / 2 + 1024 + 4128.
    Other shapes (no SP / SP): h128 4648 / 4388, a16 6216 / 5700, g2 5800 / 5284, f1536 9256 /
    8740, s128 6184 / 5668 a token."""
    translated = {rank: cuda_flex_equivalent(measured[shape, sp, rank]) for rank in range(TP)}
    assert translated[0] == translated[1]
    assert planner_bytes(shape, sp) == translated[0]
    if shape == SHAPES[0]:
        assert translated[0] == 128 * (5668 if sp else 6184)


def test_sequence_parallel_saving(measured):
    """What SP saves per rank is only the norms' share: (1 - 1/t) x 2 norms x (2h + 4) on CUDA
    = 516 B a token at h 256; the colwise inputs (2 x 2h) are not split. Measured on the CPU:
    (1 - 1/t) x 2 x (8h + 4) = 2052 (9240 - 7188)."""
    for shape in SHAPES:
        h, a, g, f, s, b = shape
        tokens = s * b
        off, on = (measured[shape, sp, 0] for sp in (False, True))
        assert (off["saved_bytes"] - on["saved_bytes"]) / tokens == (1 - 1 / TP) * 2 * (8 * h + 4)
        assert (planner_bytes(shape, False) - planner_bytes(shape, True)) / tokens == (1 - 1 / TP) * 2 * (2 * h + 4)
