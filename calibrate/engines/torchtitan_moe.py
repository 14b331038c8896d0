"""What a torchtitan 0.3.0 MoE block keeps for backward under its activation-checkpoint policies.

    pip install torchtitan==0.3.0 && python -m calibrate.engines.torchtitan_moe [--out PATH]

Builds torchtitan's own Qwen3Model with MoE blocks (models/qwen3/__init__.py _build_qwen3_moe_layers:
GQA with fused wqkv and per-head q/k RMSNorm, CosSinRoPE, FlexAttention; models/common/moe.py MoE:
TokenChoiceTopKRouter, RoutedExperts = token dispatcher + GroupedExperts on torch._grouped_mm, and
optionally a shared FeedForward, the piece DeepSeek-V3's blocks add) at small shapes that move the
hidden width, the experts, top-k, the expert width, the shared expert and the router kind one at a
time, on the CPU in bf16. It applies no AC, torchtitan's SelectiveAC (op-level) and FullAC
(distributed/activation_checkpoint.py) and measures what one forward leaves allocated (torch.profiler
allocation events, the model's output excluded) with 2 and 4 layers: half the difference is one
block (calibrate/engines/torchtitan_sac.py forward_retained_bytes, the Llama 3 measurement's method).

Bent to run on the CPU, and why what is kept stays CUDA's (or how the test translates it):
- MoE dispatch: comm_backend "standard" (AllToAllTokenDispatcher) with no EP mesh falls back to
  LocalTokenDispatcher.dispatch/combine (argsort, index, scatter_add in plain torch), exactly what a
  CUDA run without expert parallelism runs. minimal_async_ep (triton) is stubbed at import only.
- torch._grouped_mm runs on the CPU (torch 2.13 has a CPU kernel; its backward does not, and none
  runs here); autograd saves the same (A, B) for it on either device (derivatives.yaml).
- The router gate runs under torch.autocast(device_type, dtype=torch.float32). torch 2.13's
  autocast.__init__ accepts float32 on CUDA but disables autocast on the CPU ("target dtype is not
  supported"), which would run the gate in bf16 and keep the bf16 norm output instead of its fp32
  copy. The CPU autocast kernel itself handles float32, so the context is swapped (in
  torchtitan.models.common.moe only) for one that enables CPU autocast at float32 the way CUDA's
  does: the gate keeps the fp32 copy of its input and the fp32 weight copy, as on CUDA.
- FlexAttention runs eagerly (calibrate/harness/recording.py eager_flex_attention).
- The forward gets no positions (the masks are built from them): torchtitan's trainer passes none,
  and CosSinRoPE then broadcasts a view of its cache instead of gathering a per-token copy.
Not bent, translated in tests/test_activations_torchtitan_moe.py: nn.RMSNorm decomposes on the CPU
(fp32 upcast and fp32 normalized input kept, 6 bytes a token a normalized element more than CUDA's
fused kernel, which keeps the bf16 input), four norms a block: ffn, attention, q and k per head.
Results go to data/references/torchtitan_moe_cpu.json (atomically).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path

import torch

from calibrate.engines.torchtitan_sac import apply_policy, forward_retained_bytes
from calibrate.harness.recording import eager_flex_attention, run_cli, stub_triton_kernels

OUT = Path(__file__).resolve().parents[2] / "data" / "references" / "torchtitan_moe_cpu.json"
BASE = dict(dim=256, heads=8, kv_heads=4, head_dim=32, experts=8, top_k=2, moe_ffn=256, shared_ffn=0,
            score_func="softmax", route_norm=True, seq=128, batch=2)
SHAPES = [  # one field moved from BASE at a time
    {},
    {"dim": 512, "head_dim": 64, "seq": 64},  # h (and the attention with it)
    {"experts": 32},  # E: the router's scores
    {"top_k": 4},  # k: every routed row
    {"moe_ffn": 640},  # f: the experts' intermediates
    {"shared_ffn": 512},  # a shared expert (DeepSeek-V3's MoE)
    {"shared_ffn": 384, "score_func": "sigmoid", "route_norm": False},  # DeepSeek-V3's router
]


def _cpu_float32_autocast() -> None:
    import torchtitan.models.common.moe as moe

    @contextlib.contextmanager
    def autocast(device_type, dtype=None, **kwargs):
        if device_type != "cpu" or dtype is not torch.float32:
            with torch.autocast(device_type, dtype=dtype, **kwargs):
                yield
            return
        enabled, prev = torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")
        torch.set_autocast_dtype("cpu", torch.float32)
        torch.set_autocast_enabled("cpu", True)
        torch.autocast_increment_nesting()
        try:
            yield
        finally:
            if torch.autocast_decrement_nesting() == 0:
                torch.clear_autocast_cache()
            torch.set_autocast_enabled("cpu", enabled)
            torch.set_autocast_dtype("cpu", prev)

    moe.torch = type("torch_with_cuda_like_cpu_autocast", (), {"__getattr__": lambda self, name: getattr(torch, name),
                                                                "autocast": staticmethod(autocast)})()


def build(layers: int, case: dict, policy: str):
    from torchtitan.models.common import CosSinRoPE
    from torchtitan.models.common.config_utils import make_ffn_config
    from torchtitan.models.qwen3 import _build_qwen3_moe_layers, qwen3_configs

    base = qwen3_configs["debugmodel_moe"](attn_backend="flex")
    dim = case["dim"]
    blocks = _build_qwen3_moe_layers(
        n_layers=layers, dim=dim, n_heads=case["heads"], n_kv_heads=case["kv_heads"], head_dim=case["head_dim"],
        moe_hidden_dim=case["moe_ffn"], num_experts=case["experts"], top_k=case["top_k"], fuse_qkv=True,
        attn_backend="flex", moe_comm_backend="standard",
        rope=CosSinRoPE.Config(dim=case["head_dim"], max_seq_len=4096, theta=1000000.0))
    for block in blocks:
        router = dataclasses.replace(block.moe.router, score_func=case["score_func"], route_norm=case["route_norm"])
        shared = None
        if case["shared_ffn"]:
            init = {"weight": torch.nn.init.normal_}
            shared = make_ffn_config(dim=dim, hidden_dim=case["shared_ffn"], w1_param_init=init, w2w3_param_init=init)
        block.moe = dataclasses.replace(block.moe, router=router, shared_experts=shared)
    config = dataclasses.replace(
        base, dim=dim, layers=blocks, tok_embeddings=dataclasses.replace(base.tok_embeddings, embedding_dim=dim),
        norm=dataclasses.replace(base.norm, normalized_shape=dim),
        lm_head=dataclasses.replace(base.lm_head, in_features=dim), enable_weight_tying=False)
    return build_bf16(config, policy)


def build_bf16(config, policy: str):
    """The model of `config`, seeded and initialized, in bf16 for training under `policy`."""
    torch.manual_seed(0)
    model = config.build()
    model.init_weights() if hasattr(model, "init_weights") else None
    return apply_policy(model.to(torch.bfloat16).train(), policy)


def measure_cases(build_model, base: dict, shapes: list) -> list[dict]:
    """Each of `shapes` (fields moved from `base`) under no AC, SelectiveAC and FullAC with the CPU
    bends above: `build_model(layers, case, policy)` with 2 and 4 layers, half the difference."""
    stub_triton_kernels()
    eager_flex_attention()
    _cpu_float32_autocast()
    rows = []
    for moved in shapes:
        case = {**base, **moved}
        for policy in ("none", "selective", "full"):
            two, four = (forward_retained_bytes(build_model(n, case, policy), case["seq"], case["batch"],
                                                pass_positions=False) for n in (2, 4))
            rows.append({**case, "policy": policy, "layer_bytes": (four - two) / 2})
            print(rows[-1], flush=True)
    return rows


def measure() -> list[dict]:
    return measure_cases(build, BASE, SHAPES)


def main(argv=None) -> int:
    return run_cli(argv, __doc__, OUT, "python -m calibrate.engines.torchtitan_moe: torchtitan 0.3.0's Qwen3Model with "
                   "MoE blocks on the CPU in bf16, bytes one forward leaves allocated per block (torch.profiler "
                   "allocation events, 4 layers minus 2, halved); the router's float32 autocast enabled on the CPU as "
                   "CUDA enables it", measure)


if __name__ == "__main__":
    sys.exit(main())
