"""What megatron-core 0.16.1's selective recompute keeps of a transformer layer, per --recompute-modules,
counted on the real layer.

    pip install megatron-core==0.16.1 && python -m calibrate.engines.megatron_recompute [--out PATH]

Builds megatron-core's TransformerLayer from its local spec (get_gpt_layer_local_spec: RMSNorm modules of
their own before the attention and the MLP, unfused DotProductAttention, an MLP or an MoELayer of
SequentialMLP experts with a shared expert and the alltoall dispatcher) on the CPU in bf16, one gloo rank,
under recompute_granularity 'selective' with each recompute_modules list below, runs a forward under
torch.autograd.graph.saved_tensors_hooks and sums, once the forward is done, the storage each saved tensor
still holds (an output-discarding checkpoint, tensor_parallel/random.py CheckpointWithoutOutput, frees its
output's storage after the forward used it), each storage once, parameters and the layer input left out;
then a backward (which recomputes). It also counts what the local RMSNorm alone saves, beside its input.
Stand-ins, none of which changes what is saved: megatron_moe's CPU stand-ins (calibrate/engines/
megatron_moe.py), the checkpoints' CUDA RNG state (none on the CPU) and the tracker's fork, an explicit
causal mask (the default builds one on CUDA), and Transformer Engine's FP8 state, off (megatron-core's
CheckpointWithoutOutput reads it whatever its fp8 argument: `self.fp8 = fp8 is not None`). Results go to
data/references/megatron_recompute_cpu.json (atomically), read by tests/test_megatron_recompute.py.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from calibrate.harness.worker_io import counted_in_child, one_gloo_rank

OUT = Path(__file__).resolve().parents[2] / "data" / "references" / "megatron_recompute_cpu.json"
HIDDEN, FFN, SEQ, BATCH, HEADS = 64, 128, 16, 2, 4
CONFIGS = {  # name: (MoE layer?, recompute_modules)
    "moe-core_attn": (True, ["core_attn"]),
    "moe-core_attn-moe": (True, ["core_attn", "moe"]),
    "moe-core_attn-shared_experts": (True, ["core_attn", "shared_experts"]),
    "moe-core_attn-layernorm": (True, ["core_attn", "layernorm"]),
    "dense-core_attn": (False, ["core_attn"]),
    "dense-core_attn-mlp": (False, ["core_attn", "mlp"]),
    "dense-core_attn-layernorm": (False, ["core_attn", "layernorm"]),
}


def _cpu_checkpoints() -> None:
    import megatron.core.tensor_parallel.random as mrandom

    mrandom._get_cuda_rng_state = lambda *args, **kwargs: None
    mrandom._set_cuda_rng_state = lambda *args, **kwargs: None
    type(mrandom.get_cuda_rng_tracker()).fork = lambda self, name=None: contextlib.nullcontext()

    class NoFp8:
        is_fp8_enabled = staticmethod(lambda: False)
        get_fp8_recipe = staticmethod(lambda: None)

    mrandom.FP8GlobalStateManager = NoFp8
    mrandom.activation_recompute_forward = lambda **kwargs: contextlib.nullcontext()
    mrandom.fp8_autocast = lambda **kwargs: contextlib.nullcontext()


def _kept_bytes(run, excluded: set) -> int:
    """Bytes the tensors `run` saves still hold after it returns, each storage once."""
    import gc

    import torch

    packed = []

    class Packed:
        __slots__ = ("tensor",)

        def __init__(self, tensor):
            self.tensor = tensor

    def pack(t):
        packed.append(p := Packed(t))
        return p

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda p: p.tensor):
        out = run()
    gc.collect()
    seen, total = set(excluded), 0
    for p in packed:
        storage = p.tensor.untyped_storage()
        if storage.data_ptr() in seen and storage.nbytes():
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return out, total


def count(name: str) -> dict:
    """One configuration in this process: per-token bytes the layer keeps, and its RMSNorm's own."""
    import torch
    import torch.nn.functional as F

    one_gloo_rank()
    import megatron.core
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import TransformerLayer

    from calibrate.engines.megatron_moe import _cpu_stand_ins

    moe, modules = CONFIGS[name]
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=1)
    _cpu_stand_ins({})
    _cpu_checkpoints()
    torch.manual_seed(0)
    kwargs = dict(num_layers=1, hidden_size=HIDDEN, num_attention_heads=HEADS, ffn_hidden_size=FFN,
                  gated_linear_unit=True, activation_func=F.silu, params_dtype=torch.bfloat16, bf16=True,
                  add_bias_linear=False, normalization="RMSNorm", use_cpu_initialization=True,
                  gradient_accumulation_fusion=False, bias_activation_fusion=True, masked_softmax_fusion=False,
                  persist_layer_norm=False, apply_rope_fusion=False, bias_dropout_fusion=False, hidden_dropout=0.0,
                  attention_dropout=0.0, recompute_granularity="selective", recompute_modules=list(modules))
    if moe:
        kwargs.update(num_moe_experts=8, moe_router_topk=2, moe_ffn_hidden_size=FFN,
                      moe_shared_expert_intermediate_size=FFN, moe_token_dispatcher_type="alltoall", moe_grouped_gemm=False, moe_permute_fusion=False,
                      moe_router_fusion=False)
    config = TransformerConfig(**kwargs)
    spec = get_gpt_layer_local_spec(num_experts=8 if moe else None, moe_grouped_gemm=False, normalization="RMSNorm")
    layer = TransformerLayer(config=config, submodules=spec.submodules, layer_number=1).train()
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    x = torch.randn(SEQ, BATCH, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    mask = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)[None, None]  # causal, True masked
    out, kept = _kept_bytes(lambda: layer(x, attention_mask=mask), {x.untyped_storage().data_ptr()} | params)
    out = out[0] if isinstance(out, tuple) else out
    out.float().sum().backward()  # the layer trains: backward recomputes and runs on what was kept
    assert x.grad is not None and torch.isfinite(x.grad).all()
    y = torch.randn(SEQ, BATCH, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    norm_out, norm_saved = _kept_bytes(lambda: layer.input_layernorm(y), {y.untyped_storage().data_ptr()} | params)
    tokens = SEQ * BATCH
    return {"name": name, "megatron_core": megatron.core.__version__, "torch": torch.__version__, "moe": moe,
            "recompute_modules": modules, "hidden": HIDDEN, "ffn": FFN, "heads": HEADS, "experts": 8 if moe else 1,
            "topk": 2 if moe else 0, "shared_ffn": FFN if moe else 0, "tokens": tokens,
            "kept_bytes_per_token": kept / tokens,
            "norm_saved_bytes_per_token": norm_saved / tokens,
            "norm_output_bytes_per_token": norm_out.untyped_storage().nbytes() / tokens}


def measure(one_process: bool = False) -> list[dict]:
    """A row for every configuration, each counted in a fresh process (parallel_state is global);
    one_process: all of them in one child."""
    groups = [list(CONFIGS)] if one_process else [[name] for name in CONFIGS]
    return [row for names in groups
            for row in counted_in_child("calibrate.engines.megatron_recompute", names, 600 * len(names))]


def main(argv=None) -> int:
    from calibrate.harness.recording import count_or_record

    return count_or_record(sys.argv[1:] if argv is None else argv, count, __doc__, OUT,
                           "python -m calibrate.engines.megatron_recompute: megatron-core 0.16.1 TransformerLayer "
                           "(local spec, bf16, hidden 64, ffn 128; MoE: 8 experts top-2 and a shared expert of 128) "
                           "on one gloo rank under selective recompute of each recompute_modules list: bytes per "
                           "token its saved tensors still hold after the forward, each storage once, parameters and "
                           "the layer input left out; and what its RMSNorm alone saves beside its input",
                           measure, "megatron-core")


if __name__ == "__main__":
    sys.exit(main())
