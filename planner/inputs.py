"""The planning API's inputs, given by value, each checked where it enters, with their defaults.

Four typed records (model, cluster, training, layout) that a CLI, a Streamlit app or calibrate/
fill in; `resolve` turns each into the planner's own objects. Every default the planner applies
lives in DEFAULTS and is reported back in the answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from pathlib import Path

from planner.bounds import check
from planner.errors import InputError
from planner.model import ModelSpec

DEFAULTS = {
    "gpu": "h100-sxm",
    "seq_len": 4096,
    # 4Mi tokens: Llama 2 (Touvron et al. 2023, Table 1) used 4M-token batches
    "tokens_per_step": 4 * 2**20,
    "engine": "deepspeed",
    "precision": "bf16",
    "optimizer": "adamw",
    "memory_headroom": 0.05,
    "max_mbs": 16,
    "top": 5,
}
"""Every default of the planning API, in one place."""

SHAPE_FIELDS = ("layers", "hidden", "heads", "kv_heads", "ffn", "ffn_kind", "vocab", "tied_embeddings", "dropout", "experts",
                "experts_per_token", "shared_expert_ffn", "dense_layers", "dense_ffn", "moe_layer_step", "mtp_layers")
ZERO_FIELDS = ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size", "stage3_max_live_parameters",
               "stage3_max_reuse_distance", "stage3_param_persistence_threshold", "sub_group_size")
NVME_FIELDS = ("nvme_optimizer_buffer_count", "nvme_param_buffer_count", "nvme_param_buffer_size", "nvme_params_in_cpu")
"""ZeRO-Infinity's buffer knobs (layout.ZeroConfig): planning API and `planner check` only, no CLI flags."""


def _checked(record, keys) -> None:
    for key in keys:
        value = getattr(record, key)
        if value is not None:
            object.__setattr__(record, key, check(key, value))


def _boolean(value, flag: str):
    if value is not None and not isinstance(value, bool):
        raise InputError(f"{flag}: must be true or false, got {value!r}")


@dataclass(frozen=True)
class ModelInput:
    """Which model: a catalog name, a Hugging Face config (path or dict), a parameter count, or a
    full shape; shape fields override any of them."""

    name: str | None = None
    """Catalog name (planner/data models.json), or a path ending in .json."""
    config: str | Path | dict | None = None
    """A Hugging Face config.json: its path or its parsed dict."""
    params: float | None = None
    """Parameter count: derive a Llama-3-style shape (planner/shapes.py)."""
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    ffn: int | None = None
    ffn_kind: str | None = None
    vocab: int | None = None
    tied_embeddings: bool | None = None
    dropout: bool | None = None
    """Hidden and attention dropout in training (ModelSpec.dropout; default the catalog's or config's, off
    for a shape given by fields)."""
    experts: int | None = None
    """Routed MLP experts per block (Mixtral/Qwen-MoE style; `ffn` is then each expert's width)."""
    experts_per_token: int | None = None
    """Top-k experts per token."""
    shared_expert_ffn: int | None = None
    """Width of a shared expert every token also passes (Qwen2-MoE; 0: none)."""
    dense_layers: int | None = None
    """First blocks with a dense MLP instead of the experts (DeepSeek-V3 first_k_dense_replace)."""
    dense_ffn: int | None = None
    """MLP width of the dense blocks."""
    moe_layer_step: int | None = None
    """Every this-th block (after the dense-first ones) has the experts, the others a dense MLP."""
    mtp_layers: int | None = None
    """Multi-token-prediction depths trained after the last block (ModelSpec.mtp_layers; default 0)."""

    def __post_init__(self):
        _checked(self, ("params", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "experts",
                        "experts_per_token", "shared_expert_ffn", "dense_layers", "dense_ffn", "moe_layer_step",
                        "mtp_layers"))
        _boolean(self.tied_embeddings, "--tied-embeddings")
        _boolean(self.dropout, "--dropout")
        if self.ffn_kind is not None and self.ffn_kind not in ("gelu", "swiglu"):
            raise InputError(f"--ffn-kind: must be one of gelu, swiglu, got {self.ffn_kind!r}")
        given = [k for k in ("name", "config", "params") if getattr(self, k) is not None]
        if len(given) > 1:
            raise InputError("--model and --params: give one of them, not both")

    def resolve(self) -> ModelSpec:
        from planner import model as M

        overrides = {k: getattr(self, k) for k in SHAPE_FIELDS if getattr(self, k) is not None}
        source = self.config if self.config is not None else self.name
        if isinstance(source, dict) or (source is not None and str(source).endswith(".json")):
            from planner.hf_config import from_hf_config

            return M.with_overrides(from_hf_config(source), **overrides)
        if source is not None:
            return M.with_overrides(M.lookup(str(source)), **overrides)
        if self.params is not None:
            from planner.shapes import derive_shape

            # --params sizes the model itself; MTP depths come on top, as DeepSeek-V3's 671B + 14B
            mtp = overrides.pop("mtp_layers", None)
            return M.with_overrides(derive_shape(self.params, **overrides), mtp_layers=mtp)
        missing = [k for k in ("layers", "hidden", "heads", "vocab") if k not in overrides]
        if missing:
            raise InputError("--model: give --model NAME|config.json, --params N, or a full shape "
                             f"(missing {', '.join('--' + m.replace('_', '-') for m in missing)})")
        from planner.shapes import llama3_ffn

        overrides.setdefault("kv_heads", overrides["heads"])
        kind = overrides.setdefault("ffn_kind", "swiglu")
        overrides.setdefault("ffn", 4 * overrides["hidden"] if kind == "gelu" else llama3_ffn(overrides["hidden"]))
        overrides.setdefault("tied_embeddings", family_ties_embeddings(kind))
        return M.ModelSpec(name="custom", source="shape given by flags", **overrides)

    def assumed(self) -> dict:
        """What resolve() chose that the flags did not say, for the answer's `defaults`."""
        shape_only = self.config is None and self.name is None and self.params is None
        if shape_only and self.tied_embeddings is None and self.layers is not None:
            return {"tied_embeddings": family_ties_embeddings(self.ffn_kind or "swiglu")}
        return {}


def family_ties_embeddings(ffn_kind: str) -> bool:
    """Whether the family a flag-given shape stands for shares its input embedding with its output
    layer: a GELU decoder is the GPT family, which ties them in every engine's model code
    (transformers GPT2Config/BloomConfig tie_word_embeddings True; llmfoundry/models/mpt/
    configuration_mpt.py tie_word_embeddings=True; Megatron-LM and Megatron-DeepSpeed
    megatron/arguments.py --untie-embeddings-and-output-weights off by default); a SwiGLU one is
    the Llama family, which does not (transformers LlamaConfig tie_word_embeddings False)."""
    return ffn_kind == "gelu"


@dataclass(frozen=True)
class ClusterInput:
    """Which GPUs and how many; any catalog value can be overridden (units as the flags: GiB, GB/s,
    TFLOP/s)."""

    gpu: str | None = None
    """Catalog name or alias (default DEFAULTS['gpu'])."""
    gpus: int | None = None
    """Total GPUs."""
    gpus_per_node: int | None = None
    """GPUs per node (default: the GPU type's usual node, or fewer when the job is smaller)."""
    gpu_memory_gib: float | None = None
    peak_tflops: float | None = None
    """Dense peak TFLOP/s of the training precision."""
    hbm_gb_per_s: float | None = None
    intra_node_gb_per_s: float | None = None
    inter_node_gb_per_s: float | None = None
    pcie_gb_per_s: float | None = None
    host_ram_gib: float | None = None
    nvme_gb_per_s: float | None = None
    calibration: str | None = None
    """A calibration profile's name (data/calibration/<name>.json) or path; None or 'none': the priors."""
    pod_gpus: int | None = None
    """GPUs under one non-blocking switch domain (default 0: the whole network is non-blocking)."""
    oversubscription: float | None = None
    """A pod's NIC bandwidth over its uplink bandwidth (default 1: non-blocking)."""

    def __post_init__(self):
        _checked(self, [f.name for f in fields(self) if f.name not in ("gpu", "calibration")])

    def resolve(self, precision: str, default_gpus: int | None = None) -> "Cluster":
        from planner import hardware as H
        from planner.options import Precision

        gpu = H.lookup_gpu(self.gpu or DEFAULTS["gpu"])
        peak = dict(gpu.peak_flops_per_s)
        if self.peak_tflops:
            fp8 = str(precision).strip().lower() == "fp8"
            peak["fp8" if fp8 else Precision.parse(precision, "--precision").gemm_dtype] = self.peak_tflops * 1e12

        def scaled(value, unit):
            return None if value is None else value * unit

        gpu = H.with_overrides(
            gpu, memory_bytes=None if self.gpu_memory_gib is None else int(self.gpu_memory_gib * 2**30),
            peak_flops_per_s=peak, hbm_bytes_per_s=scaled(self.hbm_gb_per_s, 1e9),
            intra_node_bytes_per_s=scaled(self.intra_node_gb_per_s, 1e9),
            inter_node_bytes_per_s=scaled(self.inter_node_gb_per_s, 1e9),
            pcie_bytes_per_s=scaled(self.pcie_gb_per_s, 1e9),
            host_ram_bytes_per_node=None if self.host_ram_gib is None else int(self.host_ram_gib * 2**30),
            nvme_bytes_per_s_per_node=scaled(self.nvme_gb_per_s, 1e9))
        num = self.gpus or default_gpus
        if num is None:
            raise InputError("--gpus: required (total GPUs, e.g. --gpus 16)")
        per_node = self.gpus_per_node or min(gpu.gpus_per_node, num)
        if gpu.gpus_per_host and self.gpus_per_node in (None, gpu.gpus_per_host):
            per_node = H.nvlink_domain(gpu, num)
        from planner.calibration import load

        return H.Cluster(gpu=gpu, num_gpus=num, gpus_per_node=per_node, calibration=load(self.calibration, gpu.name),
                         pod_gpus=self.pod_gpus or 0, oversubscription=self.oversubscription or 1.0)


@dataclass(frozen=True)
class TrainingInput:
    """Sequence, batch, precision, optimizer, engine and DeepSpeed buffer settings."""

    seq_len: int | None = None
    """Tokens per sequence (default DEFAULTS['seq_len'])."""
    gbs: int | None = None
    """Global batch in sequences."""
    tokens_per_step: float | None = None
    """Global batch in tokens (recommend; default DEFAULTS['tokens_per_step'])."""
    precision: str | None = None
    """--precision word (bf16, fp16, fp32, bf16-pure, fp8; default bf16)."""
    fp8_recipe: str | None = None
    """--fp8-recipe word (planner/options.py Fp8Recipe; default the engine's, with --precision fp8)."""
    fp8_param_gather: bool | None = None
    """Megatron --fp8-param-gather (default: the engine's under FP8; Training.fp8_param_gather)."""
    optimizer: str | None = None
    flash_attention: bool = True
    engine: str | None = None
    """--engine word; estimate picks one from the layout when absent (api.estimate)."""
    reduce_bucket_size: int | None = None
    allgather_bucket_size: int | None = None
    stage3_prefetch_bucket_size: int | None = None
    stage3_max_live_parameters: int | None = None
    stage3_max_reuse_distance: int | None = None
    stage3_param_persistence_threshold: int | None = None
    sub_group_size: int | None = None
    nvme_optimizer_buffer_count: int | None = None
    nvme_param_buffer_count: int | None = None
    nvme_param_buffer_size: int | None = None
    nvme_params_in_cpu: int | None = None
    """offload_optimizer.buffer_count, offload_param.buffer_count/buffer_size/max_in_cpu (layout.ZeroConfig)."""
    overlap_comm: bool | None = None
    contiguous_gradients: bool | None = None
    fp32_grad_accum: bool | None = None
    """DeepSpeed data_types.grad_accum_dtype "fp32" (default: the model dtype)."""
    tp_comm_overlap: bool | None = None
    """Megatron --tp-comm-overlap (default off)."""
    compile: bool | None = None
    """torch.compile on each Hugging Face block (default off; Training.compile)."""
    grad_reduce_in_bf16: bool | None = None
    """Megatron --grad-reduce-in-bf16 (default off; Training.grad_reduce_in_bf16)."""
    recompute_modules: str | tuple | list | None = None
    """Megatron --recompute-modules, comma-separated or a list (default core_attn;
    Training.recompute_modules)."""
    fsdp_mixed_precision: str | None = None
    """Composer's FSDP mixed precision under llm-foundry's modules (default 'default'; Training.fsdp_mixed_precision)."""
    modules: str | None = None
    """--modules word (planner/modules.py WORDS): whose block is trained (default: the engine's users'
    own, modules.block_modules)."""
    overlap_p2p: bool | None = None
    """Interleaved pipeline sends beside compute where the engine does so (default on; Training.overlap_p2p)."""
    pipeline_edge_layers: int | None = None
    """0 or 1 blocks' worth the first and last stages give up for the embedding and the loss
    (default: the engine's; Training.pipeline_edge_layers)."""
    loss_chunks: int | None = None
    """Sequence chunks of torchtitan's loss (default: the engine's; Training.loss_chunks)."""
    expandable_segments: bool | None = None
    """PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the launch (default: the engine's
    launcher's; Training.expandable_segments)."""
    partition_activations: bool | None = None
    """DeepSpeed activation_checkpointing.partition_activations (default off, DeepSpeed's)."""
    cpu_checkpointing: bool | None = None
    """DeepSpeed activation_checkpointing.cpu_checkpointing (default off)."""
    moe_capacity_factor: float | None = None
    """MoE expert capacity factor C (None: the engine's default: DeepSpeed-MoE's 1.0 under
    megatron-deepspeed, dropless under the others; planner/moe.py)."""
    moe_pad_to_capacity: bool | None = None
    """Megatron --moe-pad-expert-input-to-capacity (default off; needs moe_capacity_factor)."""
    moe_grouped_gemm: bool | None = None
    """Megatron --moe-grouped-gemm (default: the engine's; Training.moe_grouped_gemm)."""
    optimizer_offload_fraction: float | None = None
    """Share of the optimizer partition --offload-optimizer cpu moves to the host under Megatron
    (default 1.0; Training.optimizer_offload_fraction)."""
    tokens: float | None = None
    """Training tokens: report days, GPU-hours and cost."""
    price_per_gpu_hour: float | None = None

    def __post_init__(self):
        _checked(self, ("seq_len", "gbs", "tokens_per_step", "tokens", "price_per_gpu_hour", "moe_capacity_factor",
                        "optimizer_offload_fraction", *ZERO_FIELDS, *NVME_FIELDS))
        _boolean(self.flash_attention, "--no-flash-attention")
        _boolean(self.overlap_comm, "--overlap-comm")
        _boolean(self.contiguous_gradients, "--no-contiguous-gradients")
        _boolean(self.fp32_grad_accum, "--fp32-grad-accum")
        _boolean(self.tp_comm_overlap, "--tp-comm-overlap")
        _boolean(self.compile, "--compile")
        _boolean(self.grad_reduce_in_bf16, "--grad-reduce-in-bf16")
        _boolean(self.overlap_p2p, "--no-overlap-p2p")
        _boolean(self.partition_activations, "activation_checkpointing.partition_activations")
        _boolean(self.cpu_checkpointing, "activation_checkpointing.cpu_checkpointing")
        _boolean(self.moe_pad_to_capacity, "--moe-pad-to-capacity")
        _boolean(self.moe_grouped_gemm, "--moe-grouped-gemm")
        _boolean(self.fp8_param_gather, "--fp8-param-gather")
        _boolean(self.expandable_segments, "--expandable-segments")
        if self.gbs is not None and self.tokens_per_step is not None:
            raise InputError("--gbs and --tokens-per-step: give one of them, not both")

    def resolve(self, gbs: int, engine: str) -> "Training":
        from planner.layout import Training, ZeroConfig

        zero = {k: getattr(self, k) for k in (*ZERO_FIELDS, *NVME_FIELDS, "overlap_comm", "contiguous_gradients", "fp32_grad_accum",
                                              "partition_activations", "cpu_checkpointing")}
        return Training(seq_len=self.seq_len or DEFAULTS["seq_len"], gbs=gbs,
                        precision=self.precision or ("fp8" if self.fp8_recipe else DEFAULTS["precision"]),
                        optimizer=self.optimizer or DEFAULTS["optimizer"], flash_attention=self.flash_attention,
                        engine=engine, zero_config=ZeroConfig(**{k: v for k, v in zero.items() if v is not None}),
                        tp_comm_overlap=bool(self.tp_comm_overlap), compile=bool(self.compile), modules=self.modules,
                        grad_reduce_in_bf16=bool(self.grad_reduce_in_bf16),
                        **({} if self.recompute_modules is None else {"recompute_modules": self.recompute_modules}),
                        fsdp_mixed_precision=self.fsdp_mixed_precision or "default",
                        moe_capacity_factor=self.moe_capacity_factor,
                        overlap_p2p=self.overlap_p2p is not False, pipeline_edge_layers=self.pipeline_edge_layers,
                        loss_chunks=self.loss_chunks, moe_pad_to_capacity=bool(self.moe_pad_to_capacity),
                        moe_grouped_gemm=self.moe_grouped_gemm,
                        fp8_recipe=self.fp8_recipe, fp8_param_gather=self.fp8_param_gather,
                        expandable_segments=self.expandable_segments,
                        optimizer_offload_fraction=1.0 if self.optimizer_offload_fraction is None
                        else self.optimizer_offload_fraction)


@dataclass(frozen=True)
class LayoutInput:
    """One layout (estimate): parallel degrees, ZeRO stage, offload, micro-batch and recompute."""

    tp: int = 1
    pp: int = 1
    dp: int | None = None
    """Data-parallel degree (default gpus / (tp pp cp))."""
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    """Expert tensor parallelism (megatron-core --expert-tensor-parallel-size); None: the engine's default."""
    vpp: int = 1
    schedule: str | None = None
    """'1f1b', 'interleaved', 'gpipe' (default: interleaved when vpp > 1)."""
    zero: int = 0
    offload_optimizer: str = "none"
    offload_params: str = "none"
    mbs: int = 1
    recompute: str = "none"
    recompute_layers: int | None = None
    """With recompute 'full': layers of each model chunk recomputed (Megatron --recompute-method
    block --recompute-num-layers), or per checkpoint with recompute_method 'uniform'; None: every
    layer, one checkpoint each."""
    recompute_method: str | None = "block"
    """Megatron --recompute-method for recompute_layers: 'block' or 'uniform' (None: 'block', as a
    layout row without recompute_layers carries it)."""
    sequence_parallel: bool | None = None
    """Megatron sequence parallelism (None: the engine's default, Engine.sequence_parallel_with_tp)."""
    rank_order: str = "tp-cp-dp-pp"
    """Rank placement, innermost first (planner/options.py RankOrder): 'tp-cp-dp-pp' or 'tp-cp-pp-dp'."""

    def __post_init__(self):
        _checked(self, ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "recompute_layers"))
        if self.zero not in (0, 1, 2, 3) or isinstance(self.zero, bool):
            raise InputError(f"--zero: must be one of 0, 1, 2, 3, got {self.zero!r}")
        _boolean(self.sequence_parallel, "--sequence-parallel")


def coerce(value, kind, flag: str):
    """An input record from a record, a dict of its fields (unknown keys name themselves), or None."""
    if value is None:
        return kind()
    if isinstance(value, kind):
        return value
    if isinstance(value, dict):
        known = {f.name for f in fields(kind)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise InputError(f"{flag}: unknown field {unknown[0]!r}; known: {', '.join(sorted(known))}")
        return kind(**value)
    raise InputError(f"{flag}: expected a {kind.__name__} or a dict, got {type(value).__name__}")


def model_input(value) -> ModelInput | ModelSpec:
    """A ModelInput from a ModelSpec (kept), a catalog name or config path, a config dict, or a
    parameter count."""
    if isinstance(value, (ModelSpec, ModelInput)):
        return value
    if isinstance(value, dict):
        if "model_type" in value:
            return ModelInput(config=value)
        return coerce(value, ModelInput, "--model")
    if isinstance(value, Path):
        return ModelInput(config=value)
    if isinstance(value, str):
        return ModelInput(name=value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(float(value)):
            raise InputError(f"--params: must be a finite number, got {value!r}")
        return ModelInput(params=value)
    raise InputError(f"--model: expected a catalog name, a config.json path or dict, or a parameter count, "
                     f"got {type(value).__name__}")


def resolve_model(value) -> ModelSpec:
    value = model_input(value)
    return value if isinstance(value, ModelSpec) else value.resolve()


def with_gpus(cluster: ClusterInput, gpus: int) -> ClusterInput:
    return replace(cluster, gpus=gpus)
