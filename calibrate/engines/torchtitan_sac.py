"""What a torchtitan 0.3.0 Llama 3 block keeps for backward under its activation-checkpoint policies.

    pip install torchtitan==0.3.0 && python -m calibrate.engines.torchtitan_sac [--out PATH]

Builds torchtitan's own Llama3Model (models/llama3: fused wqkv, FlexAttention) at small shapes on
the CPU in bf16, applies its SelectiveAC (op-level) and FullAC policies (distributed/
activation_checkpoint.py), and measures what one forward leaves allocated (torch.profiler
allocation events, the model's output excluded), with 2 and 4 layers: half the difference is one
block. torchtitan checkpoints non-reentrantly, so saved_tensors_hooks cannot see inside; the
allocator can. Three things are bent to run on a CPU, none of which changes what is kept:
FlexAttention runs eagerly instead of compiled (torchtitan compiles it; both return out, lse and
max_scores), its CPU-backward refusal is lifted for the forward (no backward runs here), and the
MoE dispatch kernels (triton-only, unused by a dense Llama) are not imported. Results go to
data/references/torchtitan_sac_cpu.json (atomically), read by tests/test_activations_real.py.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

from calibrate.harness.recording import eager_flex_attention, run_cli, stub_triton_kernels

OUT = Path(__file__).resolve().parents[2] / "data" / "references" / "torchtitan_sac_cpu.json"
SHAPES = [  # (dim, heads, kv_heads, ffn, seq, batch)
    (256, 16, 16, 768, 128, 2),
    (256, 8, 2, 768, 128, 2),  # GQA: the fused wqkv output narrows
    (512, 8, 8, 1024, 64, 2),  # h and f
    (256, 16, 4, 1536, 64, 4),  # f alone against the rest
]


def build(layers: int, dim: int, heads: int, kv_heads: int, ffn: int, policy: str, convert=None):
    """torchtitan's Llama3Model at this shape in bf16 under `policy`; `convert` (a model config to a
    model config, as torchtitan's converters are) is applied before it is built."""
    from torchtitan.models.common import ComplexRoPE
    from torchtitan.models.llama3 import _build_llama3_layers, llama3_configs

    base = llama3_configs["debugmodel"](attn_backend="flex")
    blocks = _build_llama3_layers(n_layers=layers, dim=dim, n_heads=heads, n_kv_heads=kv_heads, hidden_dim=ffn,
                                  rope=ComplexRoPE.Config(dim=dim // heads, max_seq_len=4096, theta=500000),
                                  fuse_qkv=True, attn_backend="flex")
    config = dataclasses.replace(
        base, dim=dim, layers=blocks, tok_embeddings=dataclasses.replace(base.tok_embeddings, embedding_dim=dim),
        norm=dataclasses.replace(base.norm, normalized_shape=dim),
        lm_head=dataclasses.replace(base.lm_head, in_features=dim))
    if convert is not None:
        config = convert(config)
    torch.manual_seed(0)
    return apply_policy(config.build().to(torch.bfloat16).train(), policy)


def apply_policy(model, policy: str):
    """torchtitan's own SelectiveAC (op-level) or FullAC on `model`, or none."""
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    if policy == "selective":
        SelectiveAC(SelectiveAC.Config()).apply(model)
    elif policy == "full":
        FullAC(FullAC.Config()).apply(model)
    return model


def forward_retained_bytes(model, seq: int, batch: int, pass_positions: bool = True) -> int:
    """Bytes one forward leaves allocated (torch.profiler allocation events), the output excluded;
    `pass_positions` False calls the model without positions, as torchtitan's trainer does."""
    from torch.profiler import ProfilerActivity, profile

    import gc

    gc.collect()  # a model freed while profiling would count as a negative allocation
    ids = torch.randint(0, 2048, (batch, seq))
    positions = torch.arange(seq).repeat(batch, 1)
    masks = model.get_attention_masks(positions=positions)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = model(ids, positions=positions, attention_masks=masks) if pass_positions else \
            model(ids, attention_masks=masks)
    allocated = sum(e.self_cpu_memory_usage for e in prof.events() if e.self_cpu_memory_usage)
    return allocated - out.numel() * out.element_size()


def measure() -> list[dict]:
    stub_triton_kernels()
    eager_flex_attention()
    rows = []
    for dim, heads, kv, ffn, seq, batch in SHAPES:
        for policy in ("none", "selective", "full"):
            two, four = (forward_retained_bytes(build(n, dim, heads, kv, ffn, policy), seq, batch) for n in (2, 4))
            rows.append({"dim": dim, "heads": heads, "kv_heads": kv, "ffn": ffn, "seq": seq, "batch": batch,
                         "policy": policy, "layer_bytes": (four - two) / 2})
            print(rows[-1], flush=True)
    return rows


def main(argv=None) -> int:
    return run_cli(argv, __doc__, OUT, "python -m calibrate.engines.torchtitan_sac: torchtitan's Llama3Model on the "
                   "CPU in bf16, bytes one forward leaves allocated per block (torch.profiler allocation events, "
                   "4 layers minus 2, halved)", measure)


if __name__ == "__main__":
    sys.exit(main())
