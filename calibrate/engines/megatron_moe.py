"""What megatron-core 0.16.1's MoE layer saves for backward, per token, counted on the real module.

    pip install megatron-core==0.16.1 && python -m calibrate.engines.megatron_moe [--out PATH]

Builds megatron-core's MoELayer from its local spec (get_gpt_layer_local_spec: SequentialMLP experts
of Column/RowParallelLinear, the alltoall token dispatcher) on the CPU in bf16, one gloo rank, tp = ep
= 1, with Megatron-LM's defaults for a SwiGLU model (bias_activation_fusion, i.e. --bias-swiglu-fusion:
fusions/fused_bias_swiglu.py weighted_bias_swiglu_impl), runs a forward under
torch.autograd.graph.saved_tensors_hooks and a backward, and sums what the forward saved, each storage
once at its size, parameters and the layer's input (the MLP norm's output the block already keeps)
left out, by the code that saved it: router (router.py, moe_utils.py topk_routing_with_score_function),
dispatcher (moe_utils.py permute/unpermute from token_dispatcher.py), experts (experts.py, mlp.py,
the fused SwiGLU) and the shared expert (shared_experts.py). Each configuration runs in a fresh
process. Three CPU stand-ins, none of which changes what is saved: torch.cuda.current_device answers
"cpu" (Router.gating moves its weight there), the dispatcher's CUDA stream and device-to-host copies of
its integer split sizes run on the CPU, and moe_utils' fused-kernel names, defined only when Transformer
Engine imports (te_general_gemm, fused_*), are set to None (unused with the fusions off). Results go to
data/references/megatron_moe_cpu.json (atomically), read by tests/test_activations_megatron_moe.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from calibrate.harness.worker_io import one_gloo_rank

OUT = Path(__file__).resolve().parents[2] / "data" / "references" / "megatron_moe_cpu.json"
HIDDEN, FFN, SEQ, BATCH = 64, 128, 16, 2
CONFIGS = {  # name: TransformerConfig overrides of the base (E 8, top-2, fused SwiGLU, alltoall)
    "E8-k2": {},
    "E4-k2": {"num_moe_experts": 4},
    # megatron-core refuses top-1 without --moe-router-pre-softmax (router.py TopKRouter)
    "E8-k1-pre-softmax": {"moe_router_topk": 1, "moe_router_pre_softmax": True},
    "E8-k2-shared-128": {"moe_shared_expert_intermediate_size": 128},
    "E8-k2-allgather": {"moe_token_dispatcher_type": "allgather"},
}


def category(frames: list) -> str:
    """Which part of the layer saved a tensor, from the megatron-core frames that saved it."""
    s = " ".join(frames)
    if "shared_experts" in s:
        return "shared_expert"
    if "moe/experts.py" in s or "transformer/mlp.py" in s or "fused_bias_swiglu" in s:
        return "experts"
    if "token_dispatcher.py" in s:
        return "dispatcher"
    return "router" if "moe/router.py" in s or "router_gating_linear" in s else "other"


def _cpu_stand_ins(result: dict) -> None:
    import torch
    from megatron.core.transformer.moe import moe_utils
    from megatron.core.transformer.moe import token_dispatcher as td
    from megatron.core.transformer.moe.moe_utils import maybe_move_tensor_to_cpu

    torch.cuda.current_device = lambda: "cpu"
    td.MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = object()

    def dtoh(self, point, tokens_per_expert=None):  # token_dispatcher.py _maybe_dtoh_and_synchronize, on the CPU
        if not self.drop_and_pad and point == self.cuda_dtoh_point:
            tokens_per_expert = maybe_move_tensor_to_cpu(tokens_per_expert)
            for name in ("input_splits", "output_splits", "output_splits_tp"):
                setattr(self, name, maybe_move_tensor_to_cpu(getattr(self, name), as_numpy=True))
            self.num_out_tokens = maybe_move_tensor_to_cpu(self.num_out_tokens)
            if self.num_local_experts > 1 and not self.config.moe_permute_fusion:
                self.num_global_tokens_per_local_expert = maybe_move_tensor_to_cpu(
                    self.num_global_tokens_per_local_expert)
        return tokens_per_expert

    td.MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize = dtoh
    for name in ("te_general_gemm", "fused_compute_score_for_moe_aux_loss", "fused_moe_aux_loss", "fused_permute",
                 "fused_permute_with_probs", "fused_sort_chunks_by_index", "fused_sort_chunks_by_index_with_probs",
                 "fused_topk_with_score_function", "fused_unpermute"):
        if not hasattr(moe_utils, name):
            setattr(moe_utils, name, None)


def count(name: str) -> dict:
    """One configuration in this process: per-token saved bytes by part."""
    import gc
    import traceback
    import weakref

    import torch
    import torch.nn.functional as F

    one_gloo_rank()  # once a process (measure's one_process)
    import megatron.core
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.transformer_config import TransformerConfig

    result = {"name": name, "megatron_core": megatron.core.__version__, "torch": torch.__version__}
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=1)
    torch.manual_seed(0)
    _cpu_stand_ins(result)
    kwargs = dict(num_layers=1, hidden_size=HIDDEN, num_attention_heads=4, ffn_hidden_size=FFN, moe_ffn_hidden_size=FFN,
                  num_moe_experts=8, moe_router_topk=2, gated_linear_unit=True, activation_func=F.silu,
                  params_dtype=torch.bfloat16, bf16=True, add_bias_linear=False, moe_token_dispatcher_type="alltoall",
                  moe_grouped_gemm=False, use_cpu_initialization=True, gradient_accumulation_fusion=False,
                  moe_permute_fusion=False, moe_router_fusion=False, bias_activation_fusion=True,
                  masked_softmax_fusion=False, persist_layer_norm=False, apply_rope_fusion=False,
                  bias_dropout_fusion=False, hidden_dropout=0.0, attention_dropout=0.0)
    config = TransformerConfig(**{**kwargs, **CONFIGS[name]})
    spec = get_gpt_layer_local_spec(num_experts=config.num_moe_experts, moe_grouped_gemm=False).submodules.mlp
    layer = MoELayer(config=config, submodules=spec.submodules, layer_number=1).train()
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    x = torch.randn(SEQ, BATCH, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    saved, refs = [], []

    class Packed:
        __slots__ = ("tensor", "__weakref__")

        def __init__(self, tensor):
            self.tensor = tensor

    def pack(t):
        frames = [f"{f.filename[f.filename.index('megatron/core/'):]}:{f.name}"
                  for f in traceback.extract_stack()[:-1] if "/megatron/core/" in f.filename]
        saved.append((t.untyped_storage().data_ptr(), t.untyped_storage().nbytes(), category(frames)))
        refs.append(weakref.ref(p := Packed(t)))
        return p

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda p: p.tensor):
        out = layer(x)
    out = out[0] if isinstance(out, tuple) else out
    gc.collect()
    parts, seen = {}, {x.untyped_storage().data_ptr()} | params
    for (ptr, nbytes, part), ref in zip(saved, refs):
        if ptr in seen or ref() is None:  # a parameter, the input, counted already, or freed after forward
            continue
        seen.add(ptr)
        parts[part] = parts.get(part, 0) + nbytes
    out.float().sum().backward()  # the layer trains: backward runs on what was saved
    assert x.grad is not None and torch.isfinite(x.grad).all()
    tokens = SEQ * BATCH
    return {**result, "experts": config.num_moe_experts, "topk": config.moe_router_topk,
            "shared_ffn": config.moe_shared_expert_intermediate_size or 0, "hidden": HIDDEN, "ffn": FFN,
            "tokens": tokens, "dispatcher": type(layer.token_dispatcher).__name__,
            "bytes_per_token": {k: v / tokens for k, v in sorted(parts.items())}}


def measure(one_process: bool = False) -> list[dict]:
    """A row for every configuration, each counted in a fresh process (parallel_state and the process
    group are global); one_process: all of them in one (the same tp = ep = 1 parallel state set up
    once, a layer built and counted anew for each), as tests/test_activations_megatron_moe.py does."""
    rows = []
    for names in [list(CONFIGS)] if one_process else [[name] for name in CONFIGS]:
        proc = subprocess.run([sys.executable, "-m", "calibrate.engines.megatron_moe", "--config", ",".join(names)],
                              capture_output=True, text=True, cwd=str(Path(__file__).resolve().parents[2]),
                              timeout=600 * len(names))
        if proc.returncode:
            raise SystemExit(f"megatron_moe {','.join(names)}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
        rows += [json.loads(line) for line in proc.stdout.strip().splitlines()[-len(names):]]
        for row in rows[-len(names):]:
            print(row, flush=True, file=sys.stderr)
    return rows


def main(argv=None) -> int:
    from calibrate.harness.recording import count_or_record

    return count_or_record(sys.argv[1:] if argv is None else argv, count, __doc__, OUT,
                           "python -m calibrate.engines.megatron_moe: megatron-core 0.16.1 MoELayer (local spec, "
                           "SequentialMLP, fused SwiGLU, bf16) on one gloo rank, bytes its forward saves per token by "
                           "part (saved_tensors_hooks, each storage once, parameters and the layer input left out)",
                           measure, "megatron-core")


if __name__ == "__main__":
    sys.exit(main())
