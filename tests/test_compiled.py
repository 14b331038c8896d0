"""torch.compile of Hugging Face blocks (--compile) against what Inductor really makes of one.

The reference, data/references/hf_compiled_cpu.json, is python -m calibrate.benches.hf_compiled: transformers'
LlamaDecoderLayer (SDPA, bf16) eager and torch.compile'd (Inductor, default mode, caches off) on the
CPU at three shapes: the bytes per token its forward saves (saved_tensors_hooks, each storage once,
parameters, input and rotary tables left out), and the kernels Inductor generates per forward and
backward graph with the extern GEMMs and attention it calls beside them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner import activations, compute, export, hardware, layout, memory
from planner.errors import InputError
from planner.model import ModelSpec, lookup
from planner.stage import Step

REFERENCE = Path(__file__).resolve().parent.parent / "data" / "references" / "hf_compiled_cpu.json"
ROWS = json.loads(REFERENCE.read_text())["rows"]
C = memory.coefficients("time")


def _model(row) -> ModelSpec:
    return ModelSpec(layers=1, hidden=row["hidden"], heads=row["heads"], kv_heads=row["kv_heads"], ffn=row["ffn"],
                     vocab=256)


def _per_token(row, compiled: bool) -> float:
    training = layout.Training(seq_len=row["seq"], engine="fsdp", compile=compiled)
    return sum(x.bytes_per_token for x in activations.saved_tensors(_model(row), training, row["seq"], 1.0, row["batch"]))


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"h{r['hidden']}-kv{r['kv_heads']}-f{r['ffn']}")
def test_compiled_layer_saves_what_inductor_saves(row):
    h, q, kv, a, f = row["hidden"], row["hidden"], row["kv_heads"] * row["hidden"] // row["heads"], row["heads"], row["ffn"]
    # compiled, bf16: norm outputs 2 x 2h, rstd 2 x 4, q 2q, k and v 2 x 2kv, SDPA output 2q and lse 4a,
    # o_proj's input copy 2q, gate, up and down's input 3 x 2f: 4h + 6q + 4kv + 4a + 6f + 8
    assert row["compiled_bytes_per_token"] == 4 * h + 6 * q + 4 * kv + 4 * a + 6 * f + 8  # 7,080 at h 256 kv 64 f 704
    # eager (hf_llama_saved, measured on the layer before): 16h + 4q + 4kv + 4a + 8f + 8
    assert row["eager_bytes_per_token"] == 16 * h + 4 * q + 4 * kv + 4 * a + 8 * f + 8
    assert _per_token(row, compiled=True) == row["compiled_bytes_per_token"]
    assert _per_token(row, compiled=False) == row["eager_bytes_per_token"]


def test_compiled_layer_launches_inductors_kernels_and_its_extern_ones():
    # GQA rows: 20 generated + 7 GEMMs + SDPA forward; 11 generated + 14 GEMMs + SDPA backward
    row = next(r for r in ROWS if r["kv_heads"] < r["heads"])
    assert (row["forward_extern"], row["backward_extern"]) == (8, 15)
    fwd, bwd = compute.eager_host_s(lookup("llama-3-8b"), layout.Training(engine="fsdp", compile=True), C)
    assert (fwd, bwd) == pytest.approx(((row["forward_kernels"] + 8) * C["eager_op_host_s"],
                                        (row["backward_kernels"] + 15) * C["eager_op_host_s"]))
    eager = compute.eager_host_s(lookup("llama-3-8b"), layout.Training(engine="fsdp"), C)
    assert eager == pytest.approx((81 * C["eager_op_host_s"], 146 * C["eager_op_host_s"]))  # eager_ops_cpu.json


def test_compiled_blocks_move_what_fused_kernels_move():
    """Inductor fuses each pointwise/reduction region (Ansel et al. 2024 section 5): a compiled block's
    elementwise traffic is the fused-kernel list the planner uses for Megatron's fused kernels, well
    under the eager block's measured bytes."""
    m, cluster = lookup("llama-3-8b"), hardware.Cluster(hardware.lookup_gpu("h100-sxm"), 8, 8)
    lay = layout.single(dp=8, zero=3, mbs=1)
    compiled = compute.elementwise_fwd_s(Step(m, cluster, layout.Training(engine="fsdp", compile=True), lay, C))[0]
    fused = compute.elementwise_fwd_s(Step(m, cluster, layout.Training(engine="megatron"), lay, C))[0]
    eager = compute.elementwise_fwd_s(Step(m, cluster, layout.Training(engine="fsdp"), lay, C))[0]
    assert compiled == pytest.approx(fused) and compiled < 0.5 * eager


def test_compile_is_refused_where_it_was_not_measured():
    with pytest.raises(InputError, match="--compile: measured for Hugging Face blocks"):
        layout.Training(engine="megatron", compile=True)
    from planner import api

    with pytest.raises(InputError, match="--compile: measured for transformers' Llama-style dense blocks"):
        api.estimate("qwen3-8b", {"gpus": 8}, {"engine": "fsdp", "compile": True}, {"dp": 8, "zero": 3})


def test_compile_is_exported_to_accelerate(tmp_path):
    """accelerate launch reads dynamo_config from the file and hands the backend to the training
    process (accelerate/utils/launch.py prepare_multi_gpu_env: ACCELERATE_DYNAMO_BACKEND)."""
    from accelerate.commands import launch as accel_launch
    from accelerate.utils import launch as accel_launch_utils

    m, cluster = lookup("llama-3-8b"), hardware.Cluster(hardware.lookup_gpu("h100-sxm"), 8, 8)
    row = {"tp": 1, "pp": 1, "dp": 8, "cp": 1, "ep": 1, "zero": 3, "mbs": 1, "gas": 1, "recompute": "none",
           "sequence_parallel": False, "offload_optimizer": "none", "offload_params": "none"}
    path = tmp_path / "accelerate_config.yaml"
    path.write_text(export.accelerate_yaml(m, cluster, layout.Training(engine="fsdp", compile=True), row, "ds.json"))
    args = accel_launch.launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, _, _ = accel_launch._validate_launch_command(args)
    assert accel_launch_utils.prepare_multi_gpu_env(args)["ACCELERATE_DYNAMO_BACKEND"] == "INDUCTOR"
    assert "dynamo_config" not in export.accelerate_config(m, cluster, layout.Training(engine="fsdp"), row, "ds.json")


@pytest.mark.slow
def test_compiled_model_under_checkpointing_keeps_each_layer_input():
    """torch.compile of a whole transformers LlamaModel with activation_checkpointing_enable (dynamo
    traces the non-reentrant checkpoint as a region AOT Autograd recomputes): per layer, the forward
    saves the layer's bf16 input alone, as eager does (2h B a token: half the difference of 4 and 2
    layers, counted with saved_tensors_hooks on the CPU, ~20 s)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch._inductor.config.fx_graph_cache = False

    def saved(layers: int) -> int:
        torch._dynamo.reset()
        torch.manual_seed(0)
        config = transformers.LlamaConfig(hidden_size=256, num_attention_heads=8, num_key_value_heads=2,
                                          intermediate_size=704, vocab_size=256, num_hidden_layers=layers,
                                          attn_implementation="sdpa")
        model = transformers.LlamaModel(config).to(torch.bfloat16).train()
        model.activation_checkpointing_enable()
        compiled = torch.compile(model)
        seen, total = {p.untyped_storage().data_ptr() for p in model.parameters()}, 0

        def pack(t):
            nonlocal total
            if t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                total += t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            compiled(input_ids=torch.randint(0, 256, (2, 128)), use_cache=False)
        return total

    per_layer = (saved(4) - saved(2)) / 2 / (2 * 128)
    assert per_layer == 2 * 256  # the bf16 input, 2h
    model = ModelSpec(layers=1, hidden=256, heads=8, kv_heads=2, ffn=704, vocab=256)
    training = layout.Training(seq_len=128, engine="fsdp", compile=True)
    kept = activations.kept_per_layer(model, training, layout.single(mbs=2, recompute="full"))[0]
    assert kept / (2 * 128) == per_layer
