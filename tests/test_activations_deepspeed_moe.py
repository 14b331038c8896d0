"""DeepSpeed's MoE layer (Megatron-DeepSpeed's deepspeed.moe): what it saves for backward, against the
planner's Megatron-DeepSpeed block list.

The reference, data/references/deepspeed_moe_cpu.json, is python -m calibrate.engines.deepspeed_moe: DeepSpeed
0.19.8's own deepspeed.moe.layer.MoE (TopKGate, MOELayer, Linear-GELU-Linear experts, ep_size 1, bf16,
capacity factor 1) on one gloo rank, the bytes its forward leaves saved per token (the difference of
96 and 192 tokens), each storage once, parameters and the layer input left out, by the code that saved
them. Per token, e = 2 bytes, h hidden, f expert ffn, E experts, top-k:
- experts: k capacity rows of (dispatched input e h + GELU input e f + second linear's input e f);
- gate: the input's fp32 copy 4h, the fp32 softmax 4E, and per gating function: top-1 the int64
  one-hot mask 8E; top-2 two fp32 route masks 8E, the gate sum, its clamp and two normalized gates 16;
  top-k the gathered fp32 scores and their quotient 8E, the bool mask E, the int64 indices 8k and the
  normalizer with its clamp 8;
- dispatch: the int64 source row of every expert slot (8 k a token);
- combine: each token's k gathered expert rows e h, their fp32 gates 4 and int64 slots 8.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner import activations, layout
from planner.model import ModelSpec

REFERENCE = Path(__file__).resolve().parent.parent / "data" / "references" / "deepspeed_moe_cpu.json"
ROWS = {row["name"]: row for row in json.loads(REFERENCE.read_text())["rows"]}
EXPERT_PARTS = ("expert fc1 input (permuted rows)", "activation input", "fc2 input")


def _planned(row) -> dict:
    """The planner's per-token bytes of the MoE MLP under Megatron-DeepSpeed (everything after the
    MLP's input), split as the reference is: the experts, and gate + dispatch + combine."""
    model = ModelSpec(layers=1, hidden=row["hidden"], heads=4, kv_heads=4, ffn=row["ffn"], vocab=256,
                      experts=row["experts"], experts_per_token=row["topk"], ffn_kind="gelu", norm="layernorm",
                      bias=True, positions="learned", tied_embeddings=True, architecture="gpt2")
    training = layout.Training(seq_len=48, engine="megatron-deepspeed")
    saved = activations.saved_tensors(model, training, 48, float(row["topk"]), 2)  # capacity k S / E: no padding
    mlp = saved[[x.name for x in saved].index("mlp input") + 1:]
    experts = sum(x.bytes_per_token for x in mlp if x.name in EXPERT_PARTS)
    return {"experts": experts, "routing": sum(x.bytes_per_token for x in mlp) - experts}


def test_reference_is_deepspeeds_own_layer():
    assert json.loads(REFERENCE.read_text())["environment"]["deepspeed"] == "0.19.8"
    assert {r["capacity_factor"] for r in ROWS.values()} == {1.0}  # moe/layer.py MoE default


@pytest.mark.parametrize("name", list(ROWS))
def test_moe_layer_saves_what_deepspeed_saves(name):
    row = ROWS[name]
    got, E, k, h, f = row["bytes_per_token"], row["experts"], row["topk"], row["hidden"], row["ffn"]
    assert got["experts"] == k * (2 * h + 2 * 2 * f)  # E8-k2: 2 x (128 + 384) = 1024
    gating = {1: 8 * E, 2: 8 * E + 16}.get(k, 9 * E + 8 * k + 8)
    assert got["gate"] == 4 * h + 4 * E + gating  # E8-k2: 256 + 32 + 80 = 368
    assert got["dispatch"] == 8 * k
    assert got["combine"] == k * (2 * h + 4 + 8)  # E8-k2: 2 x 140 = 280
    plan = _planned(row)
    assert plan["experts"] == got["experts"]
    assert plan["routing"] == got["gate"] + got["dispatch"] + got["combine"]


def test_top2_gating_of_a_wide_model_is_a_fifth_of_the_moe_layer():
    """Megatron-DeepSpeed's MoE recipe shape (h 2048, 128 experts, top-2, ffn 8192, GELU) in bf16: the
    gate, dispatch and combine keep 4 x 2048 + 12 x 128 + 16 + 16 + 2 x (4096 + 12) = 17,952 B a token
    beside the experts' 2 x (4096 + 32,768) = 73,728 B; the planner booked none of it before."""
    row = {"hidden": 2048, "ffn": 8192, "experts": 128, "topk": 2}
    plan = _planned(row)
    assert plan["routing"] == 4 * 2048 + 12 * 128 + 16 + 16 + 2 * (4096 + 12)
    assert plan["experts"] == 2 * (4096 + 2 * 2 * 8192)


@pytest.mark.slow
def test_deepspeed_saves_what_the_reference_says(tmp_path):
    """The count itself, on the installed DeepSpeed, in a process of its own (it initializes a gloo
    process group; about 15 s)."""
    from recording import rerecord

    rows = rerecord("calibrate.engines.deepspeed_moe", tmp_path / "deepspeed_moe.json", timeout_s=600)
    assert [r["name"] for r in rows] == list(ROWS)
    for row in rows:
        assert row["bytes_per_token"] == ROWS[row["name"]]["bytes_per_token"], row["name"]
