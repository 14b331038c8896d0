"""megatron-core's multi-token prediction: the parameters its GPTModel adds per MTP depth, counted.

For each configuration, megatron-core 0.16.1's own GPTModel (local layer spec, on one gloo rank,
tp = pp = 1) is built with and without an MTP block spec (models/gpt/gpt_layer_specs.py
get_gpt_mtp_block_spec), twice: as the whole model (pre_process and post_process: the one stage of
pp = 1) and as a last pipeline stage (post_process only: what a rank of the last stage of pp > 1
holds, MTP depths on it). The rows give both parameter counts, each storage once, for
tests/test_megatron_mtp.py to hold the planner's ModelSpec.mtp_layers against.

    python -m calibrate.engines.megatron_mtp [--out FILE]
"""

from __future__ import annotations

import sys
from pathlib import Path

from calibrate.harness.worker_io import counted_in_child, one_gloo_rank

OUT = Path(__file__).resolve().parents[2] / "data" / "references" / "megatron_mtp_cpu.json"

CONFIGS = {
    # Llama-style: RMSNorm, SwiGLU, no biases, rotary, untied output layer
    "llama-style": dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=96,
                        normalization="RMSNorm", gated_linear_unit=True, add_bias_linear=False,
                        position_embedding_type="rope", share_embeddings=False),
    # GPT-style: LayerNorm with biases, GeLU, learned positions, tied embeddings
    "gpt-style": dict(num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=256,
                      normalization="LayerNorm", gated_linear_unit=False, add_bias_linear=True,
                      position_embedding_type="learned_absolute", share_embeddings=True),
    # DeepSeek-style: one dense block first, then routed experts with a shared one; the MTP depth
    # takes the last block's kind (a routed one)
    "moe-dense-first": dict(num_layers=3, hidden_size=64, num_attention_heads=4, ffn_hidden_size=160,
                            normalization="RMSNorm", gated_linear_unit=True, add_bias_linear=False,
                            position_embedding_type="rope", share_embeddings=False, num_moe_experts=8,
                            moe_router_topk=2, moe_ffn_hidden_size=32, moe_shared_expert_intermediate_size=32,
                            moe_layer_freq=[0, 1, 1]),
}
VOCAB, MAX_POSITIONS = 1000, 128


def count(name: str) -> dict:
    """One configuration in this process: parameter elements of the four models."""
    import torch
    import torch.nn.functional as F

    one_gloo_rank()
    import megatron.core
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import (get_gpt_decoder_block_spec, get_gpt_layer_local_spec,
                                                          get_gpt_mtp_block_spec)
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    shape = dict(CONFIGS[name])
    tied, norm = shape.pop("share_embeddings"), shape["normalization"]
    position = shape.pop("position_embedding_type")
    activation = {"activation_func": F.silu} if shape["gated_linear_unit"] else {}
    row = {"name": name, "megatron_core": megatron.core.__version__, "torch": torch.__version__, "vocab": VOCAB,
           "max_positions": MAX_POSITIONS, "position_embedding_type": position, "share_embeddings": tied,
           **CONFIGS[name]}
    for mtp in (0, 1):
        config = TransformerConfig(**shape, **activation, use_cpu_initialization=True, mtp_num_layers=mtp or None,
                                   gradient_accumulation_fusion=False, moe_grouped_gemm=False)
        if config.num_moe_experts:
            spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization=norm)
        else:
            spec = get_gpt_layer_local_spec(normalization=norm)
        for stage, pre in (("whole", True), ("last_stage", False)):
            torch.manual_seed(0)
            mtp_spec = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False) if mtp else None
            model = GPTModel(config, spec, vocab_size=VOCAB, max_sequence_length=MAX_POSITIONS, pre_process=pre,
                             post_process=True, mtp_block_spec=mtp_spec, share_embeddings_and_output_weights=tied,
                             position_embedding_type=position)
            storages = {p.untyped_storage().data_ptr(): p.numel() for p in model.parameters()}
            row[f"params_{stage}_mtp{mtp}"] = sum(storages.values())
    return row


def measure() -> list[dict]:
    """A row for every configuration, all in one fresh process."""
    return counted_in_child("calibrate.engines.megatron_mtp", list(CONFIGS))


def main(argv=None) -> int:
    from calibrate.harness.recording import count_or_record

    return count_or_record(sys.argv[1:] if argv is None else argv, count, __doc__, OUT,
                           "python -m calibrate.engines.megatron_mtp: megatron-core 0.16.1 GPTModel (local spec) on one "
                           "gloo rank, parameter elements with and without one MTP depth, as the whole model and as a "
                           "last pipeline stage (post_process only)",
                           measure, "megatron-core")


if __name__ == "__main__":
    sys.exit(main())
