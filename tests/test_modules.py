"""The user's modules apart from the engine (planner/modules.py), the terms llm-foundry's MPT adds, the
allocator's give-back at capacity and Megatron's sequence parallelism by default, each checked against
the code it reads or a published run."""

import numpy as np
import pytest

from planner import activations, api, layout, memory, saved
from planner.held import gathered_param_bytes
from planner.engines import Modules
from planner.errors import InputError
from planner.model import ModelSpec
from planner.modules import block_modules
from planner.stage import Stage

# MPT-7B as llm-foundry's benchmark tables give it (scripts/train/yamls/pretrain/mpt-7b.yaml: d_model 4096,
# n_heads 32, n_layers 32, expansion_ratio 4, vocab 50368), as a shape given by flags
H, L, V, A = 4096, 32, 50368, 32
MPT7B = ModelSpec(layers=L, hidden=H, heads=A, kv_heads=A, ffn=4 * H, ffn_kind="gelu", vocab=V)
MPT7B_FLAGS = {"layers": L, "hidden": H, "heads": A, "ffn_kind": "gelu", "vocab": V}


def test_a_gelu_shape_given_by_flags_trains_llm_foundry_modules_under_hugging_face_engines():
    fsdp = layout.Training(engine="fsdp")
    assert block_modules(MPT7B, fsdp) is Modules.LLM_FOUNDRY
    assert block_modules(MPT7B, layout.Training(engine="megatron")) is Modules.MEGATRON
    llama = ModelSpec(layers=2, hidden=H, heads=A, kv_heads=8, ffn=14336, vocab=V)
    assert block_modules(llama, fsdp) is Modules.HUGGING_FACE
    assert block_modules(MPT7B, layout.Training(engine="fsdp", modules="hf")) is Modules.HUGGING_FACE
    est = api.estimate(MPT7B_FLAGS, {"gpus": 8}, {"engine": "fsdp"}, {"zero": 3})
    assert est.defaults["modules"] == "llm-foundry"
    with pytest.raises(InputError, match="--modules"):
        layout.Training(engine="megatron", modules="llm-foundry")


def test_llm_foundry_mpt_block_saves_32h_plus_lse_per_token():
    # llm-foundry 5e85bd62d MPTBlock with triton attention, bf16, MHA: norm_1's input copy 2h + fp32
    # mean/rstd 8, Wqkv's input 2h, Wqkv's output 6h (FlashAttnFunc keeps q, k, v as its views), the
    # attention output 2h (out_proj's input, a view) and fp32 lse 4a, norm_2 2h + 8, up_proj's input 2h,
    # GELU's input 2 x 4h, down_proj's input 2 x 4h
    per_token = sum(x.bytes_per_token for x in saved.llm_foundry_mpt_saved(MPT7B, layout.Training(engine="fsdp")))
    assert per_token == 32 * H + 4 * A + 16
    # the whole block of one 2048-token micro-batch, as layer_bytes splits nothing at tp 1
    whole = activations.kept_per_layer(MPT7B, layout.Training(seq_len=2048, engine="fsdp"), layout.single())[0]
    assert whole == 2048 * (32 * H + 4 * A + 16)


def test_llm_foundry_loss_holds_16_bit_logits_and_their_gradient():
    # flash_attn losses/cross_entropy.py: saves the bf16 logits, backward writes bf16 dlogits: 2 + 2 B
    coef = memory.coefficients("memory")
    assert memory.loss_bytes_per_logit(MPT7B, layout.Training(engine="fsdp"), coef) == 4
    assert memory.loss_bytes_per_logit(MPT7B, layout.Training(engine="fsdp", modules="hf"), coef) == 12


def test_autocast_keeps_a_16_bit_copy_of_every_weight_its_forward_cast():
    # Composer DEFAULT mixed precision: fp32 parameters, autocast casts each Linear's weight to bf16 and
    # autograd keeps the cast: per block 12h^2 (Wqkv 3h^2, out_proj h^2, up 4h^2, down 4h^2) + its two norm
    # weights 2h, 32 blocks, and the untied output layer's V x h, 2 B each
    training = layout.Training(seq_len=2048, engine="fsdp")
    last = np.zeros(1, dtype=np.int64)
    kept = memory.autocast_weight_bytes(Stage(MPT7B, training, layout.single(zero=3), last))[0]
    assert kept == 2 * (L * (12 * H * H + 2 * H) + V * H)
    # under full recompute only the block recomputing in backward holds its cast
    one = memory.autocast_weight_bytes(Stage(MPT7B, training, layout.single(zero=3, recompute="full"), last))[0]
    assert one == 2 * ((12 * H * H + 2 * H) + V * H)
    assert memory.autocast_weight_bytes(Stage(MPT7B, layout.Training(engine="fsdp", modules="hf"), layout.single(zero=3), last))[0] == 0


def test_mpt_7b_on_256_h100_at_micro_batch_6_fits_as_it_ran():
    # llm-foundry benchmarking README (4952183), H100 80GB BF16 large scale: MPT-7B, 256 GPUs, seq 2048,
    # micro-batch 6, FSDP FULL_SHARD, no activation checkpointing: it ran
    est = api.estimate(MPT7B_FLAGS, {"gpus": 256, "gpu": "h100-sxm"},
                       {"engine": "fsdp", "seq_len": 2048, "gbs": 1536}, {"zero": 3, "mbs": 6})
    mem = est.record["memory"]
    assert mem["verdict"] != "oom"
    # the fit is decided on what is allocated (the allocator frees its cache before it raises OOM), not
    # on the reserve it keeps with room to spare, which here would reach the card's whole memory
    outside = mem["required_bytes"] - mem["allocated_bytes"]
    reserve = memory.reserved_bytes(mem["allocated_bytes"], memory.coefficients("memory"))
    assert mem["required_bytes"] < mem["capacity_bytes"] < reserve + outside
    assert mem["gpu_bytes"] == mem["capacity_bytes"]  # the device fills up to its limit


def test_the_reserve_is_reported_where_the_device_has_room():
    # below capacity the device holds the allocator's reserve: allocated x (1 + allocator_fragmentation)
    est = api.estimate("llama-3-8b", {"gpus": 8, "gpu": "h100-sxm"}, {"engine": "fsdp", "seq_len": 1024},
                       {"zero": 3, "mbs": 1})
    mem = est.record["memory"]
    frag = memory.coefficients("memory")["allocator_fragmentation"]
    assert mem["reserved_bytes"] == pytest.approx(mem["allocated_bytes"] * (1 + frag), rel=1e-9)
    assert mem["gpu_bytes"] > mem["required_bytes"]


def test_megatron_runs_sequence_parallel_with_tp_by_default():
    # NeMo 2 recipes (llama3_70b.py, gpt3_175b.py pretrain_recipe): sequence_parallel=True with their TP
    est = api.estimate("llama-3-70b", {"gpus": 16}, {"engine": "megatron", "gbs": 64}, {"tp": 8, "pp": 2})
    assert est.record["layout"]["sequence_parallel"] and est.defaults["sequence_parallel"] is True
    off = api.estimate("llama-3-70b", {"gpus": 16}, {"engine": "megatron", "gbs": 64},
                       {"tp": 8, "pp": 2, "sequence_parallel": False})
    assert not off.record["layout"]["sequence_parallel"] and "sequence_parallel" not in off.defaults
    dsm = api.estimate("llama-3-70b", {"gpus": 16}, {"engine": "megatron-deepspeed", "gbs": 64}, {"tp": 8, "pp": 2})
    assert not dsm.record["layout"]["sequence_parallel"]


def test_megatron_readme_462b_fits_as_it_ran():
    # Megatron-LM README, 'Training Speed and Scalability' (model_table.png, Megatron-Core r0.8.0): 462B,
    # 112 layers, h 18432, 144 heads, seq 4096, vocab 131072, 6144 H100, tp 8, pp 16, batch 3072, run with
    # --tp-comm-overlap, which needs sequence parallelism; without it the activations alone overflow
    shape = {"layers": 112, "hidden": 18432, "heads": 144, "ffn_kind": "gelu", "vocab": 131072}
    run = ({"gpus": 6144, "gpu": "h100-sxm"}, {"engine": "megatron", "seq_len": 4096, "gbs": 3072})
    est = api.estimate(shape, *run, {"tp": 8, "pp": 16, "zero": 1})
    assert est.record["memory"]["verdict"] != "oom"
    no_sp = api.estimate(shape, *run, {"tp": 8, "pp": 16, "zero": 1, "sequence_parallel": False})
    assert no_sp.record["memory"]["verdict"] == "oom"


def test_liger_keeps_16_bit_norm_inputs_and_recomputes_silu():
    # liger_kernel 0.8.5 apply_liger_kernel_to_llama: LigerRMSNorm keeps X (2h) and an fp32 rstd (4) where
    # transformers keeps the fp32 input 4h, rstd 4 and the normalized 2h; LigerSiLUMulFunction keeps gate and
    # up (4f) where LlamaMLP also keeps act(gate) (2f): Llama 3 8B, h 4096, q 4096, kv 1024, a 32, f 14336
    from planner.model import lookup

    m = lookup("llama-3-8b")
    liger = sum(x.bytes_per_token for x in saved.hf_liger_llama_saved(m, layout.Training(engine="fsdp"), 4096))
    assert liger == 8 * 4096 + 4 * 4096 + 4 * 1024 + 4 * 32 + 6 * 14336 + 8
    hf = sum(x.bytes_per_token for x in saved.hf_llama_saved(m, layout.Training(engine="fsdp"), 4096))
    assert hf - liger == 8 * 4096 + 2 * 14336
    with pytest.raises(InputError, match="--modules hf-liger"):
        api.estimate("mixtral-8x7b", {"gpus": 8}, {"engine": "fsdp", "modules": "hf-liger"}, {"zero": 3})


def test_liger_fused_linear_cross_entropy_holds_one_chunk_of_logits():
    # ops/fused_linear_cross_entropy.py: BT 4096, V 128256, H 4096: inc_factor ceil(V / H) = 32, chunk
    # next_power_of_2(4096 / 32) = 128 rows of bf16 logits, grad_input BT x H, grad_weight V x H (bf16),
    # fp32 loss per token; against transformers' 12 B per logit over all of BT x V
    from planner.model import lookup

    m = lookup("llama-3-8b")
    last = np.zeros(1, dtype=np.int64)
    held = memory.liger_fused_loss_bytes(Stage(m, layout.Training(seq_len=4096, engine="fsdp", modules="hf-liger"), layout.single(), last))[0]
    assert held == 2 * 128 * 128256 + 2 * 4096 * 4096 + 2 * 128256 * 4096 + 4 * 4096
    est = api.estimate("llama-3-8b", {"gpus": 8}, {"engine": "fsdp", "modules": "hf-liger", "seq_len": 4096}, {"zero": 3})
    assert est.record["memory"]["breakdown"]["logits"] == held


def test_megatron_grads_in_bf16_where_the_user_asks(tmp_path):
    # Megatron-LM training/arguments.py: bf16 keeps fp32 main grads unless --grad-reduce-in-bf16 (NeMo's
    # performance recipes: grad_reduce_in_fp32 False); Llama 3 8B whole on one rank: 4 B vs 2 B a parameter
    from planner import export

    fp32 = api.estimate("llama-3-8b", {"gpus": 8}, {"engine": "megatron"}, {"zero": 1})
    bf16 = api.estimate("llama-3-8b", {"gpus": 8}, {"engine": "megatron", "grad_reduce_in_bf16": True}, {"zero": 1})
    params = fp32.model.params
    assert fp32.record["memory"]["breakdown"]["grads"] == 4 * params
    assert bf16.record["memory"]["breakdown"]["grads"] == 2 * params
    with pytest.raises(InputError, match="--grad-reduce-in-bf16"):
        layout.Training(engine="deepspeed", grad_reduce_in_bf16=True)
    files = export.emit(tmp_path, bf16.model, bf16.cluster, bf16.training, bf16.record["layout"])
    assert "--grad-reduce-in-bf16" in (tmp_path / "megatron_args.txt").read_text() and files


def test_megatron_deepspeed_partitions_checkpoints_only_when_asked(tmp_path):
    # DeepSpeed's activation_checkpointing config and Megatron-DeepSpeed's --partition-activations (store_true,
    # applied by deepspeed.checkpointing.configure over the config's key) are off unless set: each TP rank keeps
    # its checkpointed inputs whole; asked for, the export passes the flag Megatron-DeepSpeed reads
    from planner import export

    def est(**training):
        return api.estimate("llama-3-8b", {"gpus": 8}, {"engine": "megatron-deepspeed", "gbs": 8, **training},
                            {"tp": 2, "recompute": "full", "zero": 1})

    whole, split = est(), est(partition_activations=True)
    # 32 layers x 4096 tokens x 4096 x 2 B, half of it on the other TP rank
    assert whole.record["memory"]["breakdown"]["activations"] - split.record["memory"]["breakdown"]["activations"] \
        == 32 * 4096 * 4096 * 2 // 2
    export.emit(tmp_path / "on", split.model, split.cluster, split.training, split.record["layout"])
    export.emit(tmp_path / "off", whole.model, whole.cluster, whole.training, whole.record["layout"])
    assert "--partition-activations" in (tmp_path / "on" / "megatron_args.txt").read_text()
    assert "--partition-activations" not in (tmp_path / "off" / "megatron_args.txt").read_text()


def test_composer_pure_mixed_precision_keeps_no_fp32_parameters():
    # Composer get_mixed_precision 'PURE': 16-bit parameters, so FSDP gathers 2 B a parameter and autocast
    # has nothing to cast (no weight copies kept); 'DEFAULT' gathers the fp32 parameters (4 B)
    pure = layout.Training(seq_len=2048, engine="fsdp", fsdp_mixed_precision="pure")
    default = layout.Training(seq_len=2048, engine="fsdp")
    assert gathered_param_bytes(MPT7B, pure) == 2 and gathered_param_bytes(MPT7B, default) == 4
    last = np.zeros(1, dtype=np.int64)
    assert memory.autocast_weight_bytes(Stage(MPT7B, pure, layout.single(zero=3), last))[0] == 0
    with pytest.raises(InputError, match="--fsdp-mixed-precision"):
        api.estimate("llama-3-8b", {"gpus": 8}, {"engine": "fsdp", "fsdp_mixed_precision": "pure"}, {"zero": 3})
    with pytest.raises(InputError, match="--fsdp-mixed-precision"):
        layout.Training(engine="fsdp", fsdp_mixed_precision="bf16")


def test_deepspeed_keeps_its_own_16_bit_parameters_under_llm_foundry_modules():
    # Composer's mixed precision is an FSDP setting: DeepSpeed's bf16 engine holds 16-bit parameters itself,
    # so llm-foundry's modules there gather 2 B and keep no autocast weight casts
    ds = layout.Training(seq_len=2048, engine="deepspeed")
    assert block_modules(MPT7B, ds) is Modules.LLM_FOUNDRY
    assert gathered_param_bytes(MPT7B, ds) == 2
    assert memory.autocast_weight_bytes(Stage(MPT7B, ds, layout.single(zero=3), np.zeros(1, dtype=np.int64)))[0] == 0
    with pytest.raises(InputError, match="--fsdp-mixed-precision"):
        api.estimate(MPT7B_FLAGS, {"gpus": 8}, {"engine": "deepspeed", "fsdp_mixed_precision": "pure"}, {"zero": 3})


def test_megatron_deepspeed_refuses_its_cp_beside_sequence_parallelism():
    # microsoft/Megatron-DeepSpeed megatron/initialize.py _initialize_distributed: ds_sequence_parallel_size > 1
    # with --sequence-parallel raises RuntimeError, so no such layout is estimated, searched or exported
    with pytest.raises(InputError, match="--sequence-parallel: --engine megatron-deepspeed's --cp"):
        api.estimate("llama-3-8b", {"gpus": 8}, {"engine": "megatron-deepspeed"},
                     {"tp": 2, "cp": 2, "sequence_parallel": True})
    rec = api.recommend(70e9, {"gpus": 16}, {"engine": "megatron-deepspeed"}, top=20)
    assert rec.layouts and not any(r["layout"]["cp"] > 1 and r["layout"]["sequence_parallel"] for r in rec.layouts)
    # Megatron-Core's CP runs beside its SP
    assert api.estimate("llama-3-8b", {"gpus": 8}, {"engine": "megatron"},
                        {"tp": 2, "cp": 2, "sequence_parallel": True}).record["layout"]["sequence_parallel"]
