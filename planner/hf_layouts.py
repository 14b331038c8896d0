"""The Hugging Face module layouts: each architecture's parameter tensors (names, shapes, TP split,
GEMM group) in registration order, built from a ModelSpec `m`; `LAYOUTS` maps ARCHITECTURES to them."""

from __future__ import annotations

from planner.tensors import BLOCK, FIRST, LAST, Tensor


# ---------------------------------------------------------------------------------------------
# the Hugging Face module layouts (transformers modeling_llama / modeling_mixtral,
# modeling_gpt2, modeling_gpt_neox: parameters in __init__ order)


def _linear(name, out_features, in_features, tp_dim, bias, gemm=None, bias_split=None):
    """nn.Linear: weight (out, in), then bias (out,); a column-parallel bias splits with the weight."""
    w = Tensor(f"{name}.weight", (out_features, in_features), tp_dim, gemm=gemm)
    b = Tensor(f"{name}.bias", (out_features,), 0 if (bias_split if bias_split is not None else tp_dim == 0) else None)
    return [w, b] if bias else [w]


def _norm(name, m, place=BLOCK):
    out = [Tensor(f"{name}.weight", (m.hidden,), None, place=place)]
    return out + ([Tensor(f"{name}.bias", (m.hidden,), None, place=place)] if m.norm == "layernorm" else [])


def _mlp_llama4(m, p: str) -> list[Tensor]:
    """transformers 5 Llama4TextMoe: feed_forward.experts (Llama4TextExperts: gate_up_proj (E, h, 2f),
    down_proj (E, f, h), stored input-major), router, shared_expert (an ungated MLP of the expert
    width); dense blocks a Llama4TextMLP (feed_forward.gate_proj, up_proj, down_proj)."""
    h, f, E = m.hidden, m.ffn, m.experts
    p = p + "feed_forward."
    if E == 1:
        return (_linear(p + "gate_proj", f, h, 0, False, "fc1") + _linear(p + "up_proj", f, h, 0, False, "fc1")
                + _linear(p + "down_proj", h, f, 1, False, "fc2"))
    fs = m.shared_expert_ffn
    out = [Tensor(p + "experts.gate_up_proj", (E, h, 2 * f), 2, expert=True, gemm="fc1"),
           Tensor(p + "experts.down_proj", (E, f, h), 1, expert=True, gemm="fc2"),
           Tensor(p + "router.weight", (E, h), None, gemm="router")]
    if fs:
        out += (_linear(p + "shared_expert.gate_proj", fs, h, 0, False, "shared_fc1")
                + _linear(p + "shared_expert.up_proj", fs, h, 0, False, "shared_fc1")
                + _linear(p + "shared_expert.down_proj", h, fs, 1, False, "shared_fc2"))
    return out


def _mlp_llama(m, p: str) -> list[Tensor]:
    h, f = m.hidden, m.ffn
    if m.architecture == "llama4":
        return _mlp_llama4(m, p)
    if m.experts > 1:  # transformers 5 MixtralSparseMoeBlock: router, then the stacked experts
        E = m.experts
        up = 2 * f if m.ffn_kind == "swiglu" else f
        router = [Tensor(f"{p}mlp.router.weight", (E, h), None, gemm="router"),
                  Tensor(f"{p}mlp.router.bias", (E,), None)] if m.router_bias else \
            [Tensor(f"{p}mlp.gate.weight", (E, h), None, gemm="router")]
        out = [Tensor(f"{p}mlp.experts.gate_up_proj" if m.ffn_kind == "swiglu" else f"{p}mlp.experts.up_proj",
                      (E, up, h), 1, expert=True, gemm="fc1"),
               Tensor(f"{p}mlp.experts.down_proj", (E, h, f), 2, expert=True, gemm="fc2")]
        if m.bias:  # transformers 5 GptOssExperts: input-major weights, each followed by its bias
            out = [Tensor(f"{p}mlp.experts.gate_up_proj", (E, h, up), 2, expert=True, gemm="fc1"),
                   Tensor(f"{p}mlp.experts.gate_up_proj_bias", (E, up), 1, expert=True),
                   Tensor(f"{p}mlp.experts.down_proj", (E, f, h), 1, expert=True, gemm="fc2"),
                   Tensor(f"{p}mlp.experts.down_proj_bias", (E, h), None, expert=True)]
        # transformers 5 Qwen3MoeSparseMoeBlock.__init__ builds experts, then gate
        out = router + out if m.router_first else out + router
        if m.shared_expert_ffn and m.architecture == "deepseek_v3":
            # transformers 5 DeepseekV3MoE / Glm4MoeMoE: shared_experts, an MLP of n_shared x the
            # expert width, no gate
            fs = m.shared_expert_ffn
            out += (_linear(f"{p}mlp.shared_experts.gate_proj", fs, h, 0, False, "shared_fc1")
                    + _linear(f"{p}mlp.shared_experts.up_proj", fs, h, 0, False, "shared_fc1")
                    + _linear(f"{p}mlp.shared_experts.down_proj", h, fs, 1, False, "shared_fc2"))
        elif m.shared_expert_ffn:  # transformers 5 Qwen2MoeSparseMoeBlock: shared_expert, shared_expert_gate
            fs = m.shared_expert_ffn
            out += (_linear(f"{p}mlp.shared_expert.gate_proj", fs, h, 0, False, "shared_fc1")
                    + _linear(f"{p}mlp.shared_expert.up_proj", fs, h, 0, False, "shared_fc1")
                    + _linear(f"{p}mlp.shared_expert.down_proj", h, fs, 1, False, "shared_fc2")
                    + [Tensor(f"{p}mlp.shared_expert_gate.weight", (1, h), None, gemm="shared_gate")])
        return out
    out = _linear(f"{p}mlp.gate_proj", f, h, 0, m.bias, "fc1") if m.ffn_kind == "swiglu" else []
    out += _linear(f"{p}mlp.up_proj", f, h, 0, m.bias, "fc1")
    return out + _linear(f"{p}mlp.down_proj", h, f, 1, m.bias, "fc2")


def _qk_norms(m, p: str) -> list[Tensor]:
    """transformers 5 Qwen3Attention: q_norm and k_norm, Qwen3RMSNorm(head_dim), after o_proj."""
    d = m.dim_per_head
    return [Tensor(f"{p}self_attn.q_norm.weight", (d,), None), Tensor(f"{p}self_attn.k_norm.weight", (d,), None)] \
        if m.qk_norm else []


def _mla(m, p: str) -> list[Tensor]:
    """transformers 5 DeepseekV3Attention: the down projections and their norms run whole on every
    TP rank, the up projections are column-parallel, o_proj row-parallel (megatron-core 0.16.1
    multi_latent_attention.py MLASelfAttention: linear_q/kv_down_proj parallel_mode='duplicated')."""
    h, a, dr, c = m.hidden, m.heads, m.qk_rope_head_dim, m.kv_lora_rank
    dv = m.v_head_dim or m.dim_per_head
    if m.q_lora_rank:
        q = (_linear(p + "self_attn.q_a_proj", m.q_lora_rank, h, None, False, "q_down")
             + [Tensor(p + "self_attn.q_a_layernorm.weight", (m.q_lora_rank,), None)]
             + _linear(p + "self_attn.q_b_proj", m.q_width, m.q_lora_rank, 0, False, "q_up"))
    else:
        q = _linear(p + "self_attn.q_proj", m.q_width, h, 0, False, "q_up")
    return (q + _linear(p + "self_attn.kv_a_proj_with_mqa", c + dr, h, None, False, "kv_down")
            + [Tensor(p + "self_attn.kv_a_layernorm.weight", (c,), None)]
            + _linear(p + "self_attn.kv_b_proj", a * (m.dim_per_head - dr + dv), c, 0, False, "kv_up")
            + _linear(p + "self_attn.o_proj", h, m.attention_out_width, 1, False, "o"))


def _llama(m) -> list[Tensor]:
    h, q, kv = m.hidden, m.q_width, m.kv_width
    p = "model.layers.{i}."
    qkv_bias = m.bias or m.qkv_bias
    sinks = [Tensor(p + "self_attn.sinks", (m.heads,), 0)] if m.attention_sinks else []
    attention = _mla(m, p) if m.kv_lora_rank else sinks + (
        _linear(p + "self_attn.q_proj", q, h, 0, qkv_bias, "qkv") + _linear(p + "self_attn.k_proj", kv, h, 0, qkv_bias, "qkv")
        + _linear(p + "self_attn.v_proj", kv, h, 0, qkv_bias, "qkv") + _linear(p + "self_attn.o_proj", h, q, 1, m.bias, "o")
        + _qk_norms(m, p))
    block = attention + _mlp_llama(m, p) + _norm(p + "input_layernorm", m) + _norm(p + "post_attention_layernorm", m)
    first = [Tensor("model.embed_tokens.weight", (m.vocab, h), 0, place=FIRST)]
    if m.positions == "learned":
        first.append(Tensor("model.embed_positions.weight", (m.max_positions, h), None, place=FIRST))
    last = _norm("model.norm", m, LAST) + [_output(m)]
    return first + block + last


def _gpt2(m) -> list[Tensor]:
    # Conv1D keeps weights as (in, out): column-parallel splits dim 1, row-parallel dim 0
    h, q, kv, f = m.hidden, m.q_width, m.kv_width, m.ffn
    up = 2 * f if m.ffn_kind == "swiglu" else f
    p = "transformer.h.{i}."

    def conv(name, n_in, n_out, column, gemm):
        w = Tensor(f"{name}.weight", (n_in, n_out), 1 if column else 0, gemm=gemm)
        return [w, Tensor(f"{name}.bias", (n_out,), 0 if column else None)] if m.bias else [w]

    block = (_norm(p + "ln_1", m) + conv(p + "attn.c_attn", h, q + 2 * kv, True, "qkv") + conv(p + "attn.c_proj", q, h, False, "o")
             + _norm(p + "ln_2", m) + conv(p + "mlp.c_fc", h, up, True, "fc1") + conv(p + "mlp.c_proj", f, h, False, "fc2"))
    first = [Tensor("transformer.wte.weight", (m.vocab, h), 0, place=FIRST)]
    if m.positions == "learned":
        first.append(Tensor("transformer.wpe.weight", (m.max_positions, h), None, place=FIRST))
    return first + block + _norm("transformer.ln_f", m, LAST) + [_output(m)]


def _gpt_neox(m) -> list[Tensor]:
    h, q, kv, f = m.hidden, m.q_width, m.kv_width, m.ffn
    up = 2 * f if m.ffn_kind == "swiglu" else f
    p = "gpt_neox.layers.{i}."
    block = (_norm(p + "input_layernorm", m) + _norm(p + "post_attention_layernorm", m)
             + _linear(p + "attention.query_key_value", q + 2 * kv, h, 0, m.bias or m.qkv_bias, "qkv")
             + _linear(p + "attention.dense", h, q, 1, m.bias, "o")
             + _linear(p + "mlp.dense_h_to_4h", up, h, 0, m.bias, "fc1") + _linear(p + "mlp.dense_4h_to_h", h, f, 1, m.bias, "fc2"))
    first = [Tensor("gpt_neox.embed_in.weight", (m.vocab, h), 0, place=FIRST)]
    if m.positions == "learned":
        first.append(Tensor("gpt_neox.embed_positions.weight", (m.max_positions, h), None, place=FIRST))
    return first + block + _norm("gpt_neox.final_layer_norm", m, LAST) + [_output(m)]


def _output(m) -> Tensor:
    return Tensor("lm_head.weight", (m.vocab, m.hidden), 0, place=LAST, gemm="logits", tied=m.tied_embeddings)


LAYOUTS = {"llama": _llama, "gpt2": _gpt2, "gpt_neox": _gpt_neox, "deepseek_v3": _llama, "llama4": _llama}
