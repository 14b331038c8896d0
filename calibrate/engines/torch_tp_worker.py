"""Worker: PyTorch's own tensor parallelism (DTensor parallelize_module with ColwiseParallel,
RowwiseParallel, SequenceParallel and PrepareModuleInput, as torchtitan plans a Llama block) on 2
gloo ranks, tp = 2: what ONE transformer block saves for backward on each rank, with sequence
parallelism off and on.

The block mirrors torchtitan 0.3.0's Llama3TransformerBlock in plain torch (torchtitan is not
installed here): attention_norm = nn.RMSNorm(dim); wq, wk, wv as SEPARATE bias-free nn.Linear
modules (torchtitan's fuse_qkv=False layout and classic torchtitan). A fused wqkv whose rows are
laid out [kv_heads, heads/kv_heads + 2, head_dim] also keeps whole head groups per rank under a
ColwiseParallel shard, but v is then a slice of the fused output, so the attention kernel's saved v
would pin the whole q + 2 kv wide storage: an artefact of this plain-torch split, not of what
torchtitan keeps (its block counts 4q + 4kv bytes a token at tp 1, tests/test_activations_real.py).
With separate linears the three share one saved input (the norm output, deduplicated by storage)
exactly like the fused one. Then complex RoPE (xq.float() viewed complex, times a complex64 cache
buffer, view_as_real, type_as), scaled_dot_product_attention (causal, enable_gqa: the CPU flash
kernel keeps q, k, v, out and an fp32 log-sum-exp per head), wo, ffn_norm RMSNorm and
w2(silu(w1 x) * w3 x).

TP plan (torchtitan parallelize_llama): attention_norm / ffn_norm SequenceParallel() when SP;
attention and feed_forward PrepareModuleInput(input_layouts Shard(1) if SP else Replicate,
desired Replicate); wq/wk/wv and w1/w3 ColwiseParallel(); wo and w2 RowwiseParallel(output_layouts
Shard(1) if SP else Replicate). Colwise outputs are local tensors (use_local_output=True), so the
attention core runs on heads / t local heads.

Counting: calibrate.benches.saved.counting with a pack hook that first unwraps tensor subclasses (DTensor ->
its _local_tensor, funcol AsyncCollectiveTensor -> .elem): the pack hook receives the DTensor
itself (the autograd graph is built at the DTensor level), whose own storage is a wrapper's. The
parameters' local shards, the RoPE cache buffer and the block's input are excluded. Every rank
also checks that its TP block's output equals an unsharded copy's (same seed) to bf16 tolerance.
Usage: python -m torch.distributed.run --nproc_per_node 2 -m calibrate.engines.torch_tp_worker \
    '{"shapes": [[256, 8, 8, 768, 64, 2]], "sp": [false, true]}'
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)

from calibrate.benches.saved import SavedCounter
from calibrate.harness.worker_io import device, write_result

TP = 2


def _local(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor that holds a (possibly wrapped) tensor's bytes."""
    for _ in range(4):
        if isinstance(t, DTensor):
            t = t._local_tensor
        elif hasattr(t, "elem") and type(t).__name__ == "AsyncCollectiveTensor":
            t = t.elem
        else:
            break
    return t


class LocalSavedCounter(SavedCounter):
    """SavedCounter that counts a saved DTensor by its local tensor's storage; each entry also
    names the outer tensor's type and placements."""

    def __init__(self, exclude=()):
        super().__init__([_local(t) for t in exclude])

    def pack(self, t: torch.Tensor):
        inner = _local(t)
        ptr = inner.untyped_storage().data_ptr()
        if ptr and ptr not in self.exclude and ptr not in self.saved:
            kind = "plain"
            if isinstance(t, DTensor):
                kind = "DTensor" + str(tuple(str(p) for p in t.placements)).replace("'", "")
            dtype = str(inner.dtype).replace("torch.", "")
            creator = type(t.grad_fn).__name__ if t.grad_fn is not None else "leaf"
            self.saved[ptr] = (inner.untyped_storage().nbytes(), tuple(inner.shape), dtype, creator, kind)
        return t


def rope_cache(head_dim: int, seq: int, theta: float = 500000.0) -> torch.Tensor:
    """torchtitan precompute_freqs_cis: complex64 (seq, head_dim / 2)."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    t = torch.arange(seq, dtype=torch.float32)
    freqs = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(freqs), freqs)


def apply_rotary_emb(xq, xk, freqs_cis):
    """torchtitan apply_rotary_emb (complex RoPE)."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


class Attention(torch.nn.Module):
    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.head_dim = dim // heads
        self.wq = torch.nn.Linear(dim, heads * self.head_dim, bias=False)
        self.wk = torch.nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = torch.nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = torch.nn.Linear(heads * self.head_dim, dim, bias=False)

    def forward(self, x, freqs_cis):
        bs, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        # -1: the local heads (heads / t under TP; use_local_output gives plain local tensors)
        xq = xq.view(bs, seqlen, -1, self.head_dim)
        xk = xk.view(bs, seqlen, -1, self.head_dim)
        xv = xv.view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        out = F.scaled_dot_product_attention(xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2),
                                             is_causal=True, enable_gqa=True)
        out = out.transpose(1, 2).contiguous().view(bs, seqlen, -1)
        return self.wo(out)


class FeedForward(torch.nn.Module):
    def __init__(self, dim, ffn):
        super().__init__()
        self.w1 = torch.nn.Linear(dim, ffn, bias=False)
        self.w2 = torch.nn.Linear(ffn, dim, bias=False)
        self.w3 = torch.nn.Linear(dim, ffn, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(torch.nn.Module):
    """torchtitan 0.3.0 Llama3TransformerBlock (no activation checkpointing)."""

    def __init__(self, dim, heads, kv_heads, ffn, seq):
        super().__init__()
        self.attention_norm = torch.nn.RMSNorm(dim, eps=1e-5)
        self.attention = Attention(dim, heads, kv_heads)
        self.ffn_norm = torch.nn.RMSNorm(dim, eps=1e-5)
        self.feed_forward = FeedForward(dim, ffn)
        self.rope = (dim // heads, seq)

    def add_rope_cache(self, dev) -> None:
        """After the bf16 cast: .to(bf16) would turn a complex64 buffer real."""
        self.register_buffer("freqs_cis", rope_cache(*self.rope).to(dev), persistent=False)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x), self.freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


def tp_plan(sp: bool) -> dict:
    """torchtitan parallelize_llama's plan for one block."""
    seq_or_rep = Shard(1) if sp else Replicate()
    plan = {
        "attention": PrepareModuleInput(input_layouts=(seq_or_rep, None), desired_input_layouts=(Replicate(), None)),
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=seq_or_rep),
        "feed_forward": PrepareModuleInput(input_layouts=(seq_or_rep,), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=seq_or_rep),
    }
    if sp:
        plan["attention_norm"] = SequenceParallel()
        plan["ffn_norm"] = SequenceParallel()
    return plan


def measure(shape, sp: bool, mesh, dev) -> dict:
    dim, heads, kv_heads, ffn, seq, batch = shape
    rank = dist.get_rank()
    torch.manual_seed(0)
    ref = Block(dim, heads, kv_heads, ffn, seq).to(dev, torch.bfloat16)  # unsharded, same weights
    ref.add_rope_cache(dev)
    torch.manual_seed(0)
    block = Block(dim, heads, kv_heads, ffn, seq).to(dev, torch.bfloat16)
    block.add_rope_cache(dev)
    parallelize_module(block, mesh, tp_plan(sp))

    torch.manual_seed(1)
    full = torch.randn(batch, seq, dim, device=dev, dtype=torch.bfloat16)
    # the block's input as torchtitan hands it on: a plain local tensor (the previous block's
    # output, use_local_output); under SP this rank's sequence shard
    local = full.chunk(TP, dim=1)[rank] if sp else full
    x = local.detach().clone().requires_grad_(True)
    exclude = [*block.parameters(), block.freqs_cis, x]
    counter = LocalSavedCounter(exclude)
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
        out = block(x)
    out_local = _local(out)
    expected = ref(full)
    expected = expected.chunk(TP, dim=1)[rank] if sp else expected
    err = (out_local.float() - expected.float()).abs().max().item()
    scale = expected.float().abs().max().item()
    out_local.float().sum().backward()  # the graph runs backward with these saved tensors
    table = [list(v) for v in sorted(counter.saved.values(), key=lambda v: -v[0])]
    tokens = seq * batch
    print(f"[rank {rank}] h{dim} a{heads} g{kv_heads} f{ffn} s{seq} b{batch} tp{TP} sp={sp}: "
          f"{counter.total_bytes / tokens:g} B a token", flush=True)
    for nbytes, shape_, dtype, fn, kind in table:
        print(f"[rank {rank}]   {nbytes / tokens:8g} B/token  {str(shape_):18} {dtype:9} {fn:46} {kind}", flush=True)
    return {"dim": dim, "heads": heads, "kv_heads": kv_heads, "ffn": ffn, "seq": seq, "batch": batch, "sp": sp,
            "rank": rank, "saved_bytes": counter.total_bytes, "table": table,
            "max_abs_err": err, "ref_max_abs": scale, "out_type": type(out).__name__}


def main(cfg: dict) -> None:
    dev = device()
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    mesh = init_device_mesh(dev.type, (TP,))
    runs = [measure(tuple(shape), sp, mesh, dev) for shape in cfg["shapes"] for sp in cfg.get("sp", [False, True])]
    write_result({"rank": dist.get_rank(), "runs": runs})
    dist.barrier()  # no rank tears gloo down while the other still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {"shapes": [[256, 8, 8, 768, 64, 2]]})
    # On a loaded host the interpreter's teardown aborted now and then ("terminate called without an
    # active exception": a C++ thread left joinable by the process group); the result is written and
    # the group destroyed, so leave without the static destructors.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
