"""What real transformers blocks save for backward, counted with saved_tensors_hooks
(calibrate/benches/saved.py), against planner/activations.py for the engines that train Hugging Face
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

from calibrate.benches.saved import hf_layer_bytes, hf_saved_bytes  # noqa: E402
from cuda_sdpa import fp32_gqa_math_extra_bytes  # noqa: E402
from planner import activations, layout, memory  # noqa: E402
from planner.hf_config import from_hf_config  # noqa: E402
from planner.stage import Stage

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
    return hf_saved_bytes(hf_config(layers, impl, change), seq, batch, str(dtype).replace("torch.", ""), checkpointing)


def per_layer(impl, change, seq, batch, dtype, checkpointing=False) -> int:
    return hf_layer_bytes(hf_config(2, impl, change), seq, batch, str(dtype).replace("torch.", ""), checkpointing)


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
    # CUDA runs fp32 GQA in SDPA's math kernel (4 heads, 2 kv heads): 752 B a token more, measured on an
    # H200 (data/calibration/h200.json activations/hf-llama/sdpa-fp32: 377,344 B a layer)
    extra = fp32_gqa_math_extra_bytes(q=64, kv=32, o=64, heads=4, seq=32, tokens=32 * 2)
    assert extra == 32 * 2 * 752
    assert planner_per_layer("sdpa", {}, 32, 2, "fp32") == measured + extra == 377_344


def test_gradient_checkpointing_keeps_each_layer_input():
    measured = per_layer("sdpa", {}, 32, 2, torch.bfloat16, checkpointing=True)
    assert measured == 32 * 2 * 2 * 64  # the decoder layer's bf16 input, s b h x 2 bytes
    assert planner_per_layer("sdpa", {}, 32, 2, "bf16", recompute="full") == measured


@pytest.mark.parametrize("every", [2, 4, 5])
def test_checkpointing_every_kth_layer_keeps_the_others_whole(every):
    """transformers 5.25 activation_checkpointing_enable(every_n_layers=k): of 6 layers, those at
    0, k, 2k, ... keep their input, the rest everything; the planner's --recompute-layers N for the
    engines that launch it this way is N = ceil(6 / k) (rules.every_n_layers_broken)."""
    every_layer = saved_bytes(6, "sdpa", {}, 32, 2, torch.bfloat16, checkpointing=True)
    measured = saved_bytes(6, "sdpa", {}, 32, 2, torch.bfloat16, checkpointing=every) - every_layer
    whole, kept = 32 * 2 * (16 * 64 + 4 * 64 + 4 * 32 + 4 * 4 + 8 * 176 + 8), 32 * 2 * 2 * 64  # test_sdpa_layer_bf16
    n = -(-6 // every)  # 3, 2, 2 layers checkpointed
    rotary = 2 * 32 * 16 * 2  # cos, sin (1, 1, s, head_dim) bf16, saved once by the layers left whole
    assert measured == (6 - n) * (whole - kept) + rotary  # the planner leaves rotary out (test_final_norm...)
    spec = from_hf_config(hf_config(6, "sdpa", {}))
    training = layout.Training(seq_len=32, engine="deepspeed")

    def planner(**kw):
        return float(activations.kept_bytes(spec, training, layout.single(mbs=2, recompute="full", **kw), 6)[0])
    assert planner(recompute_layers=n) - planner() == measured - rotary


@pytest.mark.parametrize("every", [1, 2])
def test_offloaded_checkpointing_moves_each_checkpointed_input_to_the_host(every, monkeypatch):
    """transformers 5.25 activation_checkpointing_enable(offload=True) wraps each checkpoint in
    torch.autograd.graph.save_on_cpu: what passes its pack hook goes to pinned host memory. Counted
    on the real Llama (6 layers, every k-th checkpointed): each checkpointed layer's bf16 input, 2sbh,
    once; what the planner books on the host under --cpu-checkpointing and takes off the device."""
    import transformers.modeling_utils as modeling_utils

    moved = {}

    class CountingSaveOnCpu(torch.autograd.graph.saved_tensors_hooks):
        def __init__(self, pin_memory=False, device_type="cuda"):
            def pack(t):
                moved.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
                return t
            super().__init__(pack, lambda t: t)

    monkeypatch.setattr(modeling_utils, "save_on_cpu", CountingSaveOnCpu)
    config = transformers.LlamaConfig(**BASE, num_hidden_layers=6, vocab_size=128, attn_implementation="sdpa")
    model = transformers.LlamaModel(config).to(torch.bfloat16).train()
    model.activation_checkpointing_enable(every_n_layers=every, offload=True)
    model(input_ids=torch.randint(0, 128, (2, 32)), use_cache=False)
    n = -(-6 // every)  # 6, 3 layers checkpointed
    assert sum(moved.values()) == n * 32 * 2 * 2 * 64  # s b h x 2 bytes each
    spec = from_hf_config(hf_config(6, "sdpa", {}))
    training = layout.Training(seq_len=32, engine="fsdp", zero_config=layout.ZeroConfig(cpu_checkpointing=True))
    lay = layout.single(mbs=2, recompute="full", recompute_layers=None if every == 1 else n)
    assert float(activations.host_checkpoint_bytes(spec, training, lay, 6)[0]) == sum(moved.values())
    on_device = layout.Training(seq_len=32, engine="fsdp")
    assert float(activations.kept_bytes(spec, on_device, lay, 6)[0] - activations.kept_bytes(spec, training, lay, 6)[0]) \
        == sum(moved.values())


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
    head = activations.head_input_bytes(Stage(spec, training, layout.single(mbs=2), 0))[0]
    assert float(head) == two - layers - rotary - ids + 32 * 2 * 2 * 64


@pytest.mark.parametrize("layers, vocab", [(1, 8192), (3, 8192), (1, 2048)])
def test_step_peak_is_activations_plus_logits(layers, vocab):
    """The transient peak of one forward+backward of LlamaForCausalLM (torch.profiler allocation
    events in time order; gradients preallocated by the step before) against the planner's
    activations of the stage plus its logits at the engine's loss peak: 12 bytes per vocabulary
    element, in cross_entropy's backward (_log_softmax_backward_data), where log_softmax's saved
    fp32 output, nll_loss_backward's fp32 gradient and the fp32 result are live together; the
    forward's 16-bit logits and fp32 copy (10 B with the saved output) are gone by then."""
    from calibrate.benches.saved import transient_peak_bytes

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
    per_logit = memory.loss_bytes_per_logit(spec, training, memory.coefficients("memory"))
    assert per_logit == 12
    predicted = activations.stage_activation_bytes(Stage(spec, training, lay, 0))[0] \
        + activations.logits_bytes(Stage(spec, training, lay, 0), per_logit)[0]
    # e.g. 1 layer, V 8192: 128 tokens x (12 x 8192 logits + 2,840 layer + 516 head) = 13.0 MB
    assert measured == pytest.approx(predicted, rel=0.02)


# ---------------------------------------------------------------------------------------------
# Megatron: a Megatron-style GPT block (calibrate/engines/megatron_block.py: the ops of megatron-core's layer
# with CUDA's fused softmax as it saves), full recompute of the first N layers of the chunk
# (--recompute-method block --recompute-num-layers), and megatron-core's own layer beside it

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
    from calibrate.engines.megatron_block import block_method_saved_bytes

    assert torch.ops.aten.dropout(torch.ones(4, dtype=torch.bfloat16), 0.5, True).dtype == torch.bfloat16
    counted = block_method_saved_bytes(4, recomputed, seq, batch, hidden, heads, ffn)
    measured = cuda_equivalent(counted, 4, recomputed, seq, batch, hidden, heads)
    sbh, as2b = seq * batch * hidden, heads * seq * seq * batch
    assert measured == recomputed * 2 * sbh + (4 - recomputed) * (34 * sbh + 5 * as2b)
    assert megatron_kept_bytes(4, recomputed, seq, batch, hidden, heads, ffn) == pytest.approx(measured, rel=0.02)


MEGATRON_CORE_LLAMA_SHAPES = [(128, 2, 256, 8, 1024), (64, 2, 512, 8, 1376)]


@pytest.fixture(scope="module")
def megatron_core_saved():
    """{(seq, batch, hidden, heads, ffn, llama, groups): bytes} megatron-core's own layer keeps, for every
    configuration the three tests below count, in one fresh process (calibrate/engines/megatron_block.py
    megatron_core_layers_saved_bytes: a layer built and counted on its own for each)."""
    from calibrate.engines.megatron_block import megatron_core_layers_saved_bytes

    configs = [(*shape, False, 0) for shape in MEGATRON_SHAPES] + [(128, 2, 256, 8, 1024, False, 2)] \
        + [(*shape, True, 0) for shape in MEGATRON_CORE_LLAMA_SHAPES]
    return dict(zip(configs, megatron_core_layers_saved_bytes(configs)))


@pytest.mark.slow
@pytest.mark.parametrize("seq, batch, hidden, heads, ffn", MEGATRON_SHAPES)
def test_megatron_core_layer_keeps_what_the_style_block_keeps(megatron_core_saved, seq, batch, hidden, heads, ffn):
    """megatron-core 0.16.1's own TransformerLayer (local spec, bf16, dropout 0.1) on the CPU keeps
    what the Megatron-style block keeps but for three things, each explained: the layer's input is
    left out here (2sbh: the previous layer keeps it); LayerNorm's mean and rstd come in fp32 (4 of
    sb, 2 bytes more each); and with masked_softmax_fusion off (its kernel is CUDA's) FusedScaleMask-
    Softmax upcasts the scores to fp32 (attention_softmax_in_fp32) and keeps that softmax, 2 bytes an
    a s^2 b element more than CUDA's ScaledUpperTriangMaskedSoftmax keeps in bf16, which the style
    block counts. So the style block's tests (above) hold for megatron-core's layer on CUDA."""
    from calibrate.engines.megatron_block import block_method_saved_bytes

    style = block_method_saved_bytes(1, 0, seq, batch, hidden, heads, ffn)
    core = megatron_core_saved[(seq, batch, hidden, heads, ffn, False, 0)]
    # s128 b2 h256 a8: 4,329,472 = 3,934,208 - 131,072 + 2,048 + 524,288
    assert core == style - 2 * seq * batch * hidden + 4 * seq * batch * 2 + heads * seq * seq * batch * 2


@pytest.mark.slow
def test_megatron_core_unfused_attention_repeats_grouped_keys_and_values(megatron_core_saved):
    """With GQA and no flash kernel, megatron-core's DotProductAttention repeat_interleaves key and
    value to every head (new tensors the matmuls keep): 8 heads in 2 groups at h 256 keep q, k and v
    at every head's width, 3 e h = 1,536 bytes a token, as MHA does, not e (q + 2 kv) = 768; the
    planner's unfused Megatron list alike (it booked 768 before)."""
    from planner.model import ModelSpec

    s, b, h, a, f = 128, 2, 256, 8, 1024
    mha = megatron_core_saved[(s, b, h, a, f, False, 0)]
    gqa = megatron_core_saved[(s, b, h, a, f, False, 2)]
    assert gqa == mha  # q copied out of linear_qkv's output, k and v repeated: 3 e h either way

    def planned(kv_heads):
        m = ModelSpec(layers=1, hidden=h, heads=a, kv_heads=kv_heads, ffn=f, vocab=128, ffn_kind="gelu",
                      norm="layernorm", bias=True, positions="learned", max_positions=s, dropout=True,
                      architecture="gpt2")
        training = layout.Training(seq_len=s, flash_attention=False, engine="megatron")
        return sum(x.bytes_per_token for x in activations.saved_tensors(m, training, s, 1.0, b))

    assert planned(2) == planned(8)


@pytest.mark.slow
@pytest.mark.parametrize("seq, batch, hidden, heads, ffn", MEGATRON_CORE_LLAMA_SHAPES)
def test_megatron_core_llama_layer_keeps_what_the_planner_books(megatron_core_saved, seq, batch, hidden, heads, ffn):
    """megatron-core 0.16.1's own Llama-style TransformerLayer (RMSNorm, Megatron-LM's fused
    bias_swiglu, no biases, no dropout, bf16) with SDPA as its core attention (flash's saves: q, k, v
    as views of linear_qkv's output, the output, o_proj's input a view of it, and an fp32 log-sum-exp),
    counted on the CPU. The translation: each torch RMSNorm keeps on the CPU its input and normalized
    input in fp32 and the rstd, 8h + 4 bytes a token; on CUDA its fused kernel (and TE's) keeps the
    16-bit input and the rstd, 2h + 4, of which the planner books 2h (the rstd, 4 bytes a norm, is
    Korthikanti's omission too). Then the planner's Megatron list, 16h + 4a + 6f, is exact."""
    from planner.model import ModelSpec

    counted = megatron_core_saved[(seq, batch, hidden, heads, ffn, True, 0)] / (seq * batch)
    # s128 b2 h256 a8 f1024: 13,352 = 2 x (8 x 256 + 4) + 2h + 6h + 2h + 4a + 2h + 4f + 2f
    assert counted == 2 * (8 * hidden + 4) + 12 * hidden + 4 * heads + 6 * ffn
    on_cuda = counted - 2 * (8 * hidden + 4) + 2 * (2 * hidden + 4)
    model = ModelSpec(layers=1, hidden=hidden, heads=heads, kv_heads=heads, ffn=ffn, vocab=256)
    saved = activations.saved_tensors(model, layout.Training(seq_len=seq, engine="megatron"), seq, 1.0, batch)
    assert on_cuda == sum(x.bytes_per_token for x in saved) + 2 * 4  # 10,280 = 16h + 4a + 6f + two rstd


@pytest.mark.parametrize("group", [2, 4])
def test_megatron_uniform_recompute_keeps_a_group_input_and_reruns_a_group(group):
    """--recompute-method uniform --recompute-num-layers N over 4 Megatron-style blocks (s128 b2
    h256 a8 f1024): the forward keeps one 2sbh input per group of N (4/N x 131,072 bytes), and the
    backward reruns a whole group before its backward, so the peak of forward + backward rises by
    N - 1 blocks' saved tensors (each 3,934,208 bytes as the CPU keeps them) less the inputs no longer
    kept: N 2: 3,934,208 - 2 x 131,072 = 3,672,064 (measured 3,661,952); N 4: 3 x 3,934,208 -
    3 x 131,072 = 11,409,408 (measured 11,394,240). The planner books ceil(L/N) inputs and N whole
    blocks of recompute working set."""
    from calibrate.engines.megatron_block import block_method_saved_bytes, uniform_method_bytes

    s, b, h, a, f = 128, 2, 256, 8, 1024
    layer_cpu, layer_input = block_method_saved_bytes(1, 0, s, b, h, a, f), 2 * s * b * h
    kept_1, peak_1 = uniform_method_bytes(4, 1, s, b, h, a, f)
    kept_n, peak_n = uniform_method_bytes(4, group, s, b, h, a, f)
    assert (kept_1, kept_n) == (4 * layer_input, 4 // group * layer_input)
    assert peak_n - peak_1 == pytest.approx((group - 1) * layer_cpu - (4 - 4 // group) * layer_input, rel=0.01)

    from planner.model import ModelSpec

    spec = ModelSpec(layers=4, hidden=h, heads=a, kv_heads=a, ffn=f, vocab=128, ffn_kind="gelu", norm="layernorm",
                     bias=True, positions="learned", max_positions=s, dropout=True, architecture="gpt2")
    training = layout.Training(seq_len=s, precision="bf16", flash_attention=False, engine="megatron")
    every = layout.single(mbs=b, recompute="full")
    grouped = layout.single(mbs=b, recompute="full", recompute_layers=group, recompute_method="uniform")
    assert activations.kept_bytes(spec, training, grouped, 4)[0] == kept_n  # 4 / N inputs of 131,072 B
    working_1 = activations.recompute_working_bytes(spec, training, every)[0]
    assert activations.recompute_working_bytes(spec, training, grouped)[0] == group * working_1
    # every layer still runs twice: the same recompute FLOPs and time as one checkpoint per layer
    assert activations.recomputed_layers(grouped, 4, 1)[0] == activations.recomputed_layers(every, 4, 1)[0] == 4


# ---------------------------------------------------------------------------------------------
# torchtitan 0.3.0's own Llama3Model under its SelectiveAC and FullAC, measured by
# `python -m calibrate.engines.torchtitan_sac` (torchtitan is not a test dependency: the measurement is
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
            continue  # tests/test_activations_real.py test_torchtitan_unchecked_block_on_cuda
        spec = ModelSpec(layers=4, hidden=row["dim"], heads=row["heads"], kv_heads=row["kv_heads"], ffn=row["ffn"],
                         vocab=2048)
        train = layout.Training(seq_len=row["seq"], precision="bf16", engine="torchtitan")
        lay = layout.single(mbs=row["batch"], recompute=row["policy"])
        planned = float(activations.kept_per_layer(spec, train, lay)[0])
        assert planned == row["layer_bytes"] - rng_state, row
        checked += 1
    assert checked == 8


def torchtitan_cuda_equivalent(row) -> float:
    """torchtitan's unchecked block as counted on the CPU, less what CUDA does not keep. nn.RMSNorm:
    on the CPU torch 2.13 decomposes rms_norm (CompositeImplicitAutograd: an fp32 upcast of the
    input and the fp32 normalized input are saved, 8h bytes a token, plus the fp32 rstd), on CUDA
    the fused kernel keeps the bf16 input and the rstd (derivatives.yaml _fused_rms_norm): 6h less
    per norm, two norms. RoPE: the measurement passes positions and cast the model with .to(bf16),
    which turned the complex64 cache buffer real, so each block's positions-indexed cache copy
    ((b, s, 1, d/2) bf16: d bytes a token) is an artifact; torchtitan's trainer passes no positions
    and the cache slice is a view of the buffer."""
    tokens, dim, head_dim = row["seq"] * row["batch"], row["dim"], row["dim"] // row["heads"]
    return row["layer_bytes"] - tokens * (2 * 6 * dim + head_dim)


def test_torchtitan_unchecked_block_on_cuda():
    """torchtitan 0.3.0's Llama3 block without activation checkpointing (recorded at 4 shapes that
    move h, the kv heads and f), translated to CUDA, equals torchtitan_llama_saved to the byte:
    e.g. h 256, a 16, g 16, f 768: 13,464 - (12 x 256 + 16) = 10,376 B a token = 8h + 4q + 4kv +
    8a + 8f + 8 = 2,048 + 1,024 + 1,024 + 128 + 6,144 + 8 (Megatron's fused block would be 8,776:
    6f and 4a)."""
    import json
    from pathlib import Path

    from planner.model import ModelSpec

    doc = json.loads((Path(__file__).resolve().parent.parent / "data/references/torchtitan_sac_cpu.json").read_text())
    rows = [r for r in doc["rows"] if r["policy"] == "none"]
    assert len(rows) == 4
    assert torchtitan_cuda_equivalent(rows[0]) == 256 * 10_376  # s 128 x b 2 tokens
    for row in rows:
        spec = ModelSpec(layers=4, hidden=row["dim"], heads=row["heads"], kv_heads=row["kv_heads"], ffn=row["ffn"],
                         vocab=2048)
        train = layout.Training(seq_len=row["seq"], precision="bf16", engine="torchtitan")
        planned = float(activations.kept_per_layer(spec, train, layout.single(mbs=row["batch"]))[0])
        assert planned == torchtitan_cuda_equivalent(row), row



def test_torchtitan_float8_blocks_keep_what_the_planner_books():
    """torchtitan 0.3.0's block with torchao 0.18's float8 linears (its Float8LinearConverter,
    emulated on the CPU) keeps what the bf16 block keeps under every policy: torchao's autograd
    function saves the 16-bit input, not an FP8 copy; SelectiveAC adds tensorwise scaling's amax
    scalars, 20 B a block of 5 linears, and no more (rowwise's torch.amax is not on its save list).
    Each row against the planner at --precision fp8 with the recipe: checkpointed blocks less the
    5,056-byte CPU RNG state, the unchecked one translated to CUDA as the bf16 block is."""
    import json
    from pathlib import Path

    from planner.model import ModelSpec

    doc = json.loads((Path(__file__).resolve().parent.parent / "data/references/torchtitan_float8_cpu.json").read_text())
    assert (doc["environment"]["torchtitan"], doc["environment"]["torchao"]) == ("0.3.0", "0.18.0")
    rows = [r for r in doc["rows"] if r["kind"] == "saved"]
    by = {(r["dim"], r["kv_heads"], r["policy"], r["recipe"]): r["layer_bytes"] for r in rows}
    assert by[(256, 16, "selective", "tensorwise")] - by[(256, 16, "selective", "bf16")] == 5 * 4
    checked = 0
    for row in rows:
        if row["recipe"] == "bf16":
            continue
        spec = ModelSpec(layers=4, hidden=row["dim"], heads=row["heads"], kv_heads=row["kv_heads"], ffn=row["ffn"],
                         vocab=2048)
        train = layout.Training(seq_len=row["seq"], precision="fp8", fp8_recipe=row["recipe"], engine="torchtitan")
        lay = layout.single(mbs=row["batch"], recompute=row["policy"])
        planned = float(activations.kept_per_layer(spec, train, lay)[0])
        measured = torchtitan_cuda_equivalent(row) if row["policy"] == "none" else row["layer_bytes"] - 5056
        assert planned == measured, row
        checked += 1
    assert checked == 12

# ---------------------------------------------------------------------------------------------
# transformers 5 GPT2Block and GPTNeoXLayer (planner/activations.py hf_gpt2_saved, hf_gpt_neox_saved),
# counted on the CPU like the Llama layers above and translated to what CUDA keeps
# (hf_cuda_equivalent). Five shapes move h, the heads, f and the sequence one at a time; at these small
# widths even the 16-byte LayerNorm statistics are over 0.5 % of a layer, so any term 10x wrong
# breaks the 2 % check.

HF_SHAPES = [  # (hidden, heads, ffn, seq, batch)
    (64, 4, 128, 32, 2),
    (128, 4, 128, 32, 2),  # h alone (head_dim 32)
    (64, 16, 128, 32, 2),  # heads alone (head_dim 4): the 4a log-sum-exp, the a s scores
    (64, 4, 512, 32, 2),  # f alone
    (64, 4, 128, 64, 2),  # s alone: the a s scores (micro-batch 1 is test_hf_gpt_batch_one)
]


def gpt2_config(layers, impl, hidden, heads, ffn, attention_dropout, hidden_dropout) -> dict:
    # GPT2Config: attn_pdrop on the scores, resid_pdrop after c_proj (attention and MLP), embd_pdrop on the embeddings
    return {"model_type": "gpt2", "n_embd": hidden, "n_head": heads, "n_inner": ffn, "num_hidden_layers": layers,
            "vocab_size": 128, "n_positions": 128, "attn_pdrop": attention_dropout, "resid_pdrop": hidden_dropout,
            "embd_pdrop": hidden_dropout, "attn_implementation": impl}


def neox_config(layers, impl, hidden, heads, ffn, attention_dropout, hidden_dropout) -> dict:
    # GPTNeoXConfig defaults: use_parallel_residual True, hidden_act 'gelu', rotary_pct 0.25, attention_bias True
    return {"model_type": "gpt_neox", "hidden_size": hidden, "num_attention_heads": heads, "intermediate_size": ffn,
            "num_hidden_layers": layers, "vocab_size": 128, "max_position_embeddings": 128,
            "attention_dropout": attention_dropout, "hidden_dropout": hidden_dropout, "attn_implementation": impl}


def hf_cuda_equivalent(counted, seq, batch, hidden, heads, hidden_dropouts, eager_attention_dropout) -> int:
    """What CUDA keeps where the CPU count of one layer (or one model's extras) differs:
    - LayerNorm mean and rstd: the CPU kernel keeps them in bf16 (aten native/layer_norm.cpp
      layer_norm_cpu, the input dtype), CUDA's in fp32 (native/cuda/layer_norm_kernel.cu
      layer_norm_cuda, acc_type): +2 bytes each, two norms a layer;
    - dropout on hidden states: CPU's at::dropout (native/Dropout.cpp _dropout_impl) multiplies by
      a bf16 noise tensor that the mul keeps (2 bytes an element), CUDA's fused native_dropout keeps a
      bool mask (1 byte): -1 byte per element of each of the `hidden_dropouts` s b h tensors;
    - dropout on eager attention scores likewise: -1 byte per a s^2 b element.
    SDPA with dropout is not translated here: the CPU's flash kernel takes no dropout (torch 2.13
    sdp_utils_cpp.cpp use_flash_attention_cpp; seen: the output's grad_fn is then ToCopyBackward0 of
    _scaled_dot_product_attention_math, not ScaledDotProductFlashAttentionForCpuBackward0), whose
    fp32 upcast keeps fp32 q, k, v, scores and noise, while CUDA's flash kernel applies dropout inside and
    keeps what it keeps without it plus a philox seed and offset per call (no per-token bytes).
    The tests therefore count SDPA with the attention dropout at 0 and the hidden dropouts on."""
    stats = 2 * 2 * (4 - 2) * seq * batch
    hidden_masks = hidden_dropouts * seq * batch * hidden * (2 - 1)
    score_mask = eager_attention_dropout * heads * seq * seq * batch * (2 - 1)
    return counted + stats - hidden_masks - score_mask


def hf_measured(config, impl, dropout, hidden, heads, ffn, seq, batch, checkpointing=False) -> int:
    """One layer's CPU count, translated to CUDA (hf_cuda_equivalent)."""
    p = 0.1 if dropout else 0.0
    counted = hf_layer_bytes(config(2, impl, hidden, heads, ffn, p if impl == "eager" else 0.0, p), seq, batch,
                             "bfloat16", checkpointing)
    if checkpointing:
        return counted
    return hf_cuda_equivalent(counted, seq, batch, hidden, heads, 2 * dropout, dropout and impl == "eager")


def hf_planner_per_layer(config, impl, dropout, hidden, heads, ffn, seq, batch, recompute="none") -> float:
    p = 0.1 if dropout else 0.0
    spec = from_hf_config(config(2, impl, hidden, heads, ffn, p, p))
    assert spec.dropout == dropout
    training = layout.Training(seq_len=seq, precision="bf16", flash_attention=impl == "sdpa", engine="deepspeed")
    return float(activations.kept_per_layer(spec, training, layout.single(mbs=batch, recompute=recompute))[0])


@pytest.mark.parametrize("hidden, heads, ffn, seq, batch", HF_SHAPES)
@pytest.mark.parametrize("dropout", [True, False])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_gpt2_layer_bf16(impl, dropout, hidden, heads, ffn, seq, batch):
    """GPT2Block per token (bf16, CUDA): ln_1 and ln_2 inputs 2h each and their fp32 mean + rstd 16;
    c_attn and c_fc inputs 2h each; gelu_new keeps 5 tensors of f (10f); SDPA: c_attn's whole output
    6h (q, k, v are views of it), the output 2h (c_proj's input, a view), lse 4a; eager: q, k^T, v
    copies 6h, c_proj input 2h, bf16 softmax 2as (+ mask 1as and dropout output 2as); dropout masks
    1h after c_proj and after the MLP.
    e.g. sdpa, dropout, s32 b2 h64 a4 f128: 64 x (16 x 64 + 4 x 4 + 10 x 128 + 16 + 2 x 64) = 157,696;
    eager, dropout, same shape: 64 x (18 x 64 + 5 x 4 x 32 + 10 x 128 + 16) = 197,632."""
    measured = hf_measured(gpt2_config, impl, dropout, hidden, heads, ffn, seq, batch)
    h, a, f, s = hidden, heads, ffn, seq
    attention = 4 * a if impl == "sdpa" else 2 * a * s + dropout * 3 * a * s
    assert measured == seq * batch * (16 * h + attention + 10 * f + 16 + dropout * 2 * h)
    assert hf_planner_per_layer(gpt2_config, impl, dropout, hidden, heads, ffn, seq, batch) == \
        pytest.approx(measured, rel=0.02)


@pytest.mark.parametrize("hidden, heads, ffn, seq, batch", HF_SHAPES)
@pytest.mark.parametrize("dropout", [True, False])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_gpt_neox_layer_bf16(impl, dropout, hidden, heads, ffn, seq, batch):
    """GPTNeoXLayer per token (bf16, CUDA, parallel residual): the layer input 2h once (both norms read
    it) and two fp32 mean + rstd 16; both norms' outputs 4h; q and k after rotary (torch.cat copies)
    4h; dense input 2h; exact gelu keeps its input and dense_4h_to_h its output, 4f; SDPA: the whole
    query_key_value output 6h (v is a view of it), the flash output 2h ([b, a, s, d] like q, so dense
    reads a copy), lse 4a; eager: a v copy 2h, the fp32 softmax 4as and its bf16 cast 2as (with
    dropout: mask 1as and dropout output 2as instead of the cast); dropout masks 1h after attention
    and after the MLP.
    e.g. sdpa, dropout, s32 b2 h64 a4 f128: 64 x (22 x 64 + 4 x 4 + 4 x 128 + 16) = 124,928;
    eager, no dropout, same shape: 64 x (14 x 64 + 6 x 4 x 32 + 4 x 128 + 16) = 140,288."""
    measured = hf_measured(neox_config, impl, dropout, hidden, heads, ffn, seq, batch)
    h, a, f, s = hidden, heads, ffn, seq
    if impl == "sdpa":
        per_token = 20 * h + 4 * a + 4 * f + 16 + dropout * 2 * h
    else:
        per_token = 14 * h + 6 * a * s + 4 * f + 16 + dropout * (2 * h + a * s)
    assert measured == seq * batch * per_token
    assert hf_planner_per_layer(neox_config, impl, dropout, hidden, heads, ffn, seq, batch) == \
        pytest.approx(measured, rel=0.02)


@pytest.mark.parametrize("config", [gpt2_config, neox_config])
def test_hf_gpt_gradient_checkpointing_keeps_each_layer_input(config):
    measured = hf_measured(config, "sdpa", True, 64, 4, 128, 32, 2, checkpointing=True)
    assert measured == 32 * 2 * 2 * 64  # the layer's bf16 input, s b h x 2 bytes
    assert hf_planner_per_layer(config, "sdpa", True, 64, 4, 128, 32, 2, recompute="full") == measured


@pytest.mark.parametrize("config", [gpt2_config, neox_config])
def test_hf_gpt_final_norm_head_input_and_embedding_dropout(config):
    # s32 b2 h64 a4, dropout on: the model beyond its two layers keeps the int64 token ids (8 a token),
    # GPT-2's int64 position ids (1, s) or GPT-NeoX's rotary cos and sin (1, 1, s, 4: rotary_pct 0.25 of
    # head_dim 16, bf16), the embedding dropout's bf16 noise (CUDA: a 1-byte mask, embedding_dropout_bytes)
    # and the final LayerNorm's input 2h and bf16 mean + rstd (CUDA fp32: 8); lm_head's input (2h more)
    # is absent from AutoModel
    seq, batch, hidden, tokens = 32, 2, 64, 64
    two = hf_saved_bytes(config(2, "sdpa", hidden, 4, 128, 0.0, 0.1), seq, batch)
    layers = 2 * hf_layer_bytes(config(2, "sdpa", hidden, 4, 128, 0.0, 0.1), seq, batch)
    positions = 8 * seq if config is gpt2_config else 2 * seq * 4 * 2
    rest = two - layers - 8 * tokens - positions
    assert rest == tokens * (2 * hidden + 2 * 2 + 2 * hidden)
    cuda = hf_cuda_equivalent(rest, seq, batch, hidden, 4, 1, False) - 2 * (4 - 2) * tokens  # one norm, not two
    assert cuda == tokens * (2 * hidden + 8 + hidden)
    spec = from_hf_config(config(2, "sdpa", hidden, 4, 128, 0.1, 0.1))
    training = layout.Training(seq_len=seq, engine="deepspeed")
    lay = layout.single(mbs=batch)
    head = float(activations.head_input_bytes(Stage(spec, training, lay, 0))[0])
    embedding = float(activations.embedding_dropout_bytes(Stage(spec, training, lay, 0))[0])
    assert embedding == tokens * hidden
    assert head == cuda - embedding + tokens * 2 * hidden


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("config", [gpt2_config, neox_config])
def test_hf_gpt_batch_one(config, impl):
    """Micro-batch 1, s64 h64 a4 f128, dropout on. torch.matmul (aten native/LinearAlgebra.cpp
    _matmul_impl) folds [1, a, s, d] to [a, s, d] with reshape, which at batch 1 is a view of a
    transposed projection output instead of a copy: GPT-2's eager q, k^T and v then keep c_attn's
    whole output (6h, as the three copies did), GPT-NeoX's eager v keeps query_key_value's whole
    output, 6h instead of a 2h copy: 4h a token more at micro-batch 1, which hf_gpt_neox_saved books
    from the layout's micro-batch size (more cases in tests/test_activations_neox.py). Same bytes
    for SDPA and for GPT-2."""
    h, a, f, s, b = 64, 4, 128, 64, 1
    measured = hf_measured(config, impl, True, h, a, f, s, b)
    if config is gpt2_config:  # test_gpt2_layer_bf16's formula
        expected = 16 * h + (4 * a if impl == "sdpa" else 5 * a * s) + 10 * f + 16 + 2 * h
    else:  # test_gpt_neox_layer_bf16's, + 4h of v's view in eager
        expected = 22 * h + 4 * a + 4 * f + 16 if impl == "sdpa" else 16 * h + 7 * a * s + 4 * f + 16 + 4 * h
    assert measured == s * b * expected
    assert hf_planner_per_layer(config, impl, True, h, a, f, s, b) == pytest.approx(measured, rel=0.02)


# ---------------------------------------------------------------------------------------------
# transformers 5 sparse MoE decoder layers (planner/activations.py hf_moe_mlp_saved):
# MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock (shared expert and its sigmoid gate) and
# Qwen3MoeSparseMoeBlock, whose stacked experts run the default experts_implementation 'grouped_mm'
# (transformers integrations/moe.py grouped_mm_experts_forward): every (token, expert) pair is one
# row of one grouped_mm, k T rows whatever the routing, so the count does not depend on which experts
# the random router picks (the eager per-expert loop would add per-expert index tensors).
# At h 32, f 16 the smallest term (the 4-byte sum of the renormalized top-k weights) is over 0.2 %
# of a layer; the planner must equal the count exactly but for grouped_mm's int32 offsets (4E bytes
# per layer, not per token), so any coefficient off at all fails. Shapes move h, E, k, f and the
# shared expert's width one at a time.

MOE_BASE = dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16)
MOE_SEQ, MOE_BATCH = 16, 2
MOE_SHAPES = [  # (model_type, config changes)
    ("mixtral", {}),
    ("mixtral", {"hidden_size": 64}),  # h alone (head_dim fixed)
    ("mixtral", {"num_local_experts": 8}),  # E alone
    ("mixtral", {"num_experts_per_tok": 3}),  # k alone
    ("mixtral", {"intermediate_size": 48}),  # f alone
    ("qwen2_moe", {}),
    ("qwen2_moe", {"shared_expert_intermediate_size": 72}),  # shared f alone
    ("qwen2_moe", {"num_experts_per_tok": 3}),  # k with bf16 routing weights, no renormalization
    ("qwen3_moe", {}),  # norm_topk_prob True (Qwen3-30B-A3B's)
    ("qwen3_moe", {"norm_topk_prob": False}),  # Qwen3MoeConfig's default
]


def moe_config(model_type: str, change: dict, layers: int = 2) -> dict:
    routed = {"mixtral": dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=16),
              "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                shared_expert_intermediate_size=24, decoder_sparse_step=1, mlp_only_layers=[]),
              "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                norm_topk_prob=True)}[model_type]
    return {"model_type": model_type, **MOE_BASE, **routed, **change, "num_hidden_layers": layers,
            "vocab_size": 128, "max_position_embeddings": 128, "tie_word_embeddings": False,
            "attn_implementation": "sdpa"}


def moe_expected_per_token(model_type: str, cfg: dict, e: int = 2) -> int:
    """Bytes per token of one MoE decoder layer from the transformers 5.25 source, e bytes per element."""
    h, d, a, g = cfg["hidden_size"], cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    q, kv = a * d, g * d
    n = cfg.get("num_local_experts", cfg.get("num_experts"))
    k = cfg["num_experts_per_tok"]
    f = cfg.get("moe_intermediate_size", cfg.get("intermediate_size"))
    fs = cfg.get("shared_expert_intermediate_size", 0) if model_type == "qwen2_moe" else 0
    # test_sdpa_layer_bf16's layer without its MLP: two norms (fp32 input 4h, rstd 4, normalized input
    # and output e h each: 16h + 8 in bf16), q, k, v, out, fp32 lse; Qwen3's q/k norms (test_qwen3_layer_bf16)
    attention = 2 * (4 * h + 4 + 2 * e * h) + e * (2 * q + 2 * kv) + 4 * a
    if model_type == "qwen3_moe":
        attention += (4 + e) * (q + kv) + 4 * a + 4 * g
    router = 4 * n + 8 * k  # fp32 softmax output, int64 topk indices
    if model_type == "mixtral" or cfg.get("norm_topk_prob"):
        router += 4 * k + 4  # in-place div of the fp32 top-k weights: a clone of them and their sum
    # int64 perm // k, perm, inv_perm; gathered tokens e kh; gate_up 2e kf, act e kf, product e kf; down output e kh
    experts = 24 * k + e * (2 * k * h + 4 * k * f)
    experts += 4 * k if model_type == "mixtral" else e * k  # routing weights: fp32 (Mixtral) or the model's (Qwen)
    shared = e * (4 * fs + h + 1) if fs else 0  # Qwen2MoeMLP gate/up/act/product; its output; sigmoid
    return attention + router + experts + shared


@pytest.mark.parametrize("model_type, change", MOE_SHAPES)
def test_hf_moe_layer_bf16(model_type, change):
    cfg = moe_config(model_type, change)
    s, b = MOE_SEQ, MOE_BATCH
    measured = hf_layer_bytes(cfg, s, b, "bfloat16")
    n = cfg.get("num_local_experts", cfg.get("num_experts"))
    offsets = 4 * n  # grouped_mm's int32 offsets (E,), one per layer, shared by both grouped_mms
    assert measured == s * b * moe_expected_per_token(model_type, cfg) + offsets
    spec = from_hf_config(cfg)
    training = layout.Training(seq_len=s, precision="bf16", flash_attention=True, engine="deepspeed")
    planned = float(activations.kept_per_layer(spec, training, layout.single(mbs=b))[0])
    # norm_topk_prob off (Qwen3MoeConfig's default) keeps 4k + 4 bytes a token less: read from the config
    assert planned == measured - offsets
    assert planned == pytest.approx(measured, rel=0.02)


@pytest.mark.parametrize("model_type", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_hf_moe_layer_fp32(model_type):
    """fp32: the norms' casts are no-ops (input and normalized input kept, 4h each), Qwen's routing
    weights are fp32 like Mixtral's, every other term scales with the element size."""
    cfg = moe_config(model_type, {})
    s, b = MOE_SEQ, MOE_BATCH
    measured = hf_layer_bytes(cfg, s, b, "float32")
    offsets = 4 * cfg.get("num_local_experts", cfg.get("num_experts"))
    assert measured == s * b * moe_expected_per_token(model_type, cfg, e=4) + offsets
    training = layout.Training(seq_len=s, precision="fp32", flash_attention=True, engine="deepspeed")
    spec = from_hf_config(cfg)
    planned = float(activations.kept_per_layer(spec, training, layout.single(mbs=b))[0])
    # CUDA's math kernel for fp32 GQA (tests/cuda_sdpa.py)
    cuda = fp32_gqa_math_extra_bytes(spec.q_width, spec.kv_width, spec.attention_out_width, spec.heads, s, s * b)
    assert planned == measured - offsets + cuda
