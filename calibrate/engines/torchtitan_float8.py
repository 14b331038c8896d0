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
the same block without the converter (rows of kind "saved").

And what FSDP2 all-gathers of each unit with torchao's float8 all-gather, as torchtitan 0.2.2 enabled
it (components/float8.py: convert_to_float8_training with Float8LinearConfig(enable_fsdp_float8_all_gather
=True), tensorwise; torchtitan 0.3.0's converter builds Float8Linear without it), against bf16: the
torchtitan_fsdp model (3 blocks, dim 64) under apply_fsdp_to_decoder on 2 gloo ranks, each
all-gather's output buffer recorded in one forward (rows of kind "all_gather", bytes per unit).
Results go to data/references/torchtitan_float8_cpu.json (atomically), read by
tests/test_activations_real.py and tests/test_fp8.py.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from calibrate.engines.torchtitan_sac import build, forward_retained_bytes
from calibrate.harness.recording import eager_flex_attention, stub_triton_kernels, worker_or_record

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
    return measure_saved() + measure_all_gather()


def measure_saved() -> list[dict]:
    stub_triton_kernels()
    eager_flex_attention()
    rows = []
    for dim, heads, kv, ffn, seq, batch in SHAPES:
        for policy in ("none", "selective", "full"):
            for recipe in RECIPES:
                convert = None if recipe == "bf16" else float8_converter(recipe)
                two, four = (forward_retained_bytes(build(n, dim, heads, kv, ffn, policy, convert), seq, batch)
                             for n in (2, 4))
                rows.append({"kind": "saved", "dim": dim, "heads": heads, "kv_heads": kv, "ffn": ffn, "seq": seq,
                             "batch": batch, "policy": policy, "recipe": recipe, "layer_bytes": (four - two) / 2})
                print(rows[-1], flush=True)
    return rows


def measure_all_gather() -> list[dict]:
    from calibrate.engines import torchtitan_fsdp as tf
    from calibrate.harness.launch import launch

    out = launch("calibrate.engines.torchtitan_float8", ["--worker", json.dumps({})], nproc=tf.D, timeout_s=300)
    if out.status != "ok" or len(out.ranks) != tf.D:
        raise SystemExit(f"torchtitan_float8: {out.status}: {out.error}\n{out.log_tail}")
    first, second = (r["runs"] for r in out.ranks)
    assert first == second, "the ranks differ"
    return [{"kind": "all_gather", "dim": tf.DIM, "heads": tf.HEADS, "kv_heads": tf.KV_HEADS, "ffn": tf.FFN,
             "layers": tf.LAYERS, "vocab": ALL_GATHER_VOCAB, "ranks": tf.D, **r} for r in first]


ALL_GATHER_VOCAB = 256


def all_gather_worker(cfg: dict) -> None:
    """Each unit's all-gather output bytes in one forward, bf16 and with torchao's float8 all-gather."""
    stub_triton_kernels()  # before torchtitan is imported
    eager_flex_attention()
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    from calibrate.engines import torchtitan_fsdp as tf
    from calibrate.harness.worker_io import rank, write_result

    dist.init_process_group("gloo")
    runs = []
    for recipe in ("bf16", "tensorwise-fp8-all-gather"):
        model = tf.build(ALL_GATHER_VOCAB)
        units = {}
        for fqn, p in model.named_parameters():
            units[tf.unit_of(fqn)] = units.get(tf.unit_of(fqn), 0) + p.numel()
        if recipe != "bf16":  # torchtitan 0.2.2's Float8Converter.convert, emulated
            convert_to_float8_training(model, config=Float8LinearConfig(emulate=True, enable_fsdp_float8_all_gather=True),
                                       module_filter_fn=lambda mod, fqn: fqn != "lm_head")
        apply_fsdp_to_decoder(model, init_device_mesh("cpu", (tf.D,), mesh_dim_names=("fsdp",)),
                              param_dtype=torch.bfloat16, reduce_dtype=torch.float32, pp_enabled=False,
                              reshard_after_forward_policy="default")
        gathered = []

        class RecordingAllGather(DefaultAllGather):
            def __call__(self, output_tensor, input_tensor, group, async_op=False):
                gathered.append(output_tensor.numel() * output_tensor.element_size())
                super().__call__(output_tensor, input_tensor, group, async_op=False)

        for m in model.modules():
            if hasattr(m, "set_custom_all_gather"):
                m.set_custom_all_gather(RecordingAllGather())
        with torch.no_grad():  # the units gather in forward order: embedding, blocks, [norm, lm_head]
            model(torch.randint(0, ALL_GATHER_VOCAB, (2, 32)),
                  attention_masks=model.get_attention_masks(positions=torch.arange(32).repeat(2, 1)))
        order = ["embed", *[f"layers.{i}" for i in range(tf.LAYERS)], "head"]
        runs.append({"recipe": recipe, "unit_params": units, "gathered_bytes": dict(zip(order, gathered, strict=True))})
    write_result({"rank": rank(), "world": dist.get_world_size(), "runs": runs})


def main(argv=None) -> int:
    return worker_or_record(argv, all_gather_worker, __doc__, OUT, "python -m calibrate.engines.torchtitan_float8: "
                            "torchtitan's Llama3Model on the CPU in bf16 with torchao's emulated float8 linears "
                            "(torchtitan's Float8LinearConverter), bytes one forward leaves allocated per block "
                            "(torch.profiler allocation events, 4 layers minus 2, halved), beside the block without "
                            "them; each FSDP2 unit's all-gather output on 2 gloo ranks, bf16 and with torchao's float8 "
                            "all-gather", measure, package=("torchtitan", "torchao"))


if __name__ == "__main__":
    sys.exit(main())
