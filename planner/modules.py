"""The user's modules: whose transformer block a job trains, a choice apart from the parallel engine.

The engine decides how states are sharded and when ranks communicate; the modules decide what a
block saves for backward and how its loss holds the logits. An engine runs the modules its users
run unless `--modules` names others it can drive (`Training.modules`); `block_modules` is the one
place that resolves the choice, and `planner/activations.py saved_tensors` the registry of
saved-tensor lists keyed by (modules, architecture).
"""

from __future__ import annotations

from planner.engines import Buffers, Modules
from planner.errors import InputError

WORDS = {"hf": Modules.HUGGING_FACE, "hf-liger": Modules.HF_LIGER, "megatron": Modules.MEGATRON,
         "torchtitan": Modules.TORCHTITAN, "llm-foundry": Modules.LLM_FOUNDRY}
"""--modules words: hf (transformers' own blocks, eager or SDPA attention as --no-flash-attention
says), hf-liger (the same patched by Liger Kernel), megatron (Megatron-Core with Transformer Engine),
torchtitan, llm-foundry (MPT)."""

DRIVES = {Modules.HUGGING_FACE: (Modules.HUGGING_FACE, Modules.HF_LIGER, Modules.LLM_FOUNDRY)}
"""Modules an engine can drive beside its own: DeepSpeed and FSDP wrap any nn.Module (llm-foundry's
MPT runs under either through Composer); Megatron and torchtitan train their own blocks only."""


def word_of(modules: Modules) -> str:
    return next(w for w, m in WORDS.items() if m is modules)


def parse(value) -> Modules | None:
    """A --modules word (or member) as Modules; None stays None (the engine's default)."""
    if value is None or isinstance(value, Modules):
        return value
    key = str(value).strip().lower().replace("_", "-")
    if key not in WORDS:
        raise InputError(f"--modules: must be one of {', '.join(WORDS)}, got {value!r}")
    return WORDS[key]


def choices(engine) -> tuple:
    """The modules `engine` (an Engine record) can train."""
    return DRIVES.get(engine.modules, (engine.modules,))


def check(modules: Modules | None, engine) -> None:
    if modules is not None and modules not in choices(engine):
        words = ", ".join(word_of(m) for m in choices(engine))
        raise InputError(f"--modules: --engine {engine.name} trains {words}; got {word_of(modules)}")


FSDP_MIXED_PRECISION = ("default", "pure")
"""Composer's fsdp_config mixed_precision for llm-foundry's modules (composer/distributed/
mosaic_parallelism.py get_mixed_precision): 'default' fp32 parameters under autocast with 16-bit
reductions, what llm-foundry's benchmark harness passes (scripts/train/benchmarking/submit_benchmarks.py
fsdp_config_mixed_precision='DEFAULT'); 'pure' 16-bit parameters, reductions and buffers, what its
training yamls set (scripts/train/yamls/pretrain/mpt-*.yaml)."""


def autocasts_fp32_params(model, training) -> bool:
    """Whether the job keeps fp32 parameters and lets autocast cast them for every GEMM: llm-foundry's
    modules under Composer's FSDP (the fsdp engine; DeepSpeed keeps its own 16-bit parameters) with
    'default' mixed precision (FSDP_MIXED_PRECISION) and a master copy to keep. Then the FSDP all-gathers and unsharded units move fp32 (held.gathered_param_bytes),
    autograd keeps each GEMM's 16-bit weight cast (memory.autocast_weight_bytes), the casts cost HBM
    traffic (compute.autocast_weight_traffic_s) and the residual stream is fp32
    (planner/saved/llm_foundry.py llm_foundry_block_input_scale)."""
    return (block_modules(model, training) is Modules.LLM_FOUNDRY and training.engine.buffers is Buffers.FSDP
            and training.fsdp_mixed_precision == "default" and training.precision.has_master_copy)


def block_modules(model, training) -> Modules:
    """Whose block `training` trains for `model`: --modules where given; else the engine's own, where
    a Hugging Face engine given a GELU shape by flags (no family named: the llama layout with an
    ungated MLP, which transformers has no block for) trains llm-foundry's MPT, the GELU LayerNorm
    decoder FSDP and DeepSpeed users train from a shape (llmfoundry/models/mpt/configuration_mpt.py:
    expansion_ratio 4, GELU, LayerNorm)."""
    if training.modules is not None:
        return training.modules
    engine = training.engine.modules
    if engine is Modules.HUGGING_FACE and model.architecture == "llama" and model.ffn_kind == "gelu" \
            and model.experts == 1:
        return Modules.LLM_FOUNDRY
    return engine
