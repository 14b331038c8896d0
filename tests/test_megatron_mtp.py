"""Multi-token prediction (ModelSpec.mtp_layers) against megatron-core's own GPTModel.

The reference, data/references/megatron_mtp_cpu.json, is python -m calibrate.engines.megatron_mtp:
megatron-core 0.16.1 GPTModel parameter counts with and without one MTP depth, as the whole model
(pp = 1) and as a last pipeline stage (pp > 1). What one depth adds, by the rows' arithmetic:
- Llama-style (h 64, 4 heads, 2 KV groups, SwiGLU f 96, RMSNorm): its block 2 norms 128 + qkv 64 x 128
  + proj 4096 + fc1 2 x 96 x 64 + fc2 96 x 64 = 30,848, eh_proj 2 x 64 x 64 = 8,192, 3 norms 192:
  39,232; a last stage of pp > 1 also builds the embedding, 1000 x 64 = 64,000.
- GPT-style (LayerNorm with biases, GeLU f 256, learned positions, tied): block 49,984, eh_proj 8,192
  (no bias), 3 LayerNorms 384: 58,560; the last stage's embedding 64,000 + 128 x 64 positions beside
  its copy of the tied output layer.
- DeepSeek-style (a dense block, then routed ones): the depth is a routed block (8 experts of f 32,
  a shared one, router 512): 72,320 + 8,384 = 80,704.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner import layout, sharding
from planner.model import ModelSpec, with_overrides
from planner.stage import Stage

REFERENCE = Path(__file__).resolve().parent.parent / "data" / "references" / "megatron_mtp_cpu.json"
ROWS = {row["name"]: row for row in json.loads(REFERENCE.read_text())["rows"]}


def _spec(row) -> ModelSpec:
    """The row's shape as the planner's model (no MTP)."""
    shape = dict(layers=row["num_layers"], hidden=row["hidden_size"], heads=row["num_attention_heads"],
                 kv_heads=row.get("num_query_groups") or row["num_attention_heads"], vocab=row["vocab"],
                 tied_embeddings=row["share_embeddings"])
    if row["name"] == "gpt-style":
        return ModelSpec(**shape, ffn=row["ffn_hidden_size"], ffn_kind="gelu", norm="layernorm", bias=True,
                         qkv_bias=True, positions="learned", max_positions=row["max_positions"], architecture="gpt2")
    if row.get("num_moe_experts"):
        return ModelSpec(**shape, ffn=row["moe_ffn_hidden_size"], experts=row["num_moe_experts"],
                         experts_per_token=row["moe_router_topk"],
                         shared_expert_ffn=row["moe_shared_expert_intermediate_size"],
                         dense_layers=row["moe_layer_freq"].index(1), dense_ffn=row["ffn_hidden_size"],
                         architecture="deepseek_v3", head_dim=16)
    return ModelSpec(**shape, ffn=row["ffn_hidden_size"])


def _last_stage_params(model: ModelSpec, pp: int) -> float:
    """Parameter elements one rank of the last stage holds (tp 1, ep 1, megatron)."""
    training = layout.Training(seq_len=128, engine="megatron")
    lay = layout.Layouts(tp=1, pp=pp, dp=1, cp=1, ep=1, vpp=1, zero=[1], offload_optimizer=0, offload_params=0, mbs=1,
                         gas=pp, recompute=0, sequence_parallel=0, schedule=0)
    dense, expert = sharding.rank_params(Stage(model, training, lay, lay.pp - 1))
    return float(dense[0] + expert[0])


def test_reference_is_megatron_cores_own_model():
    assert json.loads(REFERENCE.read_text())["environment"]["megatron-core"] == "0.16.1"
    assert set(ROWS) == {"llama-style", "gpt-style", "moe-dense-first"}


@pytest.mark.parametrize("name", list(ROWS))
def test_one_depth_adds_what_megatron_core_builds(name):
    row = ROWS[name]
    plain = _spec(row)
    assert with_overrides(plain, mtp_layers=1).params - plain.params == \
        row["params_whole_mtp1"] - row["params_whole_mtp0"]


@pytest.mark.parametrize("name", list(ROWS))
def test_last_stage_adds_the_depth_and_an_embedding(name):
    row = ROWS[name]
    plain = _spec(row)
    added = _last_stage_params(with_overrides(plain, mtp_layers=1), pp=2) - _last_stage_params(plain, pp=2)
    assert added == row["params_last_stage_mtp1"] - row["params_last_stage_mtp0"]


def test_deepseek_v3_depth_is_a_routed_block():
    """DeepSeek-V3 (arXiv 2412.19437 section 2.2; Megatron-LM's count per depth, training.py
    num_floating_point_operations): one routed block of 256 experts, 7168 x 2048 x 3 each, plus the
    shared expert, router, MLA attention and norms, then 2 x 7168^2 for eh_proj and 3 x 7168."""
    from planner.model import lookup

    v3 = lookup("deepseek-v3")
    depth = with_overrides(v3, mtp_layers=1).params - v3.params
    experts = 256 * 3 * 7168 * 2048  # 11,274,289,152
    assert depth == v3.layer_params + 2 * 7168 * 7168 + 3 * 7168
    assert experts < depth < experts + 0.4e9  # the rest: attention 187M, shared expert 44M, eh_proj 103M


@pytest.mark.slow
def test_megatron_core_counts_what_the_reference_says():
    """The count itself, on the installed megatron-core (a test extra; one process, about 10 s)."""
    from calibrate.engines.megatron_mtp import measure

    assert measure() == list(ROWS.values())


def test_model_flops_add_megatrons_count_per_depth():
    """Megatron-LM d98e8a6 training.py num_floating_point_operations: a depth is one more layer of the
    last kind, 2h^2 + 3h for eh_proj and its norms, and the logits once more, each 3 x 2 FLOPs per
    multiply-add per token, and the layer's attention scores 2 s (q + o) forward per token (Narayanan
    et al. 2021 eq. 3's 4 s h, the convention the planner's model FLOPs keep). Llama-3-8B's shape,
    seq 16."""
    from planner import compute
    from planner.model import lookup

    llama = lookup("llama-3-8b")
    h, f, kv, V = 4096, 14336, 1024, 128256
    training = layout.Training(seq_len=16, engine="megatron")
    lay = layout.Layouts(tp=1, pp=1, dp=1, cp=1, ep=1, vpp=1, zero=[1], offload_optimizer=0, offload_params=0, mbs=1,
                         gas=1, recompute=0, sequence_parallel=0, schedule=0)
    tokens = 16
    layer = h * (h + 2 * kv) + h * h + 2 * h * f + f * h  # qkv, proj, fc1 (gate and up), fc2
    scores = 2 * 16 * (h + h)  # QK^T and AV over the whole sequence
    expected = 6 * tokens * (layer + 2 * h * h + 3 * h + h * V) + 3 * tokens * scores
    plain = compute.flops_per_step(llama, training, lay)["model_flops"][0]
    with_mtp = compute.flops_per_step(with_overrides(llama, mtp_layers=1), training, lay)["model_flops"][0]
    assert with_mtp - plain == pytest.approx(expected, rel=1e-6)


def test_the_other_engines_say_why_they_cannot_train_it():
    """Of the five engines, Megatron's GPTModel alone builds MTP depths as modelled here: the others'
    comparison lines name the flag, not only that every layout broke a rule."""
    from planner import api
    from planner.inputs import ModelInput

    r = api.recommend(ModelInput(name="mixtral-8x7b", mtp_layers=1), {"gpus": 32}, {"engine": "megatron"}, top=1)
    assert r.layouts and {e["engine"] for e in r.engines} == {"deepspeed", "megatron-deepspeed", "fsdp", "torchtitan"}
    assert all(e["layout"] is None and "--mtp-layers" in e["note"] for e in r.engines)


CI = json.loads((REFERENCE.parent / "megatron_ci_moe_mtp_h100.json").read_text())


def _ci_config() -> dict:
    """NVIDIA's Megatron-LM CI MoE run's Megatron arguments (data/references/megatron_ci_moe_mtp_h100.json)
    as a DeepSeek-V3-style config (MLA, one dense block first, a shared expert)."""
    c = CI["config"]
    return {"model_type": "deepseek_v3", "hidden_size": c["hidden_size"], "intermediate_size": c["ffn_hidden_size"],
            "moe_intermediate_size": c["moe_ffn_hidden_size"], "n_routed_experts": c["num_experts"],
            "num_experts_per_tok": c["moe_router_topk"],
            "n_shared_experts": c["moe_shared_expert_intermediate_size"] // c["moe_ffn_hidden_size"],  # 1024 / 1024
            "first_k_dense_replace": 1,  # --moe-layer-freq ([0]*1+[1]*15)
            "num_hidden_layers": c["num_layers"], "num_attention_heads": c["num_attention_heads"],
            "num_key_value_heads": c["num_attention_heads"], "q_lora_rank": c["q_lora_rank"],
            "kv_lora_rank": c["kv_lora_rank"], "qk_nope_head_dim": c["qk_head_dim"],
            "qk_rope_head_dim": c["qk_pos_emb_head_dim"], "v_head_dim": c["v_head_dim"],
            "vocab_size": CI["padded_vocab"], "tie_word_embeddings": False, "max_position_embeddings": c["seq_length"]}


def _ci_estimate(mtp_layers: int):
    """That run as planner inputs."""
    from planner import api
    from planner.inputs import ModelInput

    c = CI["config"]
    return api.estimate(ModelInput(config=_ci_config(), mtp_layers=mtp_layers),
                        {"gpu": "h100-sxm", "gpus": c["gpus"], "gpus_per_node": c["gpus_per_node"]},
                        {"engine": "megatron", "seq_len": c["seq_length"], "gbs": c["global_batch_size"],
                         "flash_attention": False,  # --attention-backend unfused
                         "tp_comm_overlap": False},
                        {"tp": 2, "pp": 2, "vpp": 4, "ep": 4, "etp": 1, "dp": 2, "zero": 1, "mbs": c["micro_batch_size"],
                         "recompute": "none", "sequence_parallel": True}).to_json()


def test_the_last_stage_of_nvidias_moe_ci_run_peaks_as_measured():
    """Megatron-LM's CI logs the last rank's peak allocated bytes: the last pipeline stage, its MTP
    depth (a routed block, eh_proj, norms, an embedding) and two sets of logits on it. 57.92e9 bytes
    from step 3 to 29; within 10 %. Without the depth the planner books 50.6e9 there (-13 %)."""
    j = _ci_estimate(mtp_layers=1)
    last = j["memory"]["per_stage"][-1]
    assert last["stage"] == 1
    allocated = last["phases"][last["peak_phase"]]["allocated_bytes"]
    assert allocated == pytest.approx(CI["measured"]["mem_max_allocated_bytes_steps_3_to_29"], rel=0.10)


def test_a_config_with_mtp_weights_says_they_are_left_out():
    """transformers' DeepseekV3ForCausalLM builds no MTP module (its checkpoint's layer 61 is skipped on
    loading): the config's num_nextn_predict_layers is named in the model's source, not counted."""
    from planner.hf_config import from_hf_config

    cfg = {**_ci_config(), "num_nextn_predict_layers": 1}
    spec = from_hf_config(cfg)
    assert spec.mtp_layers == 0 and "num_nextn_predict_layers" in spec.source and "--mtp-layers 1" in spec.source
