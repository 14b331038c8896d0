"""torchtitan's context parallelism for FlexAttention keeps K and V of the whole sequence.

One torchrun launch of calibrate/engines/torch_cp_worker.py on 2 gloo ranks (cp = 2) runs torch 2.13's
flex_cp_allgather (what torchtitan 0.3.0 apply_cp_to_forward calls) and flex_attention on each
rank's sequence shard and counts what the forward saves. FlexAttention keeps its key and value
inputs, i.e. the all-gathered ones: b g (cp s_local) d bf16 each, cp times a local shard. The
planner books the cp - 1 extra shards per layer (planner/activations.py cp_gathered_kv_bytes); the
local shard is already among torchtitan_llama_saved's 4kv bytes a token.
Run: DS_ACCELERATOR=cpu python -m pytest -q -p no:cacheprovider tests/test_torch_cp_real.py
"""

from __future__ import annotations

import json

import pytest

from calibrate.harness.launch import launch
from planner import activations, layout
from planner.model import ModelSpec

pytestmark = pytest.mark.slow
CP = 2
SHAPES = [  # (batch, heads, kv heads, local tokens, head dim)
    (1, 4, 4, 64, 32),
    (2, 8, 2, 64, 32),  # GQA: k and v narrow, the batch doubles
    (1, 4, 1, 128, 64),  # MQA, longer shard, wider heads
]


@pytest.fixture(scope="module")
def measured():
    out = launch("calibrate.engines.torch_cp_worker", [json.dumps({"shapes": SHAPES})], nproc=CP, timeout_s=240)
    assert out.status == "ok" and len(out.ranks) == CP, out.to_json()
    return {(tuple(x["shape"]), x["rank"]): x for r in out.ranks for x in r["runs"]}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("rank", range(CP))
def test_flex_attention_keeps_the_gathered_kv(measured, shape, rank):
    batch, heads, kv_heads, local, d = shape
    x = measured[shape, rank]
    gathered = [row for row in x["table"] if tuple(row[1]) == (batch, kv_heads, CP * local, d)]
    assert len(gathered) == 2 and all(row[2] == "bfloat16" for row in gathered), x["table"]  # K and V
    kept = sum(row[0] for row in gathered)
    assert kept == 2 * batch * kv_heads * CP * local * d * 2  # K and V, whole sequence, 2 bytes
    # the planner: the cp - 1 shards beyond the local K and V, for the same shape under torchtitan
    model = ModelSpec(layers=2, hidden=heads * d, heads=heads, kv_heads=kv_heads, ffn=4 * heads * d, vocab=1000)
    training = layout.Training(seq_len=CP * local, engine="torchtitan")
    lay = layout.single(cp=CP, mbs=batch)
    local_kv = 2 * batch * local * kv_heads * d * 2  # the shard the block's own k, v terms count
    assert activations.cp_gathered_kv_bytes(model, training, lay)[0] == kept - local_kv
    # Megatron's ring passes chunks instead and keeps only its own
    megatron = layout.Training(seq_len=CP * local, engine="megatron")
    assert activations.cp_gathered_kv_bytes(model, megatron, lay)[0] == 0
