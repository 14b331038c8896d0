"""What Hugging Face transformers' LayerNorm + GELU families save for backward (transformers 5.25:
GPT-2, GPT-NeoX), each by its own modules."""

from __future__ import annotations

import numpy as np

from planner.layout import Training
from planner.model import ModelSpec
from planner.saved.base import SP, TP, Saved


LAYER_NORM_STATS_BYTES_PER_TOKEN = 8.0
"""torch.nn.LayerNorm's mean and rstd per row, fp32 on CUDA whatever the input dtype (torch 2.x
aten/src/ATen/native/cuda/layer_norm_kernel.cu layer_norm_cuda: at::empty({M}, acc_type)); the CPU
kernel (native/layer_norm.cpp layer_norm_cpu) keeps them in the input dtype, 2 + 2 bytes in bf16."""


def hf_layer_norm_saved(e: float, h: int, where: str) -> list[Saved]:
    """torch.nn.LayerNorm (aten native_layer_norm, derivatives.yaml native_layer_norm_backward): its
    input and the fp32 mean and rstd per token on CUDA. Its output is saved by the linear it feeds."""
    return [Saved(f"{where} input", e * h, SP),
            Saved(f"{where} mean and rstd, fp32", LAYER_NORM_STATS_BYTES_PER_TOKEN, SP)]


def hf_gpt2_saved(model: ModelSpec, training: Training, seq: float) -> list[Saved]:
    """transformers 5 GPT2Block (models/gpt2/modeling_gpt2.py GPT2Block, GPT2Attention, GPT2MLP;
    pytorch_utils.py Conv1D = addmm of the input viewed 2-D), counted with saved_tensors_hooks and
    translated to what CUDA keeps (tests/test_activations_real.py): per token, bf16,
    SDPA 16h + 4a + 10f + 16 (+ 2h of dropout masks), eager 16h + 2as + 10f + 16 (+ 3as + 2h).
    Assumes GPT2Config's defaults: activation_function 'gelu_new' (activations.py NewGELUActivation,
    eager Python 0.5 x (1 + tanh(c (x + 0.044715 x^3))): keeps x, tanh, 1 + tanh, 0.5 x and its
    output, 5f), reorder_and_upcast_attn False, attn_pdrop = resid_pdrop (model.dropout).
    SDPA: q, k and v are views of c_attn's output, so the flash kernel keeps all of it (q + 2kv); its
    output is [b, s, a, d] in memory (it follows q's strides), so c_proj's input is a view of it;
    with dropout CUDA's flash kernel keeps the same plus a philox seed/offset per call (the CPU takes
    the fp32 math path then, which CUDA does not). Eager (modeling_gpt2.py eager_attention_forward):
    matmul copies q, k^T and v contiguous, softmax keeps its bf16 output, dropout a 1-byte mask and
    its output, c_proj a contiguous copy of the attention output."""
    e = training.precision.element_bytes
    h, q, kv, a = model.hidden, model.q_width, model.kv_width, model.heads
    w = model.mlp_width_per_token
    out = hf_layer_norm_saved(e, h, "ln_1") + [Saved("c_attn input (ln_1 output)", e * h, SP)]
    if training.flash_attention:
        out += [Saved("c_attn output (SDPA keeps q, k, v views of it)", e * (q + 2 * kv), TP),
                Saved("SDPA output (c_proj input)", e * q, TP),
                Saved("flash log-sum-exp (fp32)", 4.0 * a, TP, core=True)]
    else:
        out += [Saved("q, contiguous copy", e * q, TP), Saved("k transposed, contiguous copy", e * kv, TP),
                Saved("v, contiguous copy", e * kv, TP), Saved("softmax output", e * a * seq, TP, core=True)]
        if model.dropout:
            out += [Saved("attention dropout mask", 1.0 * a * seq, TP, core=True),
                    Saved("attention dropout output", e * a * seq, TP, core=True)]
        out.append(Saved("c_proj input (contiguous)", e * q, TP))
    if model.dropout:
        out.append(Saved("attention resid_dropout mask", 1.0 * h, SP))
    out += hf_layer_norm_saved(e, h, "ln_2") + [Saved("c_fc input (ln_2 output)", e * h, SP)]
    out += [Saved(f"gelu_new {name}", e * w, TP)
            for name in ("input (c_fc output)", "0.5 x", "tanh", "1 + tanh", "output (c_proj input)")]
    if model.dropout:
        out.append(Saved("mlp dropout mask", 1.0 * h, SP))
    return out


def hf_gpt_neox_saved(model: ModelSpec, training: Training, seq: float, mbs) -> list[Saved]:
    """transformers 5 GPTNeoXLayer (models/gpt_neox/modeling_gpt_neox.py GPTNeoXLayer, GPTNeoXAttention,
    GPTNeoXMLP, apply_rotary_pos_emb), counted with saved_tensors_hooks and translated to what CUDA
    keeps (tests/test_activations_real.py, tests/test_activations_neox.py): per token, bf16, SDPA
    20h + 4a + 4f + 16 (+ 2h of dropout masks), eager 14h + 6as + 4f + 16 (with dropout 16h + 7as +
    4f + 16), + 4h in eager at micro-batch `mbs` 1.
    Assumes GPTNeoXConfig's defaults: use_parallel_residual True (both LayerNorms read the layer input,
    one storage), hidden_act 'gelu' (activations.py GELUActivation = torch's exact erf gelu: keeps its
    input); attention_dropout and hidden_dropout both on or both off (model.dropout). Any rotary_pct:
    torch.cat makes q and k full-width copies. SDPA: v is a view of query_key_value's output, so the
    flash kernel keeps all of it (q + 2kv) beside q and k after rotary; the flash output follows q's
    [b, a, s, d] layout, so dense's input is a contiguous copy; with dropout CUDA's flash kernel keeps
    the same (CPU takes the math path). Eager (eager_attention_forward): matmul keeps q and k as
    views and copies v, softmax keeps its fp32 output, then the 16-bit cast (or, with dropout, a
    1-byte mask and the dropout output) for the second matmul. torch.matmul folds v [b, a, s, d]
    to [b a, s, d] with reshape (aten native/LinearAlgebra.cpp _matmul_impl): v is a chunk of
    query_key_value's output viewed [b, s, a, 3d] and transposed, whose b and a strides merge only
    where b is 1, so there the reshape is a view and bmm keeps query_key_value's whole output
    (q + 2kv) instead of a kv copy: `mbs` (an array over layouts) picks which."""
    e = training.precision.element_bytes
    h, q, kv, a = model.hidden, model.q_width, model.kv_width, model.heads
    w = model.mlp_width_per_token
    out = [Saved("layer input (both norms' input, parallel residual)", e * h, SP),
           Saved("input_layernorm mean and rstd, fp32", LAYER_NORM_STATS_BYTES_PER_TOKEN, SP),
           Saved("post_attention_layernorm mean and rstd, fp32", LAYER_NORM_STATS_BYTES_PER_TOKEN, SP),
           Saved("query_key_value input (input_layernorm output)", e * h, SP),
           Saved("mlp input (post_attention_layernorm output)", e * h, SP),
           Saved("q after rotary (torch.cat copy)", e * q, TP), Saved("k after rotary (torch.cat copy)", e * kv, TP)]
    if training.flash_attention:
        out += [Saved("query_key_value output (SDPA keeps v, a view of it)", e * (q + 2 * kv), TP),
                Saved("SDPA output", e * q, TP, core=True),
                Saved("flash log-sum-exp (fp32)", 4.0 * a, TP, core=True)]
    else:
        v = np.where(np.asarray(mbs) == 1, e * (q + 2 * kv), e * kv)
        out += [Saved("v: a contiguous copy, at micro-batch 1 a view of query_key_value's whole output", v, TP),
                Saved("softmax output (fp32)", 4.0 * a * seq, TP, core=True)]
        if model.dropout:
            out += [Saved("attention dropout mask", 1.0 * a * seq, TP, core=True),
                    Saved("attention dropout output", e * a * seq, TP, core=True)]
        elif e != 4.0:  # .to(query.dtype) of the fp32 softmax: a no-op in fp32
            out.append(Saved("softmax output, 16-bit", e * a * seq, TP, core=True))
    out.append(Saved("dense input (contiguous)", e * q, TP))
    if model.dropout:
        out += [Saved("post_attention_dropout mask", 1.0 * h, SP), Saved("post_mlp_dropout mask", 1.0 * h, SP)]
    out += [Saved("gelu input (dense_h_to_4h output)", e * w, TP),
            Saved("dense_4h_to_h input (gelu output)", e * w, TP)]
    return out
