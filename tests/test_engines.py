"""Engines as data: the search's rules come from the engine records, and the torchtitan engine's
mechanisms (read from torchtitan 0.3.0 and torch 2.13) hold their figures."""

import io
import json

import numpy as np
import pytest

from planner import activations, cli, hardware, layout, memory, states, pipeline, search, sharding, timing
from planner.engines import ENGINES, TORCHTITAN
from planner.errors import InputError
from planner.model import lookup
from planner.options import Offload, Schedule
from planner.rules import check_single
from planner.engines.megatron.export import pipeline_layout
from planner.stage import Stage

H100 = hardware.lookup_gpu("h100-sxm")


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_search_obeys_and_reaches_every_engine_record(name):
    # a small model on 16 GPUs: every valid layout keeps to the record, and every combination the
    # record allows is reached by some valid layout (the rules neither leak nor over-reject)
    engine = ENGINES[name]
    model = lookup("llama-2-7b")
    res = search.search(model, hardware.Cluster(H100, 16, 8), layout.Training(gbs=64, engine=name))
    v = res.valid
    pp = v.pp > 1
    assert set(np.unique(v.zero)) == set(engine.zero_stages)
    assert set(np.unique(v.zero[pp])) == set(engine.pipeline_zero_stages)
    searched = {s for s in engine.pipeline_schedules if s != Schedule.GPIPE}  # GPipe: 1F1B's bubble, more memory
    if Schedule.ZB_H1 in searched:  # ZB-H1: 1F1B's memory, a smaller bubble, so it takes 1F1B's place
        searched.discard(Schedule.ONE_F_ONE_B)
    assert set(np.unique(v.schedule[pp])) == searched
    assert ((v.tp > 1) | (v.cp > 1)).any() == engine.tensor_parallel
    assert set(np.unique(v.offload_optimizer)) == {Offload.NONE, *engine.offload_devices}
    if engine.offload_together:
        assert (v.offload_optimizer == v.offload_params).all()


def test_one_layout_breaking_an_engine_rule_names_its_flag():
    model, c = lookup("llama-2-7b"), hardware.Cluster(H100, 16, 8)
    cases = [("fsdp", dict(pp=2, dp=8), "--pp"), ("deepspeed", dict(tp=2, dp=8), "--tp"),
             ("megatron", dict(dp=16, zero=2), "--zero"), ("deepspeed", dict(pp=2, dp=8, zero=2), "--zero"),
             ("deepspeed", dict(pp=2, vpp=2, dp=8), "--vpp"), ("megatron", dict(dp=16, zero=1, offload_optimizer="nvme"),
                                                                "--offload"),
             ("megatron", dict(dp=16, zero=1, offload_params="cpu"), "--offload-params")]
    for engine, kw, flag in cases:
        with pytest.raises(InputError, match=flag):
            check_single(model, c, layout.Training(gbs=64, engine=engine), layout.single(**kw))
    # torchtitan composes FSDP with pipeline stages, which the fsdp engine forbids
    check_single(model, c, layout.Training(gbs=64, engine="torchtitan"), layout.single(pp=2, dp=8, zero=3))


# ---------------------------------------------------------------------------------------------
# torchtitan 0.3.0


def test_torchtitan_pipeline_split_gives_the_edges_fewer_layers():
    # torchtitan distributed/pipeline_parallel.py _generate_llm_fqn_per_model_part with its defaults
    # (first/last_stage_less_layers = 1), as run on torchtitan 0.3.0: 32 layers on 4 stages ->
    # 8, 9, 8, 7; 80 on 8 -> 10, 11, 10, 10, 10, 10, 10, 9; 126 on 16 -> 7, 8 x 14, 7
    def split(layers, p):
        return [int(pipeline.layers_on_stage(layers, p, i, TORCHTITAN.pipeline_edge_layers)) for i in range(p)]

    assert split(32, 4) == [8, 9, 8, 7]
    assert split(80, 8) == [10, 11, 10, 10, 10, 10, 10, 9]
    assert split(126, 16) == [7] + [8] * 14 + [7]
    assert int(pipeline.max_layers_on_stage(32, np.array([4]), 1)[0]) == 9


def test_megatron_accounts_for_embedding_and_loss_in_the_pipeline_split():
    # Llama 3 405B (126 blocks) on 16 stages as Meta ran it (Dubey et al. 2024, "The Llama 3 Herd of
    # Models", section 3.3.2: one block fewer on the first and on the last stage): Megatron-LM 0.19.2
    # --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split count the
    # embedding and the loss as a block each, (126 + 2)/16 = 8 slots a stage: 7, 8 x 14, 7
    m = lookup("llama-3.1-405b")
    edges = layout.Training(seq_len=8192, engine="megatron", pipeline_edge_layers=1)
    assert [int(pipeline.layers_on_stage(126, 16, i, edges.pipeline_edge_layers)) for i in range(16)] == [7] + [8] * 14 + [7]
    # and lets them interleave: 128 slots over 16 x 2 chunks of 4, where 126 blocks alone do not divide
    lay = layout.single(tp=8, pp=16, dp=64, vpp=2, zero=1, sequence_parallel=True, gas=32)
    check_single(m, hardware.Cluster(hardware.lookup_gpu("h100-sxm"), 8192, 8), edges, lay)
    # without them, 126 blocks over 32 chunks run as a --pipeline-model-parallel-layout (Engine.pipeline_layout):
    # 30 chunks of 4 blocks and 2 of 3, E first and L last, 32 entries
    plain = layout.Training(seq_len=8192, engine="megatron")
    check_single(m, hardware.Cluster(hardware.lookup_gpu("h100-sxm"), 8192, 8), plain, lay)
    entries = pipeline_layout(m, plain, 16, 2).split("|")
    assert [e.count("t") for e in entries] == [4] * 30 + [3] * 2 and entries[0][0] == "E" and entries[-1][-1] == "L"
    assert pipeline_layout(m, edges, 16, 2) is None  # (126 + 2) / 32 divides: --account-for-* flags instead
    # 16 x 8 chunks of one slot each: stage 0's first chunk holds the embedding and builds no block,
    # which megatron-core allows (0.16.1 transformer_block.py get_num_layers_to_build asserts >= 0);
    # without the edge slots 128 chunks exceed the 126 blocks
    eight = layout.single(tp=8, pp=16, dp=64, vpp=8, zero=1, sequence_parallel=True, gas=32)
    check_single(m, hardware.Cluster(hardware.lookup_gpu("h100-sxm"), 8192, 8), edges, eight)
    with pytest.raises(InputError, match="--pp\\*--vpp: must not exceed the layer count 126"):
        check_single(m, hardware.Cluster(hardware.lookup_gpu("h100-sxm"), 8192, 8),
                     layout.Training(seq_len=8192, engine="megatron"), eight)
    # stage 0 holds 7 blocks, a middle stage 8: its parameters are 8/7 of stage 0's blocks'
    p0 = sharding.rank_params(Stage(m, edges, lay, 0))[0]
    p1 = sharding.rank_params(Stage(m, edges, lay, 1))[0]
    block = m.layer_params / 8  # a block's parameters over the 8 TP ranks
    assert p1 - (p0 - m.embedding_params / 8) == pytest.approx(block, rel=0.01)  # one more block, no embedding
    # engines that split blocks evenly refuse the switch, in one line naming it
    with pytest.raises(InputError, match="--pp-edge-layers"):
        layout.Training(engine="deepspeed", pipeline_edge_layers=1)


def test_torchtitan_op_sac_keeps_inputs_and_every_other_matmul():
    # Llama-3-8B block, s 8192, b 1, bf16, no TP: SelectiveAC saves the block input (2h), the fused
    # wqkv's output (2(q + 2kv)), FlexAttention's output (2q) with its fp32 logsumexp and max_scores
    # (8a), w1's output (2f) and w2's output (2h); wo and w3 (the 2nd and 4th matmuls) are recomputed
    m = lookup("llama-3-8b")
    training = layout.Training(seq_len=8192, engine="torchtitan")
    per_token = 2 * 4096 + 2 * (4096 + 2 * 1024) + 2 * 4096 + 8 * 32 + 2 * 14336 + 2 * 4096  # 65,792 B
    kept = activations.kept_per_layer(m, training, layout.single(recompute="selective"))[0]
    assert kept == 8192 * per_token
    # no recompute (torchtitan's eager block, counted in tests/test_activations_real.py): two norm inputs and
    # their fp32 rstd, the norm outputs wqkv and w1/w3 read, q k v, the attention output with its 8a,
    # and w1's, silu's, w3's outputs and w2's input: 8h + 4q + 4kv + 8a + 8f + 8 = 168,200 B/token
    whole = activations.kept_per_layer(m, training, layout.single(recompute="none"))[0]
    assert whole == 8192 * (8 * 4096 + 4 * 4096 + 4 * 1024 + 8 * 32 + 8 * 14336 + 8)


def test_torchtitan_chunked_loss_holds_one_chunk_of_logits():
    # components/loss.py ChunkedLossWrapper, 8 chunks: one chunk's logits at aten cross_entropy's
    # backward peak (12 B per logit, measured in tests/test_activations_real.py) and a [B, L, D] fp32
    # gradient buffer, vs Megatron's whole micro-batch at VocabParallelCrossEntropy's 10 B
    m = lookup("llama-3-8b")
    lay = layout.single()
    coef = memory.coefficients("memory")
    titan, megatron = layout.Training(seq_len=8192, engine="torchtitan"), layout.Training(seq_len=8192, engine="megatron")
    tt = activations.logits_bytes(Stage(m, titan, lay, np.zeros(1)), memory.loss_bytes_per_logit(m, titan, coef))[0]
    mg = activations.logits_bytes(Stage(m, megatron, lay, np.zeros(1)), memory.loss_bytes_per_logit(m, megatron, coef))[0]
    assert mg == 10 * 8192 * 128256
    assert tt == 12 * 8192 * 128256 / 8 + 4 * 8192 * 4096


def test_torchtitan_pipeline_keeps_gradients_unsharded_until_the_schedule_ends():
    # torch/distributed/pipelining/stage.py backward_maybe_with_nosync: FSDP modules get
    # set_requires_gradient_sync(False) and set_reshard_after_backward(False) until perform_reduce_grad
    # after the last micro-batch; _fsdp_param.py to_accumulated_grad_if_needed keeps them in the
    # fp32 reduce dtype: 4 B/param of the stage during backward, parameters gathered (2 B/param),
    # one reduction per step. Without a pipeline FSDP reduce-scatters every backward.
    m = lookup("llama-3-8b")
    training = layout.Training(engine="torchtitan")
    piped = layout.single(pp=2, dp=4, zero=3, gas=8)
    dense, _ = sharding.rank_params(Stage(m, training, piped, 0))
    assert states.grad_bytes(Stage(m, training, piped, 0))[0] == 4 * dense[0]
    assert states.weight_bytes(Stage(m, training, piped, 0))[0] == 2 * dense[0]
    assert states.grad_bytes(Stage(m, training, piped, 0), at_step=True)[0] == pytest.approx(4 * dense[0] / 4)
    assert timing.grad_reductions_per_step(training, piped)[0] == 1
    flat = layout.single(dp=8, zero=3, gas=8)
    assert timing.grad_reductions_per_step(training, flat)[0] == 8


def test_recommend_with_the_torchtitan_engine():
    out = io.StringIO()
    assert cli.main(["recommend", "--model", "llama-3-70b", "--gpus", "64", "--engine", "torchtitan", "--json",
                     "--top", "3"], out=out) == 0
    d = json.loads(out.getvalue())
    assert d["assumptions"]["engine"] == "torchtitan" and d["layouts"]
    assert all(r["memory"]["fits"] and r["layout"]["zero"] in (0, 2, 3) for r in d["layouts"])


def test_torchtitan_pipeline_keeps_receive_buffers_per_microbatch():
    # torch.distributed.pipelining PipelineStage: a middle stage of 4 keeps m activation and m gradient
    # receive buffers (counted on the real engine in tests/test_torch_pipelining_real.py). Llama-3-8B,
    # s 8192, mbs 1, bf16: a boundary tensor is 8192 x 4096 x 2 = 64 MiB; m 16: 32 x 64 MiB = 2 GiB
    from dataclasses import replace

    m = lookup("llama-3-8b")
    lay = layout.single(pp=4, gas=16, recompute="full")
    titan = layout.Training(seq_len=8192, engine="torchtitan")
    without = layout.Training(seq_len=8192, engine=replace(TORCHTITAN, pipeline_p2p_buffers=False))
    extra = activations.stage_activation_bytes(Stage(m, titan, lay, 1))[0] - activations.stage_activation_bytes(Stage(m, without, lay, 1))[0]
    assert extra == 32 * 64 * 2**20
    # the first stage receives gradients only: 16 x 64 MiB
    first = activations.stage_activation_bytes(Stage(m, titan, lay, 0))[0] - activations.stage_activation_bytes(Stage(m, without, lay, 0))[0]
    assert first == 16 * 64 * 2**20


def test_deepspeed_moe_keeps_experts_whole_on_every_tp_rank():
    # DeepSpeed's MoE layer (what Megatron-DeepSpeed builds) defaults to no expert tensor parallelism:
    # each TP rank holds its local experts whole and runs them on 1/t of the tokens; megatron-core's
    # expert TP defaults to the TP size. Mixtral 8x7B, tp 2, ep 8: a layer's experts are 8 x 3 x 4096
    # x 14336 = 1,409,286,144 elements, one expert each rank: 176,160,768 whole, 88,080,384 split
    import inspect

    from deepspeed.moe.layer import MoE

    assert inspect.signature(MoE.__init__).parameters["enable_expert_tensor_parallelism"].default is False
    m = lookup("mixtral-8x7b")
    lay = layout.single(tp=2, dp=8, ep=8)
    mds, mlm = layout.Training(engine="megatron-deepspeed"), layout.Training(engine="megatron")
    per_layer_mds = sharding.rank_params(Stage(m, mds, lay, 0))[1][0] / 32  # 32 layers
    per_layer_mlm = sharding.rank_params(Stage(m, mlm, lay, 0))[1][0] / 32
    assert per_layer_mds == 3 * 4096 * 14336  # one whole expert
    assert per_layer_mlm == 3 * 4096 * 14336 / 2  # its TP half
    # the dense part is split alike
    assert sharding.rank_params(Stage(m, mds, lay, 0))[0][0] == sharding.rank_params(Stage(m, mlm, lay, 0))[0][0]


def test_hugging_face_engines_offer_no_expert_parallelism():
    """Their exported configs launch none: DeepSpeed's AutoEP fails to initialize with transformers 5.25
    (test below), and accelerate's FSDP shards every unit over the data-parallel ranks. Mixtral 8x7B on 8
    GPUs under DeepSpeed: the search ranked tp1 pp1 ep2 dp8 z3 first before the rule."""
    from planner import api

    for engine in ("deepspeed", "fsdp"):
        rec = api.recommend("mixtral-8x7b", {"gpus": 8}, {"engine": engine}, top=40)
        assert rec.layouts and all(row["layout"]["ep"] == 1 for row in rec.layouts)
        with pytest.raises(InputError, match="--ep: --engine " + engine):
            api.estimate("mixtral-8x7b", {"gpus": 8}, {"engine": engine}, {"dp": 8, "ep": 2, "zero": 3})
    assert api.recommend("mixtral-8x7b", {"gpus": 8}, {"engine": "torchtitan"}, pinned={"ep": 2}, top=1).layouts


@pytest.mark.slow
def test_deepspeed_autoep_does_not_initialize_with_the_installed_transformers():
    """DeepSpeed 0.19.8's AutoEP on 2 gloo ranks, a 4-expert Mixtral, ZeRO-3: deepspeed.initialize raises in
    auto_ep_presets/base.py (_CanRecordRegistry.get of transformers 5.25 takes one argument). When an upgrade
    makes this launch, export ds_config "expert_parallel" and set the deepspeed engine's expert_parallel."""
    from calibrate.harness.launch import launch

    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
          "zero_allow_untested_optimizer": True, "zero_optimization": {"stage": 3},
          "expert_parallel": {"enabled": True, "autoep_size": 2, "preset_model": "mixtral"}}
    out = launch("calibrate.engines.deepspeed_autoep_worker", [json.dumps(ds)], nproc=2, launcher="deepspeed",
                 env={"DS_ACCELERATOR": "cpu"}, timeout_s=300)
    assert out.status == "ok" and len(out.ranks) == 2, out.log_tail
    assert not any(r["initialized"] for r in out.ranks), out.ranks
    assert all("_CanRecordRegistry.get()" in r["error"] for r in out.ranks)


def test_megatron_gradients_are_its_fp32_buffer_whole_on_every_rank():
    """megatron-core 0.16.1 DistributedDataParallel on one gloo rank (python -m calibrate.engines.megatron_grad_buffer):
    with grad_reduce_in_fp32, which Megatron-LM sets for bf16, every parameter's main_grad is a float32 view
    of one contiguous buffer of the rank's whole model (12,448 elements padded to 12,544 = 98 x 128), the
    distributed optimizer notwithstanding; without it, bf16. The planner's Megatron gradients: 4 B per
    parameter of the rank, unsharded at ZeRO-1 (the gap to megatron-deepspeed's bf16 ZeRO-1 gradients,
    2 B, is this buffer's dtype)."""
    import subprocess
    import sys
    from pathlib import Path

    proc = subprocess.run([sys.executable, "-m", "calibrate.engines.megatron_grad_buffer"], capture_output=True,
                          text=True, timeout=300, cwd=str(Path(__file__).resolve().parents[1]))
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["megatron_core"] == "0.16.1" and got["params"] == 64 * 96 + 96 + 96 * 64 + 64
    fp32, bf16 = got["grad_reduce_in_fp32=True"], got["grad_reduce_in_fp32=False"]
    assert {d for d, _ in fp32["main_grad"].values()} == {"torch.float32"}
    assert {d for d, _ in bf16["main_grad"].values()} == {"torch.bfloat16"}
    (dtype, numel, size), = fp32["buffers"]
    assert size == 4 and got["params"] <= numel < got["params"] + 128  # padded to a multiple of 128
    model, lay = lookup("llama-3-8b"), layout.single(dp=8, zero=1)
    for engine, per_param in (("megatron", 4.0), ("megatron-deepspeed", 2.0)):
        training = layout.Training(engine=engine, precision="bf16")
        dense, expert = sharding.rank_params(Stage(model, training, lay, 0))
        assert states.grad_bytes(Stage(model, training, lay, 0))[0] == pytest.approx(per_param * (dense + expert)[0])


def test_megatron_bf16_states_are_its_precision_aware_optimizer(tmp_path):
    """--precision bf16-pure under Megatron is megatron-core's precision-aware optimizer with bf16 main
    grads and moments (Megatron-LM training/arguments.py --main-grads-dtype bf16 --exp-avg-dtype bf16
    --exp-avg-sq-dtype bf16) and the fp32 master kept as 16-bit remainders (optimizer_config.py
    store_param_remainders): per parameter 2 B weight + 2 B grad + (2 + 2 + 2) B / dp of optimizer,
    against 2 + 4 + 12 / dp with --bf16 alone. It needs the distributed optimizer."""
    from planner import api, export

    def per_param(precision):
        e = api.estimate("llama-3-8b", {"gpus": 8}, {"engine": "megatron", "precision": precision, "gbs": 8},
                         {"zero": 1, "recompute": "full"})
        b, p = e.memory["breakdown"], e.model.params
        return e, (b["params"] / p, b["grads"] / p, b["optimizer"] / p)

    assert per_param("bf16")[1] == pytest.approx((2, 4, 12 / 8), rel=1e-6)
    e, pure = per_param("bf16-pure")
    assert pure == pytest.approx((2, 2, 6 / 8), rel=1e-6)
    args = export.megatron_args(e.model, e.training, e.record["layout"])
    for flag in ("--bf16", "--use-distributed-optimizer", "--use-precision-aware-optimizer", "--main-grads-dtype bf16",
                 "--exp-avg-dtype bf16", "--exp-avg-sq-dtype bf16"):
        assert flag in args, flag
    with pytest.raises(InputError, match="--precision bf16-pure.*--zero 1"):
        api.estimate("llama-3-8b", {"gpus": 8}, {"engine": "megatron", "precision": "bf16-pure"}, {"zero": 0})


def test_deepspeed_pure_bf16_needs_zero_as_deepspeed_asserts():
    """DeepSpeed's own DeepSpeedConfig refuses bf16 master weights and optimizer states at ZeRO stage 0
    and accepts them at 1; the planner refuses --precision bf16-pure at --zero 0 for its DeepSpeed
    engines (a stage-0 run would keep BF16_Optimizer's fp32 master) and still plans it under FSDP."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig

    from planner import api

    cfg = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8,
           "bf16": {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}}
    with pytest.raises(AssertionError, match="ZeRO Stage 1, 2, or 3"):
        DeepSpeedConfig({**cfg, "zero_optimization": {"stage": 0}})
    DeepSpeedConfig({**cfg, "zero_optimization": {"stage": 1}})
    for engine in ("deepspeed", "megatron-deepspeed"):
        with pytest.raises(InputError, match="--precision bf16-pure.*--zero 1"):
            api.estimate("llama-3-8b", {"gpus": 8}, {"engine": engine, "precision": "bf16-pure", "gbs": 8}, {"zero": 0})
        api.estimate("llama-3-8b", {"gpus": 8}, {"engine": engine, "precision": "bf16-pure", "gbs": 8}, {"zero": 1})
    api.estimate("llama-3-8b", {"gpus": 8}, {"engine": "fsdp", "precision": "bf16-pure", "gbs": 8}, {"zero": 0})


def test_torchtitan_runs_q_k_v_as_one_gemm():
    """torchtitan 0.3.0 models/llama3/__init__.py builds its attention with fuse_qkv=True
    (models/common/attention.py FusedQKVLinear: one wqkv linear) and keeps FeedForward's w1, w3, w2
    apart; Megatron-core fuses linear_qkv and linear_fc1; Hugging Face's Llama runs every projection
    alone. Llama 3 8B per token: wqkv 2 h (q + 2 kv) = 2 x 4096 x (4096 + 2 x 1024) FLOPs."""
    from planner.engines import lookup as engine

    m = lookup("llama-3-8b")

    def gemms(name):
        e = engine(name)
        return [(g.name, g.flops_per_token) for g in m.gemms(e.fused_gemms, e.fused_qkv) if not g.expert]

    titan = gemms("torchtitan")
    assert [n for n, _ in titan].count("qkv") == 1 and len(titan) == 5  # wqkv, wo, w1, w3, w2
    assert dict(titan)["qkv"] == 2 * 4096 * (4096 + 2 * 1024)
    assert len(gemms("megatron")) == 4 and len(gemms("fsdp")) == 7


def test_megatron_takes_nvidias_deepseek_v3_interleaving():
    """NVIDIA's DeepSeek-V3 recipes interleave 61 blocks unevenly (megatron-bridge
    recipes/deepseek/h100/deepseek_v3.py: tp 2, pp 8, vpp 4, ep 64 on 1,024 H100; gb200: pp 4, vpp 4)
    through --pipeline-model-parallel-layout; Megatron takes them, engines without a layout do not.
    The most loaded rank holds ceil(61 / 8) = 8 blocks and ceil(61 / 4) = 16."""
    from planner import api
    from planner.errors import InputError as Refused

    for pp, vpp, gpus, ep in ((8, 4, 1024, 64), (4, 4, 256, 64)):
        est = api.estimate("deepseek-v3", {"gpus": gpus, "gpu": "h100-sxm"},
                           {"engine": "megatron", "seq_len": 4096, "gbs": 16384},
                           {"tp": 1 + (gpus == 1024), "pp": pp, "vpp": vpp, "ep": ep, "etp": 1, "zero": 1,
                            "sequence_parallel": gpus == 1024})
        assert est.record["layout"]["vpp"] == vpp
        assert max(pipeline.layers_on_stage(61, pp, s) for s in range(pp)) == -(-61 // pp)
    with pytest.raises(Refused, match="--vpp"):
        api.estimate("deepseek-v3", {"gpus": 256}, {"engine": "torchtitan", "seq_len": 4096, "gbs": 4096},
                     {"pp": 4, "vpp": 4, "ep": 64, "zero": 3})


def test_a_pinned_uneven_interleaving_is_searched():
    """recommend with --pp 4 --vpp 4 pinned for DeepSeek-V3's 61 blocks (NVIDIA's GB200 recipe, dgxc-benchmarking
    deepseek_v3 table) answers with that interleaving, as estimate takes it; unpinned, the search keeps to
    even ones."""
    from planner import api

    rec = api.recommend("deepseek-v3", {"gpus": 256, "gpu": "gb200"}, {"engine": "megatron", "gbs": 4096},
                        top=1, pinned={"pp": 4, "vpp": 4, "ep": 64}, compare_engines=False)
    assert rec.layouts and (rec.layouts[0]["layout"]["pp"], rec.layouts[0]["layout"]["vpp"]) == (4, 4)
