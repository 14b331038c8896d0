"""What torch.compile (Inductor) makes of a transformers Llama decoder layer: the tensors it saves for
backward and the kernels it generates, against the eager layer, counted on the CPU.

    python -m calibrate.benches.hf_compiled [--out PATH]

transformers' LlamaDecoderLayer (SDPA attention, bf16, the rotary embeddings given as the model
gives them) run eagerly and compiled by torch.compile (Inductor, the default mode), each under
torch.autograd.graph.saved_tensors_hooks: the bytes per token of what the forward saves, each storage
once, parameters, the layer's input and the rotary tables left out. AOT Autograd's partitioner
(torch/_functorch/partitioners.py min_cut_rematerialization_partition) decides what a compiled
graph saves on any device alike; SDPA saves its output and logsumexp on the CPU as CUDA's flash
kernel does. Inductor's kernels per layer pass (torch/_inductor/metrics.py generated_kernel_count:
the fused pointwise and reduction kernels, forward and backward graphs apart; the GEMMs and SDPA
are extern kernels beside them) are counted as the CPU backend fuses (its Triton backend fuses the
same scheduler nodes). Results go to data/references/hf_compiled_cpu.json (atomically), read by
planner/compute.py and tests/test_compiled.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "data" / "references" / "hf_compiled_cpu.json"
SHAPES = [  # (hidden, heads, kv_heads, intermediate, seq, batch)
    (256, 8, 2, 704, 128, 2),
    (256, 8, 8, 512, 128, 2),  # MHA
    (512, 8, 4, 1376, 64, 2),
]


EXTERN = {"aten::mm", "aten::addmm", "aten::bmm", "aten::_scaled_dot_product_flash_attention_for_cpu",
          "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}
"""The compute kernels Inductor calls rather than generates, by their aten names on the CPU (CUDA's
flash kernels in their place)."""


def _saved_bytes(fn, skip: set, tokens: int) -> tuple:
    """(bytes per token, [(shape, dtype)]) of what `fn`'s forward saves, each storage once."""
    import torch

    seen, total, items = set(skip), 0, []

    def pack(t):
        nonlocal total
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            total += t.untyped_storage().nbytes()
            items.append([list(t.shape), str(t.dtype).replace("torch.", "")])
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return total / tokens, items, out


def measure_one(hidden: int, heads: int, kv_heads: int, ffn: int, seq: int, batch: int) -> dict:
    import torch
    import torch._dynamo
    import torch._inductor.metrics as metrics
    import transformers

    torch._dynamo.reset()
    # compiled afresh: a cached graph loads without generating its kernels, and AOT Autograd's cache
    # compiles the backward graph with the forward's (the counts split per graph only when built)
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads,
                                      intermediate_size=ffn, vocab_size=256, num_hidden_layers=1,
                                      attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    layer = model.model.layers[0]
    x = torch.randn(batch, seq, hidden, dtype=torch.bfloat16, requires_grad=True)
    positions = torch.arange(seq).unsqueeze(0).expand(batch, -1)
    rope = model.model.rotary_emb(x, positions)
    skip = {p.untyped_storage().data_ptr() for p in layer.parameters()} | \
        {t.untyped_storage().data_ptr() for t in (x, *rope)}
    tokens = batch * seq

    def call(module):
        return lambda: module(x, position_embeddings=rope, attention_mask=None, position_ids=positions)

    eager, eager_items, _ = _saved_bytes(call(layer), skip, tokens)
    compiled_layer = torch.compile(layer)
    metrics.reset()
    compiled, compiled_items, out = _saved_bytes(call(compiled_layer), skip, tokens)
    forward_kernels = metrics.generated_kernel_count
    out = out[0] if isinstance(out, tuple) else out
    out.float().sum().backward()
    backward_kernels = metrics.generated_kernel_count - forward_kernels
    x.grad = None
    extern = {}
    for name in ("forward", "backward"):  # the compiled graphs' extern kernels: GEMMs and attention
        out = compiled_layer(x, position_embeddings=rope, attention_mask=None, position_ids=positions)
        out = out[0] if isinstance(out, tuple) else out
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            out.float().sum().backward() if name == "backward" else compiled_layer(
                x, position_embeddings=rope, attention_mask=None, position_ids=positions)
        extern[name] = sum(1 for e in prof.events() if e.name in EXTERN)
    return {"hidden": hidden, "heads": heads, "kv_heads": kv_heads, "ffn": ffn, "seq": seq, "batch": batch,
            "eager_bytes_per_token": eager, "compiled_bytes_per_token": compiled, "compiled_saved": compiled_items,
            "forward_kernels": forward_kernels, "backward_kernels": backward_kernels,
            "forward_extern": extern["forward"], "backward_extern": extern["backward"]}


def measure() -> list[dict]:
    rows = []
    for shape in SHAPES:
        rows.append(measure_one(*shape))
        print({k: v for k, v in rows[-1].items() if k != "compiled_saved"}, flush=True, file=sys.stderr)
    return rows


def main(argv=None) -> int:
    from calibrate.harness.recording import run_cli

    return run_cli(argv, __doc__, OUT, "python -m calibrate.benches.hf_compiled: transformers LlamaDecoderLayer "
                   "(SDPA, bf16) eager and torch.compile'd (Inductor, default mode) on the CPU: bytes per token its "
                   "forward saves (saved_tensors_hooks, each storage once, parameters, input and rotary tables left "
                   "out) and Inductor's generated kernels per forward and backward graph", measure, "transformers")


if __name__ == "__main__":
    sys.exit(main())
