"""The model: a decoder-only transformer's shape and the one list of its parameter tensors.

`ModelSpec.tensors()` yields every parameter tensor (name, shape, how Megatron tensor
parallelism splits it, whether it is a routed expert's) in the order Hugging Face registers
them. Everything else about parameters is derived from that list: the exact count (checked
against published counts and against `named_parameters()` of transformers models built on the
meta device), what one rank holds under TP/PP/EP, ZeRO-3's persistent parameters, the flat order
DeepSpeed partitions, DeepSpeed's "largest layer" and the GEMMs of a block. The tensor records
and their sums are planner/tensors.py, each architecture's layout planner/hf_layouts.py; the
catalog of named models is here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import cached_property

import numpy as np

from planner.errors import InputError
from planner.hf_layouts import LAYOUTS
from planner.tensors import BLOCK, FIRST, LAST, Gemm, ParamSums, Tensor, local_numel

FFN_KINDS = ("gelu", "swiglu")
NORM_KINDS = ("layernorm", "rmsnorm")
POSITION_KINDS = ("learned", "rotary")
ARCHITECTURES = ("llama", "gpt2", "gpt_neox", "deepseek_v3", "llama4")
"""Hugging Face module layouts (names and registration order): LlamaForCausalLM (also Mistral,
Qwen2, and Mixtral's MoE block), GPT2LMHeadModel (Conv1D, fused c_attn), GPTNeoXForCausalLM,
DeepseekV3ForCausalLM (multi-head latent attention, `shared_experts`; also Glm4MoeForCausalLM,
whose attention is Llama's), Llama4ForCausalLM (`feed_forward`, input-major stacked experts)."""


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
    qk_norm: bool = False
    """An RMSNorm over each head's query and key, weight of the head width (Qwen3 q_norm, k_norm;
    Megatron-core qk_layernorm)."""
    router_first: bool = True
    """The MoE router registers before the experts (Mixtral, Qwen2-MoE); Qwen3-MoE registers it
    after them. Only the order of the tensor list changes (DeepSpeed's flat partitions)."""
    router_bias: bool = False
    """The MoE router's linear has a bias (transformers 5 GptOssTopKRouter: weight and bias, named
    mlp.router)."""
    sliding_window: int = 0
    """Keys a sliding-window attention layer reads per query (0: every layer attends to the whole
    causal prefix; transformers 5 sliding_window with layer_types 'sliding_attention')."""
    sliding_window_layers: int = 0
    """How many blocks use the sliding window (gpt-oss: every other one, 18 of 36)."""
    attention_sinks: bool = False
    """A learned sink logit per head, joined to every softmax row (transformers 5 GptOssAttention.sinks,
    one per head, split over TP with the heads)."""
    norm_topk_prob: bool = True
    """The MoE router renormalizes its top-k weights to sum to 1 (transformers 5 MixtralTopKRouter
    always; Qwen2-MoE and Qwen3-MoE when config.norm_topk_prob). Only what the router keeps for
    backward changes (planner/activations.py hf_moe_mlp_saved)."""
    shared_expert_ffn: int = 0
    """Intermediate width of the shared expert every token also passes, beside its routed ones
    (Qwen2-MoE shared_expert_intermediate_size; 0: none). `ffn` is then the routed experts' width."""
    dense_layers: int = 0
    """The first k blocks have a dense MLP of width `dense_ffn` in place of the experts (DeepSeek-V3
    and GLM-4.5 first_k_dense_replace; Qwen-MoE mlp_only_layers when they are 0..k-1)."""
    dense_ffn: int = 0
    """MLP width of the dense blocks (DeepSeek-V3 intermediate_size 18432)."""
    moe_layer_step: int = 1
    """Of the blocks after the dense-first ones, block i has the routed experts when (i + 1) is a
    multiple of this step, the others a dense MLP of `dense_ffn` (transformers 5 Qwen2MoeDecoderLayer
    decoder_sparse_step; Llama4TextConfig moe_layers = range(step - 1, L, step)); 1: all of them."""
    kv_lora_rank: int = 0
    """Multi-head latent attention (DeepSeek-V2 paper, Liu et al. 2024, section 2.1.2): rank d_c of
    the joint key/value compression; 0: standard attention. `head_dim` is then the non-rotary
    query/key width per head (qk_nope_head_dim) and kv_heads equals heads."""
    q_lora_rank: int = 0
    """MLA's query compression rank d_c' (0: queries projected directly, as DeepSeek-V2-Lite)."""
    qk_rope_head_dim: int = 0
    """MLA's decoupled rotary query/key width per head d_h^R (the rotary key is shared by all heads)."""
    v_head_dim: int = 0
    """MLA's value width per head (0: the query/key head width)."""
    mtp_layers: int = 0
    """Multi-token-prediction depths trained after the last block (DeepSeek-V3, arXiv 2412.19437
    section 2.2; Megatron-core --mtp-num-layers; a Hugging Face config's num_nextn_predict_layers
    says how many its checkpoint holds, which transformers does not build). Each depth is one more
    block of the last block's kind, a norm of the hidden state and one of the next token's
    embedding, a 2h -> h projection and a final norm, sharing the embedding and the output layer
    (megatron-core 0.16.1 transformer/multi_token_prediction.py MultiTokenPredictionLayer), all on
    the last pipeline stage, which then holds an embedding copy of its own (models/gpt/gpt_model.py
    GPTModel: pre_process or mtp_process builds LanguageModelEmbedding)."""
    architecture: str = "llama"
    """Hugging Face module layout the tensors are named and ordered by (ARCHITECTURES)."""
    name: str = "custom"
    """Catalog name or 'custom'."""
    source: str = ""
    """Where the shape comes from."""

    def __post_init__(self):
        from planner.bounds import check

        for key in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "experts", "experts_per_token",
                    "max_positions", "head_dim", "shared_expert_ffn", "dense_layers", "dense_ffn", "moe_layer_step",
                    "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim", "mtp_layers"):
            value = getattr(self, key)
            if not isinstance(value, int):  # a float that is whole is a user's typo, not an int
                raise InputError(f"--{key.replace('_', '-')}: must be an integer, got {value!r}")
            check(key, value)
        for key, allowed in (("ffn_kind", FFN_KINDS), ("norm", NORM_KINDS), ("positions", POSITION_KINDS),
                             ("architecture", ARCHITECTURES)):
            if getattr(self, key) not in allowed:
                raise InputError(f"--{key.replace('_', '-')}: must be one of {', '.join(allowed)}, "
                                 f"got {getattr(self, key)!r}")
        if self.heads % self.kv_heads:
            raise InputError(f"--kv-heads: must divide --heads ({self.heads}), got {self.kv_heads}")
        if self.head_dim == 0 and self.hidden % self.heads:
            raise InputError(f"--heads: must divide --hidden ({self.hidden}), got {self.heads}")
        if self.experts_per_token > self.experts:
            raise InputError("--experts-per-token: must not exceed the number of experts")
        if self.shared_expert_ffn and (self.experts == 1 or self.architecture not in ("llama", "deepseek_v3", "llama4")):
            raise InputError("--shared-expert-ffn: needs --experts > 1 (a Llama/Qwen-style MoE)")
        if self.dense_layers and (self.experts == 1 or self.dense_ffn == 0 or self.dense_layers >= self.layers
                                  or self.architecture not in ("llama", "deepseek_v3", "llama4")):
            raise InputError(f"--dense-layers: needs --experts > 1, --dense-ffn > 0 and fewer than --layers "
                             f"({self.layers}) blocks, got {self.dense_layers}")
        if self.moe_layer_step > 1 and (self.experts == 1 or self.dense_ffn == 0
                                        or self.architecture not in ("llama", "deepseek_v3", "llama4")):
            raise InputError(f"--moe-layer-step: needs --experts > 1 and --dense-ffn > 0 (the other blocks' MLP), "
                             f"got {self.moe_layer_step}")
        if self.moe_layers == 0 and self.experts > 1:
            raise InputError(f"--moe-layer-step: no block of the {self.layers} would have the experts "
                             f"(--dense-layers {self.dense_layers}, --moe-layer-step {self.moe_layer_step})")
        if self.dense_ffn and self.moe_layers == self.layers:
            raise InputError("--dense-ffn: needs --dense-layers > 0 or --moe-layer-step > 1")
        mla = (self.q_lora_rank, self.qk_rope_head_dim, self.v_head_dim)
        if self.kv_lora_rank and (self.architecture != "deepseek_v3" or self.kv_heads != self.heads
                                  or not self.head_dim or self.qk_norm):
            raise InputError("--kv-lora-rank: multi-head latent attention needs the deepseek_v3 architecture, "
                             "--kv-heads equal to --heads, --head-dim (the non-rotary width) and no --qk-norm")
        if any(mla) and not self.kv_lora_rank:
            raise InputError("--q-lora-rank, --qk-rope-head-dim, --v-head-dim: need --kv-lora-rank > 0 "
                             "(multi-head latent attention)")

    # ---- widths --------------------------------------------------------------------------
    @property
    def dim_per_head(self) -> int:
        """Query/key width per head (MLA: its non-rotary and rotary parts)."""
        return (self.head_dim or self.hidden // self.heads) + self.qk_rope_head_dim

    @property
    def v_width(self) -> int:
        """Width of the value projection output (the attention output's is heads x that per head)."""
        return self.kv_heads * (self.v_head_dim or self.dim_per_head)

    def attended_keys(self, seq_len: int, causal: bool) -> float:
        """Keys a query attends to, averaged over the blocks and the sequence's positions: the whole
        sequence (`causal` False: the paper FLOP convention, Narayanan et al. 2021 eq. 3), half of it
        under a causal mask (what FlashAttention computes, Dao 2023 section 3.1.1), and for a
        sliding-window block min(position + 1, w): s w - w^2 / 2 keys over the sequence (w <= s),
        a window's worth under the paper convention."""
        s, w = float(seq_len), float(self.sliding_window)
        full = s / 2 if causal else s
        windowed = (w - w * w / (2 * s) if causal else w) if 0 < w < s else full
        n = min(self.sliding_window_layers, self.layers) if w else 0
        return ((self.layers - n) * full + n * windowed) / self.layers

    @property
    def attention_out_width(self) -> int:
        """Width of A V, the output projection's input: a d (MLA: a d_v)."""
        return self.heads * (self.v_head_dim or self.dim_per_head)

    def routed_before(self, i):
        """Blocks with the routed experts among the first `i` (an array or a number): those j < i past
        the dense-first ones with (j + 1) % moe_layer_step == 0."""
        step, k = self.moe_layer_step, self.dense_layers
        return np.asarray(i) // step - np.minimum(i, k) // step

    def is_routed(self, i: int) -> bool:
        """Whether block i has the routed experts (the other blocks are `dense_block`)."""
        return bool(self.routed_before(i + 1) - self.routed_before(i)) if self.experts > 1 else False

    @property
    def moe_layers(self) -> int:
        """Blocks with the routed experts (all of them for a dense model's one kind)."""
        return int(self.routed_before(self.layers)) if self.experts > 1 else self.layers

    @cached_property
    def dense_block(self) -> "ModelSpec":
        """The dense blocks of a model that mixes them with routed ones (dense-first, or every
        moe_layer_step-th routed) as a model of their own, every per-block formula applying to it;
        the model itself when all blocks are alike."""
        if self.moe_layers == self.layers:
            return self
        return replace(self, layers=self.layers - self.moe_layers, ffn=self.dense_ffn, experts=1, experts_per_token=1,
                       shared_expert_ffn=0, dense_layers=0, dense_ffn=0, moe_layer_step=1, mtp_layers=0)

    @property
    def mtp_block(self) -> "ModelSpec":
        """The block kind of each multi-token-prediction depth: the last block's (megatron-core 0.16.1
        models/gpt/gpt_layer_specs.py get_gpt_mtp_block_spec_for_backend: spec.layer_specs[-1])."""
        return self if self.moe_layers == self.layers or self.is_routed(self.layers - 1) else self.dense_block

    @property
    def mtp_extra_params(self) -> int:
        """Parameters of one MTP depth besides its block: eh_proj (2h -> h, no bias) and the enorm,
        hnorm and final_layernorm (multi_token_prediction.py MultiTokenPredictionLayer.__init__; the
        same 2h^2 + 3h that Megatron-LM training.py num_floating_point_operations counts per depth)."""
        norm = self.hidden * (2 if self.norm == "layernorm" else 1)  # LayerNorm: weight and bias
        return 2 * self.hidden * self.hidden + 3 * norm

    @property
    def q_width(self) -> int:
        """Width of the query projection output a*d."""
        return self.heads * self.dim_per_head

    @property
    def kv_width(self) -> int:
        """Width of each of the key and value projection outputs g*d."""
        return self.kv_heads * self.dim_per_head

    @property
    def mlp_width_per_token(self) -> int:
        """Intermediate width each token's MLP work spans: its top-k routed experts and the shared
        one (what the MLP's saved activations and elementwise kernels scale with), dropless."""
        return self.mlp_width(self.experts_per_token)

    def mlp_width(self, routed):
        """That width when each token costs `routed` rows of the routed experts (k dropless; with an
        expert capacity, planner/moe.py routed_per_token) and passes the shared expert once."""
        return routed * self.ffn + self.shared_expert_ffn

    # ---- the tensor list -----------------------------------------------------------------
    def tensors(self) -> list[Tensor]:
        """Every parameter tensor in Hugging Face registration order, blocks expanded (names with
        their layer index). The tied output layer is listed, marked `tied`. No MTP depth: transformers
        builds none (params counts them)."""
        out = [t for t in self._tensors if t.place == FIRST]
        for i in range(self.layers):
            block = self.block_tensors() if self.moe_layers == self.layers or self.is_routed(i) else \
                self.dense_block.block_tensors()
            out += [replace(t, name=t.name.format(i=i)) for t in block]
        return out + [t for t in self._tensors if t.place == LAST]

    @cached_property
    def _tensors(self) -> tuple[Tensor, ...]:
        """First-stage tensors, one block (names with '{i}') and last-stage tensors, in order."""
        return tuple(LAYOUTS[self.architecture](self))

    def tensors_at(self, place: str) -> tuple[Tensor, ...]:
        """The first stage's own tensors (FIRST), one block's (BLOCK) or the last stage's (LAST)."""
        return tuple(t for t in self._tensors if t.place == place)

    def block_tensors(self) -> tuple[Tensor, ...]:
        """One routed-expert block (a dense model's only kind; `dense_block` has the other)."""
        return self.tensors_at(BLOCK)

    # ---- counts derived from the list ----------------------------------------------------
    @cached_property
    def sums(self) -> "ParamSums":
        """Element sums of the list by place and TP/EP treatment (what vectorized formulas read)."""
        return ParamSums.of(self._tensors)

    @property
    def layer_params(self) -> int:
        """Parameters of one transformer block, all experts included."""
        return sum(t.numel for t in self.block_tensors())

    @property
    def embedding_params(self) -> int:
        """Input token embedding V*h (vocab-parallel under TP)."""
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        """Exact total parameter count (tied matrices counted once; the MTP depths included)."""
        s = self.sums
        dense = (self.layers - self.moe_layers) * self.dense_block.sums.block_total
        mtp = self.mtp_layers * (self.mtp_block.sums.block_total + self.mtp_extra_params)
        return self.moe_layers * s.block_total + dense + s.first_total + s.last_total + mtp

    @property
    def active_params(self) -> int:
        """Parameters touched per token (MoE: only the top-k experts' tensors)."""
        expert = sum(t.numel for t in self.block_tensors() if t.expert)
        routed = self.moe_layers + self.mtp_layers * (self.experts > 1 and self.mtp_block is self)
        return self.params - routed * expert * (self.experts - self.experts_per_token) // self.experts

    @property
    def largest_layer_params(self) -> int:
        """Parameters of the largest module (its own tensors): DeepSpeed's `largest_layer_params`
        (stage3.py estimate_zero3_model_states_mem_needs_all_live: max over model.modules() of
        sum(p.numel() for p in m.parameters(recurse=False)))."""
        return max(_largest_module(self._tensors), _largest_module(self.dense_block.block_tensors()))

    @property
    def largest_block_module_params(self) -> int:
        """Parameters of the largest module inside a transformer block (what ZeRO-3 fetches per
        submodule there; the embedding and the output layer left out)."""
        return max(_largest_module(self.block_tensors()), _largest_module(self.dense_block.block_tensors()))

    def gemms(self, fused: bool, fused_qkv: bool = False) -> list[Gemm]:
        """A block's forward GEMMs as the engine runs them: one per weight matrix (Hugging Face
        modules), or the tensors of one group fused into one GEMM (Megatron-core attention.py
        linear_qkv, mlp.py linear_fc1 for gated units); `fused_qkv` fuses the qkv group alone."""
        groups: dict[str, Gemm] = {}
        for t in self.block_tensors():
            if t.gemm is None:
                continue
            elements = t.numel // (self.experts if t.expert else 1)
            key = t.gemm if fused or (fused_qkv and t.gemm == "qkv") else t.name
            if key in groups:
                g = groups[key]
                groups[key] = replace(g, flops_per_token=g.flops_per_token + 2.0 * elements)
            else:
                groups[key] = Gemm(t.gemm, 2.0 * elements, t.tp_dim is not None, t.expert)
        return list(groups.values())

    def flat_local_sizes(self, tp: int, pp: int, stage: int, ep: int = 1) -> np.ndarray:
        """Elements of one rank's tensors in registration order: the flat buffer DeepSpeed ZeRO-1/2
        partitions (stage_1_and_2.py flattens each param group in model order)."""
        from planner.pipeline import first_layer_on_stage

        n = self.layers // pp + (stage < self.layers % pp)
        return self.flat_sizes(tp, n, stage == 0, stage == pp - 1, ep, start=int(first_layer_on_stage(self.layers, pp, stage)))

    def flat_sizes(self, tp: int, n_layers: int, first: bool, last: bool, ep: int = 1, expert_tp: int | None = None,
                   start: int = 0) -> np.ndarray:
        """flat_local_sizes of a stage given by its block count, its first block's index `start`
        (which of its blocks are dense: is_routed) and whether it is the first and/or the last (a
        tied output layer is a second copy on a last stage that is not also the first); routed
        experts split over `expert_tp` TP ranks (default: tp)."""
        def local(tensors, place):
            return np.array([local_numel(t, expert_tp if t.expert and expert_tp is not None else tp, self.experts, ep)
                             for t in tensors if t.place == place and (not t.tied or not first)], dtype=np.float64)

        routed, dense = local(self._tensors, BLOCK), local(self.dense_block._tensors, BLOCK)
        if self.moe_layers == self.layers:
            blocks = [np.tile(routed, n_layers)]
        else:
            blocks = [routed if self.is_routed(i) else dense for i in range(start, start + n_layers)]
        edges = (local(self._tensors, FIRST) if first else np.zeros(0), local(self._tensors, LAST) if last else np.zeros(0))
        return np.ceil(np.concatenate([edges[0], *blocks, edges[1]]))

    def shape_dict(self) -> dict:
        d = asdict(self)
        d["params"] = self.params
        return d


def _largest_module(tensors) -> int:
    per_module: dict[str, int] = {}
    for t in tensors:
        if not t.tied:
            per_module[t.module] = per_module.get(t.module, 0) + t.numel
    return max(per_module.values())


# ---------------------------------------------------------------------------------------------
# catalog


def load_catalog() -> dict[str, ModelSpec]:
    """Models in data/models.json, keyed by lower-case name."""
    from planner.data import catalog

    out = {}
    for entry in catalog("models.json")["models"]:
        entry = {k: v for k, v in entry.items() if k not in ("published_params", "published_source", "aliases")}
        spec = ModelSpec(**entry)
        out[spec.name.lower()] = spec
    return out


def published_params() -> dict[str, int]:
    """Published exact parameter counts from data/models.json (where the source gives one)."""
    from planner.data import catalog

    return {e["name"].lower(): e["published_params"] for e in catalog("models.json")["models"]
            if e.get("published_params")}


def lookup(name: str) -> ModelSpec:
    """Catalog model by case-insensitive name; unknown names suggest close matches."""
    import difflib

    models = load_catalog()
    key = str(name).lower()
    if key in models:
        return models[key]
    # aliases of one model match alike: name each model once
    close = list(dict.fromkeys(models[c].name for c in difflib.get_close_matches(key, list(models), n=6, cutoff=0.4)))[:3]
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise InputError(
        f"--model: unknown model {name!r}{hint}; known: {', '.join(sorted(s.name for s in models.values()))}, "
        "or a path to a Hugging Face config.json"
    )


def with_overrides(spec: ModelSpec, **overrides) -> ModelSpec:
    """Replace shape fields (None values ignored), re-validating."""
    clean = {k: v for k, v in overrides.items() if v is not None}
    if not clean:
        return spec
    if "heads" in clean and "kv_heads" not in clean and spec.kv_heads == spec.heads:
        clean["kv_heads"] = clean["heads"]
    return replace(spec, name=f"{spec.name}+overrides", **clean)
