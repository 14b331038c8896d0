"""A Megatron-style GPT block in plain torch, to count what Megatron keeps for backward on CPU.

megatron-core needs CUDA (its checkpoint saves CUDA RNG states, its softmax is a CUDA kernel), so
this block runs the same ops in the same order as megatron-core 0.16.1's local layer spec
(models/gpt/gpt_layer_specs.py get_gpt_layer_local_spec): input LayerNorm, linear_qkv, core
attention as transformer/dot_product_attention.py DotProductAttention.forward (baddbmm of views of
the fused QKV output, softmax, attention dropout, bmm with the value view), linear_proj, bias-dropout-
add, pre-MLP LayerNorm, linear_fc1, GeLU, linear_fc2, bias-dropout-add. The causal mask is a
constant that the CUDA kernel (fused_softmax.py ScaledUpperTriangMaskedSoftmax) never saves: leave it
out of the count. Full recompute runs as transformer/transformer_block.py _checkpointed_forward does:
a reentrant checkpoint (tensor_parallel.checkpoint) around each of the first N layers ('block'), or
around every group of N consecutive layers ('uniform').
"""

from __future__ import annotations

import torch
from torch import nn


class MegatronStyleBlock(nn.Module):
    """One pre-LayerNorm GPT block, sequence-first [s, b, h] like Megatron."""

    def __init__(self, hidden: int, heads: int, ffn: int, dropout: float):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.input_layernorm = nn.LayerNorm(hidden)
        self.linear_qkv = nn.Linear(hidden, 3 * hidden)
        self.linear_proj = nn.Linear(hidden, hidden)
        self.pre_mlp_layernorm = nn.LayerNorm(hidden)
        self.linear_fc1 = nn.Linear(hidden, ffn)
        self.linear_fc2 = nn.Linear(ffn, hidden)
        self.dropout = dropout

    def attention(self, x: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
        s, b, _ = x.shape
        n, d = self.heads, self.head_dim
        # attention.py SelfAttention.get_query_key_value_tensors: views of the fused output
        mixed = self.linear_qkv(x).view(s, b, n, 3 * d)
        q, k, v = torch.split(mixed, d, dim=3)
        scores = torch.baddbmm(torch.empty(b * n, s, s, dtype=x.dtype), q.reshape(s, b * n, d).transpose(0, 1),
                               k.reshape(s, b * n, d).transpose(0, 1).transpose(1, 2), beta=0.0, alpha=d ** -0.5)
        probs = torch.softmax(scores.view(b, n, s, s).masked_fill(causal, float("-inf")), dim=-1)
        probs = nn.functional.dropout(probs, self.dropout, self.training)
        context = torch.bmm(probs.view(b * n, s, s), v.reshape(s, b * n, d).transpose(0, 1))
        return context.view(b, n, s, d).permute(2, 0, 1, 3).reshape(s, b, n * d)

    def forward(self, x: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
        drop = nn.functional.dropout
        x = x + drop(self.linear_proj(self.attention(self.input_layernorm(x), causal)), self.dropout, self.training)
        mlp = self.linear_fc2(nn.functional.gelu(self.linear_fc1(self.pre_mlp_layernorm(x))))
        return x + drop(mlp, self.dropout, self.training)


def _blocks(layers, seq, batch, hidden, heads, ffn, dropout, dtype):
    torch.manual_seed(0)
    blocks = nn.ModuleList(MegatronStyleBlock(hidden, heads, ffn, dropout) for _ in range(layers)).to(dtype).train()
    causal = torch.ones(seq, seq, dtype=torch.bool).triu(1)
    x = torch.randn(seq, batch, hidden, dtype=dtype, requires_grad=True)
    return blocks, causal, x


def uniform_forward(blocks, causal, x, group: int):
    """_checkpointed_forward 'uniform': checkpoint_handler(custom(l, l + N)) for l = 0, N, 2N, ..."""
    from torch.utils.checkpoint import checkpoint

    def run(start, end):
        def custom(h):
            for block in blocks[start:end]:
                h = block(h, causal)
            return h
        return custom

    h = x
    for start in range(0, len(blocks), group):
        h = checkpoint(run(start, start + group), h, use_reentrant=True)
    return h


def uniform_method_bytes(layers: int, group: int, seq: int, batch: int, hidden: int, heads: int, ffn: int,
                         dropout: float = 0.1, dtype=torch.bfloat16) -> tuple:
    """(bytes kept for backward after the forward, peak bytes above the start of one forward +
    backward) of `layers` Megatron-style blocks under --recompute-method uniform with `group`
    layers per checkpoint."""
    from calibrate.saved import counting, transient_peak_bytes

    blocks, causal, x = _blocks(layers, seq, batch, hidden, heads, ffn, dropout, dtype)
    with counting([*blocks.parameters(), causal]) as c:
        uniform_forward(blocks, causal, x, group)

    def step():
        uniform_forward(blocks, causal, x, group).float().sum().backward()

    step()  # parameter gradients exist from here on, as in training
    return c.total_bytes, transient_peak_bytes(step)


def block_method_saved_bytes(layers: int, recomputed: int, seq: int, batch: int, hidden: int, heads: int, ffn: int,
                             dropout: float = 0.1, dtype=torch.bfloat16) -> int:
    """Bytes `layers` Megatron-style blocks keep for backward in one forward when the first
    `recomputed` run under a reentrant checkpoint (Megatron --recompute-method block)."""
    from torch.utils.checkpoint import checkpoint

    from calibrate.saved import counting

    blocks, causal, x = _blocks(layers, seq, batch, hidden, heads, ffn, dropout, dtype)
    with counting([*blocks.parameters(), causal]) as c:
        h = x
        for i, block in enumerate(blocks):
            h = checkpoint(block, h, causal, use_reentrant=True) if i < recomputed else block(h, causal)
    return c.total_bytes
