"""The execution: how a job is split (TP/PP/DP/CP/EP, ZeRO, offload, micro-batching, recompute)
and the settings every candidate layout shares.

`Layouts` holds many candidate layouts as parallel numpy arrays (a single layout is an array of
one); every formula in memory.py and timing.py takes a `Layouts`, so the search evaluates all
candidates in one vectorized pass. `Training` holds the settings shared by all candidates.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np

from planner.bounds import check
from planner.engines import ENGINES, Engine, Modules, MoeCapacity, lookup as engine_lookup
from planner.engines.deepspeed.zero_config import ZeroConfig  # the Training field's type; re-exported
from planner.errors import InputError
from planner.modules import FSDP_MIXED_PRECISION, check as modules_check, choices as modules_choices, parse as modules_parse, word_of as modules_word
from planner.options import Fp8Recipe, Offload, Optimizer, Precision, RankOrder, Recompute, RecomputeMethod, Schedule

# megatron-core 0.16.1 transformer_config.py recompute_modules choices the planner models, in Megatron's
# order (moe_act needs moe_grouped_gemm: TransformerConfig.__post_init__ raises without it)
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)



def among(values, choices) -> np.ndarray:
    """Elementwise: is each of `values` one of `choices` (np.isin without its sort, which costs
    30 us a call on the search's few option codes)."""
    values = np.asarray(values)
    out = np.zeros(values.shape, dtype=bool)
    for choice in choices:
        out |= values == choice
    return out


@dataclass(frozen=True)
class Training:
    """Settings shared by every candidate layout of one question."""

    seq_len: int = 4096
    """Tokens per sequence s."""
    gbs: int = 0
    """Global batch in sequences (0: mbs * dp, one micro-batch per step)."""
    precision: Precision = Precision.BF16
    """Weights, gradients and activations dtype (planner/options.py Precision)."""
    optimizer: Optimizer = Optimizer.ADAMW
    """Optimizer whose states are kept (planner/options.py Optimizer)."""
    flash_attention: bool = True
    """FlashAttention (no s^2 score tensors kept)."""
    engine: Engine = "deepspeed"
    """The training engine's record (a --engine word is looked up on creation)."""
    zero_config: ZeroConfig = field(default_factory=ZeroConfig)
    """DeepSpeed buffer sizes."""
    tp_comm_overlap: bool = False
    """Megatron --tp-comm-overlap: sequence-parallel TP collectives pipelined with their GEMMs
    (where a layout has sequence parallelism)."""
    pipeline_edge_layers: int | None = None
    """Blocks' worth the first and last pipeline stages give up for the embedding and the loss
    (None: the engine's default, Engine.pipeline_edge_layers; 1 under Megatron plans
    --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split, which lets 126
    blocks interleave over 16 stages as (126 + 2)/(16 v))."""
    overlap_p2p: bool = True
    """Pipeline sends run beside the next chunk's compute where the engine does so under the
    interleaved schedule (Engine.p2p_overlaps_interleaved); False: Megatron-LM with
    --no-overlap-p2p-communication, as its releases before 2023 ran (batch_isend_irecv waited at once)."""
    moe_capacity_factor: float | None = None
    """Expert capacity factor C of an MoE (None: the engine's default, planner/moe.py
    capacity_settings: DeepSpeed-MoE 1.0 under megatron-deepspeed, dropless elsewhere)."""
    moe_pad_to_capacity: bool = False
    """Megatron --moe-pad-expert-input-to-capacity: every expert runs exactly its capacity."""
    moe_grouped_gemm: bool | None = None
    """The local experts' GEMMs run as one grouped GEMM each (Megatron --moe-grouped-gemm; None: the
    engine's, Engine.grouped_experts)."""
    optimizer_offload_fraction: float = 1.0
    """Share of the optimizer partition a layout with --offload-optimizer cpu keeps on the host, where
    the engine offloads part of it (Engine.offload_hybrid_optimizer: megatron-core's
    --optimizer-offload-fraction, HybridDeviceOptimizer offloading parameters in order until that
    share); the rest steps on the GPU beside it. Others offload all of it (1.0)."""
    compile: bool = False
    """torch.compile on each Hugging Face block (Inductor's default mode): fused elementwise kernels,
    fewer launches and what AOT Autograd's partitioner saves (measured: data/references/
    hf_compiled_cpu.json); the engines with their own fused kernels or blocks take none."""
    grad_reduce_in_bf16: bool = False
    """Megatron --grad-reduce-in-bf16: gradients kept and reduced in bf16, not fp32 main grads
    (Engine.grad_reduce_bf16_choice; default off, Megatron-LM's bf16 default)."""
    recompute_modules: tuple = ("core_attn",)
    """What `--recompute selective` recomputes under Megatron (--recompute-modules; megatron-core
    0.16.1 transformer_config.py recompute_modules, default ['core_attn']): RECOMPUTE_MODULES, in that
    order (Engine.recompute_modules_choice; the other engines' selective policy is their own)."""
    fsdp_mixed_precision: str = "default"
    """Composer's FSDP mixed_precision under llm-foundry's modules (planner/modules.py
    FSDP_MIXED_PRECISION): 'default' fp32 parameters under autocast, 'pure' 16-bit ones."""
    loss_chunks: int | None = None
    """Sequence chunks the loss is computed over, each chunk's logits freed before the next (None:
    the engine's default, Engine.loss_chunks; 1 under torchtitan 0.2.2 and earlier, whose
    components/loss.py cross_entropy_loss takes the whole micro-batch's logits upcast to fp32; the
    chunked loss came after, in commit 786e26f8e)."""
    modules: Modules | None = None
    """Whose transformer block the job trains (--modules; planner/modules.py): None, the engine's
    users' own (modules.block_modules resolves it per model); an engine drives only those it can
    (modules.choices)."""
    fp8_recipe: Fp8Recipe | None = None
    """The block GEMMs' FP8 recipe (--fp8-recipe; --precision fp8 takes the engine's default,
    Engine.fp8_recipes[0]); weights, gradients and everything else stay in `precision` (bf16). None:
    16-bit GEMMs."""
    fp8_param_gather: bool | None = None
    """FP8 parameters, all-gathered as such by the distributed optimizer (Megatron --fp8-param-gather;
    planner/fp8.py param_gather). None: the engine's users' choice (Engine.fp8_param_gather) under
    an FP8 recipe."""
    expandable_segments: bool | None = None
    """PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the launch (--expandable-segments): the
    allocator's reserve is memory.allocator_fragmentation_expandable. None: the engine's launcher's
    choice (Engine.expandable_segments)."""

    def __post_init__(self):
        check("seq_len", self.seq_len)
        if self.gbs != 0:
            check("gbs", self.gbs)
        fp8 = str(self.precision).strip().lower() == "fp8"
        if not fp8 and str(self.precision).strip().lower() not in Precision.words():
            raise InputError(f"--precision: must be one of {', '.join(Precision.words())}, fp8 (recommend also takes "
                             f"auto: the faster of bf16 and fp8), got {self.precision!r}")
        object.__setattr__(self, "precision", Precision.BF16 if fp8 else Precision.parse(self.precision, "--precision"))
        object.__setattr__(self, "optimizer", Optimizer.parse(self.optimizer, "--optimizer"))
        object.__setattr__(self, "engine", engine_lookup(self.engine))
        self._check_fp8(fp8)
        if not isinstance(self.flash_attention, bool):
            raise InputError(f"--no-flash-attention: must be true or false, got {self.flash_attention!r}")
        if not isinstance(self.overlap_p2p, bool):
            raise InputError(f"overlap_p2p: must be true or false, got {self.overlap_p2p!r}")
        self._check_edge_layers()
        self._check_loss_chunks()
        self._check_recompute_modules()
        if self.expandable_segments is None:
            object.__setattr__(self, "expandable_segments", self.engine.expandable_segments)
        elif not isinstance(self.expandable_segments, bool):
            raise InputError(f"--expandable-segments: must be true or false, got {self.expandable_segments!r}")
        if not isinstance(self.grad_reduce_in_bf16, bool):
            raise InputError(f"--grad-reduce-in-bf16: must be true or false, got {self.grad_reduce_in_bf16!r}")
        if self.grad_reduce_in_bf16 and not self.engine.grad_reduce_bf16_choice:
            raise InputError(f"--grad-reduce-in-bf16: --engine {self.engine.name} has no such choice (--engine megatron)")
        if self.fsdp_mixed_precision not in FSDP_MIXED_PRECISION:
            raise InputError(f"--fsdp-mixed-precision: must be one of {', '.join(FSDP_MIXED_PRECISION)}, "
                             f"got {self.fsdp_mixed_precision!r}")
        object.__setattr__(self, "modules", modules_parse(self.modules))
        modules_check(self.modules, self.engine)
        if not isinstance(self.compile, bool):
            raise InputError(f"--compile: must be true or false, got {self.compile!r}")
        if self.compile and self.engine.modules is not Modules.HUGGING_FACE:
            raise InputError(f"--compile: measured for Hugging Face blocks (--engine deepspeed or fsdp); --engine "
                             f"{self.engine.name} runs its own blocks")
        if self.tp_comm_overlap and not self.engine.tp_comm_overlap:
            raise InputError(f"--tp-comm-overlap: --engine {self.engine.name} has no TP communication overlap "
                             "(Megatron-LM with TransformerEngine has: --engine megatron)")
        self._check_moe_capacity()
        fraction = check("optimizer_offload_fraction", self.optimizer_offload_fraction)
        object.__setattr__(self, "optimizer_offload_fraction", float(fraction))
        if fraction != 1 and not self.engine.offload_hybrid_optimizer:
            raise InputError(f"--optimizer-offload-fraction: --engine {self.engine.name} offloads the whole optimizer "
                             "(1.0); --engine megatron offloads part of it")

    def _check_edge_layers(self) -> None:
        edge = self.pipeline_edge_layers
        if edge is None:
            object.__setattr__(self, "pipeline_edge_layers", self.engine.pipeline_edge_layers)
        elif isinstance(edge, bool) or edge not in (0, 1):
            raise InputError(f"--pp-edge-layers: must be 0 or 1, got {edge!r}")
        elif edge != self.engine.pipeline_edge_layers and not self.engine.pipeline_edge_choice:
            raise InputError(f"--pp-edge-layers: --engine {self.engine.name} splits blocks evenly over its stages "
                             "(--engine megatron or torchtitan take 0 or 1)")

    def _check_fp8(self, asked: bool) -> None:
        """--precision fp8 / --fp8-recipe: a recipe the engine runs, over bf16 mixed precision."""
        recipe = self.fp8_recipe
        if recipe is None and not asked:
            if self.fp8_param_gather:
                raise InputError("--fp8-param-gather: needs FP8 GEMMs (--precision fp8)")
            object.__setattr__(self, "fp8_param_gather", False)
            return
        flag = "--fp8-recipe" if recipe is not None else "--precision"
        if not self.engine.fp8_recipes:
            names = [n for n, e in ENGINES.items() if e.fp8_recipes]
            have = ", ".join(names[:-1]) + " or " + names[-1]
            raise InputError(f"{flag}: --engine {self.engine.name} has no FP8 training path; --engine {have} has one")
        if self.precision is not Precision.BF16:
            raise InputError(f"--fp8-recipe: FP8 GEMMs run under bf16 mixed precision (--precision fp8), "
                             f"not --precision {self.precision}")
        recipe = self.engine.fp8_recipes[0] if recipe is None else Fp8Recipe.parse(recipe, "--fp8-recipe")
        if recipe not in self.engine.fp8_recipes:
            raise InputError(f"--fp8-recipe: --engine {self.engine.name} runs "
                             f"{', '.join(map(str, self.engine.fp8_recipes))}, got {recipe}")
        object.__setattr__(self, "fp8_recipe", recipe)
        gather = self.fp8_param_gather
        if gather is None:
            object.__setattr__(self, "fp8_param_gather", self.engine.fp8_param_gather)
        elif not isinstance(gather, bool):
            raise InputError(f"--fp8-param-gather: must be true or false, got {gather!r}")
        elif gather and not self.engine.fp8_param_gather and not (
                self.engine.fp8_library == "torchao" and recipe is Fp8Recipe.TENSORWISE):
            raise InputError(f"--fp8-param-gather: Megatron's (--engine megatron), or torchtitan's with "
                             f"--fp8-recipe tensorwise; --engine {self.engine.name} with {recipe} gathers 16-bit "
                             "parameters")

    @property
    def gemm_dtype(self) -> str:
        """The GPU catalog's peak key of the block GEMMs: fp8 under an FP8 recipe."""
        return "fp8" if self.fp8_recipe is not None else self.precision.gemm_dtype

    def _check_recompute_modules(self) -> None:
        words = self.recompute_modules
        if isinstance(words, str):
            words = [w for w in words.replace(",", " ").split() if w]
        if not isinstance(words, (list, tuple)) or not words or any(w not in RECOMPUTE_MODULES for w in words):
            raise InputError(f"--recompute-modules: a comma-separated list of {', '.join(RECOMPUTE_MODULES)}, "
                             f"got {self.recompute_modules!r}")
        chosen = tuple(w for w in RECOMPUTE_MODULES if w in words)
        object.__setattr__(self, "recompute_modules", chosen)
        if chosen != DEFAULT_RECOMPUTE_MODULES and not self.engine.recompute_modules_choice:
            raise InputError(f"--recompute-modules: --engine {self.engine.name} recomputes its own selection under "
                             "--recompute selective; --engine megatron takes a list")

    def _check_loss_chunks(self) -> None:
        chunks = self.loss_chunks
        if chunks is None:
            object.__setattr__(self, "loss_chunks", self.engine.loss_chunks)
        elif isinstance(chunks, bool) or not isinstance(chunks, int) or not 1 <= chunks <= 1024:
            raise InputError(f"--loss-chunks: must be an integer from 1 to 1024, got {chunks!r}")
        elif chunks != self.engine.loss_chunks and self.engine.loss_chunks == 1:
            raise InputError(f"--loss-chunks: --engine {self.engine.name} computes the loss over the whole "
                             "micro-batch (1); --engine torchtitan chunks it (ChunkedLossWrapper num_chunks)")

    def _check_moe_capacity(self) -> None:
        """--moe-capacity-factor where the engine's MoE layer has a capacity; --moe-pad-to-capacity
        where padding is optional (megatron-core 0.16.1 transformer_config.py __post_init__: it needs
        moe_expert_capacity_factor)."""
        kind = self.engine.moe_capacity
        if self.moe_capacity_factor is not None:
            object.__setattr__(self, "moe_capacity_factor", check("moe_capacity_factor", self.moe_capacity_factor))
            if kind is MoeCapacity.DROPLESS:
                raise InputError(f"--moe-capacity-factor: --engine {self.engine.name} runs dropless MoE blocks "
                                 "(no expert capacity); --engine megatron or megatron-deepspeed take one")
        if not isinstance(self.moe_pad_to_capacity, bool):
            raise InputError(f"--moe-pad-to-capacity: must be true or false, got {self.moe_pad_to_capacity!r}")
        if self.moe_pad_to_capacity and kind is not MoeCapacity.MEGATRON:
            raise InputError(f"--moe-pad-to-capacity: --engine {self.engine.name} has no such choice (DeepSpeed-MoE "
                             "always pads, Hugging Face and torchtitan MoE are dropless); --engine megatron takes it")
        grouped = self.moe_grouped_gemm
        if grouped is None:
            object.__setattr__(self, "moe_grouped_gemm", self.engine.grouped_experts)
        elif not isinstance(grouped, bool):
            raise InputError(f"--moe-grouped-gemm: must be true or false, got {grouped!r}")
        elif grouped != self.engine.grouped_experts and not self.engine.grouped_experts_choice:
            raise InputError(f"--moe-grouped-gemm: --engine {self.engine.name} runs its experts "
                             f"{'grouped' if self.engine.grouped_experts else 'one GEMM each'}; --engine megatron "
                             "takes the choice")
        if self.moe_pad_to_capacity and self.moe_capacity_factor is None:
            raise InputError("--moe-pad-to-capacity: needs --moe-capacity-factor C (Megatron pads to that capacity)")

    def for_engine(self, engine) -> "Training":
        """These settings under another engine, less what that engine does not take (--tp-comm-overlap,
        --compile, --moe-capacity-factor, --moe-pad-to-capacity, --optimizer-offload-fraction): the search's
        comparisons across engines."""
        other = engine_lookup(engine)
        return replace(self, engine=other, tp_comm_overlap=self.tp_comm_overlap and other.tp_comm_overlap,
                       modules=self.modules if self.modules in modules_choices(other) else None,
                       grad_reduce_in_bf16=self.grad_reduce_in_bf16 and other.grad_reduce_bf16_choice,
                       recompute_modules=self.recompute_modules if other.recompute_modules_choice
                       else DEFAULT_RECOMPUTE_MODULES,
                       compile=self.compile and other.modules is Modules.HUGGING_FACE,
                       pipeline_edge_layers=self.pipeline_edge_layers if other.pipeline_edge_choice
                       and self.pipeline_edge_layers != self.engine.pipeline_edge_layers else None,
                       loss_chunks=self.loss_chunks if other.loss_chunks > 1 and self.engine.loss_chunks > 1 else None,
                       fp8_recipe=None if self.fp8_recipe is None or not other.fp8_recipes else
                       self.fp8_recipe if self.fp8_recipe in other.fp8_recipes else other.fp8_recipes[0],
                       fp8_param_gather=None,
                       # a choice apart from the engine's launcher's default is the user's, kept
                       expandable_segments=None if self.expandable_segments == self.engine.expandable_segments
                       else self.expandable_segments,
                       moe_capacity_factor=None if other.moe_capacity is MoeCapacity.DROPLESS else self.moe_capacity_factor,
                       moe_pad_to_capacity=self.moe_pad_to_capacity and other.moe_capacity is MoeCapacity.MEGATRON,
                       moe_grouped_gemm=self.moe_grouped_gemm if other.grouped_experts_choice
                       and self.moe_grouped_gemm != self.engine.grouped_experts else None,
                       optimizer_offload_fraction=self.optimizer_offload_fraction if other.offload_hybrid_optimizer else 1.0)

    def overlaps_grad_reduce(self, zero) -> np.ndarray:
        """Whether the gradient reduction overlaps backward, per ZeRO stage: the user's
        --overlap-comm where the engine takes it (DeepSpeed overlap_comm), else the engine's default
        (DeepSpeed zero/config.py overlap_comm_valid: None resolves to stage == 3)."""
        flag = self.zero_config.overlap_comm if self.engine.overlap_flag else None
        zero = np.asarray(zero)
        default = among(zero, self.engine.overlap_default)
        if flag is None:
            return default
        # DeepSpeed 0.19.8 engine.py _configure_zero_optimizer: only the ZeRO optimizers read
        # overlap_comm; stage 0 reduces at the boundary whatever it says
        return np.where(zero >= 1, flag, default) if self.engine.deepspeed else np.full(zero.shape, flag)

    def as_dict(self) -> dict:
        """The JSON `training` object (engine by name)."""
        from dataclasses import asdict

        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["precision"], out["optimizer"] = "fp8" if self.fp8_recipe else str(self.precision), str(self.optimizer)
        out["fp8_recipe"] = None if self.fp8_recipe is None else str(self.fp8_recipe)
        out["engine"] = self.engine.name
        out["modules"] = None if self.modules is None else modules_word(self.modules)
        out["zero_config"] = asdict(self.zero_config)
        if self.engine.recompute_modules_choice:  # what --recompute selective means; the others' is their own
            out["recompute_modules"] = list(self.recompute_modules)
        else:
            del out["recompute_modules"]
        if not self.engine.grouped_experts_choice:  # the others' experts run as their code runs them
            del out["moe_grouped_gemm"]
        return out


# field name -> order is the JSON order
FIELDS = ("tp", "pp", "dp", "cp", "ep", "vpp", "zero", "offload_optimizer", "offload_params",
          "mbs", "gas", "recompute", "recompute_layers", "recompute_method", "sequence_parallel", "schedule", "etp",
          "rank_order")


def _take_flat(values: np.ndarray, index: np.ndarray) -> np.ndarray:
    """values[index] for a flat field; a field broadcast from one value (stride 0: a setting every
    candidate shares) stays a broadcast view instead of a copy per candidate."""
    if values.strides == (0,) and values.size:
        return np.broadcast_to(values[:1], index.shape)
    return values.take(index)


@dataclass
class Layouts:
    """Candidate layouts as parallel int64 arrays of one shape. Categoricals hold the codes of
    planner/options.py (Offload, Recompute, Schedule, RankOrder)."""

    tp: np.ndarray
    """Tensor-parallel degree t (inside a node)."""
    pp: np.ndarray
    """Pipeline stages p."""
    dp: np.ndarray
    """Data-parallel degree d (ZeRO shards over d*cp)."""
    cp: np.ndarray
    """Context-parallel degree (sequence split for attention)."""
    ep: np.ndarray
    """Expert-parallel degree (taken from the data-parallel ranks)."""
    vpp: np.ndarray
    """Virtual stages per pipeline rank (interleaved schedule when > 1)."""
    zero: np.ndarray
    """ZeRO stage 0-3 (Megatron distributed optimizer = 1, FSDP full shard = 3)."""
    offload_optimizer: np.ndarray
    """Offload code: optimizer states (and fp32 grads) to CPU or NVMe."""
    offload_params: np.ndarray
    """Offload code: ZeRO-3 parameter partitions to CPU or NVMe."""
    mbs: np.ndarray
    """Micro-batch size b in sequences."""
    gas: np.ndarray
    """Micro-batches per step per data-parallel rank m (gradient accumulation steps)."""
    recompute: np.ndarray
    """Recompute code."""
    sequence_parallel: np.ndarray
    """1 when Megatron sequence parallelism splits the non-TP regions over t."""
    schedule: np.ndarray
    """Schedule code."""
    recompute_layers: np.ndarray = 0
    """Under full recompute, the layers of each model chunk (a pipeline stage, or each of its vpp
    virtual stages) recomputed, the first ones of the chunk; the others keep every activation
    (Megatron --recompute-method block --recompute-num-layers). 0: every layer."""
    recompute_method: np.ndarray = 0
    """RecomputeMethod code for recompute_layers N > 0: block (the first N layers, as above) or
    uniform (every layer, checkpointed in groups of N: one kept input per group, N layers
    rematerialized at once in backward)."""
    etp: np.ndarray = 0
    """Expert tensor parallelism: TP ranks a routed expert's matrices split over (megatron-core
    --expert-tensor-parallel-size); 0: the engine's default (planner/sharding.py expert_tp)."""
    rank_order: np.ndarray = 0
    """RankOrder code: data-parallel ranks inside the pipeline stages (Megatron's default) or the
    stages inside the data-parallel ranks (--use-tp-pp-dp-mapping). Moves no byte; decides which
    groups share a node or a pod."""

    def __post_init__(self):
        arrays = np.broadcast_arrays(*(np.asarray(getattr(self, k), dtype=np.int64) for k in FIELDS))
        for k, a in zip(FIELDS, arrays):
            # a field given as one value stays a read-only broadcast view (no copy of millions of rows)
            setattr(self, k, a if a.ndim and not any(a.strides) else np.ascontiguousarray(a))

    @property
    def size(self) -> int:
        return int(self.tp.size)

    @property
    def shape(self) -> tuple:
        return self.tp.shape

    @property
    def gbs(self) -> np.ndarray:
        """Global batch in sequences: mbs * gas * dp."""
        return self.mbs * self.gas * self.dp

    @property
    def world(self) -> np.ndarray:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def dp_stride(self) -> np.ndarray:
        """Ranks between neighbours of the data-parallel group (megatron-core parallel_state.py
        RankGenerator: tp, or tp x cp x pp with the pipeline inner; with cp > 1 the dp x cp group's
        members per node are then node / (tp pp), as a stride of tp x pp gives)."""
        return np.where(self.rank_order == RankOrder.PP_INNER, self.tp * self.pp, self.tp)

    @property
    def pp_stride(self) -> np.ndarray:
        """Ranks between consecutive pipeline stages: tp x cp x dp (the default order), tp x cp with
        the pipeline inner."""
        return np.where(self.rank_order == RankOrder.PP_INNER, self.tp * self.cp, self.world // np.maximum(self.pp, 1))

    @property
    def zero_ranks(self) -> np.ndarray:
        """Ranks ZeRO shards and gradients reduce over: dp x cp (Megatron-core dp_cp group,
        DeepSpeed's data-parallel group with sequence parallelism)."""
        return self.dp * self.cp

    def memo(self, name: str, args: tuple, compute):
        """compute() once per `args` (matched by identity; an array by its values, as the terms
        build the same stage array apart) for these candidates: a term that many others read
        (sharding.rank_params: 900 calls in one recommend, 60 distinct)."""
        entries = self.__dict__.setdefault("_memo", {}).setdefault(name, {})
        # the entry holds the args, so their ids stay theirs
        key = tuple((a.dtype.str, a.shape, a.tobytes()) if isinstance(a, np.ndarray) else id(a) for a in args)
        if key not in entries:
            entries[key] = (args, compute())
        return entries[key][1]

    def take(self, index) -> "Layouts":
        """The candidates at `index` (mask or integer array)."""
        index = np.asarray(index)
        if index.dtype == bool and index.ndim == 1 and self.tp.ndim == 1:
            # integer take is several times faster than boolean indexing, once per field
            index = np.flatnonzero(index)
            return Layouts(**{k: _take_flat(getattr(self, k), index) for k in FIELDS})
        return Layouts(**{k: getattr(self, k)[index] for k in FIELDS})

    def concat(self, other: "Layouts") -> "Layouts":
        """These candidates followed by `other`'s (both flat)."""
        return Layouts(**{k: np.concatenate([getattr(self, k).ravel(), getattr(other, k).ravel()]) for k in FIELDS})

    def row(self, i: int) -> dict:
        """One candidate as the JSON `layout` object (categoricals as words)."""
        out = {k: int(getattr(self, k).flat[i]) for k in FIELDS}
        out["recompute"] = Recompute(out["recompute"]).word
        out["recompute_layers"] = out["recompute_layers"] or None  # None: every layer
        out["recompute_method"] = RecomputeMethod(out["recompute_method"]).word if out["recompute_layers"] else None
        out["offload_optimizer"] = Offload(out["offload_optimizer"]).word
        out["offload_params"] = Offload(out["offload_params"]).word
        out["schedule"] = Schedule(out["schedule"]).word
        out["sequence_parallel"] = bool(out["sequence_parallel"])
        out["gbs"] = out["mbs"] * out["gas"] * out["dp"]
        out["etp"] = out["etp"] or None  # None: the engine's default
        out["rank_order"] = RankOrder(out["rank_order"]).word
        return out


def single(tp=1, pp=1, dp=1, cp=1, ep=1, vpp=1, zero=0, offload_optimizer="none", offload_params="none",
           mbs=1, gas=1, recompute="none", recompute_layers=None, recompute_method="block", sequence_parallel=False,
           schedule=None, etp=None, rank_order="tp-cp-dp-pp") -> Layouts:
    """One layout, from words, as a Layouts of size 1 (every number checked against its bound)."""
    numbers = dict(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, mbs=mbs, gas=gas)
    numbers = {k: check(k, v) for k, v in numbers.items()}
    if zero not in (0, 1, 2, 3) or isinstance(zero, bool):
        raise InputError(f"--zero: must be one of 0, 1, 2, 3, got {zero!r}")
    if schedule is None:
        schedule = Schedule.INTERLEAVED if numbers["vpp"] > 1 else Schedule.ONE_F_ONE_B
    return Layouts(
        **{k: [v] for k, v in numbers.items()}, zero=[zero],
        offload_optimizer=[Offload.parse(offload_optimizer, "--offload-optimizer")],
        offload_params=[Offload.parse(offload_params, "--offload-params")],
        recompute=[Recompute.parse(recompute, "--recompute")],
        recompute_layers=[0 if recompute_layers is None else check("recompute_layers", recompute_layers)],
        recompute_method=[RecomputeMethod.parse(recompute_method, "--recompute-method")],
        sequence_parallel=[int(bool(sequence_parallel))], schedule=[Schedule.parse(schedule, "--schedule")],
        etp=[0 if etp is None else check("etp", etp)], rank_order=[RankOrder.parse(rank_order, "--rank-order")],
    )
