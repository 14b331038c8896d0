"""What a torchtitan 0.3.0 Llama 3 block keeps for backward with torchao's float8 linears, tensorwise and
rowwise, under its activation-checkpoint policies.

    pip install torchtitan==0.3.0 torchao==0.18.0 && python -m calibrate.engines.torchtitan_float8 [--out PATH]

The block of calibrate.engines.torchtitan_sac (torchtitan's own Llama3Model, fused wqkv, FlexAttention,
bf16, on the CPU) with its linears swapped by torchtitan's own Float8LinearConverter
(components/quantization/float8.py: torchao's Float8Linear, the output layer filtered) for each
recipe's torchao Float8LinearConfig (tensorwise: Float8LinearConfig(), torchtitan 0.2.2's default;
rowwise: from_recipe_name('rowwise'), 0.3.0's), each with emulate=True: torchao's float8 matmul
runs as a 16-bit mm of the casts on the CPU, where the hardware has no float8 GEMM, and what the
autograd functions save (matmul_with_hp_or_float8_args: the high-precision input and weight) and
what the checkpoint policies see (aten.mm with float8 arguments, aten.max for the tensorwise amax)
are the GPU path's. Bytes one forward leaves allocated per block (4 layers minus 2, halved), beside
the same block without the converter. Results go to data/references/torchtitan_float8_cpu.json
(atomically), read by tests/test_activations_real.py.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from calibrate.engines.torchtitan_sac import build, forward_retained_bytes
from calibrate.harness.recording import eager_flex_attention, run_cli, stub_triton_kernels

OUT = Path(__file__).resolve().parents[2] / "data" / "references" / "torchtitan_float8_cpu.json"
SHAPES = [  # (dim, heads, kv_heads, ffn, seq, batch): every linear's dims divisible by 16, as torchao needs
    (256, 16, 16, 768, 128, 2),
    (256, 8, 2, 1536, 64, 4),  # GQA, and f against the rest
]
RECIPES = ("bf16", "tensorwise", "rowwise")


def float8_converter(recipe: str):
    """torchtitan's Float8LinearConverter with the recipe's torchao config, emulated (the converter's
    own emulate flag would take tensorwise whatever the recipe)."""
    from torchao.float8 import Float8LinearConfig
    from torchtitan.components.quantization.float8 import Float8LinearConverter

    converter = Float8LinearConverter(Float8LinearConverter.Config(emulate=True, filter_fqns=["lm_head"]))
    config = Float8LinearConfig() if recipe == "tensorwise" else Float8LinearConfig.from_recipe_name(recipe)
    converter.torchao_config = dataclasses.replace(config, emulate=True)
    return converter.convert


def measure() -> list[dict]:
    stub_triton_kernels()
    eager_flex_attention()
    rows = []
    for dim, heads, kv, ffn, seq, batch in SHAPES:
        for policy in ("none", "selective", "full"):
            for recipe in RECIPES:
                convert = None if recipe == "bf16" else float8_converter(recipe)
                two, four = (forward_retained_bytes(build(n, dim, heads, kv, ffn, policy, convert), seq, batch)
                             for n in (2, 4))
                rows.append({"dim": dim, "heads": heads, "kv_heads": kv, "ffn": ffn, "seq": seq, "batch": batch,
                             "policy": policy, "recipe": recipe, "layer_bytes": (four - two) / 2})
                print(rows[-1], flush=True)
    return rows


def main(argv=None) -> int:
    return run_cli(argv, __doc__, OUT, "python -m calibrate.engines.torchtitan_float8: torchtitan's Llama3Model on "
                   "the CPU in bf16 with torchao's emulated float8 linears (torchtitan's Float8LinearConverter), bytes "
                   "one forward leaves allocated per block (torch.profiler allocation events, 4 layers minus 2, "
                   "halved), beside the block without them", measure, package=("torchtitan", "torchao"))


if __name__ == "__main__":
    sys.exit(main())
