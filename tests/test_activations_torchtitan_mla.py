"""torchtitan 0.3.0's DeepSeek-V3 blocks (planner/activations.py torchtitan_mla_attention_saved, the
torchtitan dispatch's MLA branch, op_sac_matmuls, op_sac_bytes) against what torchtitan's own
DeepSeekV3Model keeps, measured on the CPU by `python -m calibrate.engines.torchtitan_mla` and recorded in
data/references/torchtitan_mla_cpu.json (torchtitan is not a test dependency). Eight cases move the
query rank (0: wq; 96: wq_a -> q_norm -> wq_b), the key/value rank, the heads, the head widths
(non-rotary, rotary, value), h, and the block kind (dense-first, MoE with a shared expert and a softmax
router, MoE with DeepSeek-V3's sigmoid + route_norm router) one at a time; no AC, SelectiveAC and
FullAC each. 256 tokens (s 128 x b 2), bf16.

Every comparison is exact after the documented CPU -> CUDA translation (cuda_equivalent). The smallest
per-token term (a 4-byte rstd) is 1,024 bytes a block, so any term 10x wrong misses by over 9 KB
(test_any_term_ten_times_wrong_fails makes each one 10x in turn)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from planner import activations, layout
from planner.saved import torchtitan as saved_torchtitan
from planner.model import ModelSpec

DOC = json.loads((Path(__file__).resolve().parent.parent / "data/references/torchtitan_mla_cpu.json").read_text())
RNG_STATE = 5056
"""torch.get_rng_state().numel() in torch 2.13: the CPU generator state torch.utils.checkpoint stashes
for each checkpointed block, host memory on a CUDA run (tests/test_activations_torchtitan_moe.py)."""
UNATTRIBUTED_MOE = 8
"""Bytes every measured MoE block keeps beyond the model under every policy, as in the Qwen3 MoE
recording (tests/test_activations_torchtitan_moe.py UNATTRIBUTED); the dense MLA blocks show none."""


def spec(row) -> ModelSpec:
    mla = dict(architecture="deepseek_v3", hidden=row["dim"], heads=row["heads"], kv_heads=row["heads"],
               head_dim=row["qk_nope_head_dim"], kv_lora_rank=row["kv_lora_rank"], q_lora_rank=row["q_lora_rank"],
               qk_rope_head_dim=row["qk_rope_head_dim"], v_head_dim=row["v_head_dim"], vocab=2048, layers=4)
    if not row["moe"]:
        return ModelSpec(**mla, ffn=row["dense_ffn"])
    return ModelSpec(**mla, ffn=row["moe_ffn"], experts=row["experts"], experts_per_token=row["top_k"],
                     router_first=False, norm_topk_prob=row["route_norm"],
                     shared_expert_ffn=row["moe_ffn"] * row["shared_experts"])


def planned(row, model=None) -> float:
    train = layout.Training(seq_len=row["seq"], precision="bf16", engine="torchtitan")
    lay = layout.single(mbs=row["batch"], recompute=row["policy"])
    return float(activations.kept_per_layer(model or spec(row), train, lay)[0])


def per_layer(row) -> int:
    """Per block, not per token, so not in the planner's list: in an MoE block the router gate's fp32
    weight copy autocast makes and the mm keeps (4 E h), torch._grouped_mm's int32 offsets (4 E) and
    the unattributed 8 bytes."""
    return 4 * row["experts"] * row["dim"] + 4 * row["experts"] + UNATTRIBUTED_MOE if row["moe"] else 0


def cuda_equivalent(row) -> float:
    """The unchecked block as counted on the CPU, translated to what CUDA keeps. nn.RMSNorm decomposes
    on the CPU (torch 2.13 CompositeImplicitAutograd rms_norm: the fp32 upcast and the fp32 normalized
    input, 8 bytes an element, where CUDA's fused _fused_rms_norm keeps its input as given, 2, and both
    an fp32 rstd: tests/test_activations_real.py torchtitan_cuda_equivalent):
    - attention_norm and ffn_norm (h each) and q_norm (r): 6 bytes an element less on CUDA;
    - kv_norm reads `torch.split(wkv_a(x), [c, dr])[0]`, a strided view: the CPU upcast copies the c
      part (8c kept) and nothing else holds wkv_a's output, while CUDA's fused kernel keeps the view,
      so the whole wkv_a output, 2(c + dr): 6c - 2dr less on CUDA.
    Everything else (FlexAttention run eagerly: q, k, v, out, fp32 lse and max_scores; the linears;
    the MoE) keeps the same on both devices (calibrate/engines/torchtitan_mla.py,
    calibrate/engines/torchtitan_moe.py)."""
    tokens, h, r, c, dr = (row["seq"] * row["batch"], row["dim"], row["q_lora_rank"], row["kv_lora_rank"],
                           row["qk_rope_head_dim"])
    return row["layer_bytes"] - tokens * (6 * 2 * h + 6 * r + 6 * c - 2 * dr) - per_layer(row)


def rows(policy):
    return [r for r in DOC["rows"] if r["policy"] == policy]


def test_recording_environment():
    assert DOC["environment"]["torchtitan"] == "0.3.0"
    assert DOC["environment"]["torch"].startswith("2.13")
    assert len(DOC["rows"]) == 24 and {r["policy"] for r in DOC["rows"]} == {"none", "selective", "full"}


def test_unchecked_dense_first_mla_block_on_cuda():
    """No AC, per token, bf16 (h 256, a 8, wq, c 128, dn 32, dr 16, dv 32, f 512):
    attention 2h + 4 (norm) + 2h (wq/wkv_a input) + 2(c + dr) + 4 (kv_norm: wkv_a's whole output, rstd)
    + 2c (wkv_b input) + 2a(dn + dv) (wkv_b output, v a view) + 4a(dn + dr) (q and k, torch.cat copies)
    + 2a dv (flex output) + 8a (lse, max_scores) = 512 + 4 + 512 + 288 + 4 + 256 + 1,024 + 1,536 + 512
    + 64 = 4,712; FeedForward 2h + 4 + 2h + 8f = 5,124: 9,836 B a token (CPU 13,644 = 9,836 + 6 x 512
    for the two block norms + 6 x 128 - 2 x 16 for kv_norm). The standard attention list
    (torchtitan_attention_saved at q = kv = a(dn + dr) = 384) would book 4,164 for the attention.
    Moved one at a time (CPU, a token): wq_a with r 96 +964 = 4r + 4 + 6r; c 256 +1,280 = 4 x 128 +
    6 x 128; a 16 +3,136 = 8 x (2 x 64 + 4 x 48 + 2 x 32 + 8)."""
    dense = [r for r in rows("none") if not r["moe"]]
    assert len(dense) == 6
    assert cuda_equivalent(dense[0]) == 256 * 9_836
    assert [r["layer_bytes"] / 256 - dense[0]["layer_bytes"] / 256 for r in dense[1:4]] == [964, 1_280, 3_136]
    for row in dense:
        assert planned(row) == cuda_equivalent(row), row
    standard = ModelSpec(layers=4, hidden=256, heads=8, kv_heads=8, head_dim=48, ffn=512, vocab=2048)
    train = layout.Training(seq_len=128, precision="bf16", engine="torchtitan")
    assert sum(x.bytes_per_token for x in saved_torchtitan.torchtitan_attention_saved(standard, train)) == 4_164


def test_unchecked_moe_mla_block_on_cuda():
    """No AC, MoE (E 8, k 2, f 128, one shared expert fs 128, softmax, no route_norm): the MLA attention
    4,712, then torchtitan_moe_saved's MLP half 2h + 4 + 4h (the gate's fp32 input) + 4E + 8k + 16k +
    2kh + 8kf + 4kh + 4k + 2h + 8fs = 516 + 1,024 + 32 + 16 + 32 + 1,024 + 2,048 + 2,048 + 8 + 1,536 =
    8,284: 12,996 B a token; measured 4,310,056 = 256 x (12,996 + 3,808 CPU norms) + 8,192 + 32 + 8."""
    moe = [r for r in rows("none") if r["moe"]]
    assert len(moe) == 2
    assert cuda_equivalent(moe[0]) == 256 * 12_996
    for row in moe:
        assert planned(row) == cuda_equivalent(row), row


def test_dense_first_blocks_use_the_mla_list():
    """A DeepSeek-V3-like model with one dense-first block: its dense_block is the measured dense
    MLA block, its MoE blocks the measured MoE block, through the same dispatch."""
    dense_row = rows("none")[0]  # BASE: the MoE row's attention and widths
    moe_row = next(r for r in rows("none") if r["moe"] and not r["q_lora_rank"])
    model = replace(spec(moe_row), dense_layers=1, dense_ffn=dense_row["dense_ffn"])
    assert planned(dense_row, model.dense_block) == cuda_equivalent(dense_row)
    assert planned(moe_row, model) == cuda_equivalent(moe_row)


def test_selective_mla_blocks():
    """SelectiveAC keeps the block input 2h, FlexAttention's output 2a dv and 8a, the kept mm outputs
    and in MoE blocks topk's 12k; every MLA linear is an mm that counts, so the parity follows the
    query path. wq: wq (2a(dn + dr)), wkv_b (2a(dn + dv)), w1 (2f), w2 (2h) keep:
    512 + 512 + 64 + 768 + 1,024 + 1,024 + 512 = 4,416 a token; measured 256 x 4,416 + 5,056 =
    1,135,552. wq_a (r 96): wq_a (2r), wkv_a (2(c + dr)), wo (2h), w3 (2f) keep: 512 + 512 + 64 + 192
    + 288 + 512 + 1,024 = 3,104. MoE with wq: wq, wkv_b, shared w1 (2fs) and w2 (2h); MoE with wq_a:
    wq_a, wkv_a, wo and shared w3 (2fs); the router gate and the grouped_mm uncounted."""
    selective = rows("selective")
    assert selective[0]["layer_bytes"] == 256 * 4_416 + RNG_STATE
    assert selective[1]["layer_bytes"] == 256 * 3_104 + RNG_STATE
    moe = [r for r in selective if r["moe"]]
    assert moe[0]["layer_bytes"] == 256 * (512 + 512 + 64 + 768 + 1_024 + 256 + 512 + 24) + RNG_STATE + UNATTRIBUTED_MOE
    assert moe[1]["layer_bytes"] == 256 * (512 + 512 + 64 + 192 + 288 + 512 + 256 + 24) + RNG_STATE + UNATTRIBUTED_MOE
    for row in selective:
        assert planned(row) == row["layer_bytes"] - RNG_STATE - (UNATTRIBUTED_MOE if row["moe"] else 0), row


def test_full_mla_blocks():
    """FullAC keeps the block input alone: 2h a token (256 x 512 = 131,072 + 5,056, + 8 in MoE blocks)."""
    for row in rows("full"):
        assert row["layer_bytes"] == 256 * 2 * row["dim"] + RNG_STATE + (UNATTRIBUTED_MOE if row["moe"] else 0)
        assert planned(row) == row["layer_bytes"] - RNG_STATE - (UNATTRIBUTED_MOE if row["moe"] else 0), row


def test_op_sac_matmuls_follow_torchtitan_mm_count():
    kept = lambda row: {name: k for name, _, _, _, k in activations.op_sac_matmuls(spec(row))}  # noqa: E731
    base, q_lora = rows("none")[0], rows("none")[1]
    assert kept(base) == {"wq": True, "wkv_a": False, "wkv_b": True, "wo": False, "w1": True, "w3": False, "w2": True}
    assert kept(q_lora) == {"wq_a": True, "wq_b": False, "wkv_a": True, "wkv_b": False, "wo": True,
                            "w1": False, "w3": True, "w2": False}
    moe = next(r for r in rows("none") if r["moe"] and r["q_lora_rank"])
    assert [name for name, k in kept(moe).items() if k] == ["wq_a", "wkv_a", "wo", "shared w3"]


def test_any_term_ten_times_wrong_fails(monkeypatch):
    """Mutation check: each of torchtitan_mla_attention_saved's terms made 10x, one at a time, breaks
    the unchecked comparison in at least one recorded case (the wq_a case has all 15 terms), and each
    MLA matmul's output width made 10x breaks the selective one."""
    original = saved_torchtitan.torchtitan_mla_attention_saved
    train = layout.Training(seq_len=128, precision="bf16", engine="torchtitan")
    n_terms = len(original(spec(rows("none")[1]), train))
    assert n_terms == 15
    for i in range(n_terms):
        def mla(model, training, i=i):
            out = original(model, training)
            return [replace(x, bytes_per_token=10 * x.bytes_per_token) if j == i else x for j, x in enumerate(out)]
        monkeypatch.setattr(saved_torchtitan, "torchtitan_mla_attention_saved", mla)
        assert any(planned(r) != cuda_equivalent(r) for r in rows("none")), i
    monkeypatch.setattr(saved_torchtitan, "torchtitan_mla_attention_saved", original)
    matmuls = activations.op_sac_matmuls
    for name in ("wq", "wq_a", "wq_b", "wkv_a", "wkv_b", "wo"):
        def wide(model, name=name):
            return [(n, i, 10 * o if n == name else o, s, k) for n, i, o, s, k in matmuls(model)]
        monkeypatch.setattr(activations, "op_sac_matmuls", wide)
        # wq_b and wkv_b (with wq_a), wkv_a and wo (with wq) recompute: only the kept ones can move it
        moved = [planned(r) != r["layer_bytes"] - RNG_STATE - (UNATTRIBUTED_MOE if r["moe"] else 0)
                 for r in rows("selective")]
        assert any(moved) == (name in ("wq", "wq_a", "wkv_a", "wkv_b", "wo")), name
    monkeypatch.setattr(activations, "op_sac_matmuls", matmuls)


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_splits_follow_deepseek_v3_sharding(tp):
    """deepseek_v3/sharding.py: wkv_a, kv_norm, wq_a and q_norm replicated over TP (whole), wq, wq_b,
    wkv_b colwise and the attention heads split, wo rowwise. Not measured (one CPU process); checked
    against the sharding plan term by term."""
    row = rows("none")[1]
    train = layout.Training(seq_len=row["seq"], precision="bf16", engine="torchtitan")
    splits = {x.name: x.split for x in saved_torchtitan.torchtitan_mla_attention_saved(spec(row), train)}
    whole = [name for name, split in splits.items() if split == saved_torchtitan.WHOLE]
    assert whole == ["wq or wq_a, and wkv_a input (norm output)", "q_norm input (wq_a output)", "q_norm rstd (fp32)",
                     "wq_b input (q_norm output)", "kv_norm input: wkv_a's whole output (a split view of it)",
                     "kv_norm rstd (fp32)", "wkv_b input (kv_norm output)"]
    assert [name for name, split in splits.items() if split == saved_torchtitan.TP] == [
        "wkv_b output (v is a view of it)", "q (torch.cat of its non-rotary and rotary parts)",
        "k (torch.cat of k_nope and k_pe expanded over the heads)", "flex output (wo input)",
        "flex logsumexp (fp32)", "flex max_scores (fp32)"]
    lay = layout.single(mbs=row["batch"], tp=tp)
    assert float(activations.kept_per_layer(spec(row), train, lay)[0]) < planned(row)
