"""What transformers 5.25's DeepseekV3DecoderLayer (multi-head latent attention), DeepseekV2DecoderLayer
and Glm4MoeDecoderLayer save for backward, counted on the CPU with saved_tensors_hooks
(calibrate/benches/saved.py), against planner/activations.py hf_deepseek_v3_saved.

One layer is half the difference between a base model (AutoModel) of 4 and of 2 decoder layers,
every storage once, the weights left out, counting only what the graph still holds once the forward
has returned (live=True: DeepseekV3TopkRouter's group-limited choice saves topk indices (T, n_group,
2) and (T, topk_group) int64 and a (T, E) bool masked_fill mask on a branch whose values nothing
uses, freed during the forward; the plain count books them, 16G + 8 topk_group + E bytes a token,
and may then skip a later tensor that reuses a freed address).

Two per-layer constants (no tokens in them) are left out of the planner's per-token list and taken
off the count here: grouped_mm's int32 offsets (4E bytes, as in tests/test_activations_real.py) and,
in bf16, the fp32 copy the router makes of its weight (F.linear(x.float(), self.weight.type(fp32)):
4Eh bytes). The latter is this harness's doing: AutoModel.from_config(...).to(bf16) casts gate.weight,
which from_pretrained keeps in fp32 (DeepseekV3PreTrainedModel._keep_in_fp32_modules_strict), and the
saved weight is then the parameter itself.

CPU against CUDA: the layer is eager Python but for the attention kernel. The CPU's SDPA flash kernel
needs one head width for q, k and v, so the MLA shapes under SDPA keep qk_nope + qk_rope = v_head_dim
(with dv different the CPU falls back to the fp32 math path, which CUDA does not take: CUDA runs the
memory-efficient kernel, which keeps the same q, k, v, output and logsumexp, and writes its output
[b, s, a, dv] in memory, so o_proj reads a view; hf_mla_attention_saved books that, and the eager shapes
below check the dv-wide terms with dv != dn + dr). Where the widths are equal the CPU flash kernel and
CUDA's (empty_like(q)) both write the output in q's layout, which torch.cat made [b, a, s, d], so o_proj
reads a contiguous copy: the count is CUDA's. Eager attention is the same on both.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from calibrate.benches.saved import hf_layer_bytes  # noqa: E402
from cuda_sdpa import fp32_gqa_math_extra_bytes  # noqa: E402
from planner import activations, layout  # noqa: E402
from planner.hf_config import from_hf_config  # noqa: E402

SEQ, BATCH = 16, 2

DS_BASE = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, intermediate_size=96,
               moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=2,
               topk_group=1, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=24)
# num_key_value_heads: DeepseekV3Config's default is 128 whatever the heads (eager's repeat_kv then breaks)

GLM_BASE = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
                moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=1,
                topk_group=1, use_qk_norm=True)  # Glm4MoeConfig: partial_rotary_factor 0.5 by default

DS_SHAPES = [  # config changes for SDPA (dn + dr = dv, see above)
    {},
    {"hidden_size": 128},  # h alone
    {"q_lora_rank": None},  # q_proj: no q_a_layernorm
    {"q_lora_rank": 96},  # r alone
    {"kv_lora_rank": 64},  # c alone
    {"qk_nope_head_dim": 8, "qk_rope_head_dim": 16},  # dn against dr (q and k as wide, kv_b_proj narrower)
    {"qk_nope_head_dim": 24, "v_head_dim": 32},  # dn and dv
    {"num_attention_heads": 8, "num_key_value_heads": 8},  # heads
    {"n_routed_experts": 16, "n_group": 4, "topk_group": 2},  # E (the group choice keeps nothing)
    {"num_experts_per_tok": 3},  # k
    {"moe_intermediate_size": 32},  # f and the shared expert's width with it
    {"n_shared_experts": 0},  # no shared expert
    {"n_shared_experts": 3},  # fs alone
    {"norm_topk_prob": False},  # no renormalization: 4k + 4 less
]

GLM_SHAPES = [
    {},
    {"use_qk_norm": False},
    {"partial_rotary_factor": 1.0},  # the torch.cat copies are full width either way
    {"head_dim": 32},  # q and kv
    {"num_key_value_heads": 4},  # kv alone
    {"hidden_size": 128, "n_shared_experts": 2},
]


def config(base: dict, model_type: str, change: dict, impl: str = "sdpa", layers: int = 2, dense: int = 0) -> dict:
    return {"model_type": model_type, **base, **change, "first_k_dense_replace": dense, "num_hidden_layers": layers,
            "vocab_size": 128, "max_position_embeddings": 128, "tie_word_embeddings": False,
            "attn_implementation": impl}


def norm(w: int, e: int) -> int:
    """DeepseekV3RMSNorm / Glm4MoeRMSNorm over w: fp32 input 4w, fp32 rstd 4, normalized input e w (in
    fp32 the casts are no-ops: the input itself and the normalized input)."""
    return 4 * w + 4 + e * w


def expected_per_token(cfg: dict, e: int = 2, seq: int = SEQ, dense: bool = False) -> int:
    """Bytes per token of one decoder layer from the transformers 5.25 source, e bytes an element."""
    h, a = cfg["hidden_size"], cfg["num_attention_heads"]
    eager = cfg["attn_implementation"] == "eager"
    if "kv_lora_rank" in cfg:  # MLA (DeepseekV3Attention)
        r, c, dr = cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
        dn, dv = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
        q = kv = a * (dn + dr)  # query_states (torch.cat) and expand_kv's key_states, every head
        out = a * dv  # the attention output, o_proj's input
        attention = norm(h, e) + e * h  # input_layernorm; its output, q_a_proj's and kv_a_proj_with_mqa's input
        if r:
            attention += norm(r, e) + e * r  # q_a_layernorm; q_b_proj's input
        attention += norm(c, e) + e * c  # kv_a_layernorm (fp32 upcast of the split view); kv_b_proj's input
        if e == 4:
            attention += 4 * dr  # the no-op upcast: the norm keeps kv_a_proj_with_mqa's whole output
        v = e * a * (dn + dv)  # v is a split view of kv_b_proj's output: SDPA keeps all of it
        copy = dn + dr == dv  # the flash output in q's [b, a, s, d] layout: o_proj reads a copy
    else:  # Glm4MoeAttention: Llama's, torch.cat after the partial rotary
        d, g = cfg["head_dim"], cfg["num_key_value_heads"]
        q, kv, out = a * d, g * d, a * d
        attention = norm(h, e) + e * h  # input_layernorm; q/k/v_proj's input
        if cfg["use_qk_norm"]:  # per-head Glm4MoeRMSNorm on q and k: rstd per head
            attention += (4 + e) * (q + kv) + 4 * a + 4 * g
        v, copy = e * kv, True
    if eager:  # q, k repeated to every head (views), v repeated (a copy), fp32 softmax 4as and its cast, o_proj's input
        attention += e * q + e * q + e * out + 4 * a * seq + (e * a * seq if e != 4 else 0) + e * out
    else:  # q, k, v, the output, fp32 log-sum-exp per head, o_proj's copy
        attention += e * q + e * kv + v + e * out + 4 * a + (e * out if copy else 0)
    mlp = norm(h, e) + e * h  # post_attention_layernorm; its output, read by the router and the experts
    if dense:  # DeepseekV3MLP: gate, up, act(gate), down's input
        return attention + mlp + 4 * e * cfg["intermediate_size"]
    n, k, f = cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
    fs = f * cfg["n_shared_experts"]
    v2 = cfg["model_type"] == "deepseek_v2"
    router = (4 * h if e != 4 else 0) + 4 * n + 8 * k  # fp32 input copy, fp32 sigmoid (V2 softmax), int64 indices
    if cfg.get("norm_topk_prob", True) and not v2:
        router += 4 * k + 4  # in-place div of the fp32 top-k weights: a clone of them and their sum
    # int64 perm // k, perm, inv_perm; gathered tokens e kh; gate_up 2e kf, act e kf, product e kf;
    # down output e kh; fp32 routing weights 4k; the shared MLP 4 e fs
    experts = 24 * k + e * (2 * k * h + 4 * k * f) + 4 * k + 4 * e * fs
    return attention + mlp + router + experts


def offsets(cfg: dict) -> int:
    return 4 * cfg["n_routed_experts"]  # grouped_mm's int32 offsets (E,), one per layer


def router_weight_copy(cfg: dict, e: int) -> int:
    return 4 * cfg["n_routed_experts"] * cfg["hidden_size"] if e != 4 else 0  # the harness's bf16 gate.weight


def per_layer_constants(cfg: dict, e: int) -> int:
    return offsets(cfg) + router_weight_copy(cfg, e)


def measured(cfg: dict, e: int = 2, batch: int = BATCH, seq: int = SEQ) -> int:
    return hf_layer_bytes(cfg, seq, batch, {2: "bfloat16", 4: "float32"}[e], live=True)


def planned(cfg: dict, e: int = 2, batch: int = BATCH, seq: int = SEQ, dense: bool = False) -> float:
    spec = from_hf_config({**cfg, "num_hidden_layers": 4, "first_k_dense_replace": 1})
    assert spec.architecture == "deepseek_v3" and spec.dense_layers == 1
    training = layout.Training(seq_len=seq, precision={2: "bf16", 4: "fp32"}[e],
                               flash_attention=cfg["attn_implementation"] == "sdpa", engine="deepspeed")
    block = spec.dense_block if dense else spec
    return float(activations.kept_per_layer(block, training, layout.single(mbs=batch))[0])


def check(cfg: dict, e: int = 2, dense: bool = False, seq: int = SEQ, batch: int = BATCH, cuda_extra: int = 0) -> None:
    """The CPU count against the planner; `cuda_extra`: what CUDA keeps beyond the CPU's count."""
    count = measured(cfg, e, batch, seq)
    constants = 0 if dense else per_layer_constants(cfg, e)
    assert count - constants == seq * batch * expected_per_token(cfg, e, seq, dense)
    planner = planned(cfg, e, batch, seq, dense)
    assert planner == count - constants + cuda_extra  # exact: any term off at all fails
    assert planner == pytest.approx(count - (0 if dense else router_weight_copy(cfg, e)) + cuda_extra, rel=0.02)


@pytest.mark.parametrize("change", DS_SHAPES)
def test_deepseek_v3_moe_layer_sdpa_bf16(change):
    """DeepseekV3DecoderLayer with DeepseekV3MoE, SDPA, bf16, per token (expected_per_token):
    attention 8h + 8r + 8c + 4a(dn + dr) + 2a(dn + dv) + 4a dv + 4a + 12, MLP 12h + 4E + 40k + 4kh + 8kf
    + 8fs + 8. e.g. {}: h 64, r 48, c 32, a 4, dn 16, dr 8, dv 24, E 8, k 2, f 16, fs 16:
    (512 + 384 + 256 + 384 + 320 + 384 + 16 + 12 = 2,268) + (768 + 32 + 80 + 512 + 256 + 128 + 8 = 1,784)
    = 4,052 B a token, 32 tokens 129,664 B; counted 129,664 + 32 (offsets) + 2,048 (router weight) = 131,744."""
    check(config(DS_BASE, "deepseek_v3", change))


def test_deepseek_v3_worked_example():
    cfg = config(DS_BASE, "deepseek_v3", {})
    assert expected_per_token(cfg) == 4052
    assert measured(cfg) == 32 * 4052 + 4 * 8 + 4 * 8 * 64 == 131_744


@pytest.mark.parametrize("change", [{"v_head_dim": 16}, {"v_head_dim": 40, "num_attention_heads": 8,
                                                          "num_key_value_heads": 8}, {"q_lora_rank": None}])
def test_deepseek_v3_moe_layer_eager_bf16(change):
    """Eager attention (dv free here): torch.matmul keeps q and k^T as views (q_width each), copies v
    (a dv), softmax keeps its fp32 output 4as, the second matmul its bf16 cast 2as, o_proj a
    contiguous copy of the output (a dv); kv_b_proj's output is then kept by nothing (at micro-batch 2)."""
    check(config(DS_BASE, "deepseek_v3", change, impl="eager"))


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("change", [{}, {"q_lora_rank": None}])
def test_deepseek_v3_moe_layer_fp32(impl, change):
    """fp32: the norms' casts and the router's upcast are no-ops (kv_a_layernorm then keeps the whole
    kv_a_proj_with_mqa output, 4dr more), no softmax cast, every other term scales with e."""
    check(config(DS_BASE, "deepseek_v3", change, impl=impl), e=4)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("change", [{}, {"intermediate_size": 192}, {"q_lora_rank": None}])
def test_deepseek_v3_dense_first_layer(impl, change):
    """The first_k_dense_replace blocks (model.dense_block, experts == 1): DeepseekV3MLP of
    intermediate_size keeps 4 e F, no router; every layer dense here (first_k_dense_replace 4)."""
    cfg = config(DS_BASE, "deepseek_v3", change, impl=impl)
    count = hf_layer_bytes({**cfg, "first_k_dense_replace": 4}, SEQ, BATCH, "bfloat16", live=True)
    assert count == SEQ * BATCH * expected_per_token(cfg, dense=True)
    assert planned(cfg, dense=True) == count


@pytest.mark.parametrize("change", GLM_SHAPES)
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_glm4_moe_layer_bf16(impl, change):
    """Glm4MoeDecoderLayer: Llama's attention (tests/test_activations_real.py test_sdpa_layer_bf16,
    Qwen3's q/k norms under use_qk_norm) but q and k come out of torch.cat ([b, a, s, d] contiguous),
    so SDPA's output is too and o_proj reads a copy (2q more); DeepSeek's MoE block.
    e.g. {} SDPA: h 64, q 64, kv 32, a 4, g 2: attention 8h + 4 + 6(q + kv) + 4a + 4g + 2q + 2kv + 2kv + 4q
    + 4a = 1,644, MLP 12h + 4E + 40k + 4kh + 8kf + 8fs + 8 = 1,784: 3,428 B a token."""
    cfg = config(GLM_BASE, "glm4_moe", change, impl=impl)
    if not change and impl == "sdpa":
        assert expected_per_token(cfg) == 3428
    check(cfg)


def test_glm4_moe_layer_fp32_and_dense():
    # fp32 GQA: CUDA's SDPA runs its math kernel, the CPU's flash kernel keeps less (tests/cuda_sdpa.py;
    # GLM's q comes out of torch.cat, so o_proj reads a contiguous copy on the CPU too)
    spec = from_hf_config(config(GLM_BASE, "glm4_moe", {}))
    extra = fp32_gqa_math_extra_bytes(spec.q_width, spec.kv_width, spec.attention_out_width, spec.heads, SEQ,
                                      SEQ * BATCH, o_proj_copy_on_cpu=True)
    check(config(GLM_BASE, "glm4_moe", {}), e=4, cuda_extra=extra)
    cfg = config(GLM_BASE, "glm4_moe", {})
    count = hf_layer_bytes({**cfg, "first_k_dense_replace": 4}, SEQ, BATCH, "bfloat16", live=True)
    assert count == SEQ * BATCH * expected_per_token(cfg, dense=True)
    assert planned(cfg, dense=True) == count


@pytest.mark.parametrize("topk_method", ["greedy", "group_limited_greedy"])
def test_deepseek_v2_moe_layer(topk_method):
    """DeepseekV2DecoderLayer: the same MLA list (its complex rotary keeps only the shared freqs_cis)
    and MoE block; DeepseekV2TopkRouter softmaxes (4E, like V3's sigmoid), never renormalizes and keeps
    topk's indices. group_limited_greedy masks the scores before the top-k it uses: a (T, E) bool
    mask, E bytes a token the planner leaves out (ModelSpec has no topk_method; DeepSeek-V2's 160
    experts: 160 B of a layer of hundreds of kB a token)."""
    cfg = config(DS_BASE, "deepseek_v2", {"topk_method": topk_method, "norm_topk_prob": False})
    mask = 8 if topk_method == "group_limited_greedy" else 0
    count = measured(cfg) - per_layer_constants(cfg, 2)
    assert count == SEQ * BATCH * (expected_per_token(cfg) + mask)
    assert planned(cfg) == count - SEQ * BATCH * mask
    assert planned(cfg) == pytest.approx(count + offsets(cfg), rel=0.02)


def test_what_the_live_count_leaves_out_is_the_router_group_choice():
    """The tensors saved during one DeepSeek-V3 layer's forward by nodes freed before it returns: the
    group-limited choice's topk indices (T, n_group, 2) and (T, topk_group) int64, its masked_fill
    mask (T, E) bool, and the last topk's indices (T, k), which scores.gather keeps alive: 16G +
    8 topk_group + E bytes a token gone (48 here). The plain count books them less whatever
    addresses later tensors reuse, which varies from run to run; the live count does not."""
    from calibrate.benches.saved import hf_saved_counter

    c = hf_saved_counter(config(DS_BASE, "deepseek_v3", {}, layers=1), SEQ, BATCH, live=True)
    tokens = SEQ * BATCH
    gone = {((tokens, 2, 2), "int64"), ((tokens, 1), "int64"), ((tokens, 8), "bool")}
    freed = [(ptr, (shape, dtype)) for ptr, (_, shape, dtype, _) in c.freed]
    assert {kind for _, kind in freed} == gone | {((tokens, 2), "int64")}
    # a freed address a later saved tensor reuses is held again: only ever fewer of `gone` are unheld
    assert {kind for ptr, kind in freed if ptr not in c.saved} <= gone
    assert ((tokens, 2), "int64") in {(shape, dtype) for _, shape, dtype, _ in c.saved.values()}
