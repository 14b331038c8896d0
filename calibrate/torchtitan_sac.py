"""What a torchtitan 0.3.0 Llama 3 block keeps for backward under its activation-checkpoint policies.

    pip install torchtitan==0.3.0 && python -m calibrate.torchtitan_sac [--out PATH]

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

import argparse
import dataclasses
import json
import sys
import types
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parent.parent / "data" / "references" / "torchtitan_sac_cpu.json"
SHAPES = [  # (dim, heads, kv_heads, ffn, seq, batch)
    (256, 16, 16, 768, 128, 2),
    (256, 8, 2, 768, 128, 2),  # GQA: the fused wqkv output narrows
    (512, 8, 8, 1024, 64, 2),  # h and f
    (256, 16, 4, 1536, 64, 4),  # f alone against the rest
]


def _stub_triton_kernels() -> None:
    """torchtitan.distributed.minimal_async_ep imports triton at import time (its MoE all-to-all)."""
    stub = types.ModuleType("torchtitan.distributed.minimal_async_ep")

    def unavailable(*args, **kwargs):
        raise RuntimeError("MoE async dispatch is not available on the CPU")

    stub.combine_op = stub.dispatch_op = stub.init_buffer = unavailable
    stub.MinimalAsyncEPDispatchMetadata = type("MinimalAsyncEPDispatchMetadata", (), {})
    stub.__file__, stub.__path__ = __file__, []
    sys.modules.setdefault("torchtitan.distributed.minimal_async_ep", stub)


def _eager_flex_attention() -> None:
    import torch.nn.attention.flex_attention as fa
    from torchtitan.models.common.attention import FlexAttention

    fa._validate_device = lambda *args, **kwargs: None  # forward only: nothing here runs backward
    FlexAttention._compiled_flex_attn = staticmethod(
        lambda *args, kernel_options=None, **kwargs: fa.flex_attention(*args, **kwargs))


def build(layers: int, dim: int, heads: int, kv_heads: int, ffn: int, policy: str):
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


def write_recording(out: Path, source: str, rows: list, package: str = "torchtitan") -> None:
    """The recording with the installed torch and `package` (the engine measured) versions, written
    atomically."""
    from importlib.metadata import version

    doc = {"_source": source, "environment": {"torch": torch.__version__, package: version(package),
                                              "device": "cpu"}, "rows": rows}
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(out)


def measure() -> list[dict]:
    _stub_triton_kernels()
    _eager_flex_attention()
    rows = []
    for dim, heads, kv, ffn, seq, batch in SHAPES:
        for policy in ("none", "selective", "full"):
            two, four = (forward_retained_bytes(build(n, dim, heads, kv, ffn, policy), seq, batch) for n in (2, 4))
            rows.append({"dim": dim, "heads": heads, "kv_heads": kv, "ffn": ffn, "seq": seq, "batch": batch,
                         "policy": policy, "layer_bytes": (four - two) / 2})
            print(rows[-1], flush=True)
    return rows


def run_cli(argv, doc: str, default_out: Path, source: str, measure_rows, package: str = "torchtitan") -> int:
    """`python -m calibrate.<script> [--out PATH]`: measure and write the recording."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--out", type=Path, default=default_out)
    write_recording(p.parse_args(argv).out, source, measure_rows(), package)
    return 0


def main(argv=None) -> int:
    return run_cli(argv, __doc__, OUT, "python -m calibrate.torchtitan_sac: torchtitan's Llama3Model on the CPU in "
                   "bf16, bytes one forward leaves allocated per block (torch.profiler allocation events, 4 layers "
                   "minus 2, halved)", measure)


if __name__ == "__main__":
    sys.exit(main())
