"""What real transformers blocks save for backward, counted with saved_tensors_hooks
(calibrate/saved.py), against planner/activations.py for the engines that train Hugging Face
modules (deepspeed, fsdp).

A LlamaModel of 2 and of 4 decoder layers runs one forward under the hooks; half the difference is
what one layer saves, with every storage counted once and the weights left out. Six shapes move h,
q (heads x head_dim), kv, f, the heads and the sequence one at a time, so a coefficient 10x wrong
on any of them fails. CPU and CUDA keep the same tensors here: LlamaRMSNorm and the MLP are eager
Python, and SDPA's CPU flash kernel saves what the CUDA one does (q, k, v, output, fp32 logsumexp;
CUDA adds an 8-byte philox seed/offset per call, nothing per token).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from calibrate.saved import llama_layer_bytes, llama_saved_bytes  # noqa: E402
from planner import activations, layout  # noqa: E402
from planner.hf_config import from_hf_config  # noqa: E402

BASE = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=176, head_dim=16)
SHAPES = [  # (config changes, seq, batch)
    ({}, 32, 2),
    ({"hidden_size": 128}, 32, 2),  # h alone (head_dim fixed: q, kv unchanged)
    ({"head_dim": 32}, 32, 2),  # q and kv
    ({"num_key_value_heads": 4}, 32, 2),  # kv alone
    ({"intermediate_size": 352}, 32, 2),  # f alone
    ({"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8}, 64, 1),  # heads, sequence
]


def hf_config(layers: int, impl: str, change: dict) -> dict:
    return {"model_type": "llama", **BASE, **change, "num_hidden_layers": layers, "vocab_size": 128,
            "max_position_embeddings": 128, "tie_word_embeddings": False, "attn_implementation": impl}


def saved_bytes(layers: int, impl: str, change: dict, seq: int, batch: int, dtype, checkpointing=False) -> int:
    return llama_saved_bytes(hf_config(layers, impl, change), seq, batch, str(dtype).replace("torch.", ""), checkpointing)


def per_layer(impl, change, seq, batch, dtype, checkpointing=False) -> int:
    return llama_layer_bytes(hf_config(2, impl, change), seq, batch, str(dtype).replace("torch.", ""), checkpointing)


def planner_per_layer(impl, change, seq, batch, precision, recompute="none") -> float:
    spec = from_hf_config(hf_config(2, impl, change))
    training = layout.Training(seq_len=seq, precision=precision, flash_attention=impl == "sdpa", engine="deepspeed")
    return float(activations.kept_per_layer(spec, training, layout.single(mbs=batch, recompute=recompute))[0])


@pytest.mark.parametrize("change, seq, batch", SHAPES)
def test_sdpa_layer_bf16(change, seq, batch):
    measured = per_layer("sdpa", change, seq, batch, torch.bfloat16)
    cfg = {**BASE, **change}
    h, d = cfg["hidden_size"], cfg["head_dim"]
    q, kv, f, a = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d, cfg["intermediate_size"], \
        cfg["num_attention_heads"]
    # two norms (4h fp32 + 4 rstd + 2h cast) + their outputs 2h each; q, k, v, out; lse 4a; MLP 4 x 2f
    assert measured == seq * batch * (16 * h + 4 * q + 4 * kv + 4 * a + 8 * f + 8)
    assert planner_per_layer("sdpa", change, seq, batch, "bf16") == measured


@pytest.mark.parametrize("change, seq, batch", SHAPES)
def test_qwen3_layer_bf16(change, seq, batch):
    """Qwen3DecoderLayer: the Llama layer plus Qwen3RMSNorm on each head's q and k (eager, like
    LlamaRMSNorm): an fp32 copy of the input, an fp32 rstd per head, the normalized input in bf16."""
    change = {**change, "model_type": "qwen3"}
    measured = per_layer("sdpa", change, seq, batch, torch.bfloat16)
    cfg = {**BASE, **change}
    h, d = cfg["hidden_size"], cfg["head_dim"]
    a, g = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    q, kv, f = a * d, g * d, cfg["intermediate_size"]
    llama = 16 * h + 4 * q + 4 * kv + 4 * a + 8 * f + 8
    assert measured == seq * batch * (llama + 6 * q + 6 * kv + 4 * a + 4 * g)
    assert planner_per_layer("sdpa", change, seq, batch, "bf16") == measured


@pytest.mark.parametrize("change, seq, batch", SHAPES)
def test_eager_layer_bf16(change, seq, batch):
    measured = per_layer("eager", change, seq, batch, torch.bfloat16)
    cfg = {**BASE, **change}
    h, q, f, a = cfg["hidden_size"], cfg["num_attention_heads"] * cfg["head_dim"], cfg["intermediate_size"], \
        cfg["num_attention_heads"]
    # q, k and v repeated to every head, o_proj input: 4 x 2q; softmax fp32 4as and its bf16 copy 2as
    assert measured == seq * batch * (16 * h + 8 * q + 6 * a * seq + 8 * f + 8)
    assert planner_per_layer("eager", change, seq, batch, "bf16") == measured


def test_fp32_layer():
    measured = per_layer("sdpa", {}, 32, 2, torch.float32)
    # norms keep input + normalized input (4h each) + 4 rstd, outputs 4h; q, k, v, out, lse; MLP 4 x 4f
    assert measured == 32 * 2 * (2 * (4 * 64 + 4 * 64 + 4 + 4 * 64) + 4 * (2 * 64 + 2 * 32) + 4 * 4 + 4 * 4 * 176)
    assert planner_per_layer("sdpa", {}, 32, 2, "fp32") == measured


def test_gradient_checkpointing_keeps_each_layer_input():
    measured = per_layer("sdpa", {}, 32, 2, torch.bfloat16, checkpointing=True)
    assert measured == 32 * 2 * 2 * 64  # the decoder layer's bf16 input, s b h x 2 bytes
    assert planner_per_layer("sdpa", {}, 32, 2, "bf16", recompute="full") == measured


def test_final_norm_and_head_input():
    # the model beyond its layers: the final LlamaRMSNorm (4h fp32 + 4 rstd + 2h cast; its output is
    # lm_head's input, 2h more once an lm_head reads it), the rotary cos/sin shared by every layer and
    # the embedding's int64 token ids (the planner leaves these two out: 2 x 2 x head_dim per
    # position and 8 bytes per token, once per model)
    two = saved_bytes(2, "sdpa", {}, 32, 2, torch.bfloat16)
    layers = 2 * per_layer("sdpa", {}, 32, 2, torch.bfloat16)
    rotary, ids = 2 * 32 * 16 * 2, 32 * 2 * 8  # cos, sin (1, 1, s, head_dim) bf16; ids (b, s) int64
    assert two - layers - rotary - ids == 32 * 2 * (4 * 64 + 4 + 2 * 64)
    spec = from_hf_config(hf_config(2, "sdpa", {}))
    training = layout.Training(seq_len=32, engine="deepspeed")
    head = activations.head_input_bytes(spec, training, layout.single(mbs=2), 0)[0]
    assert float(head) == two - layers - rotary - ids + 32 * 2 * 2 * 64


@pytest.mark.parametrize("layers, vocab", [(1, 8192), (3, 8192), (1, 2048)])
def test_step_peak_is_activations_plus_logits(layers, vocab):
    """The transient peak of one forward+backward of LlamaForCausalLM (torch.profiler allocation
    events; gradients preallocated by the step before) against the planner's activations of the
    stage plus its logits at 10 bytes per vocabulary element (16-bit logits, their fp32 copy in
    transformers' ForCausalLMLoss, the fp32 log-softmax cross_entropy keeps)."""
    from calibrate.saved import transient_peak_bytes

    cfg = {**hf_config(layers, "sdpa", {}), "vocab_size": vocab}
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)).to(torch.bfloat16).train()
    ids = torch.randint(0, vocab, (2, 64))

    def step():
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()

    step()
    measured = transient_peak_bytes(step)
    spec = from_hf_config(cfg)
    training = layout.Training(seq_len=64, engine="deepspeed")
    lay = layout.single(mbs=2)
    predicted = activations.stage_activation_bytes(spec, training, lay, 0)[0] \
        + activations.logits_bytes(spec, training, lay, 0, 10)[0]
    # e.g. 1 layer, V 8192: 128 tokens x (10 x 8192 logits + 2,840 layer + 516 head) = 10.9 MB
    assert measured == pytest.approx(predicted, rel=0.02)


# ---------------------------------------------------------------------------------------------
# Megatron: a Megatron-style GPT block (calibrate/megatron_block.py; megatron-core needs CUDA),
# full recompute of the first N layers of the chunk (--recompute-method block --recompute-num-layers)

MEGATRON_SHAPES = [  # (seq, batch, hidden, heads, ffn)
    (128, 2, 256, 8, 1024),
    (64, 2, 512, 8, 2048),  # h and f: the per-token terms
    (256, 1, 128, 4, 512),  # s against h: the a s^2 b scores
]


def megatron_kept_bytes(layers, recomputed, seq, batch, hidden, heads, ffn) -> float:
    from planner.model import ModelSpec

    spec = ModelSpec(layers=layers, hidden=hidden, heads=heads, kv_heads=heads, ffn=ffn, vocab=128, ffn_kind="gelu",
                     norm="layernorm", bias=True, positions="learned", max_positions=seq, dropout=True,
                     architecture="gpt2")
    training = layout.Training(seq_len=seq, precision="bf16", flash_attention=False, engine="megatron")
    lay = layout.single(mbs=batch, recompute="full" if recomputed else "none", recompute_layers=recomputed or None)
    return float(activations.kept_bytes(spec, training, lay, layers)[0])


def cuda_equivalent(counted, layers, recomputed, seq, batch, hidden, heads) -> float:
    """The count on CPU less what CUDA does not keep. Dropout: CPU's at::dropout (ATen
    native/Dropout.cpp _dropout_impl) multiplies by a noise tensor of the input dtype, which the mul
    saves (2 bytes an element); CUDA takes the fused native_dropout (is_fused_kernel_acceptable),
    which keeps a bool mask (1 byte): the a s^2 b attention mask and two s b h hidden masks per
    layer that keeps its activations. LayerNorm's mean and rstd (s b each, two norms) are left out
    by Korthikanti et al. and by the planner (under 0.1 % of a layer)."""
    stored = layers - recomputed
    masks = heads * seq * seq * batch + 2 * seq * batch * hidden
    stats = 2 * 2 * seq * batch * 2  # mean + rstd of two norms, bf16 on CPU
    return counted - stored * (masks + stats)


@pytest.mark.parametrize("seq, batch, hidden, heads, ffn", MEGATRON_SHAPES)
@pytest.mark.parametrize("recomputed", [0, 1, 3, 4])
def test_megatron_block_recompute_keeps(recomputed, seq, batch, hidden, heads, ffn):
    """4 layers, the first `recomputed` under a reentrant checkpoint: each of those keeps its 2sbh
    input, every other layer Korthikanti's 34sbh + 5as^2b (Table 2, no TP), counted tensor by tensor
    (e.g. s128 b2 h256 a8 f1024, one recomputed: 2 x 65,536 + 3 x (34 x 65,536 + 5 x 262,144))."""
    from calibrate.megatron_block import block_method_saved_bytes

    assert torch.ops.aten.dropout(torch.ones(4, dtype=torch.bfloat16), 0.5, True).dtype == torch.bfloat16
    counted = block_method_saved_bytes(4, recomputed, seq, batch, hidden, heads, ffn)
    measured = cuda_equivalent(counted, 4, recomputed, seq, batch, hidden, heads)
    sbh, as2b = seq * batch * hidden, heads * seq * seq * batch
    assert measured == recomputed * 2 * sbh + (4 - recomputed) * (34 * sbh + 5 * as2b)
    assert megatron_kept_bytes(4, recomputed, seq, batch, hidden, heads, ffn) == pytest.approx(measured, rel=0.02)


# ---------------------------------------------------------------------------------------------
# torchtitan 0.3.0's own Llama3Model under its SelectiveAC and FullAC, measured by
# `python -m calibrate.torchtitan_sac` (torchtitan is not a test dependency: the measurement is
# recorded in data/references/torchtitan_sac_cpu.json with its environment)

def test_torchtitan_checkpointed_blocks_keep_what_the_planner_books():
    """Per block, minus the 5,056-byte CPU RNG state torch.utils.checkpoint stashes for each
    checkpointed block (preserve_rng_state: torch.get_rng_state(), host memory, not the GPU's).
    e.g. h 256, a 16, f 768, s 128 x b 2, selective: 256 tokens x (512 input + 1,536 wqkv + 512
    attention + 128 lse/max + 1,536 w1 + 512 w2) = 1,212,416 bytes."""
    import json
    from pathlib import Path

    from planner.model import ModelSpec

    doc = json.loads((Path(__file__).resolve().parent.parent / "data/references/torchtitan_sac_cpu.json").read_text())
    assert doc["environment"]["torchtitan"] == "0.3.0"
    rng_state = torch.get_rng_state().numel()
    assert rng_state == 5056
    checked = 0
    for row in doc["rows"]:
        if row["policy"] == "none":
            continue  # torchtitan's unchecked block (eager RMSNorm, FlexAttention) is not modelled exactly yet
        spec = ModelSpec(layers=4, hidden=row["dim"], heads=row["heads"], kv_heads=row["kv_heads"], ffn=row["ffn"],
                         vocab=2048)
        train = layout.Training(seq_len=row["seq"], precision="bf16", engine="torchtitan")
        lay = layout.single(mbs=row["batch"], recompute=row["policy"])
        planned = float(activations.kept_per_layer(spec, train, lay)[0])
        assert planned == row["layer_bytes"] - rng_state, row
        checked += 1
    assert checked == 8
