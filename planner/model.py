"""The model: a dense (or MoE) decoder-only transformer shape and its exact parameter count.

Counts are exact (every weight and bias), so they can be checked against `transformers`
models built on the meta device and against published counts (Llama-2-7B 6,738,415,616).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from planner.errors import InputError

DATA_DIR = Path(__file__).resolve().parent.parent / "data"

FFN_KINDS = ("gelu", "swiglu")
NORM_KINDS = ("layernorm", "rmsnorm")
POSITION_KINDS = ("learned", "rotary")


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer. Sizes are element counts, not bytes."""

    layers: int
    """Number of transformer blocks L."""
    hidden: int
    """Model width h."""
    heads: int
    """Query heads a."""
    kv_heads: int
    """Key/value heads g (g == a: MHA, 1 < g < a: GQA, g == 1: MQA)."""
    ffn: int
    """MLP inner width f (per expert for MoE)."""
    vocab: int
    """Vocabulary size V (as padded in the embedding matrix)."""
    ffn_kind: str = "swiglu"
    """'gelu': 2-matrix MLP (GPT); 'swiglu': 3-matrix gated MLP (Llama)."""
    norm: str = "rmsnorm"
    """'layernorm' (weight and bias) or 'rmsnorm' (weight only)."""
    bias: bool = False
    """Biases on every linear layer (GPT, GPT-NeoX)."""
    qkv_bias: bool = False
    """Biases on the q/k/v projections only (Qwen2); implied by `bias`."""
    positions: str = "rotary"
    """'learned' absolute position embedding (GPT) or 'rotary' (no parameters)."""
    max_positions: int = 0
    """Rows of the learned position embedding (0 for rotary)."""
    tied_embeddings: bool = False
    """Output layer shares the input embedding matrix."""
    dropout: bool = False
    """Dropout after attention scores, attention output and MLP (keeps 1-byte masks)."""
    head_dim: int = 0
    """Per-head width; 0 means hidden // heads."""
    experts: int = 1
    """MLP experts per layer (1: dense)."""
    experts_per_token: int = 1
    """Experts each token is routed to (top-k)."""
    name: str = "custom"
    """Catalog name or 'custom'."""
    source: str = ""
    """Where the shape comes from."""

    def __post_init__(self):
        for key in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "experts", "experts_per_token"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(f"--{key.replace('_', '-')}: must be a positive integer, got {value!r}")
        if self.ffn_kind not in FFN_KINDS:
            raise InputError(f"--ffn-kind: must be one of {', '.join(FFN_KINDS)}, got {self.ffn_kind!r}")
        if self.norm not in NORM_KINDS:
            raise InputError(f"--norm: must be one of {', '.join(NORM_KINDS)}, got {self.norm!r}")
        if self.positions not in POSITION_KINDS:
            raise InputError(f"--positions: must be one of {', '.join(POSITION_KINDS)}, got {self.positions!r}")
        if self.heads % self.kv_heads:
            raise InputError(f"--kv-heads: must divide --heads ({self.heads}), got {self.kv_heads}")
        if self.head_dim == 0 and self.hidden % self.heads:
            raise InputError(f"--heads: must divide --hidden ({self.hidden}), got {self.heads}")
        if self.experts_per_token > self.experts:
            raise InputError("--experts-per-token: must not exceed the number of experts")

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def q_width(self) -> int:
        """Width of the query projection output a*d."""
        return self.heads * self.dim_per_head

    @property
    def kv_width(self) -> int:
        """Width of each of the key and value projection outputs g*d."""
        return self.kv_heads * self.dim_per_head

    @property
    def norm_params(self) -> int:
        """Parameters of one normalisation layer (LayerNorm: weight+bias; RMSNorm: weight)."""
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden

    # ---- parameter counts (elements) -----------------------------------------------------
    def attention_params(self) -> tuple[int, int]:
        """(parameters split by TP, parameters replicated on every TP rank) of one attention block.

        Megatron column-parallel q/k/v (weights and biases split), row-parallel output
        projection (weight split, bias replicated): Shoeybi et al. 2019, section 3.
        """
        h, q, kv = self.hidden, self.q_width, self.kv_width
        split = h * q + 2 * h * kv + q * h
        if self.bias or self.qkv_bias:
            split += q + 2 * kv
        replicated = h if self.bias else 0
        return split, replicated

    def mlp_params(self) -> tuple[int, int]:
        """(TP-split, TP-replicated) parameters of one expert's MLP (column then row parallel)."""
        h, f = self.hidden, self.ffn
        matrices = 3 if self.ffn_kind == "swiglu" else 2  # SwiGLU: gate, up, down (Shazeer 2020)
        split = matrices * h * f
        if self.bias:
            split += (matrices - 1) * f
        replicated = h if self.bias else 0
        return split, replicated

    def layer_params_split(self) -> tuple[int, int]:
        """(TP-split, TP-replicated) parameters of one transformer block, all experts included."""
        attn_split, attn_rep = self.attention_params()
        mlp_split, mlp_rep = self.mlp_params()
        router = self.hidden * self.experts if self.experts > 1 else 0
        split = attn_split + self.experts * mlp_split
        replicated = attn_rep + self.experts * mlp_rep + 2 * self.norm_params + router
        return split, replicated

    @property
    def layer_params(self) -> int:
        """Parameters of one transformer block."""
        return sum(self.layer_params_split())

    @property
    def embedding_params(self) -> int:
        """Input token embedding V*h (vocab-parallel under TP)."""
        return self.vocab * self.hidden

    @property
    def position_params(self) -> int:
        """Learned absolute position embedding (replicated under TP)."""
        return self.max_positions * self.hidden if self.positions == "learned" else 0

    @property
    def output_params(self) -> int:
        """Output projection V*h when not tied to the input embedding."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def params(self) -> int:
        """Exact total parameter count (tied matrices counted once)."""
        return (
            self.layers * self.layer_params
            + self.embedding_params
            + self.position_params
            + self.norm_params  # final norm
            + self.output_params
        )

    @property
    def active_params(self) -> int:
        """Parameters touched per token (MoE: only top-k experts' MLPs)."""
        mlp_split, mlp_rep = self.mlp_params()
        inactive = self.layers * (self.experts - self.experts_per_token) * (mlp_split + mlp_rep)
        return self.params - inactive

    @property
    def largest_layer_params(self) -> int:
        """Largest single parameter tensor (DeepSpeed estimators' `largest_layer_params`)."""
        h = self.hidden
        candidates = [self.vocab * h, h * self.q_width, h * self.ffn, self.max_positions * h]
        return max(candidates)

    def shape_dict(self) -> dict:
        d = asdict(self)
        d["params"] = self.params
        return d


# ---------------------------------------------------------------------------------------------
# catalog


def load_catalog(path: Path | None = None) -> dict[str, ModelSpec]:
    """Models in data/models.json, keyed by lower-case name."""
    path = path or DATA_DIR / "models.json"
    with open(path) as f:
        raw = json.load(f)
    catalog = {}
    for entry in raw["models"]:
        entry = {k: v for k, v in entry.items() if k not in ("published_params", "aliases")}
        spec = ModelSpec(**entry)
        catalog[spec.name.lower()] = spec
    return catalog


def published_params(path: Path | None = None) -> dict[str, int]:
    """Published exact parameter counts from data/models.json (where the source gives one)."""
    path = path or DATA_DIR / "models.json"
    with open(path) as f:
        raw = json.load(f)
    return {e["name"].lower(): e["published_params"] for e in raw["models"] if e.get("published_params")}


def lookup(name: str) -> ModelSpec:
    """Catalog model by case-insensitive name; unknown names suggest close matches."""
    import difflib

    catalog = load_catalog()
    key = name.lower()
    if key in catalog:
        return catalog[key]
    close = difflib.get_close_matches(key, list(catalog), n=3, cutoff=0.4)
    hint = f" (did you mean {', '.join(catalog[c].name for c in close)}?)" if close else ""
    raise InputError(
        f"--model: unknown model {name!r}{hint}; known: {', '.join(sorted(s.name for s in catalog.values()))}, "
        "or a path to a Hugging Face config.json"
    )


# ---------------------------------------------------------------------------------------------
# Hugging Face config.json


def from_hf_config(path: str | Path) -> ModelSpec:
    """Read a Hugging Face config.json (Llama, Mistral, Mixtral, Qwen2, GPT-2, GPT-NeoX) offline.

    Follows `transformers`' modeling code (the ground truth for the count): core shape fields are
    required; optional ones take the defaults of the family's transformers config class
    (Mistral/Mixtral: 8 KV heads; Qwen2: 32; Mixtral: 8 experts, top-2; GPT-2: tied, n_inner 4h).
    Bias layouts ModelSpec cannot express (Llama attention_bias without mlp_bias or the reverse,
    GPT-NeoX attention_bias false with its always-biased MLP) give the nearest shape and say, in
    `source`, how many bias parameters the count leaves out.
    """
    where = str(path)
    try:
        with open(path) as f:
            cfg = json.load(f)
    except FileNotFoundError:
        raise InputError(f"--model: no such file {where!r}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"--model: {where!r} is not valid JSON ({exc})") from None
    except OSError as exc:
        raise InputError(f"--model: cannot read {where!r} ({exc.strerror or exc})") from None
    if not isinstance(cfg, dict):
        raise InputError(f"--model: {where!r} must hold a JSON object")
    kind = str(cfg.get("model_type", "")).lower()

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

    def rate(key, default):
        value = cfg.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{key} must be a number, got {value!r}")
        return float(value)

    name = str(cfg.get("_name_or_path") or kind)
    source = f"Hugging Face config {where}"
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
            )
        else:
            raise InputError(
                f"--model: model_type {kind!r} in {where!r} is not supported; "
                "supported: llama, mistral, mixtral, qwen2, gpt2, gpt_neox"
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


# ---------------------------------------------------------------------------------------------
# --params: derive a plausible shape

# Llama-3 family rule (Meta llama3 model.py): head_dim 128, 8 KV heads, ffn = 1.3 * 8h/3 rounded up
# to a multiple of 1024, vocab 128,256. Width per layer from Llama-2/3 (h/L = 128 at 7-13B,
# 102 at 70B, 130 at 405B): we target h/L = 128 and pick the depth whose count is nearest.
_DERIVED_HEAD_DIM = 128
_DERIVED_KV_HEADS = 8
_DERIVED_VOCAB = 128256
_DERIVED_WIDTH_PER_LAYER = 128.0


def llama3_ffn(hidden: int) -> int:
    # Meta llama3 model.py FeedForward: int(2*4h/3), times ffn_dim_multiplier 1.3, rounded up to 1024
    raw = int(1.3 * int(2 * 4 * hidden / 3))
    return 1024 * math.ceil(raw / 1024)


def derive_shape(target_params: float, **overrides) -> ModelSpec:
    """A Llama-3-style shape whose exact count is nearest `target_params`; overrides win.

    Free choices: depth L (2..256, within 1.5x of the depth a 12 L h^2 stack with h = 128 L needs) and query heads a (hidden = 128 a, KV heads gcd(a, 8), ffn by
    the Llama-3 rule, vocab 128,256, untied). Score: |log(count / target)|, plus 0.005 per halving
    of the KV heads below 8 (the family uses 8), plus 0.02 |log((h / L) / 128)| (aspect ratio).
    With L free the count is matched by depth, so 8 KV heads nearly always win; with L fixed the
    width is searched in steps of 128, so the count stays within ~2.5% (fewer KV heads if needed).
    Overrides are ModelSpec shape fields (None values ignored); a fixed `kv_heads` restricts the
    heads to its multiples, a fixed `head_dim` replaces 128 as the width per head.
    """
    if not target_params > 0:
        raise InputError(f"--params: must be a positive number, got {target_params!r}")
    fixed = {k: v for k, v in overrides.items() if v is not None}
    from dataclasses import fields as dataclass_fields

    shape_fields = {f.name for f in dataclass_fields(ModelSpec)} - {"name", "source"}
    unknown = sorted(set(fixed) - shape_fields)
    if unknown:
        raise TypeError(f"derive_shape() got unexpected shape fields {unknown}")
    per_head = fixed.get("head_dim") or _DERIVED_HEAD_DIM
    max_heads = 1024
    if "heads" in fixed:
        head_choices = [fixed["heads"]]
    elif "hidden" in fixed:
        head_choices = [max(1, fixed["hidden"] // per_head)]
    elif "kv_heads" in fixed:
        head_choices = list(range(fixed["kv_heads"], max_heads + 1, fixed["kv_heads"]))
    else:
        head_choices = list(range(1, max_heads + 1))
    last_error: InputError | None = None

    def make(layers: int, heads: int) -> ModelSpec | None:
        nonlocal last_error
        hidden = fixed.get("hidden", heads * per_head)
        fields = dict(
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=math.gcd(heads, _DERIVED_KV_HEADS),
            ffn=llama3_ffn(hidden),
            vocab=_DERIVED_VOCAB,
            ffn_kind="swiglu",
            tied_embeddings=False,
        )
        fields.update({k: v for k, v in fixed.items() if k not in ("layers", "hidden", "heads")})
        try:
            return ModelSpec(
                name=f"derived-{target_params:.3g}",
                source="derived from --params by the Llama-3 family rule (planner/model.py)",
                **fields,
            )
        except InputError as exc:
            last_error = exc
            return None

    def score(spec: ModelSpec) -> float:
        kv_penalty = 0.0 if "kv_heads" in fixed else 0.005 * math.log2(_DERIVED_KV_HEADS / spec.kv_heads)
        aspect = abs(math.log(spec.hidden / spec.layers / _DERIVED_WIDTH_PER_LAYER))
        return abs(math.log(spec.params / target_params)) + kv_penalty + 0.02 * aspect

    best, best_score = None, math.inf
    # depths near the one a 12 L h^2 block stack with h = 128 L would need (Kaplan et al. 2020 eq. 2.1)
    depth = (target_params / (12 * _DERIVED_WIDTH_PER_LAYER**2)) ** (1 / 3)
    depths = range(max(2, int(depth / 1.5)), min(256, int(depth * 1.5) + 2) + 1)
    for layers in [fixed["layers"]] if "layers" in fixed else depths:
        # the count grows with the heads: bisect for the first choice at or above the target,
        # then score a window around it (wide enough to reach the nearest multiples of 8)
        lo, hi = 0, len(head_choices) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            spec = make(layers, head_choices[mid])
            if spec is not None and spec.params >= target_params:
                hi = mid
            else:
                lo = mid + 1
        for i in range(max(0, lo - 8), min(len(head_choices), lo + 9)):
            spec = make(layers, head_choices[i])
            if spec is not None and score(spec) < best_score:
                best, best_score = spec, score(spec)
    if best is None:
        detail = f" ({last_error})" if last_error else ""
        raise InputError(f"--params: no shape satisfies the given overrides{detail}")
    return best


def with_overrides(spec: ModelSpec, **overrides) -> ModelSpec:
    """Replace shape fields (None values ignored), re-validating."""
    clean = {k: v for k, v in overrides.items() if v is not None}
    if not clean:
        return spec
    if "heads" in clean and "kv_heads" not in clean and spec.kv_heads == spec.heads:
        clean["kv_heads"] = clean["heads"]
    return replace(spec, name=spec.name if not clean else f"{spec.name}+overrides", **clean)

