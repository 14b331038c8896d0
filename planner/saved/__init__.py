"""Saved-tensor lists, keyed by the modules that build a block (planner/modules.py: Hugging Face,
Liger, Megatron-Core with Transformer Engine, torchtitan, llm-foundry) and the model's architecture:
each implementation's own list in its own module here; planner/activations.py applies the recompute
policies, pipeline stages and the output layer to them."""

from __future__ import annotations

from planner.engines import Modules
from planner.layout import Training
from planner.model import ModelSpec
from planner.modules import block_modules
from planner.saved.base import Saved
from planner.saved.hf_gpt import hf_gpt2_saved, hf_gpt_neox_saved
from planner.saved.hf_llama import (_liger_needs_llama, hf_deepseek_v3_saved, hf_liger_llama_saved, hf_llama4_saved,
                                    hf_llama_compiled_saved, hf_llama_saved)
from planner.saved.llm_foundry import llm_foundry_mpt_saved
from planner.saved.megatron import megatron_saved
from planner.saved.torchtitan import torchtitan_llama_saved, torchtitan_moe_saved


def saved_tensors(model: ModelSpec, training: Training, seq: float, routed, mbs) -> list[Saved]:
    """What one block of the job's modules (planner/modules.py block_modules) saves for backward, per
    token, with `seq` keys per query (the attention scores per token), `routed` expert rows per token
    (planner/moe.py routed_per_token: k dropless; Hugging Face and torchtitan blocks are dropless) and
    `mbs` sequences a micro-batch (only GPT-NeoX's eager attention keeps a different list at 1): the
    SAVED registry's list for (modules, architecture), else the modules' list for any architecture."""
    modules = block_modules(model, training)
    if modules is Modules.HUGGING_FACE and model.architecture == "llama" and training.compile:
        return hf_llama_compiled_saved(model, training)
    if modules is Modules.TORCHTITAN and not training.flash_attention:
        return megatron_saved(model, training, seq, routed)  # torchtitan's blocks run SDPA's flash backend only
    found = SAVED.get((modules, model.architecture)) or SAVED[(modules, None)]
    return found(model, training, seq, routed, mbs)


SAVED = {
    (Modules.HUGGING_FACE, "llama"): lambda m, t, seq, routed, mbs: hf_llama_saved(m, t, seq),
    (Modules.HUGGING_FACE, "llama4"): lambda m, t, seq, routed, mbs: hf_llama4_saved(m, t, seq, mbs),
    (Modules.HUGGING_FACE, "deepseek_v3"): lambda m, t, seq, routed, mbs: hf_deepseek_v3_saved(m, t, seq),
    (Modules.HUGGING_FACE, "gpt2"): lambda m, t, seq, routed, mbs: hf_gpt2_saved(m, t, seq),
    (Modules.HUGGING_FACE, "gpt_neox"): lambda m, t, seq, routed, mbs: hf_gpt_neox_saved(m, t, seq, mbs),
    (Modules.HUGGING_FACE, None): lambda m, t, seq, routed, mbs: megatron_saved(m, t, seq, routed),
    (Modules.TORCHTITAN, None): lambda m, t, seq, routed, mbs:
        torchtitan_moe_saved(m, t) if m.experts > 1 else torchtitan_llama_saved(m, t),
    (Modules.MEGATRON, None): lambda m, t, seq, routed, mbs: megatron_saved(m, t, seq, routed),
    (Modules.LLM_FOUNDRY, None): lambda m, t, seq, routed, mbs: llm_foundry_mpt_saved(m, t),
    (Modules.HF_LIGER, "llama"): lambda m, t, seq, routed, mbs:
        hf_liger_llama_saved(m, t, seq) if m.experts == 1 else _liger_needs_llama(m),
    (Modules.HF_LIGER, None): _liger_needs_llama,
}
"""Saved-tensor lists keyed by (modules, architecture); None: any architecture those modules build.
The Hugging Face lists are each family's own; a family transformers has no list here for (a layout
no ARCHITECTURES entry names) takes the fused list of Korthikanti et al., which its FlashAttention
blocks save tensor for tensor."""
