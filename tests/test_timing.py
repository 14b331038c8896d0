"""Step-time model against independent references: Narayanan et al. 2021 (eq. 3, Tables 1-2),
Korthikanti et al. 2022 (Tables 4-5), PaLM appendix B, nccl-tests PERFORMANCE.md, and the
structural properties of the breakdown (parts sum to the step, non-negative, MFU <= HFU <= 1)."""


import numpy as np
import pytest

from planner import hardware, layout, timing
from planner.model import ModelSpec, lookup

A100 = hardware.lookup_gpu("a100-80gb")


def gpt(layers, hidden, heads, vocab=51200, seq=2048):
    """Megatron GPT shape of the papers: 4h GeLU MLP, MHA, LayerNorm, biases, learned positions."""
    return ModelSpec(layers=layers, hidden=hidden, heads=heads, kv_heads=heads, ffn=4 * hidden, vocab=vocab,
                     ffn_kind="gelu", norm="layernorm", bias=True, positions="learned", max_positions=seq,
                     tied_embeddings=True, dropout=True)


MEGATRON_FP16 = layout.Training(seq_len=2048, precision="fp16", flash_attention=False, engine="megatron")


# ---------------------------------------------------------------------------------------------
# FLOPs: Narayanan 2021 eq. 3 and PaLM appendix B


# (L, h, a, GPUs, B) of Narayanan 2021 Table 1 rows
TABLE1_SHAPES = [(24, 2304, 24, 32, 512), (36, 4096, 32, 128, 512), (80, 12288, 96, 1536, 2304),
                 (128, 25600, 160, 3072, 3072)]


@pytest.mark.parametrize("L, h, a, gpus, B", TABLE1_SHAPES)
def test_hardware_flops_match_narayanan_eq3(L, h, a, gpus, B):
    s, V = 2048, 51200
    lay = layout.single(dp=B, mbs=1, gas=1, recompute="full")  # global batch B sequences
    flops = timing.flops_per_step(gpt(L, h, a), MEGATRON_FP16, lay)
    # eq. 3: 96 B s L h^2 (1 + s/(6h) + V/(16 L h)); the paper drops biases/norms, so do our GEMMs
    eq3 = 96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    assert flops["hardware_flops"][0] == pytest.approx(eq3, rel=0.02)
    # without recompute: 3 passes instead of 4 -> 72 B s L h^2 (1 + s/(6h) + V/(12 L h))
    no_recompute = 72 * B * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
    assert flops["model_flops"][0] == pytest.approx(no_recompute, rel=0.02)
    # selective recompute adds the attention core forward only: 4 s^2 h per layer and sequence
    sel = timing.flops_per_step(gpt(L, h, a), MEGATRON_FP16, layout.single(dp=B, recompute="selective"))
    assert sel["hardware_flops"][0] == pytest.approx(no_recompute + 4 * B * s**2 * h * L, rel=1e-9)


def test_model_flops_match_palm_6n_plus_12lhs_for_llama():
    model = lookup("llama-2-7b")
    s = 4096
    training = layout.Training(seq_len=s)
    flops = timing.flops_per_step(model, training, layout.single(dp=1, mbs=1))
    per_token = flops["model_flops"][0] / s
    # PaLM appendix B: 6N + 12 L h s per token. N = 6,738,415,616 (hardware-and-models.md) minus the
    # input embedding 32000 x 4096 = 131,072,000, a lookup with no matmul (the untied output layer stays)
    N = 6_738_415_616 - 32_000 * 4096
    palm = 6 * N + 12 * 32 * 4096 * s
    assert per_token == pytest.approx(palm, rel=0.02)


def test_moe_model_flops_use_active_params():
    mixtral = lookup("mixtral-8x7b")
    s = 4096
    flops = timing.flops_per_step(mixtral, layout.Training(seq_len=s), layout.single(dp=1, ep=1))
    N = mixtral.active_params - mixtral.embedding_params  # top-2 experts, router included
    assert flops["model_flops"][0] / s == pytest.approx(6 * N + 12 * 32 * 4096 * s, rel=0.02)


# ---------------------------------------------------------------------------------------------
# collectives: nccl-tests PERFORMANCE.md


def test_ring_all_reduce_matches_nccl_tests_bus_bandwidth():
    size, n, busbw = 2**30, 8, 230e9  # 1 GiB on 8 GPUs at DGX A100's ~230 GB/s bus bandwidth
    t = timing.ring_time_s(size, n, busbw, "all_reduce")
    # PERFORMANCE.md: algbw = S / t, busbw = algbw * 2(n-1)/n  ->  t = S * 2 * 7/8 / busbw = 8.170 ms
    assert float(t) == pytest.approx(2**30 * 1.75 / 230e9, rel=1e-12)
    assert size / float(t) * 2 * (n - 1) / n == pytest.approx(busbw, rel=1e-12)
    # all-gather / reduce-scatter: busbw = algbw * (n-1)/n -> half the all-reduce time
    assert float(timing.ring_time_s(size, n, busbw, "all_gather")) == pytest.approx(float(t) / 2)
    # the A100 prior: 300 GB/s per direction x 0.78 = 234 GB/s, within 2% of the measured ~230
    coef = timing.coefficients("time")
    bw = timing.group_bus_bytes_per_s(hardware.Cluster(A100, 8, 8), 1, 8, coef)
    assert float(bw) == pytest.approx(230e9, rel=0.02)
    # latency: 2(n-1) ring steps per all-reduce call
    assert float(timing.ring_time_s(8, n, busbw, "all_reduce", latency_s=1e-5, count=3)) == pytest.approx(
        3 * 14 * 1e-5 + 8 * 1.75 / 230e9)


def test_dp_group_across_nodes_uses_one_nic_per_member_on_the_node():
    coef = timing.coefficients("time")
    cluster = hardware.Cluster(A100, 64, 8)
    nic = A100.inter_node_bytes_per_s * coef["bus_efficiency_inter_node"]
    # tp=8: one DP member per node -> one 25 GB/s HDR NIC; tp=2: four members -> four NICs
    assert float(timing.group_bus_bytes_per_s(cluster, 8, 8, coef)) == pytest.approx(nic)
    assert float(timing.group_bus_bytes_per_s(cluster, 2, 32, coef)) == pytest.approx(4 * nic)
    # inside one node: NVLink
    assert float(timing.group_bus_bytes_per_s(cluster, 1, 8, coef)) == pytest.approx(
        A100.intra_node_bytes_per_s * coef["bus_efficiency_intra_node"])


# ---------------------------------------------------------------------------------------------
# pipeline bubble: Narayanan 2021 sections 2.2.1-2.2.2


@pytest.mark.parametrize("p, v, m, schedule", [(4, 1, 8, "1f1b"), (4, 1, 8, "gpipe"), (4, 2, 8, "interleaved"),
                                               (8, 4, 32, "interleaved"), (2, 1, 64, "1f1b")])
def test_bubble_fraction(p, v, m, schedule):
    model = gpt(32, 2048, 16)
    # tp = cp = 1: no per-micro-batch communication, so the ideal time is compute + recompute
    lay = layout.single(pp=p, vpp=v, dp=1, mbs=1, gas=m, schedule=schedule)
    out = timing.step_time(model, hardware.Cluster(A100, p, 8), MEGATRON_FP16, lay)
    bd = out["breakdown"]
    assert bd["tp_comm"][0] == 0
    ideal = bd["compute"][0] + bd["recompute"][0]
    # (p-1)/m for 1F1B and GPipe, (p-1)/(v m) interleaved: e.g. 3/8, 3/16, 7/128, 1/64
    assert bd["pp_bubble"][0] / ideal == pytest.approx((p - 1) / (v * m), rel=1e-12)


# ---------------------------------------------------------------------------------------------
# structure: parts sum to the step, non-negative, MFU <= HFU <= 1, batch == one at a time


def random_layouts(rng, n, num_gpus=64):
    pick = lambda xs: rng.choice(xs, n)  # noqa: E731
    tp, pp, cp = pick([1, 2, 4, 8]), pick([1, 2, 4]), pick([1, 2])
    dp = np.maximum(num_gpus // (tp * pp * cp), 1)
    vpp = np.where(pp > 1, pick([1, 2]), 1)
    zero = pick([0, 1, 2, 3])
    return layout.Layouts(
        tp=tp, pp=pp, dp=dp, cp=cp, ep=pick([1, 2]), vpp=vpp, zero=zero,
        offload_optimizer=np.where(zero > 0, pick([0, 1, 2]), 0), offload_params=np.where(zero == 3, pick([0, 1, 2]), 0),
        mbs=pick([1, 2, 4, 8]), gas=pick([1, 3, 16]), recompute=pick([0, 1, 2]),
        sequence_parallel=(tp > 1) & (pick([0, 1]) > 0), schedule=np.where(vpp > 1, 1, pick([0, 2])))


MODELS = [lookup("llama-2-7b"), gpt(24, 2048, 16),
          ModelSpec(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=32000, experts=8, experts_per_token=2)]
TRAININGS = [layout.Training(seq_len=4096, engine="megatron-deepspeed"),
             layout.Training(seq_len=2048, engine="megatron", precision="fp16", flash_attention=False),
             layout.Training(seq_len=1024, engine="deepspeed", precision="fp32",
                             zero_config=layout.ZeroConfig(overlap_comm=True)),
             layout.Training(seq_len=8192, engine="fsdp", precision="bf16-pure", optimizer="adam8bit")]


@pytest.mark.parametrize("model", MODELS, ids=["llama", "gpt", "moe"])
@pytest.mark.parametrize("training", TRAININGS, ids=["mds", "megatron", "ds-fp32", "fsdp"])
@pytest.mark.parametrize("gpu", ["a100-80gb", "h100-sxm"])
def test_breakdown_sums_and_bounds(model, training, gpu):
    rng = np.random.default_rng(7)
    lay = random_layouts(rng, 3000)
    cluster = hardware.Cluster(hardware.lookup_gpu(gpu), 64, 8)
    out = timing.step_time(model, cluster, training, lay)
    bd = out["breakdown"]
    assert set(bd) == set(timing.BREAKDOWN_KEYS)
    total = sum(bd[k] for k in timing.BREAKDOWN_KEYS)
    np.testing.assert_allclose(total, out["step_s"], rtol=1e-12)
    for k, v in bd.items():
        assert v.shape == lay.tp.shape and np.all(v >= 0) and np.all(np.isfinite(v)), k
    thr = out["throughput"]
    assert np.all(thr["mfu"] <= thr["hfu"] * (1 + 1e-12))
    assert np.all(thr["hfu"] <= 1.0) and np.all(thr["mfu"] > 0)
    # throughput definitions: tokens = samples * s; TFLOP/s = FLOPs / step / GPUs
    np.testing.assert_allclose(thr["tokens_per_s"], thr["samples_per_s"] * training.seq_len)
    flops = timing.flops_per_step(model, training, lay)
    np.testing.assert_allclose(thr["model_tflops_per_gpu"], flops["model_flops"] / out["step_s"] / lay.world / 1e12)
    # the batch is evaluated by distinct field combinations: each row must equal its own evaluation
    for i in rng.choice(lay.size, 25, replace=False):
        one = timing.step_time(model, cluster, training, lay.take(np.array([i])))
        assert one["step_s"][0] == pytest.approx(out["step_s"][i], rel=1e-12)
        for k in timing.BREAKDOWN_KEYS:
            assert one["breakdown"][k][0] == pytest.approx(bd[k][i], rel=1e-12, abs=1e-15)


def test_multidimensional_layouts_keep_their_shape():
    lay = layout.Layouts(tp=[[1, 2], [4, 8]], pp=1, dp=[[8, 4], [2, 1]], cp=1, ep=1, vpp=1, zero=1,
                         offload_optimizer=0, offload_params=0, mbs=2, gas=4, recompute=1,
                         sequence_parallel=0, schedule=0)
    out = timing.step_time(lookup("llama-2-7b"), hardware.Cluster(A100, 8, 8), layout.Training(engine="megatron"), lay)
    assert out["step_s"].shape == (2, 2) and out["throughput"]["mfu"].shape == (2, 2)


# ---------------------------------------------------------------------------------------------
# mechanisms move the step the right way


def test_mechanism_directions():
    model = lookup("llama-2-7b")
    cluster = hardware.Cluster(A100, 16, 8)
    tr = layout.Training(seq_len=4096, engine="deepspeed")

    def step(training=tr, **kw):
        return timing.step_time(model, cluster, training, layout.single(**kw))

    base = step(dp=16, zero=2, mbs=2, gas=4)
    # full recompute costs about one more forward (~1/3 of fwd+bwd compute), selective much less
    full = step(dp=16, zero=2, mbs=2, gas=4, recompute="full")["breakdown"]["recompute"][0]
    sel = step(dp=16, zero=2, mbs=2, gas=4, recompute="selective")["breakdown"]["recompute"][0]
    assert 0 < sel < full and 0.25 < full / base["breakdown"]["compute"][0] < 0.4
    # ZeRO-3 moves 1.5x ZeRO-2's bytes (ZeRO paper s.7): more exposed DP time
    assert step(dp=16, zero=3, mbs=2, gas=4)["breakdown"]["dp_comm"][0] > base["breakdown"]["dp_comm"][0]
    # CPU offload: optimizer on the host (slower than the GPU's memory-bound step) plus PCIe traffic
    off = step(dp=16, zero=2, mbs=2, gas=4, offload_optimizer="cpu")["breakdown"]
    assert off["optimizer"][0] > base["breakdown"]["optimizer"][0] and off["offload"][0] > 0
    nvme = step(dp=16, zero=3, mbs=2, gas=4, offload_optimizer="nvme", offload_params="nvme")["breakdown"]
    assert nvme["offload"][0] > off["offload"][0]
    # FlashAttention is faster than the unfused s^2 path
    slow = step(layout.Training(seq_len=4096, engine="deepspeed", flash_attention=False), dp=16, zero=2, mbs=2, gas=4)
    assert slow["breakdown"]["compute"][0] > base["breakdown"]["compute"][0]


def test_time_to_train():
    out = timing.time_to_train(10.0, 4_000_000, 1e12, 1024, price_per_gpu_hour=2.0)
    # 1e12 / 4e6 = 250,000 steps x 10 s = 2.5e6 s = 28.935 days; x 1024 GPUs / 3600 = 711,111 GPU-hours
    assert float(out["days"]) == pytest.approx(2.5e6 / 86400)
    assert float(out["gpu_hours"]) == pytest.approx(2.5e6 * 1024 / 3600)
    assert float(out["cost"]) == pytest.approx(2.0 * 2.5e6 * 1024 / 3600)
    assert timing.time_to_train(1.0, 1, 1, 1)["cost"] is None


def test_time_to_train_matches_narayanan_eq4_gpt3():
    # Narayanan 2021 s.5.1: GPT-3 175B, 300B tokens, n=1024 GPUs at X=140 TFLOP/s -> "34 days" (eq. 4: 8TP/(nX))
    model, s, B = gpt(96, 12288, 96), 2048, 1536
    lay = layout.single(dp=B, recompute="full")
    step_s = timing.flops_per_step(model, MEGATRON_FP16, lay)["hardware_flops"][0] / (1024 * 140e12)
    days = timing.time_to_train(step_s, B * s, 300e9, 1024)["days"]
    assert float(days) == pytest.approx(34, rel=0.03)  # eq. 4 drops the s/(6h) and V/(16Lh) terms (+3%)


# Korthikanti 2022 Table 4: one 22B layer (h 6144, a 64, t 8, b 4, s 2048), ms forward / backward
# (the backward includes the recomputation)
TABLE4 = [("none", False, 7.7, 11.9), ("none", True, 7.2, 11.8), ("full", False, 7.7, 19.5),
          ("selective", False, 7.7, 13.2), ("selective", True, 7.2, 13.1)]


@pytest.mark.parametrize("recompute, sp, fwd_ms, bwd_ms", TABLE4)
def test_korthikanti_table4_layer_times(recompute, sp, fwd_ms, bwd_ms):
    lay = layout.single(tp=8, mbs=4, recompute=recompute, sequence_parallel=sp)
    t = timing.layer_times(gpt(48, 6144, 64), hardware.Cluster(A100, 8, 8), MEGATRON_FP16, lay)
    fwd, bwd = t["fwd_s"][0] * 1e3, (t["bwd_s"][0] + t["recompute_s"][0]) * 1e3
    print(f"\n{recompute} sp={sp}: fwd {fwd:.2f} ms (paper {fwd_ms}), bwd {bwd:.2f} ms (paper {bwd_ms})")
    assert fwd == pytest.approx(fwd_ms, rel=0.10)
    assert bwd == pytest.approx(bwd_ms, rel=0.10)
    assert fwd + bwd == pytest.approx(fwd_ms + bwd_ms, rel=0.08)
