"""Read a Hugging Face config.json (Llama, Mistral, Mixtral, Qwen2/3 and their MoE, DeepSeek-V2/V3,
GLM-4.5, GPT-2, GPT-NeoX) offline.

The file is bounded in size and depth (planner/data.py) and every field is type-checked; the
shape it yields is validated like any other (planner/bounds.py). One reader per model_type
family (READERS) turns the config into ModelSpec fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from planner.data import read_json
from planner.errors import InputError
from planner.model import ModelSpec


@dataclass(frozen=True)
class Fields:
    """A parsed config.json, read one type-checked field at a time.

    `where` names the config in error messages; `notes` collects what the resulting shape leaves
    out, appended to the spec's `source` as "; approximate: ...".
    """

    cfg: dict
    where: str
    notes: list[str] = field(default_factory=list)

    def integer(self, *keys: str, default: int | None = None) -> int:
        """First present, non-null field among `keys` (aliases) as an int; KeyError if required."""
        for key in keys:
            if self.cfg.get(key) is not None:
                value = self.cfg[key]
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
                    raise ValueError(f"{key} must be an integer, got {value!r}")
                return int(value)
        if default is None:
            raise KeyError(keys[0])
        return default

    def flag(self, key: str, default: bool) -> bool:
        """A true/false field; `default` when absent or null."""
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be true or false, got {value!r}")
        return value

    def rate(self, key: str, default: float) -> float:
        """A numeric field (a dropout probability) as a float; `default` when absent or null."""
        value = self.cfg.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{key} must be a number, got {value!r}")
        return float(value)

    def dense_blocks(self, ffn: int) -> tuple[int, int, int]:
        """(dense_layers, moe_layer_step, dense_ffn) of a Qwen-MoE config: transformers 5
        Qwen2MoeDecoderLayer builds the experts where layer_idx is not in mlp_only_layers and
        (layer_idx + 1) % decoder_sparse_step == 0, else Qwen2MoeMLP(intermediate_size). The planner
        takes mlp_only_layers when they are the first k blocks."""
        only, step = self.cfg.get("mlp_only_layers") or [], self.integer("decoder_sparse_step", default=1)
        if not isinstance(only, list) or sorted(only) != list(range(len(only))):
            raise InputError(f"--model: {self.where!r} has mlp_only_layers {only!r}; the planner models dense "
                             "blocks as the first k and every decoder_sparse_step-th routed after them")
        return (len(only), step, ffn) if only or step > 1 else (0, 1, 0)

    def approximate(self, note: str) -> None:
        """Record a part of the model the shape leaves out (said in the spec's `source`)."""
        self.notes.append(note)


def llama(f: Fields, kind: str) -> dict:
    """Llama, Mistral, Qwen2 and Mixtral: required core fields, the family's config defaults."""
    layers = f.integer("num_hidden_layers")
    hidden = f.integer("hidden_size")
    heads = f.integer("num_attention_heads")
    ffn = f.integer("intermediate_size")
    # transformers' config defaults when the key is absent (null means "same as heads")
    kv_default = {"llama": heads, "mistral": 8, "mixtral": 8, "qwen2": 32}[kind]
    kv_heads = f.integer("num_key_value_heads", default=heads) if "num_key_value_heads" in f.cfg else kv_default
    # only LlamaAttention/LlamaMLP read attention_bias/mlp_bias; Mistral/Mixtral have no
    # biases at all, Qwen2 always has q/k/v biases (and no others)
    attn_bias = kind == "llama" and f.flag("attention_bias", False)
    mlp_bias = kind == "llama" and f.flag("mlp_bias", False)
    if attn_bias and not mlp_bias:
        f.approximate(f"o_proj biases not modelled ({layers * hidden} parameters)")
    elif mlp_bias and not attn_bias:
        f.approximate(f"MLP biases not modelled ({layers * (2 * ffn + hidden)} parameters)")
    experts = f.integer("num_local_experts", "num_experts", default=8) if kind == "mixtral" else 1
    top_k = f.integer("num_experts_per_tok", default=2) if kind == "mixtral" else 1
    return dict(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        ffn=ffn,
        vocab=f.integer("vocab_size"),
        ffn_kind="swiglu",
        norm="rmsnorm",
        bias=attn_bias and mlp_bias,
        qkv_bias=kind == "qwen2" or attn_bias,
        positions="rotary",
        tied_embeddings=f.flag("tie_word_embeddings", False),
        head_dim=f.integer("head_dim", default=0),
        experts=experts,
        experts_per_token=top_k,
        architecture="llama",
    )


def gpt_oss(f: Fields, kind: str) -> dict:
    """gpt-oss: every field optional, MoE on every block, half of them sliding-window."""
    # transformers 5 GptOssConfig defaults (gpt-oss-120b) when a key is absent; GptOssAttention
    # has biases on q/k/v/o and a sink logit per head, GptOssTopKRouter a bias, GptOssExperts
    # a bias on gate_up_proj and down_proj; every layer is MoE
    layers = f.integer("num_hidden_layers", default=36)
    spec = dict(
        layers=layers,
        hidden=f.integer("hidden_size", default=2880),
        heads=f.integer("num_attention_heads", default=64),
        kv_heads=f.integer("num_key_value_heads", default=8),
        ffn=f.integer("intermediate_size", default=2880),
        vocab=f.integer("vocab_size", default=201088),
        ffn_kind="swiglu",
        norm="rmsnorm",
        bias=f.flag("attention_bias", True),
        positions="rotary",
        tied_embeddings=f.flag("tie_word_embeddings", False),
        head_dim=f.integer("head_dim", default=64),
        experts=f.integer("num_local_experts", default=128),
        experts_per_token=f.integer("num_experts_per_tok", "experts_per_token", default=4),
        router_bias=True,
        attention_sinks=True,
        architecture="llama",
    )
    # GptOssConfig: layer_types alternates sliding_attention (even blocks) and full_attention
    kinds = f.cfg.get("layer_types")
    sliding = sum(k == "sliding_attention" for k in kinds) if isinstance(kinds, list) else (layers + 1) // 2
    spec.update(sliding_window=f.integer("sliding_window", default=128), sliding_window_layers=sliding)
    return spec


def qwen2_moe(f: Fields, kind: str) -> dict:
    """Qwen2-MoE (Qwen1.5-MoE): routed experts plus a shared expert, optional dense blocks first."""
    # transformers 5 Qwen2MoeConfig (defaults: Qwen1.5-MoE-A2.7B) and Qwen2MoeDecoderLayer:
    # every layer is MoE unless decoder_sparse_step > 1 or mlp_only_layers names it
    dense_layers, moe_layer_step, dense_ffn = f.dense_blocks(f.integer("intermediate_size", default=5632))
    heads = f.integer("num_attention_heads", default=16)
    return dict(
        layers=f.integer("num_hidden_layers", default=24),
        hidden=f.integer("hidden_size", default=2048),
        heads=heads,
        # absent: the config's default 16; null: as many as the heads (Qwen2MoeConfig.__post_init__)
        kv_heads=heads if "num_key_value_heads" in f.cfg and f.cfg["num_key_value_heads"] is None
        else f.integer("num_key_value_heads", default=16),
        ffn=f.integer("moe_intermediate_size", default=1408),
        vocab=f.integer("vocab_size", default=151936),
        ffn_kind="swiglu",
        norm="rmsnorm",
        qkv_bias=f.flag("qkv_bias", True),
        positions="rotary",
        tied_embeddings=f.flag("tie_word_embeddings", False),
        experts=f.integer("num_experts", default=60),
        experts_per_token=f.integer("num_experts_per_tok", default=4),
        shared_expert_ffn=f.integer("shared_expert_intermediate_size", default=5632),
        norm_topk_prob=f.flag("norm_topk_prob", False),  # Qwen2MoeConfig default
        dense_layers=dense_layers,
        dense_ffn=dense_ffn,
        moe_layer_step=moe_layer_step,
        architecture="llama",
    )


def qwen3(f: Fields, kind: str) -> dict:
    """Qwen3 and Qwen3-MoE: q/k norms, every field optional."""
    # transformers 5 Qwen3Config / Qwen3MoeConfig defaults when a key is absent; Qwen3Attention
    # (and Qwen3MoeAttention) add q_norm/k_norm over the head width and put attention_bias on
    # q, k, v and o; every Qwen3-MoE layer is MoE unless decoder_sparse_step > 1 or
    # mlp_only_layers names it (Qwen3MoeDecoderLayer), and it has no shared expert
    moe = kind == "qwen3_moe"
    dense_layers, moe_layer_step, dense_ffn = f.dense_blocks(f.integer("intermediate_size", default=6144)) \
        if moe else (0, 1, 0)
    heads = f.integer("num_attention_heads", default=32)
    hidden = f.integer("hidden_size", default=2048 if moe else 4096)
    kv_default = 4 if moe else 32
    kv_heads = heads if "num_key_value_heads" in f.cfg and f.cfg["num_key_value_heads"] is None \
        else f.integer("num_key_value_heads", default=kv_default)
    layers = f.integer("num_hidden_layers", default=24 if moe else 32)
    attn_bias = f.flag("attention_bias", False)
    if attn_bias:
        f.approximate(f"o_proj biases not modelled ({layers * hidden} parameters)")
    # Qwen3MoeAttention: getattr(config, "head_dim", hidden // heads); Qwen3Config: head_dim 128
    head_dim = f.integer("head_dim", default=0 if moe else 128)
    return dict(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        ffn=f.integer("moe_intermediate_size", default=768) if moe else f.integer("intermediate_size", default=22016),
        vocab=f.integer("vocab_size", default=151936),
        ffn_kind="swiglu",
        norm="rmsnorm",
        qkv_bias=attn_bias,
        positions="rotary",
        tied_embeddings=f.flag("tie_word_embeddings", False),
        head_dim=head_dim,
        qk_norm=True,
        experts=f.integer("num_experts", "num_local_experts", default=128) if moe else 1,
        experts_per_token=f.integer("num_experts_per_tok", default=8) if moe else 1,
        router_first=False,
        norm_topk_prob=f.flag("norm_topk_prob", False) if moe else True,  # Qwen3MoeConfig default False
        dense_layers=dense_layers,
        dense_ffn=dense_ffn,
        moe_layer_step=moe_layer_step,
        architecture="llama",
    )


def llama4_text(f: Fields, kind: str) -> dict:
    """Llama 4's language model (a llama4 config's text_config): interleaved MoE blocks."""
    # transformers 5 Llama4TextConfig and Llama4TextDecoderLayer: the experts on the blocks of
    # moe_layers (default range(step - 1, L, step), step = interleave_moe_layer_step), a
    # Llama4TextMLP of intermediate_size_mlp elsewhere; every MoE block has a shared expert
    # of the experts' width; L2 q/k norms and NoPE layers hold no parameters
    layers = f.integer("num_hidden_layers", default=48)
    step = f.integer("interleave_moe_layer_step", default=1)
    moe = f.cfg.get("moe_layers")
    if moe is not None and list(moe) != list(range(step - 1, layers, step)):
        raise InputError(f"--model: {f.where!r} has moe_layers {moe!r}; the planner models every "
                         "interleave_moe_layer_step-th block routed")
    heads = f.integer("num_attention_heads", default=40)
    ffn = f.integer("intermediate_size", default=8192)
    return dict(
        layers=layers,
        hidden=f.integer("hidden_size", default=5120),
        heads=heads,
        kv_heads=f.integer("num_key_value_heads", default=8),
        head_dim=f.integer("head_dim", default=128),
        ffn=ffn,
        vocab=f.integer("vocab_size", default=202048),
        ffn_kind="swiglu",
        norm="rmsnorm",
        positions="rotary",
        tied_embeddings=f.flag("tie_word_embeddings", False),
        experts=f.integer("num_local_experts", default=16),
        experts_per_token=f.integer("num_experts_per_tok", default=1),
        shared_expert_ffn=ffn,
        router_first=False,
        moe_layer_step=step,
        dense_ffn=f.integer("intermediate_size_mlp", default=16384) if step > 1 else 0,
        architecture="llama4",
    )


def deepseek(f: Fields, kind: str) -> dict:
    """DeepSeek-V2/V3 (MLA attention) and GLM-4.5 (Llama attention): dense blocks, then routed."""
    # transformers 5 DeepseekV2/V3 and Glm4Moe configs and decoder layers: blocks before
    # first_k_dense_replace have a dense MLP of intermediate_size, the rest routed experts of
    # moe_intermediate_size, gate after them, and shared_experts n_shared x as wide; DeepSeek's
    # attention is MLA (q_lora_rank null: q_proj), GLM-4.5's Llama's (+ use_qk_norm)
    glm = kind == "glm4_moe"
    layers = f.integer("num_hidden_layers")
    heads = f.integer("num_attention_heads")
    moe_ffn = f.integer("moe_intermediate_size")
    dense_layers = f.integer("first_k_dense_replace", default=0)
    if f.flag("attention_bias", False) and not glm:
        f.approximate("MLA's attention_bias (q_a/kv_a/o_proj biases) not modelled")
    mtp = f.integer("num_nextn_predict_layers", default=0)
    if mtp:  # transformers builds no MTP module (its checkpoint loading skips those weights)
        f.approximate(f"its {mtp} multi-token-prediction depth(s) (num_nextn_predict_layers) left out, as transformers "
                      f"leaves them; --mtp-layers {mtp} trains them (megatron)")
    mla = {} if glm else dict(
        head_dim=f.integer("qk_nope_head_dim"), kv_lora_rank=f.integer("kv_lora_rank"),
        q_lora_rank=f.integer("q_lora_rank", default=0), qk_rope_head_dim=f.integer("qk_rope_head_dim"),
        v_head_dim=f.integer("v_head_dim"))
    attention = dict(head_dim=f.integer("head_dim", default=0), qkv_bias=f.flag("attention_bias", False),
                     qk_norm=f.flag("use_qk_norm", False)) if glm else mla
    return dict(
        layers=layers,
        hidden=f.integer("hidden_size"),
        heads=heads,
        kv_heads=f.integer("num_key_value_heads", default=heads) if glm else heads,
        ffn=moe_ffn,
        vocab=f.integer("vocab_size"),
        ffn_kind="swiglu",
        norm="rmsnorm",
        positions="rotary",
        tied_embeddings=f.flag("tie_word_embeddings", False),
        experts=f.integer("n_routed_experts"),
        experts_per_token=f.integer("num_experts_per_tok"),
        shared_expert_ffn=moe_ffn * f.integer("n_shared_experts", default=0),
        # DeepseekV2TopkRouter never renormalizes its top-k weights, whatever the config says
        norm_topk_prob=kind != "deepseek_v2" and f.flag("norm_topk_prob", True),
        router_first=False,
        dense_layers=dense_layers,
        dense_ffn=f.integer("intermediate_size") if dense_layers else 0,
        architecture="deepseek_v3",
        **attention,
    )


def gpt2(f: Fields, kind: str) -> dict:
    """GPT-2: its own field names (or the attribute_map aliases), tied, learned positions."""
    # GPT2Config.attribute_map: hidden_size, num_hidden_layers, num_attention_heads, max_position_embeddings
    hidden = f.integer("n_embd", "hidden_size")
    heads = f.integer("n_head", "num_attention_heads")
    return dict(
        layers=f.integer("n_layer", "num_hidden_layers"),
        hidden=hidden,
        heads=heads,
        kv_heads=heads,
        ffn=f.integer("n_inner", default=4 * hidden),
        vocab=f.integer("vocab_size"),
        ffn_kind="gelu",
        norm="layernorm",
        bias=True,
        positions="learned",
        max_positions=f.integer("n_positions", "max_position_embeddings"),
        tied_embeddings=f.flag("tie_word_embeddings", True),
        dropout=f.rate("attn_pdrop", 0.1) > 0,
        architecture="gpt2",
    )


def gpt_neox(f: Fields, kind: str) -> dict:
    """GPT-NeoX (Pythia): GELU MLP, LayerNorm, rotary; biases unless attention_bias is false."""
    layers = f.integer("num_hidden_layers")
    hidden = f.integer("hidden_size")
    heads = f.integer("num_attention_heads")
    ffn = f.integer("intermediate_size")
    attn_bias = f.flag("attention_bias", True)  # GPTNeoXMLP's two linears always carry biases
    if not attn_bias:
        f.approximate(f"MLP biases not modelled ({layers * (ffn + hidden)} parameters)")
    return dict(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=heads,
        ffn=ffn,
        vocab=f.integer("vocab_size"),
        ffn_kind="gelu",
        norm="layernorm",
        bias=attn_bias,
        positions="rotary",
        tied_embeddings=f.flag("tie_word_embeddings", False),
        dropout=max(f.rate("attention_dropout", 0.0), f.rate("hidden_dropout", 0.0)) > 0,
        architecture="gpt_neox",
    )


# model_type -> reader(fields, model_type) -> ModelSpec fields; the order is the error message's
READERS: dict[str, Callable[[Fields, str], dict]] = {
    "llama": llama, "mistral": llama, "mixtral": llama, "qwen2": llama,
    "qwen2_moe": qwen2_moe, "qwen3": qwen3, "qwen3_moe": qwen3,
    "deepseek_v2": deepseek, "deepseek_v3": deepseek, "glm4_moe": deepseek,
    "llama4_text": llama4_text, "gpt_oss": gpt_oss, "gpt2": gpt2, "gpt_neox": gpt_neox,
}
# model_types whose language model is their text_config (Llama4Config), read as the inner type
WRAPPERS = {"llama4": "llama4_text"}
SUPPORTED = ", ".join(name for kind in READERS
                      for name in (*[w for w, inner in WRAPPERS.items() if inner == kind], kind))


def from_hf_config(path: str | Path | dict) -> ModelSpec:
    """Read a Hugging Face config.json (Llama, Mistral, Mixtral, Qwen2, GPT-2, GPT-NeoX) offline.

    Follows `transformers`' modeling code (the ground truth for the count): core shape fields are
    required; optional ones take the defaults of the family's transformers config class
    (Mistral/Mixtral: 8 KV heads; Qwen2: 32; Mixtral: 8 experts, top-2; GPT-2: tied, n_inner 4h).
    `path` may also be the parsed dict. Bias layouts ModelSpec cannot express (Llama
    attention_bias without mlp_bias or the reverse, GPT-NeoX attention_bias false with its
    always-biased MLP) give the nearest shape and say, in `source`, how many bias parameters the
    count leaves out.
    """
    if isinstance(path, dict):
        where, cfg = "config dict", path
    else:
        where, cfg = str(path), read_json(path, "--model")
    if not isinstance(cfg, dict):
        raise InputError(f"--model: {where!r} must hold a JSON object")
    kind = str(cfg.get("model_type", "")).lower()
    if kind in WRAPPERS and isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "_name_or_path": cfg.get("_name_or_path")}
        kind = WRAPPERS[kind]
    # JSON may spell lone surrogates ("\ud800"), which no UTF-8 output can carry: keep them escaped
    name = str(cfg.get("_name_or_path") or kind)[:200].encode("utf-8", "backslashreplace").decode("utf-8")
    source = f"Hugging Face config {where}".encode("utf-8", "backslashreplace").decode("utf-8")
    reader = READERS.get(kind)
    if reader is None:
        raise InputError(f"--model: model_type {kind!r} in {where!r} is not supported; supported: {SUPPORTED}")
    fields = Fields(cfg, where)
    try:
        spec = reader(fields, kind)
    except KeyError as exc:
        raise InputError(f"--model: {where!r} lacks the field {exc.args[0]!r} for model_type {kind!r}") from None
    except (TypeError, ValueError, OverflowError) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(f"--model: {where!r} has a malformed field ({exc})") from None
    source += "".join(f"; approximate: {note}" for note in fields.notes)
    try:
        return ModelSpec(name=name, source=source, **spec)
    except InputError as exc:
        raise InputError(f"--model: {where!r} describes an invalid shape ({exc})") from None
