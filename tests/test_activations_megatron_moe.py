"""megatron-core's MoE layer: what it saves for backward, against the planner's Megatron block list.

The reference, data/references/megatron_moe_cpu.json, is python -m calibrate.engines.megatron_moe: megatron-core
0.16.1's own MoELayer (local spec: SequentialMLP experts, alltoall or allgather dispatcher, Megatron-
LM's fused SwiGLU, bf16; hidden 64, expert ffn 128) on one gloo rank, the bytes its forward saves per
token, each storage once, parameters and the layer input left out, by the part that saved them.
Per token, e = 2 bytes: the experts keep k rows of their fc1 input (the permuted copy, e h), fc1
output (2 e f), fc2 input (e f) and routing prob (e); the router k int64 indices and k fp32 softmax
values (top-1, with the pre-softmax megatron-core demands: E fp32 values and the index); the
dispatcher the routing map (E bool), the dense probs (e E) and k int64 row indices.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner import activations, layout
from planner.model import ModelSpec

REFERENCE = Path(__file__).resolve().parent.parent / "data" / "references" / "megatron_moe_cpu.json"
ROWS = {row["name"]: row for row in json.loads(REFERENCE.read_text())["rows"]}
ROUTING = ("router top-k indices and softmax", "dispatcher routing map, dense probs, sorted row indices")


def _planned(row) -> dict:
    """The planner's per-token bytes of the MoE MLP (everything after the MLP's input), split as the
    reference is: router + dispatcher, and the experts with the shared one."""
    model = ModelSpec(layers=1, hidden=row["hidden"], heads=4, kv_heads=4, ffn=row["ffn"], vocab=256,
                      experts=row["experts"], experts_per_token=row["topk"], shared_expert_ffn=row["shared_ffn"])
    training = layout.Training(seq_len=16, engine="megatron")
    saved = activations.saved_tensors(model, training, 16, float(row["topk"]), 2)
    mlp = saved[[x.name for x in saved].index("mlp input") + 1:]
    routing = sum(x.bytes_per_token for x in mlp if x.name in ROUTING)
    return {"routing": routing, "experts": sum(x.bytes_per_token for x in mlp) - routing}


@pytest.mark.slow
def test_megatron_core_saves_what_the_reference_says():
    """The count itself, on the installed megatron-core (a test extra): the same bytes by part as the
    shipped reference, configuration by configuration (about 10 s: all of them in one process, a
    layer built and counted anew for each; the recorder's default runs a process each)."""
    from calibrate.engines.megatron_moe import measure

    rows = measure(one_process=True)
    assert [row["name"] for row in rows] == list(ROWS)
    for row in rows:
        assert row["megatron_core"] == "0.16.1"
        assert row["bytes_per_token"] == ROWS[row["name"]]["bytes_per_token"], row["name"]


def test_reference_is_megatron_cores_own_layer():
    assert json.loads(REFERENCE.read_text())["environment"]["megatron-core"] == "0.16.1"
    assert {r["dispatcher"] for r in ROWS.values()} == {"MoEAlltoAllTokenDispatcher", "MoEAllGatherTokenDispatcher"}


@pytest.mark.parametrize("name", list(ROWS))
def test_moe_layer_saves_what_megatron_core_saves(name):
    row = ROWS[name]
    got, E, k, h, f = row["bytes_per_token"], row["experts"], row["topk"], row["hidden"], row["ffn"]
    # experts: k rows of (permuted fc1 input e h + fc1 output 2 e f + fc2 input e f + prob e), e = 2
    assert got["experts"] == k * (2 * h + 3 * 2 * f + 2)  # E8-k2: 2 x (128 + 768 + 2) = 1796
    # the shared expert's fused SwiGLU: fc1 output and fc2 input (its input is the layer's)
    assert got.get("shared_expert", 0) == 3 * 2 * row["shared_ffn"]
    # router: k int64 indices + k fp32 softmax values; top-1 (pre-softmax): E fp32 values + the index
    assert got["router"] == (4 * E + 8 * k if k == 1 else 12 * k)
    # dispatcher: routing map (E bool) + dense probs (2 E) + k int64 sorted row indices: 8 + 16 + 16 = 40
    assert got["dispatcher"] == E + 2 * E + 8 * k
    plan = _planned(row)
    assert plan["routing"] == got["router"] + got["dispatcher"]
    assert plan["experts"] == got["experts"] + got.get("shared_expert", 0)


def test_the_permuted_rows_are_most_of_a_wide_moe_layer():
    """DeepSeek-V3's shape (h 7168, 256 experts, top-8, expert ffn 2048) in bf16: the permuted fc1
    input, 8 x 7168 x 2 = 114,688 B a token, is more than the experts' SwiGLU, 8 x 3 x 2048 x 2 =
    98,304 B; the planner booked only the latter before."""
    model = ModelSpec(layers=1, hidden=7168, heads=128, kv_heads=128, ffn=2048, vocab=129280, experts=256,
                      experts_per_token=8)
    saved = activations.saved_tensors(model, layout.Training(engine="megatron"), 4096, 8.0, 1)
    by = {x.name: x.bytes_per_token for x in saved}
    assert by["expert fc1 input (permuted rows)"] == 8 * 7168 * 2
    assert by["fc1 output [gate|up]"] + by["fc2 input"] == 8 * 3 * 2048 * 2


def test_expert_tp_ranks_keep_every_row_of_their_experts():
    """megatron-core 0.16.1 token_dispatcher.py MoEAlltoAllTokenDispatcher: after the all-to-all the
    rows are all-gathered over the expert-TP group (dispatch_postprocess), so with etp = tp = 2 each
    rank keeps every routed row of the micro-batch, full width, and computes half of each expert's
    ffn; with etp 1 (EP over the TP ranks) the two ranks keep different experts' rows. The fc1
    output is half a rank's either way; the permuted input and the probs differ by half:
    4096 tokens x 2 rows x (4096 x 2 + 2) B / 2 = 33,562,624 B."""
    m = ModelSpec(layers=2, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=32000, experts=8, experts_per_token=2)
    training = layout.Training(seq_len=4096, engine="megatron")
    whole = activations.layer_bytes(m, training, layout.single(tp=2, sequence_parallel=True, ep=2, etp=2, dp=2))[0]
    split = activations.layer_bytes(m, training, layout.single(tp=2, sequence_parallel=True, ep=2, etp=1, dp=2))[0]
    assert float(whole[0] - split[0]) == 4096 * 2 * (4096 * 2 + 2) / 2
