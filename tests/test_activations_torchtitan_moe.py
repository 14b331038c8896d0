"""torchtitan 0.3.0's MoE block (planner/activations.py torchtitan_moe_saved, op_sac_matmuls,
op_sac_bytes) against what torchtitan's own Qwen3 MoE model keeps, measured on the CPU by
`python -m calibrate.engines.torchtitan_moe` and recorded in data/references/torchtitan_moe_cpu.json
(torchtitan is not a test dependency). Seven cases move h, E, k, f, a shared expert and the router
kind (softmax + route_norm, sigmoid without) one at a time; no AC, SelectiveAC and FullAC each.

Every comparison is exact after the documented translation, to within one unattributed 8-byte
per-block allocation that every MoE row shows whatever the policy (two 4-byte aten::scalar_tensor
allocations per block in the profile, absent from the dense Llama 3 block); the smallest per-token
term (the 4-byte route_norm denominator) is 1,024 bytes a block at 256 tokens, so any term 10x wrong
misses by over 9 KB."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner import activations, layout, saved
from planner.model import ModelSpec

DOC = json.loads((Path(__file__).resolve().parent.parent / "data/references/torchtitan_moe_cpu.json").read_text())
RNG_STATE = 5056
"""torch.get_rng_state().numel() in torch 2.13: the CPU generator state torch.utils.checkpoint
stashes for each checkpointed block (preserve_rng_state), host memory on a CUDA run
(tests/test_activations_real.py test_torchtitan_checkpointed_blocks_keep_what_the_planner_books)."""
UNATTRIBUTED = 8
"""Bytes every measured MoE block keeps beyond the model, under every policy (see the module doc)."""


def spec(row) -> ModelSpec:
    return ModelSpec(layers=4, hidden=row["dim"], heads=row["heads"], kv_heads=row["kv_heads"],
                     head_dim=row["head_dim"],
                     ffn=row["moe_ffn"], vocab=2048, experts=row["experts"], experts_per_token=row["top_k"],
                     qk_norm=True, router_first=False, norm_topk_prob=row["route_norm"],
                     shared_expert_ffn=row["shared_ffn"])


def planned(row, policy=None) -> float:
    train = layout.Training(seq_len=row["seq"], precision="bf16", engine="torchtitan")
    lay = layout.single(mbs=row["batch"], recompute=policy or row["policy"])
    return float(activations.kept_per_layer(spec(row), train, lay)[0])


def cuda_equivalent(row) -> float:
    """The unchecked block as counted on the CPU, less what CUDA does not keep per token, less what
    it keeps per layer rather than per token. nn.RMSNorm decomposes on the CPU (torch 2.13
    CompositeImplicitAutograd rms_norm: the fp32 upcast and the fp32 normalized input, 8 bytes an
    element, where CUDA's fused kernel keeps the bf16 input, 2: tests/test_activations_real.py
    torchtitan_cuda_equivalent): 6 bytes an element of attention_norm (h), ffn_norm (h), q_norm (q)
    and k_norm (kv). Per layer: the router gate's fp32 weight copy autocast makes and the mm keeps
    (4 E h) and torch._grouped_mm's int32 offsets the three grouped_mm keep (4 E)."""
    tokens, h = row["seq"] * row["batch"], row["dim"]
    q, kv = row["heads"] * row["head_dim"], row["kv_heads"] * row["head_dim"]
    per_layer = 4 * row["experts"] * h + 4 * row["experts"] + UNATTRIBUTED
    return row["layer_bytes"] - tokens * 6 * (2 * h + q + kv) - per_layer


def test_recording_environment():
    assert DOC["environment"]["torchtitan"] == "0.3.0"
    assert DOC["environment"]["torch"].startswith("2.13")
    assert len(DOC["rows"]) == 21 and {r["policy"] for r in DOC["rows"]} == {"none", "selective", "full"}


def test_unchecked_moe_block_on_cuda():
    """No AC, per token, bf16 (h 256, q 256, kv 128, a 8, g 4, E 8, k 2, f 256, route_norm, 256 tokens):
    attention 4h + 4 + (2q + 4a + 2kv + 4g) + 2q + 4kv + 2q + 8a = 3,444;
    MoE 2h + 4 (ffn norm) + 4h (gate's fp32 input) + 4E (scores) + 8k (topk ids, kept by gather)
    + 4k + 4 (route_norm's div) + 16k (argsort and argsort // k) + 2kh (routed input) + 8kf (w1, silu,
    w3, product) + 4kh + 4k (combine's fp32 product) = 8,808: 12,252 B a token;
    measured 4,521,000 = 256 x (12,252 + 6 x 896 CPU rms_norm) + 8,192 + 32 + 8."""
    rows = [r for r in DOC["rows"] if r["policy"] == "none"]
    assert len(rows) == 7
    assert cuda_equivalent(rows[0]) == 256 * 12_252
    for row in rows:
        assert planned(row) == cuda_equivalent(row), row
    shared = next(r for r in rows if r["shared_ffn"] == 512)  # + 2h (w1/w3 input) + 8 fs
    assert cuda_equivalent(shared) == 256 * (12_252 + 512 + 4096)
    sigmoid = next(r for r in rows if r["score_func"] == "sigmoid")  # no route_norm: 12 B less
    assert cuda_equivalent(sigmoid) == 256 * (12_252 - 12 + 512 + 8 * 384)


def test_selective_moe_block():
    """SelectiveAC, per token: block input 2h + wqkv output 2(q + 2kv) + flex output 2q and 8a + topk
    values and indices 12k (+ shared w1 output 2fs and w2 output 2h: wqkv and wo count 1 and 2, the
    router gate is forced to recompute uncounted, the grouped_mm are not mm ops, so shared w1 is 3 and
    kept, w3 4, w2 5 and kept). Base: 512 + 1,024 + 512 + 64 + 24 = 2,136; 256 x 2,136 + 5,056 + 8
    = 551,880 measured. Nothing of the routed experts is kept."""
    rows = [r for r in DOC["rows"] if r["policy"] == "selective"]
    assert rows[0]["layer_bytes"] == 256 * 2_136 + RNG_STATE + UNATTRIBUTED
    for row in rows:
        assert planned(row) == row["layer_bytes"] - RNG_STATE - UNATTRIBUTED, row
    # f, E and the route_norm do not move it; k only by 12 B a token per extra expert
    base = rows[0]["layer_bytes"]
    assert [r["layer_bytes"] - base for r in rows if r["dim"] == 256 and not r["shared_ffn"]] == [0, 0, 256 * 24, 0]


def test_full_moe_block():
    """FullAC keeps the block input alone: 2h a token (256 x 512 = 131,072 + 5,056 + 8)."""
    for row in (r for r in DOC["rows"] if r["policy"] == "full"):
        assert row["layer_bytes"] == 136_136
        assert planned(row) == row["layer_bytes"] - RNG_STATE - UNATTRIBUTED, row


def test_op_sac_matmuls_follow_torchtitan_mm_count():
    row = next(r for r in DOC["rows"] if r["shared_ffn"] == 512)
    kept = {name: k for name, _, _, _, k in activations.op_sac_matmuls(spec(row))}
    assert kept == {"wqkv": True, "wo": False, "router gate": False, "experts w1 (grouped_mm)": False,
                    "experts w3 (grouped_mm)": False, "experts w2 (grouped_mm)": False,
                    "shared w1": True, "shared w3": False, "shared w2": True}
    dense = ModelSpec(layers=4, hidden=256, heads=8, kv_heads=4, ffn=768, vocab=2048)
    assert [k for *_, k in activations.op_sac_matmuls(dense)] == [True, False, True, False, True]


@pytest.mark.parametrize("policy", ["none", "selective"])
def test_every_term_is_visible(policy):
    """Each saved tensor 10x its size moves the prediction by 9 x tokens x its bytes, at least
    9 x 256 x 4 B here, far beyond the 8-byte allowance: the exact comparisons above catch it."""
    row = DOC["rows"][0]
    train = layout.Training(seq_len=row["seq"], precision="bf16", engine="torchtitan")
    tokens = row["seq"] * row["batch"]
    terms = [x.bytes_per_token for x in saved.torchtitan_moe_saved(spec(row), train)] if policy == "none" else \
        [x.bytes_per_token for x in activations.torchtitan_topk_saved(spec(row))]
    assert min(terms) >= 4 and 9 * tokens * min(terms) > 1000 * UNATTRIBUTED


def test_any_term_ten_times_wrong_fails(monkeypatch):
    """Mutation check: each of torchtitan_moe_saved's terms (and torch.topk's two under SAC) made
    10x, one at a time, breaks the unchecked (selective) comparison in at least one recorded case."""
    from dataclasses import replace

    original_moe, original_topk = saved.torchtitan_moe_saved, activations.torchtitan_topk_saved
    n_terms = len(original_moe(spec(DOC["rows"][15]), layout.Training(seq_len=128, precision="bf16",
                                                                         engine="torchtitan")))
    assert n_terms == 34  # the shared-expert, route_norm case: every term present (13 attention, 21 MLP)
    for i in range(n_terms):
        def moe(model, training, i=i):
            out = original_moe(model, training)
            return [replace(x, bytes_per_token=10 * x.bytes_per_token) if j == i else x for j, x in enumerate(out)]
        monkeypatch.setattr(saved, "torchtitan_moe_saved", moe)  # the registry's (planner/saved/__init__.py)
        assert any(planned(r) != cuda_equivalent(r) for r in DOC["rows"] if r["policy"] == "none"), i
    monkeypatch.setattr(saved, "torchtitan_moe_saved", original_moe)
    for i in range(2):
        def topk(model, i=i):
            return tuple(replace(x, bytes_per_token=10 * x.bytes_per_token) if j == i else x
                         for j, x in enumerate(original_topk(model)))
        monkeypatch.setattr(activations, "torchtitan_topk_saved", topk)
        assert any(planned(r) != r["layer_bytes"] - RNG_STATE - UNATTRIBUTED
                   for r in DOC["rows"] if r["policy"] == "selective"), i
