"""Read a Hugging Face config.json (Llama, Mistral, Mixtral, Qwen2/3 and their MoE, DeepSeek-V2/V3,
GLM-4.5, GPT-2, GPT-NeoX) offline.

The file is bounded in size and depth (planner/data.py) and every field is type-checked; the
shape it yields is validated like any other (planner/bounds.py).
"""

from __future__ import annotations

from pathlib import Path

from planner.data import read_json
from planner.errors import InputError
from planner.model import ModelSpec


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
    if kind == "llama4" and isinstance(cfg.get("text_config"), dict):  # Llama4Config: the language model's part
        cfg = {**cfg["text_config"], "_name_or_path": cfg.get("_name_or_path")}
        kind = "llama4_text"

    def integer(*keys, default=None):
        """First present, non-null field among `keys` (aliases) as an int; KeyError if required."""
        for key in keys:
            if cfg.get(key) is not None:
                value = cfg[key]
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
                    raise ValueError(f"{key} must be an integer, got {value!r}")
                return int(value)
        if default is None:
            raise KeyError(keys[0])
        return default

    def flag(key, default):
        value = cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be true or false, got {value!r}")
        return value

    def dense_blocks(ffn):
        """(dense_layers, moe_layer_step, dense_ffn) of a Qwen-MoE config: transformers 5
        Qwen2MoeDecoderLayer builds the experts where layer_idx is not in mlp_only_layers and
        (layer_idx + 1) % decoder_sparse_step == 0, else Qwen2MoeMLP(intermediate_size). The planner
        takes mlp_only_layers when they are the first k blocks."""
        only, step = cfg.get("mlp_only_layers") or [], integer("decoder_sparse_step", default=1)
        if not isinstance(only, list) or sorted(only) != list(range(len(only))):
            raise InputError(f"--model: {where!r} has mlp_only_layers {only!r}; the planner models dense blocks as "
                             "the first k and every decoder_sparse_step-th routed after them")
        return (len(only), step, ffn) if only or step > 1 else (0, 1, 0)

    def rate(key, default):
        value = cfg.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{key} must be a number, got {value!r}")
        return float(value)

    # JSON may spell lone surrogates ("\ud800"), which no UTF-8 output can carry: keep them escaped
    name = str(cfg.get("_name_or_path") or kind)[:200].encode("utf-8", "backslashreplace").decode("utf-8")
    source = f"Hugging Face config {where}".encode("utf-8", "backslashreplace").decode("utf-8")
    try:
        if kind in ("llama", "mistral", "qwen2", "mixtral"):
            layers = integer("num_hidden_layers")
            hidden = integer("hidden_size")
            heads = integer("num_attention_heads")
            ffn = integer("intermediate_size")
            # transformers' config defaults when the key is absent (null means "same as heads")
            kv_default = {"llama": heads, "mistral": 8, "mixtral": 8, "qwen2": 32}[kind]
            kv_heads = integer("num_key_value_heads", default=heads) if "num_key_value_heads" in cfg else kv_default
            # only LlamaAttention/LlamaMLP read attention_bias/mlp_bias; Mistral/Mixtral have no
            # biases at all, Qwen2 always has q/k/v biases (and no others)
            attn_bias = kind == "llama" and flag("attention_bias", False)
            mlp_bias = kind == "llama" and flag("mlp_bias", False)
            if attn_bias and not mlp_bias:
                source += f"; approximate: o_proj biases not modelled ({layers * hidden} parameters)"
            elif mlp_bias and not attn_bias:
                source += f"; approximate: MLP biases not modelled ({layers * (2 * ffn + hidden)} parameters)"
            experts = integer("num_local_experts", "num_experts", default=8) if kind == "mixtral" else 1
            top_k = integer("num_experts_per_tok", default=2) if kind == "mixtral" else 1
            spec = dict(
                layers=layers,
                hidden=hidden,
                heads=heads,
                kv_heads=kv_heads,
                ffn=ffn,
                vocab=integer("vocab_size"),
                ffn_kind="swiglu",
                norm="rmsnorm",
                bias=attn_bias and mlp_bias,
                qkv_bias=kind == "qwen2" or attn_bias,
                positions="rotary",
                tied_embeddings=flag("tie_word_embeddings", False),
                head_dim=integer("head_dim", default=0),
                experts=experts,
                experts_per_token=top_k,
                architecture="llama",
            )
        elif kind == "gpt_oss":
            # transformers 5 GptOssConfig defaults (gpt-oss-120b) when a key is absent; GptOssAttention
            # has biases on q/k/v/o and a sink logit per head, GptOssTopKRouter a bias, GptOssExperts
            # a bias on gate_up_proj and down_proj; every layer is MoE
            layers = integer("num_hidden_layers", default=36)
            spec = dict(
                layers=layers,
                hidden=integer("hidden_size", default=2880),
                heads=integer("num_attention_heads", default=64),
                kv_heads=integer("num_key_value_heads", default=8),
                ffn=integer("intermediate_size", default=2880),
                vocab=integer("vocab_size", default=201088),
                ffn_kind="swiglu",
                norm="rmsnorm",
                bias=flag("attention_bias", True),
                positions="rotary",
                tied_embeddings=flag("tie_word_embeddings", False),
                head_dim=integer("head_dim", default=64),
                experts=integer("num_local_experts", default=128),
                experts_per_token=integer("num_experts_per_tok", "experts_per_token", default=4),
                router_bias=True,
                attention_sinks=True,
                architecture="llama",
            )
            # GptOssConfig: layer_types alternates sliding_attention (even blocks) and full_attention
            kinds = cfg.get("layer_types") if isinstance(cfg.get("layer_types"), list) else \
                ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
            spec.update(sliding_window=integer("sliding_window", default=128),
                        sliding_window_layers=sum(k == "sliding_attention" for k in kinds))
        elif kind == "qwen2_moe":
            # transformers 5 Qwen2MoeConfig (defaults: Qwen1.5-MoE-A2.7B) and Qwen2MoeDecoderLayer:
            # every layer is MoE unless decoder_sparse_step > 1 or mlp_only_layers names it
            dense_layers, moe_layer_step, dense_ffn = dense_blocks(integer("intermediate_size", default=5632))
            heads = integer("num_attention_heads", default=16)
            spec = dict(
                layers=integer("num_hidden_layers", default=24),
                hidden=integer("hidden_size", default=2048),
                heads=heads,
                # absent: the config's default 16; null: as many as the heads (Qwen2MoeConfig.__post_init__)
                kv_heads=heads if "num_key_value_heads" in cfg and cfg["num_key_value_heads"] is None
                else integer("num_key_value_heads", default=16),
                ffn=integer("moe_intermediate_size", default=1408),
                vocab=integer("vocab_size", default=151936),
                ffn_kind="swiglu",
                norm="rmsnorm",
                qkv_bias=flag("qkv_bias", True),
                positions="rotary",
                tied_embeddings=flag("tie_word_embeddings", False),
                experts=integer("num_experts", default=60),
                experts_per_token=integer("num_experts_per_tok", default=4),
                shared_expert_ffn=integer("shared_expert_intermediate_size", default=5632),
                norm_topk_prob=flag("norm_topk_prob", False),  # Qwen2MoeConfig default
                dense_layers=dense_layers,
                dense_ffn=dense_ffn,
                moe_layer_step=moe_layer_step,
                architecture="llama",
            )
        elif kind in ("qwen3", "qwen3_moe"):
            # transformers 5 Qwen3Config / Qwen3MoeConfig defaults when a key is absent; Qwen3Attention
            # (and Qwen3MoeAttention) add q_norm/k_norm over the head width and put attention_bias on
            # q, k, v and o; every Qwen3-MoE layer is MoE unless decoder_sparse_step > 1 or
            # mlp_only_layers names it (Qwen3MoeDecoderLayer), and it has no shared expert
            moe = kind == "qwen3_moe"
            dense_layers, moe_layer_step, dense_ffn = dense_blocks(integer("intermediate_size", default=6144)) \
                if moe else (0, 1, 0)
            heads = integer("num_attention_heads", default=32)
            hidden = integer("hidden_size", default=2048 if moe else 4096)
            kv_default = 4 if moe else 32
            kv_heads = heads if "num_key_value_heads" in cfg and cfg["num_key_value_heads"] is None \
                else integer("num_key_value_heads", default=kv_default)
            layers = integer("num_hidden_layers", default=24 if moe else 32)
            attn_bias = flag("attention_bias", False)
            if attn_bias:
                source += f"; approximate: o_proj biases not modelled ({layers * hidden} parameters)"
            # Qwen3MoeAttention: getattr(config, "head_dim", hidden // heads); Qwen3Config: head_dim 128
            head_dim = integer("head_dim", default=0 if moe else 128)
            spec = dict(
                layers=layers,
                hidden=hidden,
                heads=heads,
                kv_heads=kv_heads,
                ffn=integer("moe_intermediate_size", default=768) if moe else integer("intermediate_size", default=22016),
                vocab=integer("vocab_size", default=151936),
                ffn_kind="swiglu",
                norm="rmsnorm",
                qkv_bias=attn_bias,
                positions="rotary",
                tied_embeddings=flag("tie_word_embeddings", False),
                head_dim=head_dim,
                qk_norm=True,
                experts=integer("num_experts", "num_local_experts", default=128) if moe else 1,
                experts_per_token=integer("num_experts_per_tok", default=8) if moe else 1,
                router_first=False,
                norm_topk_prob=flag("norm_topk_prob", False) if moe else True,  # Qwen3MoeConfig default False
                dense_layers=dense_layers,
                dense_ffn=dense_ffn,
                moe_layer_step=moe_layer_step,
                architecture="llama",
            )
        elif kind == "llama4_text":
            # transformers 5 Llama4TextConfig and Llama4TextDecoderLayer: the experts on the blocks of
            # moe_layers (default range(step - 1, L, step), step = interleave_moe_layer_step), a
            # Llama4TextMLP of intermediate_size_mlp elsewhere; every MoE block has a shared expert
            # of the experts' width; L2 q/k norms and NoPE layers hold no parameters
            layers = integer("num_hidden_layers", default=48)
            step = integer("interleave_moe_layer_step", default=1)
            moe = cfg.get("moe_layers")
            if moe is not None and list(moe) != list(range(step - 1, layers, step)):
                raise InputError(f"--model: {where!r} has moe_layers {moe!r}; the planner models every "
                                 "interleave_moe_layer_step-th block routed")
            heads = integer("num_attention_heads", default=40)
            ffn = integer("intermediate_size", default=8192)
            spec = dict(
                layers=layers,
                hidden=integer("hidden_size", default=5120),
                heads=heads,
                kv_heads=integer("num_key_value_heads", default=8),
                head_dim=integer("head_dim", default=128),
                ffn=ffn,
                vocab=integer("vocab_size", default=202048),
                ffn_kind="swiglu",
                norm="rmsnorm",
                positions="rotary",
                tied_embeddings=flag("tie_word_embeddings", False),
                experts=integer("num_local_experts", default=16),
                experts_per_token=integer("num_experts_per_tok", default=1),
                shared_expert_ffn=ffn,
                router_first=False,
                moe_layer_step=step,
                dense_ffn=integer("intermediate_size_mlp", default=16384) if step > 1 else 0,
                architecture="llama4",
            )
        elif kind in ("deepseek_v2", "deepseek_v3", "glm4_moe"):
            # transformers 5 DeepseekV2/V3 and Glm4Moe configs and decoder layers: blocks before
            # first_k_dense_replace have a dense MLP of intermediate_size, the rest routed experts of
            # moe_intermediate_size, gate after them, and shared_experts n_shared x as wide; DeepSeek's
            # attention is MLA (q_lora_rank null: q_proj), GLM-4.5's Llama's (+ use_qk_norm)
            glm = kind == "glm4_moe"
            layers = integer("num_hidden_layers")
            heads = integer("num_attention_heads")
            moe_ffn = integer("moe_intermediate_size")
            dense_layers = integer("first_k_dense_replace", default=0)
            if flag("attention_bias", False) and not glm:
                source += "; approximate: MLA's attention_bias (q_a/kv_a/o_proj biases) not modelled"
            mla = {} if glm else dict(
                head_dim=integer("qk_nope_head_dim"), kv_lora_rank=integer("kv_lora_rank"),
                q_lora_rank=integer("q_lora_rank", default=0), qk_rope_head_dim=integer("qk_rope_head_dim"),
                v_head_dim=integer("v_head_dim"))
            attention = dict(head_dim=integer("head_dim", default=0), qkv_bias=flag("attention_bias", False),
                             qk_norm=flag("use_qk_norm", False)) if glm else mla
            spec = dict(
                layers=layers,
                hidden=integer("hidden_size"),
                heads=heads,
                kv_heads=integer("num_key_value_heads", default=heads) if glm else heads,
                ffn=moe_ffn,
                vocab=integer("vocab_size"),
                ffn_kind="swiglu",
                norm="rmsnorm",
                positions="rotary",
                tied_embeddings=flag("tie_word_embeddings", False),
                experts=integer("n_routed_experts"),
                experts_per_token=integer("num_experts_per_tok"),
                shared_expert_ffn=moe_ffn * integer("n_shared_experts", default=0),
                # DeepseekV2TopkRouter never renormalizes its top-k weights, whatever the config says
                norm_topk_prob=kind != "deepseek_v2" and flag("norm_topk_prob", True),
                router_first=False,
                dense_layers=dense_layers,
                dense_ffn=integer("intermediate_size") if dense_layers else 0,
                architecture="deepseek_v3",
                **attention,
            )
        elif kind == "gpt2":
            # GPT2Config.attribute_map: hidden_size, num_hidden_layers, num_attention_heads, max_position_embeddings
            hidden = integer("n_embd", "hidden_size")
            heads = integer("n_head", "num_attention_heads")
            spec = dict(
                layers=integer("n_layer", "num_hidden_layers"),
                hidden=hidden,
                heads=heads,
                kv_heads=heads,
                ffn=integer("n_inner", default=4 * hidden),
                vocab=integer("vocab_size"),
                ffn_kind="gelu",
                norm="layernorm",
                bias=True,
                positions="learned",
                max_positions=integer("n_positions", "max_position_embeddings"),
                tied_embeddings=flag("tie_word_embeddings", True),
                dropout=rate("attn_pdrop", 0.1) > 0,
                architecture="gpt2",
            )
        elif kind == "gpt_neox":
            layers = integer("num_hidden_layers")
            hidden = integer("hidden_size")
            heads = integer("num_attention_heads")
            ffn = integer("intermediate_size")
            attn_bias = flag("attention_bias", True)  # GPTNeoXMLP's two linears always carry biases
            if not attn_bias:
                source += f"; approximate: MLP biases not modelled ({layers * (ffn + hidden)} parameters)"
            spec = dict(
                layers=layers,
                hidden=hidden,
                heads=heads,
                kv_heads=heads,
                ffn=ffn,
                vocab=integer("vocab_size"),
                ffn_kind="gelu",
                norm="layernorm",
                bias=attn_bias,
                positions="rotary",
                tied_embeddings=flag("tie_word_embeddings", False),
                dropout=max(rate("attention_dropout", 0.0), rate("hidden_dropout", 0.0)) > 0,
                architecture="gpt_neox",
            )
        else:
            raise InputError(
                f"--model: model_type {kind!r} in {where!r} is not supported; "
                "supported: llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, deepseek_v2, deepseek_v3, "
                "glm4_moe, llama4, llama4_text, gpt_oss, gpt2, gpt_neox"
            )
    except KeyError as exc:
        raise InputError(f"--model: {where!r} lacks the field {exc.args[0]!r} for model_type {kind!r}") from None
    except (TypeError, ValueError, OverflowError) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(f"--model: {where!r} has a malformed field ({exc})") from None
    try:
        return ModelSpec(name=name, source=source, **spec)
    except InputError as exc:
        raise InputError(f"--model: {where!r} describes an invalid shape ({exc})") from None
