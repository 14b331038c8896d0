"""MoE expert capacity (issue 10): DeepSpeed-MoE pads every expert to ceil(S/E * C k) tokens,
Megatron-core drops past that capacity and pads with --moe-pad-expert-input-to-capacity.

Independent source for the capacity: DeepSpeed's own gating functions (deepspeed/moe/sharded_moe.py
top1gating / top2gating / topkgating) run on CPU on random logits; their dispatch mask is
[S, E, capacity]. The scaling tests compare against hand arithmetic on Mixtral 8x7B's shape
(h 4096, expert ffn 14336, SwiGLU, 32 layers, 8 experts, top-2).
"""

from __future__ import annotations

import io
import os

import numpy as np
import pytest

from planner import activations, cli, compute, export, layout, moe, timing
from planner.errors import InputError
from planner.hardware import Cluster, lookup_gpu
from planner.memory import coefficients
from planner.model import lookup, with_overrides
from planner.stage import Step

MIXTRAL = lookup("mixtral-8x7b")
EXPERT_GEMM_FLOPS = 2 * 3 * 4096 * 14336  # one expert's fc1 [gate|up] (h x 2f) and fc2 (f x h), 2 FLOPs per MAC


def run(*argv):
    out = io.StringIO()
    return cli.main(list(argv), out=out), out.getvalue()


# ---------------------------------------------------------------------------------------------
# (a) the capacity: DeepSpeed's own gating


@pytest.mark.parametrize("tokens, experts, k, factor, min_capacity, expected", [
    (4096, 8, 2, 1.0, 4, 1024),   # ceil(4096/8 * 1.0*2) = 1024
    (4096, 8, 2, 1.25, 4, 1280),  # ceil(512 * 2.5) = 1280
    (64, 16, 1, 0.5, 8, 8),       # ceil(4 * 0.5) = 2 < min_capacity 8
    (256, 8, 3, 0.7, 4, 68),      # ceil(32 * 2.1) = ceil(67.2) = 68
    (1000, 16, 4, 1.1, 0, 275),   # ceil(62.5 * 4.4) = 275 (float32 rounds 275.00000x back to 275)
    (100, 4, 2, 1.1, 0, 55),      # ceil(25 * 2.2): 55.000000000000007 in float64 (56), 55 in DeepSpeed's float32
])
def test_capacity_is_deepspeed_gating_shape(tokens, experts, k, factor, min_capacity, expected):
    """The planner's per-expert capacity equals the capacity dimension of the dispatch mask that
    DeepSpeed 0.19.8's gating builds, and the arithmetic beside each case."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    sharded_moe = pytest.importorskip("deepspeed.moe.sharded_moe")
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    logits = torch.randn(tokens, experts)
    if k == 1:
        gate = sharded_moe.top1gating(logits, factor, min_capacity)
    elif k == 2:
        gate = sharded_moe.top2gating(logits, factor, min_capacity)
    else:
        gate = sharded_moe.topkgating(logits, k, factor, min_capacity)
    dispatch_mask = gate[2]
    assert tuple(dispatch_mask.shape) == (tokens, experts, expected)  # [S, E, capacity]
    assert moe.expert_capacity(tokens, experts, k, factor, min_capacity, np.float32) == expected


@pytest.mark.parametrize("seq, factor", [(4096, 1.25), (4096, 1.0), (100, 1.1), (24, 0.5)])
def test_megatron_deepspeed_rows_are_deepspeed_dispatch(seq, factor):
    """Under megatron-deepspeed each rank's experts run E x capacity rows (MOELayer's [E, C, M]
    dispatched_input, all-to-all'd across EP), with DeepSpeed-MoE's min_capacity 4: the planner's
    rows per token times T equal E times the capacity DeepSpeed's top2gating builds."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    sharded_moe = pytest.importorskip("deepspeed.moe.sharded_moe")
    torch = pytest.importorskip("torch")
    torch.manual_seed(1)
    capacity = sharded_moe.top2gating(torch.randn(seq, 8), factor, 4)[2].shape[2]
    training = layout.Training(seq_len=seq, engine="megatron-deepspeed", moe_capacity_factor=factor)
    lay = layout.single()
    rows = moe.routed_per_token(MIXTRAL, training, lay, compute.tokens_per_microbatch(training, lay)) * seq
    assert rows == pytest.approx(8 * capacity, rel=1e-12)
    # seq 24, C 0.5: ceil(24/8 * 1.0) = 3 < 4, so 8 x 4 = 32 rows for 24 tokens (1.33 per token, not k C = 1)
    if seq == 24:
        assert rows == 32


# ---------------------------------------------------------------------------------------------
# (b) what the rows scale: expert FLOPs, routed activations, the EP all-to-all


def _training(engine, factor=None, pad=None):
    return layout.Training(seq_len=4096, engine=engine, moe_capacity_factor=factor, moe_pad_to_capacity=bool(pad))


def test_hardware_flops_count_padding_model_flops_do_not():
    """Mixtral, one 4096-token sequence: padded to C = 2 every expert runs ceil(4096/8 * 2*2) =
    2048 rows, 8 x 2048 = 16384 = 4 per token instead of k = 2. Hardware FLOPs grow by
    3 (fwd + 2 bwd) x 4096 tokens x 32 layers x 2 extra rows x 352,321,536 FLOPs per expert row;
    model FLOPs keep k = 2."""
    lay = layout.single()
    dropless = compute.flops_per_step(MIXTRAL, _training("megatron"), lay)
    padded = compute.flops_per_step(MIXTRAL, _training("megatron", 2.0, True), lay)
    assert padded["model_flops"][0] == dropless["model_flops"][0]
    assert dropless["hardware_flops"][0] == dropless["model_flops"][0]  # dropless, no recompute: nothing wasted
    extra = 3 * 4096 * 32 * (4 - 2) * EXPERT_GEMM_FLOPS  # = 554,153,000,000,000 (5.54e14)
    assert padded["hardware_flops"][0] - dropless["hardware_flops"][0] == pytest.approx(extra, rel=1e-12)
    # Megatron without padding drops past capacity: min(k, E capacity / T) = min(2, 4) = 2, unchanged
    unpadded = compute.flops_per_step(MIXTRAL, _training("megatron", 2.0), lay)
    assert unpadded["hardware_flops"][0] == dropless["hardware_flops"][0]


def test_expert_gemm_time_scales_by_the_factor():
    """The forward GEMM seconds grow by exactly the extra expert FLOPs at the GEMM rate:
    C = 2 padded adds 4096 tokens x 2 rows x 352,321,536 FLOPs / (peak x emax) (the fixed
    per-GEMM term is the same: the local expert count does not change); C = 0.5 padded removes
    4096 x 1 row's worth (capacity ceil(512 x 1) = 512, 8 x 512 = 4096 rows = 1 per token)."""
    lay = layout.single()
    cluster = Cluster(lookup_gpu("h100-sxm"), 1, 1)
    c = coefficients("time")
    base = compute.gemm_fwd_s(Step(MIXTRAL, cluster, _training("megatron"), lay, c))[0]
    # the sustained H100 rate the kernels are timed at: 989.4 TFLOP/s x h100_sxm_sustained_compute_fraction
    rate = cluster.gpu.peak_flops_per_s["bf16"] * c["h100_sxm_sustained_compute_fraction"] * c["gemm_efficiency_max"]
    double = compute.gemm_fwd_s(Step(MIXTRAL, cluster, _training("megatron", 2.0, True), lay, c))[0]
    half = compute.gemm_fwd_s(Step(MIXTRAL, cluster, _training("megatron", 0.5, True), lay, c))[0]
    assert double - base == pytest.approx(4096 * 2 * EXPERT_GEMM_FLOPS / rate, rel=1e-9)
    assert base - half == pytest.approx(4096 * 1 * EXPERT_GEMM_FLOPS / rate, rel=1e-9)
    # dropping without padding runs min(k, k C) = 1 row per token too
    assert compute.gemm_fwd_s(Step(MIXTRAL, cluster, _training("megatron", 0.5), lay, c))[0] == pytest.approx(half)


def test_routed_activations_scale_shared_expert_does_not():
    """Megatron's fused SwiGLU keeps the fc1 output (2w) and the fc2 input (w), 3 x 2 bytes per
    routed row per expert-ffn column, and each row's permuted fc1 input (2 h), routing prob (2) and
    sorted index (8) (megatron-core's MoELayer, counted: tests/test_activations_megatron_moe.py): per
    row 6 x 14336 + 2 x 4096 + 10 = 94,218 B. Padded to C = 2 (4 rows per token instead of 2) one
    block keeps 4096 tokens x 2 x 94,218 = 771,833,856 bytes more. A shared expert (Qwen2-MoE style,
    5632 wide) is run once per token whatever the capacity."""
    lay = layout.single()
    row = 6 * 14336 + 2 * 4096 + 2 + 8
    base = activations.layer_bytes(MIXTRAL, _training("megatron"), lay)[0][0]
    padded = activations.layer_bytes(MIXTRAL, _training("megatron", 2.0, True), lay)[0][0]
    assert padded - base == pytest.approx(4096 * 2 * row, rel=1e-12)  # 771,833,856 B
    shared = with_overrides(MIXTRAL, shared_expert_ffn=5632)
    base_s = activations.layer_bytes(shared, _training("megatron"), lay)[0][0]
    padded_s = activations.layer_bytes(shared, _training("megatron", 2.0, True), lay)[0][0]
    assert padded_s - base_s == pytest.approx(4096 * 2 * row, rel=1e-12)  # the shared 5632 columns cancel
    assert base_s - base == pytest.approx(4096 * 6 * 5632, rel=1e-12)  # 138,412,032 B: once per token


def test_ep_all_to_all_moves_the_padded_rows():
    """EP 8: each all-to-all sends 7/8 of T x rows x h x 2 bytes; padded to C = 1.5 the rows are
    ceil(512 x 3) x 8 = 12288 = 3 per token (dropless 2): the byte term is 1.5x, the latency term
    (7 x p2p latency) unchanged."""
    lay = layout.single(dp=8, ep=8)
    cluster = Cluster(lookup_gpu("h100-sxm"), 8, 8)
    c = coefficients("time")
    latency = 7 * c["p2p_latency_s"]
    base = timing.ep_all_to_all_s(Step(MIXTRAL, cluster, _training("megatron"), lay, c))[0] - latency
    padded = timing.ep_all_to_all_s(Step(MIXTRAL, cluster, _training("megatron", 1.5, True), lay, c))[0] - latency
    assert padded / base == pytest.approx(3 / 2, rel=1e-12)
    # dropless bytes: 4096 tokens x 2 rows x 4096 x 2 bytes x 7/8 = 58,720,256 B at NVLink x bus efficiency
    bw = cluster.gpu.intra_node_bytes_per_s * c["bus_efficiency_intra_node"]
    assert base == pytest.approx(4096 * 2 * 4096 * 2 * 7 / 8 / bw, rel=1e-12)
    # megatron-deepspeed at its default C = 1.0 pads to exactly k rows here: 8 x ceil(512 x 2) = 8192 = 2 per token
    ds = timing.ep_all_to_all_s(Step(MIXTRAL, cluster, _training("megatron-deepspeed"), lay, c))[0] - latency
    assert ds == pytest.approx(base, rel=1e-12)


def test_dropless_engines_unchanged():
    """Hugging Face and torchtitan MoE blocks are dropless: k rows per token whatever the batch;
    Megatron without a capacity factor too."""
    lay = layout.single()
    for engine in ("deepspeed", "fsdp", "torchtitan", "megatron"):
        training = _training(engine)
        assert np.all(moe.routed_per_token(MIXTRAL, training, lay, compute.tokens_per_microbatch(training, lay)) == 2.0)


# ---------------------------------------------------------------------------------------------
# (c) bad input


@pytest.mark.parametrize("argv, flag", [
    (["--moe-capacity-factor", "-1"], "--moe-capacity-factor"),
    (["--moe-capacity-factor", "abc"], "--moe-capacity-factor"),
    (["--moe-capacity-factor", "0"], "--moe-capacity-factor"),
    (["--moe-capacity-factor", "1.25", "--engine", "deepspeed"], "--moe-capacity-factor"),
    (["--moe-pad-to-capacity", "--engine", "megatron"], "--moe-pad-to-capacity"),
    (["--moe-pad-to-capacity", "--moe-capacity-factor", "1", "--engine", "megatron-deepspeed"], "--moe-pad-to-capacity"),
])
def test_bad_capacity_input_one_line_exit_2(argv, flag, capsys):
    for command in ("estimate", "recommend"):
        code, _ = run(command, "--model", "mixtral-8x7b", "--gpus", "16", *argv)
        err = capsys.readouterr().err
        assert code == 2
        assert err.count("\n") == 1 and flag in err and "Traceback" not in err


def test_api_rejects_bad_capacity_values():
    with pytest.raises(InputError, match="--moe-capacity-factor"):
        layout.Training(engine="megatron", moe_capacity_factor=float("nan"))
    with pytest.raises(InputError, match="--moe-pad-to-capacity"):
        layout.Training(engine="megatron", moe_capacity_factor=1.0, moe_pad_to_capacity="yes")


# ---------------------------------------------------------------------------------------------
# (d) export, defaults and the other engines


def test_export_writes_megatron_capacity_args():
    """Megatron-LM takes --moe-expert-capacity-factor C and --moe-pad-expert-input-to-capacity
    (megatron-core 0.16.1 TransformerConfig moe_expert_capacity_factor, moe_pad_expert_input_to_capacity)."""
    row = layout.single(dp=8, ep=8).row(0)
    args = export.megatron_args(MIXTRAL, _training("megatron", 1.25, True), row)
    assert "--moe-expert-capacity-factor 1.25" in args and "--moe-pad-expert-input-to-capacity" in args
    unpadded = export.megatron_args(MIXTRAL, _training("megatron", 0.5), row)
    assert "--moe-expert-capacity-factor 0.5" in unpadded and "--moe-pad-expert-input-to-capacity" not in unpadded
    dropless = export.megatron_args(MIXTRAL, _training("megatron"), row)
    assert not any("capacity" in a for a in dropless)


def test_cli_reaches_the_estimate_and_reports_the_default():
    """--moe-capacity-factor reaches the answer; megatron-deepspeed's DeepSpeed-MoE default 1.0 is
    reported in `defaults`; recommend compares the other engines without the flags they lack."""
    import json

    base = ["estimate", "--model", "mixtral-8x7b", "--gpus", "8", "--ep", "8", "--json"]
    _, text = run(*base, "--engine", "megatron-deepspeed")
    default = json.loads(text)
    assert default["defaults"]["moe_capacity_factor"] == 1.0
    _, text = run(*base, "--engine", "megatron-deepspeed", "--moe-capacity-factor", "2")
    doubled = json.loads(text)
    assert doubled["training"]["moe_capacity_factor"] == 2.0 and "moe_capacity_factor" not in doubled["defaults"]
    # 2 x the expert rows: hardware TFLOP/s per GPU rise while model TFLOP/s per step fall
    assert doubled["time"]["step_s"] > default["time"]["step_s"]
    code, text = run("recommend", "--model", "mixtral-8x7b", "--gpus", "16", "--engine", "megatron",
                     "--moe-capacity-factor", "1.25", "--moe-pad-to-capacity", "--top", "1", "--json")
    assert code in (0, 2)
    engines = {e["engine"] for e in json.loads(text)["engines"]}
    assert engines == {"deepspeed", "megatron-deepspeed", "fsdp", "torchtitan"}


def test_megatron_all_to_all_carries_a_ranks_sequence_shard():
    # megatron-core 0.16.1 MoEAlltoAllTokenDispatcher: each TP rank all-to-alls the routed rows of its
    # sequence-parallel shard, T/t of them (the tp all-gather comes after); Mixtral 8x7B, s 4096,
    # mbs 1, ep 4: T k h e = 4096 x 2 x 4096 x 2 = 67,108,864 bytes at tp 1, half at tp 2 with SP
    from planner.rules import check_single

    m = lookup("mixtral-8x7b")
    clus = Cluster(lookup_gpu("h100-sxm"), 16, 8)
    c = coefficients("time")
    train = layout.Training(seq_len=4096, engine="megatron")
    latency = 3 * c["p2p_latency_s"]  # (ep - 1) sends
    one = timing.ep_all_to_all_s(Step(m, clus, train, layout.single(tp=1, dp=16, ep=4), c))[0] - latency
    two = timing.ep_all_to_all_s(Step(m, clus, train, layout.single(tp=2, dp=8, ep=4, sequence_parallel=True), c))[0] - latency
    assert two == pytest.approx(one / 2)  # 33,554,432 bytes x 3/4 sent, against 67,108,864 x 3/4
    # megatron-core refuses MoE with TP and without SP in training (moe_layer.py MoELayer.forward)
    with pytest.raises(InputError, match="--sequence-parallel"):
        check_single(m, clus, train, layout.single(tp=2, dp=8, ep=4))


def test_transformers_llama4_runs_every_token_through_every_expert():
    # transformers 5.25 Llama4TextMoe: hidden_states.repeat(E, 1) x the router's sigmoid scores, then a bmm
    # over all E experts (measured in tests/test_activations_llama4.py): Scout's 16 experts a token under the
    # Hugging Face engines, its top-1 under Megatron's dispatcher; the model FLOPs keep the useful one
    from planner.compute import flops_per_step

    scout, lay = lookup("llama-4-scout"), layout.single(dp=16, gas=1)
    hf, megatron = layout.Training(seq_len=4096, engine="fsdp"), layout.Training(seq_len=4096, engine="megatron")
    assert moe.routed_per_token(scout, hf, lay, 4096.0) == 16
    assert moe.routed_per_token(scout, megatron, lay, 4096.0) == 1
    f_hf, f_mg = flops_per_step(scout, hf, lay), flops_per_step(scout, megatron, lay)
    assert f_hf["model_flops"][0] == f_mg["model_flops"][0]
    # 15 more expert rows a token, forward and backward: 3 x 2 x 3 x 5120 x 8192 x 15 per token per routed block
    extra = 3 * 2 * 3 * 5120 * 8192 * 15 * 48 * 16 * 4096
    assert f_hf["hardware_flops"][0] - f_mg["hardware_flops"][0] == pytest.approx(extra, rel=1e-9)
