"""What a torchtitan 0.3.0 DeepSeek-V3 block (multi-head latent attention) keeps for backward.

    pip install torchtitan==0.3.0 && python -m calibrate.engines.torchtitan_mla [--out PATH]

Builds torchtitan's own DeepSeekV3Model (models/deepseek_v3: model.py Attention, the MLA module, with
wq or wq_a -> q_norm -> wq_b, wkv_a -> kv_norm -> wkv_b, ComplexRoPE on the rotary parts, FlexAttention
and wo; DeepSeekV3TransformerBlock with a dense FeedForward or models/common/moe.py MoE with a shared
FeedForward) through models/deepseek_v3/__init__.py build_mla_moe_layers, every block dense (the
dense-first kind) or every block MoE, at small shapes that move the query rank (0: wq), the
key/value rank, the heads, the head widths (non-rotary, rotary, value) and the router one at a time,
on the CPU in bf16. It applies no AC, torchtitan's SelectiveAC (op-level) and FullAC and measures what
one forward leaves allocated with 2 and 4 layers: half the difference is one block
(calibrate/engines/torchtitan_sac.py forward_retained_bytes).

Bent to run on the CPU exactly as calibrate/engines/torchtitan_moe.py bends the Qwen3 MoE model (the MoE
dispatch falls back to LocalTokenDispatcher, minimal_async_ep stubbed at import, the router gate's
float32 autocast enabled on the CPU as CUDA enables it, FlexAttention eager, no positions passed:
torchtitan's trainer passes none and ComplexRoPE then multiplies by a view of its cache).
Not bent, translated in tests/test_activations_torchtitan_mla.py: nn.RMSNorm decomposes on the CPU.
Results go to data/references/torchtitan_mla_cpu.json (atomically).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from calibrate.engines.torchtitan_moe import build_bf16, measure_cases
from calibrate.harness.recording import run_cli

OUT = Path(__file__).resolve().parents[2] / "data" / "references" / "torchtitan_mla_cpu.json"
BASE = dict(moe=False, dim=256, heads=8, q_lora_rank=0, kv_lora_rank=128, qk_nope_head_dim=32, qk_rope_head_dim=16,
            v_head_dim=32, dense_ffn=512, experts=8, top_k=2, moe_ffn=128, shared_experts=1, score_func="softmax",
            route_norm=False, seq=128, batch=2)
SHAPES = [  # one field moved from BASE at a time
    {},
    {"q_lora_rank": 96},  # wq_a -> q_norm -> wq_b in place of wq
    {"kv_lora_rank": 256},  # c: kv_norm and wkv_b's input
    {"heads": 16},  # a: every per-head width
    {"qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 48},  # head widths, d_v != d_nope
    {"dim": 512},  # h
    {"moe": True},  # an MoE block (shared expert, softmax router)
    {"moe": True, "q_lora_rank": 96, "score_func": "sigmoid", "route_norm": True},  # DeepSeek-V3's router and wq_a
]


def build(layers: int, case: dict, policy: str):
    from torchtitan.models.deepseek_v3 import deepseekv3_configs
    from torchtitan.models.deepseek_v3 import _build_dsv3_layers

    base = deepseekv3_configs["debugmodel"](attn_backend="flex", moe_comm_backend="standard")
    dim = case["dim"]
    rope = dataclasses.replace(base.layers[0].attention.rope, dim=case["qk_rope_head_dim"])
    blocks = _build_dsv3_layers(
        n_layers=layers, n_dense_layers=0 if case["moe"] else layers, dim=dim, n_heads=case["heads"],
        q_lora_rank=case["q_lora_rank"], kv_lora_rank=case["kv_lora_rank"], qk_nope_head_dim=case["qk_nope_head_dim"],
        qk_rope_head_dim=case["qk_rope_head_dim"], v_head_dim=case["v_head_dim"], mscale=0.70,
        dense_hidden_dim=case["dense_ffn"], moe_hidden_dim=case["moe_ffn"], num_experts=case["experts"],
        num_shared_experts=case["shared_experts"], router_top_k=case["top_k"], router_score_func=case["score_func"],
        router_route_norm=case["route_norm"], attn_backend="flex", moe_comm_backend="standard",
        non_blocking_capacity_factor=None, rope=rope)
    config = dataclasses.replace(
        base, dim=dim, layers=blocks, mtp_layers=[],
        tok_embeddings=dataclasses.replace(base.tok_embeddings, embedding_dim=dim),
        norm=dataclasses.replace(base.norm, normalized_shape=dim),
        lm_head=dataclasses.replace(base.lm_head, in_features=dim))
    return build_bf16(config, policy)


SOURCE = ("python -m calibrate.engines.torchtitan_mla: torchtitan 0.3.0's DeepSeekV3Model (MLA) with dense or MoE "
          "blocks on the CPU in bf16, bytes one forward leaves allocated per block (torch.profiler allocation events, "
          "4 layers minus 2, halved); the router's float32 autocast enabled on the CPU as CUDA enables it")

if __name__ == "__main__":
    sys.exit(run_cli(None, __doc__, OUT, SOURCE, lambda: measure_cases(build, BASE, SHAPES)))
