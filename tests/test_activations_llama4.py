"""What transformers 5.25's Llama4TextDecoderLayer saves for backward, counted on the CPU with
saved_tensors_hooks (calibrate/benches/saved.py), against planner/saved/hf_llama.py hf_llama4_saved.

A layer is what a base model (AutoModel of a llama4_text config) of more decoder layers saves beyond
one of fewer, every storage once, the weights left out, counting only what the graph still holds once
the forward has returned (live=True). RoPE layers alone: no_rope_layer_interval 100; NoPE layers
alone: interval 1 (every layer NoPE, and full attention: no chunked mask); Llama 4's own pattern
(interval 4, one NoPE layer in 4) is the planner's per-layer average, checked over layers 4 to 7.
The MoE blocks alone: interleave_moe_layer_step 1; the dense ones: moe_layers [].

CPU against CUDA: the layer is eager Python but for the SDPA kernel. Without a mask (NoPE layers, and
RoPE layers while seq < attention_chunk_size) transformers passes enable_gqa and is_causal; the CPU's
flash kernel and CUDA's (flash takes GQA, torch >= 2.5) keep q, k, v, the output, which follows q's
[b, s, a, d] memory layout (CUDA: empty_like(q)), so o_proj reads a view, and an fp32 log-sum-exp
per head (CUDA's flash kernel adds per layer a philox seed and offset, no tokens in them). With the
chunked mask (RoPE layers, seq >= attention_chunk_size) transformers repeats k and v to every head
(use_gqa_in_sdpa is false with a mask) and torch's SDPA converts the bool mask [b, 1, s, s] to q's
dtype (convert_boolean_attn_mask) before dispatch. The CPU keeps its flash kernel (it takes a mask);
CUDA's flash kernel refuses one (sdp_utils.cpp check_for_attn_mask), so CUDA runs the memory-efficient
kernel, which keeps the same q, k, v, its output (allocated [b, s, a, d]), an fp32 logsumexp
[b, a, ceil(s/32) 32] (4a a token where seq is a multiple of 32, as Llama 4's chunk of 8192 makes it)
and the converted mask as its attn_bias (preprocess_mask pads it only where seq is not a multiple of
the kernel's alignment): the CPU count is CUDA's. Eager attention is the same on both (dropout 0:
F.dropout returns its input, no mask).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from calibrate.benches.saved import hf_layer_bytes, hf_saved_bytes  # noqa: E402
from planner import activations, layout  # noqa: E402
from planner.saved import hf_llama  # noqa: E402
from planner.hf_config import from_hf_config  # noqa: E402

SEQ, BATCH = 16, 2
ROPE, NOPE = 100, 1  # no_rope_layer_interval: every layer RoPE (below 100 layers), every layer NoPE

BASE = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=16,
            intermediate_size_mlp=96, num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=1,
            use_qk_norm=True, attention_chunk_size=64, no_rope_layer_interval=ROPE)


def config(change: dict = None, impl: str = "sdpa", interval: int = ROPE, dense: bool = False) -> dict:
    out = {"model_type": "llama4_text", **BASE, **(change or {}), "no_rope_layer_interval": interval,
           "vocab_size": 128, "max_position_embeddings": 256, "tie_word_embeddings": False,
           "attn_implementation": impl}
    return {**out, "moe_layers": []} if dense else out


def norm(h: int, e: int) -> int:
    """Llama4TextRMSNorm (LlamaRMSNorm's list): fp32 input 4h, fp32 rstd 4, the normalized input cast back
    (kept by the weight's mul) e h; its output, the next linears' input, e h more."""
    return 4 * h + 4 + 2 * e * h


def expected_per_token(cfg: dict, e: int = 2, seq: int = SEQ, batch: int = BATCH) -> float:
    """Bytes per token of one decoder layer of `cfg` (all its layers alike) from the transformers 5.25
    source, e bytes an element."""
    h, a, g, d = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    q, kv = a * d, g * d
    rope = cfg["no_rope_layer_interval"] == ROPE
    out = norm(h, e) + norm(h, e)  # input_layernorm, post_attention_layernorm
    if rope and cfg["use_qk_norm"]:  # Llama4TextL2Norm per q and k head: fp32 input (x.float()), fp32 rstd
        out += 4 * q + 4 * a + 4 * kv + 4 * g
    if not rope and cfg.get("attn_temperature_tuning", True):  # attn_scales (1, s, 1, 1) fp32 kept by the mul
        out += 4 / batch
    if cfg["attn_implementation"] == "eager":  # q, k and v repeated, softmax in e (no fp32), o_proj's copy
        out += e * q + e * q + e * q + e * a * seq + e * q
    else:  # SDPA: q, k, v, its output (o_proj's input is a view), fp32 log-sum-exp per head
        out += e * q + e * kv + e * kv + e * q + 4 * a
        if rope and seq >= cfg["attention_chunk_size"]:  # the chunked mask: k and v repeated, the mask in e
            out += 2 * e * (q - kv) + e * seq
    if cfg.get("moe_layers") == []:  # Llama4TextMLP of intermediate_size_mlp: gate, up, act(gate), down input
        return out + 4 * e * cfg["intermediate_size_mlp"]
    n, k, f = cfg["num_local_experts"], cfg["num_experts_per_tok"], cfg["intermediate_size"]
    out += 4 * n + 8 * k  # Llama4Router: fp32 sigmoid output (all E), topk's int64 indices
    out += e * n + 2 * e * n * h  # scores transposed (a copy); the input repeated E times and its product
    out += 4 * e * n * f  # Llama4TextExperts bmm over every (expert, token): gate_up 2f, act f, down input f
    return out + 4 * e * f  # shared_expert, a Llama4TextMLP of the expert width


def measured(cfg: dict, e: int = 2, seq: int = SEQ, batch: int = BATCH) -> float:
    """Bytes per token of one layer: half of 4 layers less 2."""
    return hf_layer_bytes(cfg, seq, batch, {2: "bfloat16", 4: "float32"}[e], live=True) / (seq * batch)


def planned(cfg: dict, e: int = 2, seq: int = SEQ, batch: int = BATCH, dense: bool = False) -> float:
    fields = {k: v for k, v in cfg.items() if k != "moe_layers"}
    spec = from_hf_config({**fields, "num_hidden_layers": 8, "interleave_moe_layer_step": 2 if dense else 1})
    assert spec.architecture == "llama4"
    training = layout.Training(seq_len=seq, precision={2: "bf16", 4: "fp32"}[e],
                               flash_attention=cfg["attn_implementation"] == "sdpa", engine="deepspeed")
    block = spec.dense_block if dense else spec
    assert (block.experts == 1) == dense
    return float(activations.kept_per_layer(block, training, layout.single(mbs=batch))[0]) / (seq * batch)


def check(change: dict, impl: str = "sdpa", e: int = 2, seq: int = SEQ, dense: bool = False) -> None:
    """RoPE and NoPE layers each exact against the source; the planner's layer their 3:1 average."""
    rope, nope = config(change, impl, ROPE, dense), config(change, impl, NOPE, dense)
    r, n = measured(rope, e, seq), measured(nope, e, seq)
    assert r == expected_per_token(rope, e, seq)
    assert n == expected_per_token(nope, e, seq)
    assert planned(rope, e, seq, dense=dense) == (3 * r + n) / 4


@pytest.fixture
def chunk(monkeypatch):
    """Sets the planner's chunk size to the config's (ModelSpec has no field for it; Llama 4's is 8192)."""
    return lambda size: monkeypatch.setattr(hf_llama, "LLAMA4_ATTENTION_CHUNK_SIZE", size)


def test_worked_example_moe_sdpa_bf16():
    """h 64, q 64, kv 32, a 4, g 2, E 4, k 1, f = fs 16, seq 16 < chunk. RoPE layer: norms 2 (8h + 4)
    = 1,032; L2 q/k norms 4q + 4a + 4kv + 4g = 408; SDPA 2q + 2kv + 2kv + 2q + 4a = 400; router 4E + 8k
    = 24; scores copy 2E = 8; repeated input and its product 4Eh = 1,024; experts 8Ef = 512; shared
    8fs = 128: 3,536 B a token. NoPE: 3,536 - 408 + 4/2 (the temperature scales, batch 2) = 3,130.
    Planner (3 x 3,536 + 3,130) / 4 = 3,434.5."""
    check({})
    assert measured(config()) == 3536 and measured(config(interval=NOPE)) == 3130
    assert planned(config()) == 3434.5


@pytest.mark.parametrize("change", [
    {"hidden_size": 128},  # h: norms and the repeated input
    {"num_local_experts": 8},  # E: every expert's rows, not k's
    {"num_experts_per_tok": 2},  # k: only topk's indices, 8 B more
    {"intermediate_size": 32},  # f and fs
    {"num_key_value_heads": 4},  # MHA: kv = q
    {"head_dim": 32},  # q and kv
])
def test_moe_layer_sdpa_bf16(change):
    check(change)


def test_qk_norm_off():
    """use_qk_norm false (Maverick): the RoPE layer keeps 4q + 4a + 4kv + 4g = 408 B less than the
    planner's RoPE layer, 3/4 of it in its average."""
    rope, nope = config({"use_qk_norm": False}), config({"use_qk_norm": False}, interval=NOPE)
    r, n = measured(rope), measured(nope)
    assert r == expected_per_token(rope) == 3128 and n == expected_per_token(nope) == 3130
    assert planned(rope) == (3 * (r + 408) + n) / 4


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_moe_layer_fp32(impl):
    """fp32: the norms' casts and the router's are no-ops (the norm keeps its input and the normalized
    input, 4h + 4 + 4h, the same count), every e term doubles. e.g. SDPA RoPE 6,104 B a token."""
    check({}, impl, e=4)
    assert measured(config(), e=4) == 6104


def test_eager_bf16():
    """Llama 4's eager_attention_forward softmaxes in bf16: e a s (128), no fp32 copy; q, k and v
    repeated (torch.matmul's copies) and o_proj's contiguous input, e q each: RoPE 3,776 B a token."""
    check({}, "eager")
    assert measured(config(impl="eager")) == 3776


@pytest.mark.parametrize("seq, size", [(16, 16), (16, 8), (24, 16)])
def test_chunked_attention_sdpa(chunk, seq, size):
    """seq >= attention_chunk_size (the planner's chunk set to it): the RoPE layers' bool mask makes
    transformers repeat k and v (2e(q - kv) = 128 B more) and SDPA keep the mask in e (e s); NoPE layers
    attend in full. seq 16, chunk 16: RoPE 3,536 + 128 + 32 = 3,696 B a token."""
    cfg = {"attention_chunk_size": size}
    chunk(size)
    check(cfg, seq=seq)
    if (seq, size) == (16, 16):
        assert measured(config(cfg)) == 3696


def test_chunked_attention_fp32_and_eager(chunk):
    """The mask in fp32 (4s); eager keeps no mask (transformers' additive mask is one per model)."""
    chunk(8)
    check({"attention_chunk_size": 8}, e=4)
    check({"attention_chunk_size": 8}, "eager")


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("e", [2, 4])
def test_dense_layer(impl, e):
    """The dense blocks (model.dense_block, experts == 1): Llama4TextMLP of intermediate_size_mlp F keeps
    gate, up, act(gate) and down's input, 4eF; no router. bf16 SDPA RoPE: 1,840 + 768 = 2,608."""
    check({}, impl, e, dense=True)
    if (impl, e) == ("sdpa", 2):
        assert measured(config(dense=True)) == 2608


@pytest.mark.parametrize("step", [1, 2])
def test_default_pattern_whole_model(step):
    """Llama 4's own layers (no_rope_layer_interval 4, layer 7 NoPE): layers 4 to 7 (8 layers less 4)
    are the planner's blocks to the byte, Scout's (step 1, all routed) and Maverick's layout (step 2:
    routed 5 and 7, dense 4 and 6; the planner's per-kind average puts NoPE in both kinds alike)."""
    cfg = {**config(), "no_rope_layer_interval": 4, "interleave_moe_layer_step": step}
    four = hf_saved_bytes({**cfg, "num_hidden_layers": 4}, SEQ, BATCH, live=True)
    eight = hf_saved_bytes({**cfg, "num_hidden_layers": 8}, SEQ, BATCH, live=True)
    moe, dense = planned(config()), planned(config(), dense=True)
    kinds = 4 * moe if step == 1 else 2 * moe + 2 * dense
    assert (eight - four) / (SEQ * BATCH) == kinds


def test_scout_per_token():
    """Llama-4-Scout (h 5120, a 40, g 8, d 128, E 16, k 1, f = fs 8192), bf16 SDPA, seq 4096 < 8192: a
    routed layer keeps 16h + 8q + 8kv + 8a + 4g + 8 + 4E + 8k + 2E + 4Eh + 8Ef + 8fs + (1/4)(4/mbs)
    - (1/4)(4q + 4a + 4kv + 4g) a token = 1,567,137 B, 1,376,256 of it every expert's rows: transformers
    runs each token through all 16 experts. At seq 8192 the chunked mask adds 3/4 (2e(q - kv) + e s)
    = 3/4 (16,384 + 16,384) = 24,576."""
    from planner.model import lookup

    spec = lookup("llama-4-scout")

    def per_token(seq):
        training = layout.Training(seq_len=seq, engine="deepspeed")
        return sum(float(x.bytes_per_token) for x in activations.saved_tensors(spec, training, seq, 1, 1))

    h, q, kv, a, g, n, f = 5120, 5120, 1024, 40, 8, 16, 8192
    rope = 16 * h + 8 * q + 8 * kv + 8 * a + 4 * g + 8
    moe = 4 * n + 8 + 2 * n + 4 * n * h + 8 * n * f + 8 * f
    assert per_token(4096) == rope + moe + (4 - (4 * q + 4 * a + 4 * kv + 4 * g)) / 4 == 1_567_137
    assert per_token(8192) - per_token(4096) == 3 / 4 * (4 * (q - kv) + 2 * 8192) == 24_576
