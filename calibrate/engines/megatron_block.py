"""A Megatron-style GPT block in plain torch, to count what Megatron keeps for backward on CPU.

megatron-core's own layer runs on the CPU only with stand-ins (its checkpoint saves CUDA RNG states,
its fused softmax is a CUDA kernel: megatron_core_layer_saved_bytes counts it with the RNG tracker's
fork a no-op and the unfused softmax), so this block runs the same ops in the same order as
megatron-core 0.16.1's local layer spec
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
    from calibrate.benches.saved import counting, transient_peak_bytes

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

    from calibrate.benches.saved import counting

    blocks, causal, x = _blocks(layers, seq, batch, hidden, heads, ffn, dropout, dtype)
    with counting([*blocks.parameters(), causal]) as c:
        h = x
        for i, block in enumerate(blocks):
            h = checkpoint(block, h, causal, use_reentrant=True) if i < recomputed else block(h, causal)
    return c.total_bytes


def megatron_core_layer_saved_bytes(seq: int, batch: int, hidden: int, heads: int, ffn: int,
                                    llama: bool = False, groups: int = 0) -> int:
    """Bytes megatron-core 0.16.1's own TransformerLayer (get_gpt_layer_local_spec: LayerNorm, unfused
    DotProductAttention, GeLU with biases, dropout 0.1, bf16) keeps for backward in one forward on the
    CPU, its input and parameters left out; run in a fresh process (megatron_core_layers_saved_bytes):
    parallel_state and the process group are global. CPU stand-ins as
    calibrate/engines/megatron_moe.py's, and the CUDA RNG tracker's fork (attention dropout) a no-op;
    masked_softmax_fusion off (its kernel is CUDA's), so FusedScaleMaskSoftmax runs its torch path.
    llama: the Llama-style layer instead (RMSNorm, SwiGLU with Megatron-LM's fused bias_swiglu, no
    biases, no dropout) with SDPA as its core attention (SDPACore: flash's saves on the CPU). groups:
    num_query_groups (0: one a head)."""
    return megatron_core_layers_saved_bytes([(seq, batch, hidden, heads, ffn, llama, groups)])[0]


def megatron_core_layers_saved_bytes(configs: list) -> list:
    """megatron_core_layer_saved_bytes of each (seq, batch, hidden, heads, ffn, llama, groups) in
    `configs`, all in one fresh process (python -m calibrate.engines.megatron_block --many JSON): the
    process group and parallel_state (tp = pp = 1 for all) are set up once, each layer is built anew
    and counted on its own."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    many = [[seq, batch, hidden, heads, ffn, int(llama), groups or heads]
            for seq, batch, hidden, heads, ffn, llama, groups in configs]
    proc = subprocess.run([sys.executable, "-W", "ignore", "-m", "calibrate.engines.megatron_block", "--many",
                           json.dumps(many)], capture_output=True, text=True,
                          cwd=str(Path(__file__).resolve().parents[2]), timeout=300 * len(many))
    if proc.returncode:
        raise RuntimeError(f"megatron_block: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["saved_bytes"]


def _sdpa_core():
    """A core attention for megatron-core's layer specs computing torch SDPA, causal ([s, b, n, d] in,
    [s, b, n d] out), which saves what a flash kernel saves: q, k, v, output and log-sum-exp."""
    from megatron.core.transformer.module import MegatronModule

    class SDPACore(MegatronModule):
        def __init__(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None,
                     softmax_scale=None, **kwargs):
            super().__init__(config)

        def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                    packed_seq_params=None, **kwargs):
            s, b = query.shape[:2]
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return out.permute(2, 0, 1, 3).reshape(s, b, -1)

    return SDPACore


def _megatron_core_count(seq: int, batch: int, hidden: int, heads: int, ffn: int, llama: bool = False,
                         groups: int = 0) -> int:
    import contextlib
    import os
    import socket

    from calibrate.engines.megatron_moe import _cpu_stand_ins

    if not torch.distributed.is_initialized():  # once a process (megatron_core_layers_saved_bytes)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import TransformerLayer

    from calibrate.benches.saved import counting

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    torch.manual_seed(0)
    _cpu_stand_ins({})
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    common = dict(num_layers=1, hidden_size=hidden, num_attention_heads=heads, num_query_groups=groups or heads,
                  ffn_hidden_size=ffn,
                  params_dtype=torch.bfloat16, bf16=True, use_cpu_initialization=True, gradient_accumulation_fusion=False,
                  masked_softmax_fusion=False, persist_layer_norm=False, bias_dropout_fusion=False)
    if llama:
        config = TransformerConfig(**common, normalization="RMSNorm", gated_linear_unit=True,
                                   activation_func=torch.nn.functional.silu, add_bias_linear=False,
                                   bias_activation_fusion=True, hidden_dropout=0.0, attention_dropout=0.0)
        spec = get_gpt_layer_local_spec(normalization="RMSNorm")
        spec.submodules.self_attention.submodules.core_attention = _sdpa_core()
    else:
        config = TransformerConfig(**common, bias_activation_fusion=False, hidden_dropout=0.1, attention_dropout=0.1)
        spec = get_gpt_layer_local_spec()
    layer = TransformerLayer(config, spec.submodules, layer_number=1).train()
    x = torch.randn(seq, batch, hidden, dtype=torch.bfloat16, requires_grad=True)
    causal = torch.triu(torch.ones(1, 1, seq, seq, dtype=torch.bool), 1)
    with counting([*layer.parameters(), causal, x]) as c:
        out = layer(x, attention_mask=causal)
    (out[0] if isinstance(out, tuple) else out).float().sum().backward()
    return c.total_bytes


if __name__ == "__main__":
    import json
    import sys

    import os

    if sys.argv[1:2] == ["--many"]:  # [[seq, batch, hidden, heads, ffn, llama 0/1, groups], ...]
        counts = [_megatron_core_count(*c[:5], llama=c[5] == 1, groups=c[6]) for c in json.loads(sys.argv[2])]
        print(json.dumps({"saved_bytes": counts}))
    else:
        print(json.dumps({"saved_bytes": _megatron_core_count(*map(int, sys.argv[1:6]), llama=sys.argv[6:7] == ["1"],
                                                              groups=int(sys.argv[7]) if len(sys.argv) > 7 else 0)}))
    sys.stdout.flush()
    os._exit(0)  # no process-group teardown
