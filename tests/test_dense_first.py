"""Dense-first blocks (DeepSeek-V3 and GLM-4.5 first_k_dense_replace) and multi-head latent
attention, through every place a stage's blocks matter: parameters per stage against transformers
on the meta device, which stage peaks, which stage is slowest, the FLOPs of a step against the
published active-parameter count. The arithmetic is written beside each assert."""

from dataclasses import replace

import pytest

from planner import hardware, layout, memory, pipeline, saved, sharding, timing
from planner.compute import flops_per_step
from planner.model import ModelSpec, lookup
from planner.stage import Stage, Step

H100 = hardware.lookup_gpu("h100-sxm")
C = memory.coefficients("time")

# a small DeepSeek-V3-shaped model (MLA, 3 dense-first blocks of 10 blocks, 8 routed experts top-2 + 1 shared)
SMALL = dict(model_type="deepseek_v3", hidden_size=64, intermediate_size=192, moe_intermediate_size=32,
             num_hidden_layers=10, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
             n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=3, q_lora_rank=24, kv_lora_rank=16,
             qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, vocab_size=1000, tie_word_embeddings=False)


def _enumerated_dense(layers, p, k, chunks, step=1):
    """Dense blocks per stage, block by block: block i has the experts when i >= k and (i + 1) % step
    == 0 (transformers Qwen2MoeDecoderLayer); contiguous stages of layers_on_stage (checked against
    DeepSpeed's partition_uniform in test_memory), or chunk i of L/(p v) on stage i mod p."""
    owner = []
    if chunks > 1:
        owner = [(i // (layers // (p * chunks))) % p for i in range(layers)]
    else:
        for stage in range(p):
            owner += [stage] * int(pipeline.layers_on_stage(layers, p, stage))
    dense = [i for i in range(layers) if i < k or (i + 1) % step]
    return [sum(1 for i in dense if owner[i] == stage) for stage in range(p)]


def _moe(layers, k, step=1):
    return ModelSpec(layers=layers, hidden=64, heads=4, kv_heads=4, ffn=32, vocab=100, experts=4, experts_per_token=2,
                     dense_layers=k, dense_ffn=96 if k or step > 1 else 0, moe_layer_step=step)


@pytest.mark.parametrize("layers, p, k, chunks, step", [
    (61, 16, 3, 1, 1), (61, 61, 3, 1, 1), (10, 4, 3, 1, 1), (30, 4, 9, 1, 1), (64, 4, 3, 2, 1), (64, 4, 10, 2, 1),
    (48, 4, 20, 3, 1),
    (48, 4, 0, 1, 2), (47, 5, 1, 1, 3), (48, 4, 2, 2, 2), (48, 4, 0, 3, 4),  # every step-th block routed
])
def test_dense_blocks_per_stage_match_enumeration(layers, p, k, chunks, step):
    model = _moe(layers, k, step)
    ours = [int(pipeline.dense_layers_on_stage(model, p, chunks, s)) for s in range(p)]
    assert ours == _enumerated_dense(layers, p, k, chunks, step)
    # the first stage of routed blocks only: DeepSeek-V3 on 16 stages (4,4,...,3): stage 0 holds blocks 0-3
    if chunks == 1 and step == 1:
        expected = next((s for s, d in enumerate(ours) if d == 0), p - 1)
        assert int(pipeline.first_routed_stage(k, layers, p)) == expected
    if (layers, p, k) == (61, 16, 3):
        assert ours[:2] == [3, 0]


# Qwen2-MoE with decoder_sparse_step 2: the experts on every second block, a dense MLP on the others
SPARSE_STEP = dict(model_type="qwen2_moe", hidden_size=64, intermediate_size=192, moe_intermediate_size=32,
                   num_hidden_layers=10, num_attention_heads=4, num_key_value_heads=4, num_experts=8,
                   num_experts_per_tok=2, shared_expert_intermediate_size=64, decoder_sparse_step=2, vocab_size=1000,
                   tie_word_embeddings=False)


@pytest.mark.parametrize("config_dict", [SMALL, SPARSE_STEP], ids=["dense-first", "sparse-step"])
@pytest.mark.parametrize("pp, ep", [(1, 1), (2, 2), (4, 4), (5, 8)])
def test_stage_parameters_equal_transformers_layers(config_dict, pp, ep):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from planner.hf_config import from_hf_config

    config = transformers.AutoConfig.for_model(**config_dict)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(config)
    spec = from_hf_config(config_dict)
    lay = layout.single(pp=pp, ep=ep, dp=ep)
    start = 0
    for stage in range(pp):
        n = int(pipeline.layers_on_stage(10, pp, stage))
        held, flat = {"dense": 0.0, "expert": 0.0}, []
        for name, p in hf.named_parameters():
            index = int(name.split(".")[2]) if name.startswith("model.layers.") else None
            if index is None:  # embedding on the first stage, final norm and lm_head on the last
                edge = name.startswith("model.embed") and stage == 0 or not name.startswith("model.embed") and stage == pp - 1
                held["dense"] += p.numel() if edge else 0
                flat += [p.numel()] if edge else []
            elif start <= index < start + n:
                expert = ".mlp.experts." in name  # the routed experts' stacked tensors: 8 / ep of them per rank
                held["expert" if expert else "dense"] += p.numel() / (ep if expert else 1)
                flat.append(p.numel() / (ep if expert else 1))
        dense, expert = sharding.rank_params(Stage(spec, layout.Training(engine="deepspeed"), lay, stage))
        assert (dense[0], expert[0]) == (held["dense"], held["expert"])
        # DeepSpeed's flat buffer: the stage's tensors in registration order, dense and routed blocks as they come
        assert list(spec.flat_local_sizes(1, pp, stage, ep)) == flat
        start += n


def test_deepseek_v3_peaks_on_its_first_all_routed_stage():
    # 61 blocks on 16 stages: 4 each on stages 0-12, 3 on 13-15; stage 0 = 3 dense + 1 routed, stage 1 = 4 routed.
    # A routed block (11.5e9 params, 256 experts / ep 8 = 32 local) outweighs a dense one ~20x, so stage 1
    # holds the most model states: neither the first nor the last stage
    model, cluster = lookup("deepseek-v3"), hardware.Cluster(H100, 256, 8)
    training = layout.Training(engine="deepspeed")
    lay = layout.single(pp=16, ep=8, dp=16, zero=1, recompute="full", gas=64)
    stages = memory.per_stage(model, cluster, training, lay)
    heaviest = max(range(16), key=lambda s: stages[s]["total"])
    assert heaviest == 1
    assert memory.rank_memory(model, cluster, training, lay)["total"][0] == stages[1]["total"]
    # stage 1 holds 4 routed blocks' states, stage 0 one: its params + grads + optimizer are far more
    assert stages[1]["total"] > 1.5 * stages[0]["total"]


def _mixed(dense_ffn):
    """10 blocks, the first 3 dense with an MLP `dense_ffn` wide, 8 experts of 8192 top-2 (a routed
    block's matrices: 4 x 1024^2 attention + 2 x 3 x 1024 x 8192 expert rows = 54e6 per token)."""
    return ModelSpec(layers=10, hidden=1024, heads=8, kv_heads=8, ffn=8192, vocab=32000, experts=8,
                     experts_per_token=2, dense_layers=3, dense_ffn=dense_ffn)


@pytest.mark.parametrize("pp, routed_per_stage", [
    (10, 1),  # one block per stage
    (5, 2),  # 2 per stage: stage 0 dense, dense, stage 1 dense, routed, stage 2 on routed, routed
    (3, 3),  # 4, 3, 3: stage 0 = 3 dense + 1 routed, so the slowest holds 3 routed blocks, not 4
])
def test_slowest_stage_is_the_dense_one_or_a_routed_one(pp, routed_per_stage):
    cluster, training = hardware.Cluster(H100, pp, pp), layout.Training(engine="megatron", seq_len=4096)
    lay = layout.single(pp=pp, gas=16)

    def slot(model):
        return timing.microbatch_s(Step(model, cluster, training, lay, C))["slot"][0]

    # dense blocks of 3 x 1024 x 65536 = 201e6 per token, 4x a routed one: the stages holding them are the slowest, and
    # a model of such dense blocks only has the same slowest stage (the one with the most of them) when
    # each stage's blocks are all dense there (pp = 10: one block per stage)
    heavy = _mixed(65536)
    routed_only = replace(heavy, dense_layers=0, dense_ffn=0)
    if pp == 10:
        assert slot(heavy) == pytest.approx(slot(replace(heavy.dense_block, layers=10)))
    assert slot(heavy) > 2 * slot(routed_only)
    # narrow dense blocks (4e6 + 3 x 1024 x 64 per token): the stage with the most routed blocks is the
    # slowest, timed as a routed-only model with that many blocks on every stage
    light = _mixed(64)
    assert slot(light) == pytest.approx(slot(replace(light, layers=pp * routed_per_stage, dense_layers=0, dense_ffn=0)))


def test_deepseek_v3_step_flops_follow_its_active_parameters():
    # DeepSeek-V3 report abstract: 37B activated per token (ours 37.55e9, test_model). Forward GEMM FLOPs per
    # token = 2 x the active matrix parameters: active minus the input embedding (V h) and the norm weights
    # (2h per block, MLA's two latent norms 1536 + 512, the final h); the attention core adds
    # 2 s (a d_qk + a d_v) per block (128 x 192 and 128 x 128), the output layer is among the matrices
    model = lookup("deepseek-v3")
    s, h, V = 4096, 7168, 129280
    norms = 61 * (2 * h + 1536 + 512) + h
    matrices = model.active_params - V * h - norms
    core = 2 * s * (128 * 192 + 128 * 128)
    lay = layout.single(dp=1, gas=1)
    tokens = s  # one sequence
    flops = flops_per_step(model, layout.Training(seq_len=s, engine="megatron"), lay)["model_flops"][0]
    assert flops == pytest.approx(3 * tokens * (2 * matrices + 61 * core), rel=1e-9)


def test_megatron_mla_block_keeps_the_latents_and_mla_widths():
    # megatron-core 0.16.1 MLASelfAttention on DeepSeek-V3's shape, bf16, tp 1, flash attention, no
    # recompute, per token: norm input and down-projection input 2h each; q_layernorm input 2r, rstd 4,
    # q_up input 2r (r 1536); kv_layernorm input 2c, rstd 4, kv_up input 2c (c 512); q and k
    # 2 x 128 x (128 + 64) each, v 2 x 128 x 128; log-sum-exp 4 x 128; linear_proj input 2 x 128 x 128
    model, training = lookup("deepseek-v3").dense_block, layout.Training(seq_len=4096, engine="megatron")
    h, r, c = 7168, 1536, 512
    attention = 4 * h + (4 * r + 4) + (4 * c + 4) + 2 * 2 * 128 * 192 + 2 * 128 * 128 + 4 * 128 + 2 * 128 * 128
    mlp = 4 * h + 2 * 3 * 18432  # dense-first block: norm input, fc1 input, [gate|up] and fc2 input (fused SwiGLU)
    per_token = sum(x.bytes_per_token for x in saved.megatron_saved(model, training, 4096, 1))
    assert per_token == attention + mlp


def test_an_empty_group_of_candidates_counts_no_dense_blocks():
    # the search evaluates groups of candidates that can be empty (a regression: the per-chunk loop took
    # np.max of an empty chunks array): every stage count is an empty array, not an error
    import numpy as np

    none = np.zeros(0, dtype=np.int64)
    assert pipeline.dense_layers_on_stage(lookup("llama-4-maverick"), none, none, none).shape == (0,)


def test_recommend_an_interleaved_moe_under_megatron_answers():
    from planner import api

    # Llama 4 Maverick (400.7e9 parameters, ~16 B each with Adam) on 64 H100 of 80 GB: nothing fits under
    # Megatron with the optimizer on the GPU, and the answer says what would (a regression: the search
    # crashed on an empty group); with it on the host, layouts fit
    rec = api.recommend("llama-4-maverick", {"gpus": 64}, {"engine": "megatron"}, pinned={"offload_optimizer": "none"})
    assert not rec.layouts and rec.suggestions
    rec = api.recommend("llama-4-maverick", {"gpus": 64}, {"engine": "megatron"})  # either pipeline split
    assert rec.layouts and all(r["layout"]["offload_optimizer"] == "cpu" for r in rec.layouts)


@pytest.mark.parametrize("engine, edges, pp", [("megatron", 1, 32), ("megatron", 0, 32), ("torchtitan", 1, 16)])
def test_the_peak_is_the_fullest_stage(engine, edges, pp):
    # Llama 4 Maverick (every 2nd block routed) with the embedding and the loss counted as a block each:
    # on 32 stages stage 0 keeps only dense block 0, stage 1 a routed and a dense block, so the peak
    # is stage 1's, not the first's or the last's (a regression: recommend called stage 0's 27 GiB a fit
    # where stage 1 needs 169); the summary must be the largest stage of the per-stage table
    m = lookup("llama-4-maverick")
    training = layout.Training(engine=engine, pipeline_edge_layers=edges)
    lay = layout.single(pp=pp, cp=2, ep=2, zero=1 if engine == "megatron" else 3, gas=8)
    cluster = hardware.Cluster(hardware.lookup_gpu("h100-sxm"), 64, 8)
    peak = float(memory.rank_memory(m, cluster, training, lay)["total"][0])
    stages = [s["total"] for s in memory.per_stage(m, cluster, training, lay)]
    assert peak == pytest.approx(max(stages), rel=1e-12)
