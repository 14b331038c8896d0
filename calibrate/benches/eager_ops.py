"""How many operators a Hugging Face decoder layer dispatches, and what each costs the host.

    python -m calibrate.benches.eager_ops [--out PATH]

Eager PyTorch launches every operator from the host: where a block's GPU work is shorter than
the host's dispatch of its operators, the GPU waits (the regime torch.compile and CUDA graphs
exist to leave). This counts, with a TorchDispatchMode, the aten operators one decoder layer of
transformers' own models dispatches in training (train mode, bf16, SDPA): forward, and backward
(autograd nodes and gradient accumulation), as the difference between a 2-layer and a 1-layer
model, so embedding, final norm and loss are left out; and the bytes those operators that are memory
bound read and write, per token and per element of the widths they scale with (layer_bytes), what
the planner's elementwise time of an eager block is. It also times the host's cost per operator
at tiny shapes (median of repeats, 2-layer less 1-layer model; on the GPU where there is one,
whose kernels are then shorter than their dispatch): on a CPU a lower bound for a GPU host, which
adds each kernel's launch. Results go to data/references/eager_ops_cpu.json
(atomically), read by planner/compute.py eager_block_ops and checked by tests/test_eager_ops_real.py.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

OUT = Path(__file__).resolve().parents[2] / "data" / "references" / "eager_ops_cpu.json"
_LLAMA = dict(hidden_size=64, intermediate_size=176, num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
              attn_implementation="sdpa")
_GPT2 = dict(n_embd=64, n_head=4, vocab_size=512, attn_implementation="sdpa")
VARIANTS = {  # planner/compute.py eager_ops_variant name: (transformers class, config)
    "llama": ("LlamaForCausalLM", _LLAMA),
    "llama-qkv-bias": ("Qwen2ForCausalLM", _LLAMA),  # Qwen2: biases on q, k, v only
    "llama-bias": ("LlamaForCausalLM", {**_LLAMA, "attention_bias": True, "mlp_bias": True}),
    "llama-qk-norm": ("Qwen3ForCausalLM", {**_LLAMA, "head_dim": 16}),
    "gpt2": ("GPT2LMHeadModel", _GPT2),  # dropout 0.1 everywhere (GPT2Config defaults)
    "gpt2-no-dropout": ("GPT2LMHeadModel", {**_GPT2, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}),
    "gpt_neox": ("GPTNeoXForCausalLM", dict(hidden_size=64, intermediate_size=256, num_attention_heads=4,
                                           vocab_size=512, attn_implementation="sdpa")),
}
SEQ = 16


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _model(variant: str, layers: int, **overrides):
    import transformers

    cls_name, cfg = VARIANTS[variant]
    cls = getattr(transformers, cls_name)
    torch.manual_seed(0)
    return cls(cls.config_class(num_hidden_layers=layers, **{**cfg, **overrides})).to(torch.bfloat16).to(_device()).train()


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _step(model, ids) -> tuple:
    """(forward, backward) of one micro-batch, each as a callable of the previous one's result."""
    return (lambda: model(input_ids=ids).logits), (lambda logits: logits.float().sum().backward())


def model_ops(variant: str, layers: int) -> tuple:
    """(forward, backward) operators one training micro-batch of the model dispatches."""
    model = _model(variant, layers)
    fwd, bwd = _step(model, torch.randint(0, 512, (1, SEQ), device=_device()))
    with _Count() as f:
        logits = fwd()
    with _Count() as b:
        bwd(logits)
    return f.ops, b.ops


COMPUTE_BOUND = ("mm", "matmul", "scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention")
"""Operators timed as GEMMs and attention (planner/compute.py), not as memory traffic."""
NO_TRAFFIC = ("_unsafe_view", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach",
              "alias", "lift_fresh")
"""Operators that move no data (views outside aten's view tag, allocations)."""


class _Bytes(TorchDispatchMode):
    """Bytes each memory-bound operator reads and writes (every tensor argument and result, once),
    summed by the width each tensor scales with: its elements per token (over the micro-batch's
    `tokens`) matched against `classes` ({elements per token: (base width, multiple)}), the bytes
    credited to the base; 'other' (bytes, not scaled) for the rest and for `fixed` storages."""

    def __init__(self, tokens: int, classes: dict, fixed: set):
        super().__init__()
        self.tokens, self.classes, self.fixed, self.bytes = tokens, classes, fixed, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_leaves

        out = func(*args, **(kwargs or {}))
        name = func._schema.name.split("::")[-1]
        if func.is_view or name in NO_TRAFFIC or any(part in name for part in COMPUTE_BOUND):
            return out
        for t in tree_leaves((args, kwargs, out)):
            if isinstance(t, torch.Tensor):
                per_token = t.numel() / self.tokens
                fixed = t.untyped_storage().data_ptr() in self.fixed
                base = "other" if fixed else self.classes.get(per_token, ("other", 1))[0]
                self.bytes[base] = self.bytes.get(base, 0) + t.numel() * t.element_size()
        return out


BYTE_SHAPES = {  # widths for the byte count where the op counts' shapes make two classes coincide
    # (there kv = h/2): h 96 = 6 heads of 16, kv 2 heads (32), h/2 48, kv/2 16, f 176 all differ
    v: {"hidden_size": 96, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 16}
    for v in ("llama", "llama-qkv-bias", "llama-bias", "llama-qk-norm")}


def width_classes(config) -> tuple:
    """({elements per token: (base, multiple)}, {base: width}) of a transformers config: the MLP's
    width f, the hidden size h (= the query width, asserted), the keys' and values' kv (folded into h
    without GQA), and the fractions rotary splits them into (rotate_half's halves, GPT-NeoX's
    rotary_pct quarter and its halves) and the fused q, k, v of GPT-2 and GPT-NeoX (3h)."""
    h = config.hidden_size
    f = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * h
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    assert heads * head_dim == h, config  # the query width is h: its tensors count with h
    kv = kv_heads * head_dim
    base = {"f": f, "h": h} | ({"kv": kv} if kv != h else {})
    multiples = [("f", 1), ("h", 1), ("h", 0.5), ("h", 3), ("h", 0.25), ("h", 0.75), ("h", 0.125)]
    multiples += [("kv", 1), ("kv", 0.5)] if kv != h else []
    classes = {}
    for name, m in multiples:  # first wins; BYTE_SHAPES keeps them apart
        classes.setdefault(base[name] * m, (name, m))
    return classes, base


def layer_bytes(variant: str, batch: int = 3) -> dict:
    """Bytes per token one decoder layer's memory-bound operators move in training (forward,
    backward), per element of each base width ('h', 'f', 'kv': what planner/compute.py multiplies by
    the model's own widths) and 'other' in bytes per token (norm statistics; RoPE's cos and sin,
    which the rotary module computes once for all layers): the 2-layer model less the 1-layer
    model, bf16. GEMMs and attention are excluded (COMPUTE_BOUND), views and allocations move nothing.
    3 x SEQ tokens: no weight-sized tensor (a bias gradient's sum) has a whole class's elements per token."""
    tokens = batch * SEQ
    counted = []
    for layers in (1, 2):
        model = _model(variant, layers, **BYTE_SHAPES.get(variant, {}))
        classes, base = width_classes(model.config)
        fixed = set()
        for name, module in model.named_modules():  # cos and sin: the head dim per token, built once a forward
            if name.endswith("rotary_emb"):
                module.register_forward_hook(lambda mod, inp, out: fixed.update(t.untyped_storage().data_ptr() for t in out))
        fwd, bwd = _step(model, torch.randint(0, 512, (batch, SEQ), device=_device()))
        with _Bytes(tokens, classes, fixed) as f:
            logits = fwd()
        with _Bytes(tokens, classes, fixed) as b:
            bwd(logits)
        counted.append((f.bytes, b.bytes))
    out = {}
    for phase, (one, two) in zip(("forward", "backward"), zip(*counted)):
        per = {k: (two.get(k, 0) - one.get(k, 0)) / tokens for k in set(one) | set(two)}
        out[phase] = {k: per.get(k, 0.0) / w for k, w in base.items()} | {"other": per.get("other", 0.0)}
    return out


def layer_ops(variant: str) -> dict:
    """Operators of one decoder layer: the 2-layer model's less the 1-layer model's."""
    (f1, b1), (f2, b2) = model_ops(variant, 1), model_ops(variant, 2)
    return {"forward": f2 - f1, "backward": b2 - b1}


def host_s_per_op(variant: str = "llama", repeats: int = 30, runs: int = 7) -> dict:
    """Seconds the host spends per operator of one layer (forward, backward): median over `runs` of
    the 2-layer model's time less the 1-layer model's, per micro-batch, over the layer's operators."""
    ops = layer_ops(variant)
    ids = torch.randint(0, 512, (1, SEQ), device=_device())
    models = {n: _model(variant, n) for n in (1, 2)}

    def timed(n: int) -> tuple:
        fwd, bwd = _step(models[n], ids)
        for _ in range(5):
            bwd(fwd())
        f = b = 0.0
        for _ in range(repeats):  # at these shapes the GPU, where there is one, waits for the host
            _sync()
            t0 = time.perf_counter()
            logits = fwd()
            _sync()
            t1 = time.perf_counter()
            bwd(logits)
            _sync()
            f, b = f + t1 - t0, b + time.perf_counter() - t1
        return f / repeats, b / repeats

    fwd_s, bwd_s = [], []
    for _ in range(runs):
        (f1, b1), (f2, b2) = timed(1), timed(2)
        fwd_s.append((f2 - f1) / ops["forward"])
        bwd_s.append((b2 - b1) / ops["backward"])
    return {"forward": statistics.median(fwd_s), "backward": statistics.median(bwd_s)}


def layer_host_run(variant: str = "llama") -> dict:
    """calibrate's eager_ops bench: one layer's operators and the host's seconds for them (forward +
    backward), what planner/compute.py eager_host_s predicts with eager_op_host_s."""
    ops, per = layer_ops(variant), host_s_per_op(variant)
    return {"variant": variant, "forward_ops": ops["forward"], "backward_ops": ops["backward"],
            "layer_host_s": per["forward"] * ops["forward"] + per["backward"] * ops["backward"]}


def main() -> None:
    import platform

    import transformers

    from planner.data import atomic_write

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    out = parser.parse_args().out
    torch.set_num_threads(1)
    record = {
        "source": "python -m calibrate.benches.eager_ops: aten operators one decoder layer dispatches in training "
                  "(TorchDispatchMode; 2-layer model less 1-layer model, bf16, SDPA, train mode) and the host's "
                  "seconds per operator at tiny shapes on this CPU (a lower bound for a GPU host)",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "cpu": platform.processor() or platform.machine(),
        "layer_ops": {v: layer_ops(v) for v in VARIANTS},
        "layer_bytes": {v: layer_bytes(v) for v in VARIANTS},
        "host_s_per_op": host_s_per_op(),
    }
    atomic_write(out, json.dumps(record, indent=1) + "\n", flag="--out")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
