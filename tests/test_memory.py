"""Memory terms, one test per mechanism, each against an independent figure: the ZeRO paper,
Megatron-LM's docs, Korthikanti et al. 2022, DeepSpeed's code and its measured behaviour (the
byte-exact real-engine checks are in tests/test_deepspeed_real.py), and properties of the whole rank.
A term 10x wrong fails a named test here (benchmarks/mutants.py checks that)."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import activations, api, hardware, layout, memory, pipeline, sharding
from planner import states as model_states
from planner.model import ModelSpec, lookup
from planner.options import Recompute
from planner.stage import Stage

A100 = hardware.lookup_gpu("a100-80gb")
S0 = np.zeros(1, dtype=np.int64)


def cluster(n):
    return hardware.Cluster(A100, n, min(8, n))


def states(model, training, lay, stage=0, at_step=False):
    return {"params": model_states.weight_bytes(Stage(model, training, lay, stage))[0],
            "grads": model_states.grad_bytes(Stage(model, training, lay, stage), at_step)[0],
            "optimizer": model_states.optimizer_bytes(Stage(model, training, lay, stage))[0]}


# ---------------------------------------------------------------------------------------------
# model states: ZeRO paper section 3 and Figure 1 (7.5B params, N_d = 64, mixed-precision Adam K = 12)

MEGATRON_MIXED = layout.Training(seq_len=2048, engine="megatron-deepspeed")
ZERO_FIGURE1 = {  # stage: (weights, gradients, optimizer) bytes per parameter, section 3 / Figure 1
    0: (2, 2, 12), 1: (2, 2, 12 / 64), 2: (2, 2 / 64, 12 / 64), 3: (2 / 64, 2 / 64, 12 / 64)}


@pytest.mark.parametrize("stage, paper_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.875)])
def test_weights_grads_optimizer_match_zero_paper_figure1(stage, paper_gb):
    model = lookup("megatron-gpt-7.5b")
    got = states(model, MEGATRON_MIXED, layout.single(dp=64, zero=stage))
    w, g, o = ZERO_FIGURE1[stage]  # e.g. ZeRO-2: 2 + 2/64 + 12/64 = 2.22 B/param -> 16.6 GB at 7.5e9
    assert got["params"] / model.params == pytest.approx(w, rel=1e-6)
    assert got["grads"] / model.params == pytest.approx(g, rel=1e-6)
    assert got["optimizer"] / model.params == pytest.approx(o, rel=1e-6)
    assert (w + g + o) * 7.5e9 / 1e9 == pytest.approx(paper_gb, abs=0.05)


def test_rank_params_are_the_exact_tensor_count_split_by_tp_pp():
    # Llama-2-7B, 6,738,415,616 params: embedding 32000*4096 = 131,072,000 on stage 0, output layer
    # 131,072,000 + final norm 4096 on the last stage, 32 blocks of 202,383,360 (8192 of them norms)
    m = lookup("llama-2-7b")
    lay = layout.single(tp=2, pp=2)
    first, _ = sharding.rank_params(Stage(m, layout.Training(), lay, 0))
    last, _ = sharding.rank_params(Stage(m, layout.Training(), lay, 1))
    assert first[0] == 16 * ((202_383_360 - 8192) / 2 + 8192) + 131_072_000 / 2
    assert last[0] == 16 * ((202_383_360 - 8192) / 2 + 8192) + 131_072_000 / 2 + 4096
    assert first[0] + last[0] == pytest.approx((m.params - 8192 * 32 - 4096) / 2 + 8192 * 32 + 4096)


def test_one_stage_holds_every_block_where_the_engine_trims_the_edge_stages():
    # torchtitan (pipeline_edge_layers 1) gives the first and last pipeline stage one block less; with
    # one stage that stage is both and holds the whole model: Llama-3-8B's 8,030,261,248 parameters
    # (Meta's model card), not 8,248,373,248 (one 218,112,000-parameter block more: numpy once added the
    # two "is an end stage" booleans as a logical or)
    m = lookup("llama-3-8b")
    for engine in ("torchtitan", "fsdp", "megatron"):
        dense, _ = sharding.rank_params(Stage(m, layout.Training(engine=engine), layout.single(), 0))
        assert dense[0] == 8_030_261_248
    # 32 blocks on 1, 2, 4 stages with the edges trimmed: 32; 16 + 16; 8, 9, 8, 7 (torchtitan
    # pipeline_parallel.py _generate_llm_fqn_per_model_part, first/last_stage_less_layers = 1)
    assert pipeline.max_layers_on_stage(32, np.array([1, 2, 4]), 1).tolist() == [32, 16, 9]
    assert pipeline.layers_on_stage(32, np.full(4, 4), np.arange(4), 1).tolist() == [8, 9, 8, 7]


def test_moe_experts_split_over_ep_ranks():
    # Mixtral-8x7B block: 8 experts x 3 x 4096 x 14336 = 1,409,286,144 expert params; ep 4 keeps 2 experts
    m = lookup("mixtral-8x7b")
    _, e1 = sharding.rank_params(Stage(m, layout.Training(), layout.single(ep=1, dp=4), 0))
    _, e4 = sharding.rank_params(Stage(m, layout.Training(), layout.single(ep=4, dp=4), 0))
    assert e1[0] == 32 * 1_409_286_144 and e4[0] == 32 * 1_409_286_144 / 4


@pytest.mark.parametrize("precision, plain, fixed, sharded", [
    ("fp16", 20, 4, 16), ("bf16", 18, 6, 12), ("fp32", 16, 8, 8)])
def test_megatron_distributed_optimizer_bytes_per_param(precision, plain, fixed, sharded):
    # Megatron-LM docs (api-guide/dist_optimizer): non-distributed vs distributed over d bytes/param
    model = lookup("llama-2-7b")
    training = layout.Training(engine="megatron", precision=precision)
    d = 8
    for zero, expected in ((0, plain), (1, fixed + sharded / d)):
        got = states(model, training, layout.single(dp=d, zero=zero))
        assert sum(got.values()) / model.params == pytest.approx(expected, rel=1e-9)


def test_optimizer_bytes_by_optimizer():
    # bytes/param beyond the 4-byte fp32 master: AdamW 8 (two fp32 moments), SGD momentum 4,
    # 8-bit Adam 2 (Dettmers et al. 2022), Adafactor 8/h (Shazeer & Stern 2018: row+column fp32)
    m = lookup("llama-2-7b")
    for opt, extra in (("adamw", 8.0), ("sgd", 4.0), ("adam8bit", 2.0), ("adafactor", 8.0 / 4096)):
        got = states(m, layout.Training(optimizer=opt), layout.single())["optimizer"]
        assert got / m.params == pytest.approx(4.0 + extra, rel=1e-9)


# ---------------------------------------------------------------------------------------------
# gradients: what DeepSpeed holds in each phase (measured: 2 gloo ranks, bf16, DeepSpeed 0.19.8,
# shared with tests/test_deepspeed_real.py)


def test_deepspeed_zero1_holds_full_gradients_until_the_boundary():
    # stage_1_and_2.py reduces a stage-1 gradient only at the accumulation boundary: measured 2.0 B/param
    # held after a non-boundary backward, 1.0 B/param (= 2/D, D = 2) at the step
    m = lookup("llama-2-7b")
    lay = layout.single(dp=2, zero=1, gas=4)
    training = layout.Training()
    assert model_states.grad_bytes(Stage(m, training, lay, 0))[0] / m.params == pytest.approx(2.0)
    assert model_states.grad_bytes(Stage(m, training, lay, 0), at_step=True)[0] / m.params == pytest.approx(1.0)


def test_deepspeed_zero2_holds_two_partitions_in_later_micro_steps():
    # measured 2 x 2/D during the backward of micro-steps after the first (all_grad_tensors + a fresh
    # grads_in_partition), 2/D with one micro-step and at the step: D = 2 -> 2.0, 1.0, 1.0 B/param
    m = lookup("llama-2-7b")
    training = layout.Training()
    assert model_states.grad_bytes(Stage(m, training, layout.single(dp=2, zero=2, gas=4), 0))[0] / m.params == pytest.approx(2.0)
    assert model_states.grad_bytes(Stage(m, training, layout.single(dp=2, zero=2, gas=1), 0))[0] / m.params == pytest.approx(1.0)
    assert model_states.grad_bytes(Stage(m, training, layout.single(dp=2, zero=2, gas=4), 0), True)[0] / m.params == \
        pytest.approx(1.0)


def test_offload_moves_states_to_the_host():
    # ZeRO-Offload (Ren et al. 2021 s.4): fp32 master + Adam states (12 B) and fp32 grads (4 B) per
    # parameter of the rank's partition go to the host; ZeRO-Infinity's NVMe keeps none in host RAM.
    # DeepSpeed 0.19.8 also keeps a 16-bit partition copy there (2 B) and a staging buffer of the
    # largest parameter on each side: Llama-2-7B's embedding, 32,000 x 4,096 in bf16 = 262,144,000 B
    model = lookup("llama-2-7b")
    training = layout.Training(zero_config=layout.ZeroConfig(reduce_bucket_size=1000))
    c = cluster(8)
    cpu = memory.rank_memory(model, c, training, layout.single(dp=8, zero=2, offload_optimizer="cpu"))
    assert cpu["optimizer"][0] == 2 * 32_000 * 4_096 and cpu["grads"][0] == 0
    per_rank = (16 + 2) * model.params / 8 + 2 * 32_000 * 4_096
    assert cpu["cpu_per_node"][0] == pytest.approx(per_rank * 8, rel=1e-9)  # 8 ranks per node
    lay = layout.single(dp=8, zero=3, offload_optimizer="nvme", offload_params="cpu")
    assert model_states.weight_bytes(Stage(model, training, lay, 0))[0] == 0
    # the bf16 partition, the bf16 gradient partitions and the NVMe swapper's 4 fp32 buffers of the
    # partition (under sub_group_size 1e9; test_zero3_nvme_offload_keeps_swap_buffers_in_host_memory)
    assert model_states.host_bytes(Stage(model, training, lay, 0))[0] == pytest.approx((2 + 2 + 4 * 4) * model.params / 8, rel=1e-9)


def test_zero3_offload_host_bytes_per_engine():
    # everything offloaded, bf16, 8 ranks, per parameter of the shard: FSDP2 (CPUOffloadPolicy) keeps the
    # fp32 shard, its fp32 gradient and AdamW's two states there, 4 + 4 + 8 = 16 (counted on torch's
    # fully_shard, tests/test_fsdp_real.py); DeepSpeed ZeRO-3 adds its bf16 partition and its bf16
    # gradient partitions, 16 + 2 + 2 = 20 (counted, tests/test_deepspeed_offload_real.py)
    model = lookup("llama-2-7b")
    lay = layout.single(dp=8, zero=3, offload_optimizer="cpu", offload_params="cpu")
    for engine, per_param in (("fsdp", 16), ("torchtitan", 16), ("deepspeed", 20)):
        host = model_states.host_bytes(Stage(model, layout.Training(engine=engine), lay, 0))[0]
        assert host == pytest.approx(per_param * model.params / 8, rel=1e-9), engine


def test_zero3_nvme_offload_keeps_swap_buffers_in_host_memory():
    # Llama-3-70B (70,553,706,496 parameters) over 16 ranks: a partition of 4,409,606,656. DeepSpeed
    # 0.19.8's defaults (offload_config.py): the optimizer's swapper pins 4 fp32 buffers of the largest
    # sub-group and the bf16 gradient partitions stay on the host. A sub-group closes once its
    # partitions reach sub_group_size 1e9 (stage3.py _create_fp16_sub_groups); a rank's partitions:
    # the embedding 128,256 x 8,192 / 16 = 65,667,072, a layer 53,478,400 (q, o 4,194,304, k, v 524,288,
    # gate, up, down 14,680,064, 2 norms 512). The first: embedding + 17 layers = 974,799,872, then q, k,
    # v, o, gate, up: 1,013,597,184 (the largest). 4 x 1,013,597,184 x 4 + 2 x 4,409,606,656 = 25.04 GB
    model = lookup("llama-3-70b")
    assert model.params == 70_553_706_496
    training, part = layout.Training(engine="deepspeed"), 70_553_706_496 / 16
    optimizer = model_states.host_bytes(Stage(model, training, layout.single(dp=16, zero=3, offload_optimizer="nvme"), 0))[0]
    assert optimizer == pytest.approx(4 * 1_013_597_184 * 4 + 2 * part, rel=1e-12)
    both = model_states.host_bytes(Stage(model, training, layout.single(dp=16, zero=3, offload_optimizer="nvme",
                                                            offload_params="nvme"), 0))[0]
    # the parameters' swapper pins 5 x 1e8 bf16 elements (each rounded up to 1,024 B: 100,000,256), keeps
    # the first max_in_cpu 1e9 of the partition, and, the partition spilling past it, a reuse buffer of
    # the largest sub-group's FULL parameters (stage3.py reserve_partitioned_swap_space, t.ds_numel;
    # measured: tests/test_deepspeed_nvme_real.py): the embedding 1,050,673,152 + 17 x 855,654,400 + q,
    # k, v, o, gate, up 620,756,992 = 16,217,554,944 elements, 32.4 GB a rank
    assert both - optimizer == pytest.approx((5 * 100_000_256 + 1e9 + 16_217_554_944) * 2, rel=1e-12)


def test_zero2_has_no_nvme_offload_in_deepspeed():
    # stage_1_and_2.py takes any offload_optimizer device as cpu_offload: refused, with the flag named
    from planner import rules
    from planner.errors import InputError

    model, c = lookup("llama-2-7b"), cluster(8)
    with pytest.raises(InputError, match="--offload-optimizer nvme"):
        rules.check_single(model, c, layout.Training(engine="deepspeed"),
                           layout.single(dp=8, zero=2, offload_optimizer="nvme"))
    rules.check_single(model, c, layout.Training(engine="deepspeed"), layout.single(dp=8, zero=3, offload_optimizer="nvme"))


# ---------------------------------------------------------------------------------------------
# DeepSpeed buffers (runtime/zero/stage_1_and_2.py, stage3.py, config.py defaults)


def test_reduce_buckets_are_reduce_bucket_size_elements():
    # DeepSpeedZeroConfig default reduce_bucket_size 5e8 elements: 1 GB of bf16 per rank, two with
    # overlap_comm for ZeRO-1/2 (double buffers), one for ZeRO-3
    lay = layout.Layouts(tp=1, pp=1, dp=8, cp=1, ep=1, vpp=1, zero=[0, 1, 2, 3], offload_optimizer=0,
                         offload_params=0, mbs=1, gas=1, recompute=0, sequence_parallel=0, schedule=0)
    plain = memory.deepspeed_reduce_buckets(layout.Training(), lay)
    assert list(plain) == [0, 1e9, 1e9, 1e9]
    overlap = memory.deepspeed_reduce_buckets(layout.Training(zero_config=layout.ZeroConfig(overlap_comm=True)), lay)
    assert list(overlap) == [0, 2e9, 2e9, 1e9]


def tiny_llama():
    # the tiny Llama tests/test_deepspeed_real.py trains: 2 layers, h 64, 4 heads, 2 KV heads, ffn 176, vocab 512
    return ModelSpec(layers=2, hidden=64, heads=4, kv_heads=2, ffn=176, vocab=512)


def test_straddling_parameters_counted_whole():
    # measured on the real engine (tests/test_deepspeed_real.py): rank 0's grads_in_partition holds
    # 83,072 elements (embedding, block 0 and block 1's q projection, whole) where P/D = 79,008
    m = tiny_llama()
    lay = layout.single(dp=2, zero=2)
    assert m.params == 158_016
    assert sharding.deepspeed_grad_partition_excess(Stage(m, layout.Training(), lay, 0))[0] == 83_072 - 79_008
    # bf16: 2 bytes each; ZeRO-2 holds them in backward and at the step, ZeRO-1 at the step only
    training = layout.Training()
    assert memory.deepspeed_straddle_bytes(Stage(m, training, lay, 0), at_step=False)[0] == 2 * 4064
    z1 = layout.single(dp=2, zero=1)
    assert memory.deepspeed_straddle_bytes(Stage(m, training, z1, 0), at_step=False)[0] == 0
    assert memory.deepspeed_straddle_bytes(Stage(m, training, z1, 0), at_step=True)[0] == 2 * 4064


def test_zero2_step_peak_is_2_plus_20_over_d():
    # measured: the ZeRO-1/2 optimizer step holds 2 + 20/D bytes/param: 2 weights + 12/D master
    # and Adam + 2/D gradient partition + 2/D flattened copy + 4/D fp32 copy (step(): flatten, .to(fp32))
    model = lookup("llama-2-7b")
    training = layout.Training(seq_len=1, zero_config=layout.ZeroConfig(reduce_bucket_size=1000))
    lay = layout.single(dp=4, zero=2, mbs=1)
    mem = memory.rank_memory(model, cluster(4), training, lay)
    assert memory.PHASES[mem["phase"][0]] == "optimizer step"  # one token of activations: the step is the peak
    straddle = memory.deepspeed_straddle_bytes(Stage(model, training, lay, 0), at_step=True)[0]
    tensors = sum(mem[k][0] for k in ("params", "grads", "optimizer", "buffers")) - straddle
    assert tensors / model.params == pytest.approx(2 + 20 / 4, rel=1e-6)  # 7.0 B/param at D = 4


def test_zero1_peak_is_the_boundary_reduction():
    # measured (tests/test_deepspeed_real.py): at the accumulation boundary ZeRO-1 allocates its
    # 2/D grads_in_partition (with the straddling parameters) while the full 16-bit gradient is still
    # held: 2 + 2/D + 12/D states + 2 weights = 2 + 2 + 14/D bytes/param, above the step's 2 + 20/D
    model = lookup("llama-2-7b")
    training = layout.Training(seq_len=1, zero_config=layout.ZeroConfig(reduce_bucket_size=1000))
    lay = layout.single(dp=4, zero=1, mbs=1)
    mem = memory.rank_memory(model, cluster(4), training, lay)
    assert memory.PHASES[mem["phase"][0]] == "gradient reduction"
    grads, buffers = memory.reduction_copy_bytes(Stage(model, training, lay, 0))
    straddle = memory.deepspeed_straddle_bytes(Stage(model, training, lay, 0), at_step=True)[0]
    assert grads[0] / model.params == pytest.approx(2 + 2 / 4, rel=1e-6)
    assert buffers[0] == straddle + 2 * 1000  # and the 1000-element bf16 bucket
    tensors = sum(mem[k][0] for k in ("params", "grads", "optimizer", "buffers")) - straddle - 2000
    assert tensors / model.params == pytest.approx(2 + 2 + 14 / 4, rel=1e-6)  # 7.5 B/param at D = 4
    # ZeRO-2 reduces in its backward hooks: no such moment
    assert memory.reduction_copy_bytes(Stage(model, training, layout.single(dp=4, zero=2), 0))[0][0] == 0


def test_zero3_sub_group_fp32_gradient_chunk():
    # stage3.py _prepare_fp32_grad_for_sub_group: the optimizer step holds a flattened 16-bit copy of
    # min(sub_group_size, partition) gradient elements and its fp32 conversion (2 + 4 B, bf16)
    m = lookup("llama-2-7b")
    small = layout.Training(zero_config=layout.ZeroConfig(sub_group_size=10_000_000))
    lay = layout.single(dp=8, zero=3)
    assert small.precision.element_bytes == 2
    assert memory.deepspeed_step_grad_copies(Stage(m, small, lay, 0))[0] == 6 * 10_000_000
    assert memory.deepspeed_step_grad_copies(Stage(m, layout.Training(), lay, 0))[0] == pytest.approx(6 * m.params / 8)


def test_zero3_default_reuse_keeps_whole_gathered_model():
    # measured (DeepSpeed 0.19.8, 2 gloo ranks): max_live_parameters = max_reuse_distance = 1e9 keep 2 B/param
    # gathered; so does prefetching under max_live with max_reuse_distance 0 (what it passed stays:
    # tests/test_deepspeed_zero3_live.py); with neither, one module: the largest, not a block
    model = ModelSpec(layers=8, hidden=512, heads=8, kv_heads=8, ffn=1408, vocab=1000)
    base = layout.Training(zero_config=layout.ZeroConfig(reduce_bucket_size=1000, stage3_prefetch_bucket_size=1000,
                                                         stage3_param_persistence_threshold=10))
    lay = layout.single(dp=2, zero=3)
    live = memory.zero3_live_param_bytes(Stage(model, base, lay, 0))[0]
    assert live / model.params == pytest.approx(2.0, rel=1e-6)
    no_reuse = replace(base, zero_config=replace(base.zero_config, stage3_max_reuse_distance=0))
    assert memory.zero3_live_param_bytes(Stage(model, no_reuse, lay, 0))[0] == live
    nothing_ahead = replace(no_reuse, zero_config=replace(no_reuse.zero_config, stage3_prefetch_bucket_size=0))
    # gate_proj 512 x 1408 = 720,896 elements (the embedding 1000 x 512 is smaller), bf16
    assert memory.zero3_live_param_bytes(Stage(model, nothing_ahead, lay, 0))[0] == 2 * 720_896


def test_zero3_persistent_parameters_are_the_small_tensors():
    # parameter_offload.py: tensors with ds_numel below stage3_param_persistence_threshold (default 1e5)
    # stay whole: Llama-2-7B's two 4096-element RMSNorm weights per block; its matrices are far larger
    m = lookup("llama-2-7b")
    assert sharding.persistent_params(m, layout.Training(), layout.single(dp=8, zero=3), 100_000, 0)[0] == 32 * 2 * 4096
    # GPT-3 175B, tp 8: q/k/v (fused c_attn) bias 3*12288/8 = 4608 and c_fc bias 49152/8 = 6144 are split,
    # LayerNorm weight+bias (4 x 12288) and the row-parallel biases (2 x 12288) are whole
    g = lookup("gpt3-175b")
    assert sharding.persistent_params(g, layout.Training(engine="megatron"), layout.single(tp=8),
                                      100_000, 0)[0] == 96 * (4608 + 6144 + 6 * 12288)  # 96 blocks


def test_fsdp_holds_the_root_and_a_blocks_unsharded_buffers():
    # FSDP2 fully_shard per block and at the root, bf16 params, fp32 reduce (measured on 2 gloo ranks,
    # tests/test_fsdp_transients_real.py): a middle block's backward holds the root unit gathered
    # (R = 2 x 32000 x 4096 + 4096 = 262,148,096 params, 2 B), its first gradients (lm_head + norm,
    # 131,076,096 x 2 B), and of the blocks (202,383,360 params) its parameters and gradients (2 + 2 B),
    # the next one prefetched (2 B) and the previous one's fp32 reduce-scatter input (4 B)
    m = lookup("llama-2-7b")
    fsdp = layout.Training(engine="fsdp")
    backward = 2 * 262_148_096 + 2 * 131_076_096 + (2 + 2 + 2 + 4) * 202_383_360
    assert memory.fsdp_unsharded_unit_bytes(Stage(m, fsdp, layout.single(dp=8, zero=3), 0))[0] == backward
    assert memory.fsdp_unsharded_unit_bytes(Stage(m, fsdp, layout.single(dp=8, zero=0), 0))[0] == 0


def test_overhead_counts_context_and_communicators():
    # tp 2, pp 2, dp 2: world, TP, DP and PP communicators (Megatron parallel_state) = 4 NCCL groups;
    # priors: 512 MiB CUDA context, 128 MiB per communicator (16 channels x 2 x 4 MiB NCCL_BUFFSIZE),
    # 19% of tensor bytes for the allocator's reserve (measured on whole H200 training steps)
    lay = layout.single(tp=2, pp=2, dp=2)
    assert memory.process_groups(lay)[0] == 4
    coef = memory.coefficients("memory")
    fixed = coef["cuda_context_bytes"] + coef["nccl_bytes_per_group"] * memory.process_groups(lay)
    assert fixed[0] == 512 * 2**20 + 4 * 128 * 2**20
    assert memory.reserved_bytes(np.array([2.0**30]), coef)[0] == np.ceil(1.19 * 2**30)
    # a whole rank with almost no tensors: its overhead is the context and the 4 communicators beside the
    # reserve, and what must fit is the allocated peak and those
    tiny = ModelSpec(layers=2, hidden=8, heads=1, kv_heads=1, ffn=8, vocab=8)
    mem = memory.rank_memory(tiny, cluster(8), layout.Training(seq_len=1), lay)
    assert mem["overhead"][0] == np.ceil(1024 * 2**20 + 0.19 * (mem["total"][0] - mem["overhead"][0]))
    assert mem["required"][0] == mem["allocated"][0] + 1024 * 2**20


def test_tp_comm_overlap_books_transformer_engines_userbuffers():
    # TE 2.20.2 initialize_ub: 12 communicators (ring_exchange 4, pipeline 2, bulk 4, external 2),
    # each a bf16 buffer of (sequence x micro-batch / cp, hidden), allocated by Userbuffers outside
    # PyTorch's allocator: in the device total, not in the allocated or reserved peaks
    def mem(overlap, **kw):
        return api.estimate("llama-3-70b", {"gpus": 64}, {"engine": "megatron", "seq_len": 8192, "tp_comm_overlap": overlap},
                            {"tp": 8, "pp": 2, "vpp": 4, "zero": 1, "mbs": 2, "sequence_parallel": True, **kw}).memory

    off, on = mem(False), mem(True)
    assert on["gpu_bytes"] - off["gpu_bytes"] == 12 * 8192 * 2 * 8192 * 2  # 3 GiB: h 8192, 2 x 8192 tokens
    assert on["allocated_bytes"] == off["allocated_bytes"] and on["reserved_bytes"] == off["reserved_bytes"]
    assert mem(True, cp=2)["gpu_bytes"] - mem(False, cp=2)["gpu_bytes"] == 12 * 8192 * 2 * 8192 * 2 / 2
    assert mem(True, sequence_parallel=False)["gpu_bytes"] == mem(False, sequence_parallel=False)["gpu_bytes"]


# ---------------------------------------------------------------------------------------------
# activations: Korthikanti et al. 2022 Table 2, on the GPT shapes of their Table 3 (s = 2048)

TABLE3 = [("korthikanti-gpt-22b", 4), ("korthikanti-gpt-175b", 1), ("korthikanti-gpt-530b", 1),
          ("korthikanti-gpt-1t", 1)]


@pytest.mark.parametrize("name, b", TABLE3)
@pytest.mark.parametrize("setting", ["none", "tp", "tp+sp", "tp+selective", "tp+sp+selective", "full"])
def test_korthikanti_table2(name, b, setting):
    model = lookup(name)
    s, h, a, t = 2048, model.hidden, model.heads, 8
    training = layout.Training(seq_len=s, flash_attention=False, engine="megatron")  # Korthikanti counts Megatron's block
    table2 = {  # bytes per layer, Korthikanti 2022 Table 2
        "none": (dict(tp=1), s * b * h * (34 + 5 * a * s / h)),
        "tp": (dict(tp=t), s * b * h * (10 + 24 / t + 5 * a * s / (h * t))),
        "tp+sp": (dict(tp=t, sequence_parallel=True), s * b * h * (34 / t + 5 * a * s / (h * t))),
        "tp+selective": (dict(tp=t, recompute="selective"), s * b * h * (10 + 24 / t)),
        "tp+sp+selective": (dict(tp=t, recompute="selective", sequence_parallel=True), 34 * s * b * h / t),
        "full": (dict(tp=t, recompute="full"), 2 * s * b * h),
    }
    kwargs, expected = table2[setting]
    lay = layout.single(mbs=b, **kwargs)
    assert activations.kept_per_layer(model, training, lay)[0] == pytest.approx(expected, rel=1e-12)


def test_swiglu_gqa_flash_terms():
    # tensor by tensor for a Llama-2-70B block: per token per layer, bf16, t = 1, flash attention:
    # norms+qkv/mlp inputs 4h*2, q 2*8192, k,v 2*1024 each, out-proj input 2*8192, MLP 3*2*28672,
    # fp32 log-sum-exp 4*64 (Megatron's modules)
    m = lookup("llama-2-70b")
    per_token = activations.kept_per_layer(m, layout.Training(seq_len=1, engine="megatron"), layout.single())[0]
    assert per_token == 8 * 8192 + 2 * (2 * 8192 + 2 * 1024) + 3 * 2 * 28672 + 4 * 64


def test_recompute_working_set_is_one_block():
    # Korthikanti s.5: full recompute keeps each block's input (2sbh) and rematerializes one block at a
    # time in backward: sbh(10 + 24/t + 5as/(ht)) for the 22B shape (b 1, t 8, s 2048); selective
    # rematerializes the attention core only, 5as^2b/t
    m = lookup("korthikanti-gpt-22b")
    s, b, h, a, t = 2048, 1, 6144, 64, 8
    training = layout.Training(seq_len=s, flash_attention=False, engine="megatron")
    full = activations.recompute_working_bytes(m, training, layout.single(tp=t, recompute="full"))[0]
    sel = activations.recompute_working_bytes(m, training, layout.single(tp=t, recompute="selective"))[0]
    assert full == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)
    assert sel == pytest.approx(5 * a * s * s * b / t, rel=1e-12)


def test_embedding_dropout_mask_per_micro_batch_in_flight():
    # Korthikanti s.4.3: the embedding's dropout keeps an sbh 1-byte mask per micro-batch; stage 0 of
    # a 4-stage 1F1B pipeline holds 4 micro-batches: 4 sbh (s 2048, b 1, h 6144)
    m = lookup("korthikanti-gpt-22b")
    lay = layout.single(pp=4, gas=8)
    got = activations.embedding_dropout_bytes(Stage(m, layout.Training(seq_len=2048), lay, S0))[0]
    assert got == 4 * 2048 * 6144
    assert activations.embedding_dropout_bytes(Stage(lookup("llama-2-7b"), layout.Training(), lay, S0))[0] == 0


def test_last_stage_keeps_the_head_inputs():
    # Korthikanti s.4.3: the final LayerNorm's input and the output layer's input, 2sbh each in 16 bits,
    # one micro-batch, on the last stage only (s 4096, b 2, h 4096): 4 * 4096 * 2 * 4096 bytes
    m = lookup("llama-2-7b")
    lay = layout.single(pp=4, mbs=2, gas=8)
    training = layout.Training(seq_len=4096, engine="megatron")
    assert activations.head_input_bytes(Stage(m, training, lay, np.array([3])))[0] == 4 * 4096 * 2 * 4096
    assert activations.head_input_bytes(Stage(m, training, lay, S0))[0] == 0
    # the whole last stage therefore holds more than its blocks' activations alone
    n3 = pipeline.layers_on_stage(32, 4, 3)
    blocks = activations.kept_per_layer(m, training, lay)[0] * n3 * 1  # 1 micro-batch in flight on stage 3
    assert activations.stage_activation_bytes(Stage(m, training, lay, np.array([3])))[0] == blocks + 4 * 4096 * 2 * 4096


def test_logits_are_ten_bytes_per_vocab_element():
    # Megatron-core tensor_parallel/cross_entropy.py: 16-bit logits (2 B), their fp32 copy (4 B) and the
    # fp32 softmax saved for backward (4 B), vocab-parallel over t: Llama-3-8B, s 4096, b 1, t 2
    m = lookup("llama-3-8b")
    coef = memory.coefficients("memory")["logits_bytes_per_element"]
    lay = layout.single(tp=2, pp=2)
    assert coef == 10
    got = activations.logits_bytes(Stage(m, layout.Training(seq_len=4096), lay, np.array([1])), coef)[0]
    assert got == 10 * 4096 * 128256 / 2
    assert activations.logits_bytes(Stage(m, layout.Training(seq_len=4096), lay, S0), coef)[0] == 0


@pytest.mark.parametrize("p, v, m", [(8, 1, 64), (8, 3, 64), (35, 3, 280), (4, 1, 2)])
def test_first_stage_in_flight_matches_korthikanti_factor(p, v, m):
    # Korthikanti 2022 section 4.2.3: first stage holds L(1 + (p-1)/(p v)) layers' worth when m >= p,
    # i.e. p (1 + (p-1)/(p v)) micro-batches of its L/p layers; 1F1B with m < p holds m.
    lay = layout.single(pp=p, vpp=v, gas=m)
    expected = min(p, m) if v == 1 else p * (1 + (p - 1) / (p * v))
    assert pipeline.microbatches_in_flight(lay.pp, lay.vpp, lay.gas, lay.schedule, 0)[0] == pytest.approx(expected)


def test_layers_per_stage_match_deepspeed_uniform_partition():
    deepspeed_utils = pytest.importorskip("deepspeed.runtime.utils")
    for layers, p in ((32, 4), (30, 4), (80, 7), (126, 16)):
        parts = deepspeed_utils.partition_uniform(num_items=layers, num_parts=p)  # stage i: parts[i]..parts[i+1]
        ours = [int(pipeline.layers_on_stage(layers, p, i)) for i in range(p)]
        assert sorted(ours) == sorted(b - a for a, b in zip(parts, parts[1:])) and sum(ours) == layers


# ---------------------------------------------------------------------------------------------
# the whole rank


def test_peak_rank_is_first_or_last_stage():
    model = lookup("llama-2-13b")
    training = layout.Training(engine="megatron")
    for pp in (2, 4, 5, 8):
        lay = layout.single(pp=pp, gas=16)
        stages = memory.per_stage(model, cluster(8), training, lay)
        assert max(s["total"] for s in stages) == memory.rank_memory(model, cluster(8), training, lay)["total"][0]


shapes = st.builds(
    lambda L, heads, kv_div, width, ffn_mult, vocab, kind: ModelSpec(
        layers=L, hidden=heads * width, heads=heads, kv_heads=heads // kv_div, ffn=ffn_mult * heads * width,
        vocab=vocab, ffn_kind=kind),
    L=st.sampled_from([8, 16, 24, 32]), heads=st.sampled_from([8, 16, 32]), kv_div=st.sampled_from([1, 2, 8]),
    width=st.sampled_from([32, 64, 128]), ffn_mult=st.integers(2, 4), vocab=st.integers(1000, 130000),
    kind=st.sampled_from(["gelu", "swiglu"]))


def tensor_bytes(mem):
    # NCCL communicator buffers grow with the number of process groups (one more per new
    # parallel dimension), so monotonicity is asserted on everything else
    return mem["total"] - mem["overhead"]


FREEING = layout.ZeroConfig(reduce_bucket_size=10**6, stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=10**5,
                            stage3_param_persistence_threshold=0)


def total(model, lay, training=None, n=64):
    # stage3_max_reuse_distance 0: with DeepSpeed's 1e9 default ZeRO-3 keeps the whole gathered model
    # alive, and on small models really holds more than ZeRO-2 (13.5 vs 12 B/param measured at D=2),
    # so "memory never rises with the ZeRO stage" holds for the freeing config; so does persistence 0
    # (the default 1e5-element threshold keeps most tensors of these small shapes whole on every rank)
    training = training or layout.Training(engine="megatron-deepspeed", seq_len=1024, zero_config=FREEING)
    return tensor_bytes(memory.rank_memory(model, cluster(n), training, lay))[0]


base_layout = st.fixed_dictionaries(dict(
    dp=st.sampled_from([4, 8]), zero=st.integers(0, 3), mbs=st.integers(1, 4), gas=st.integers(1, 8),
    recompute=st.sampled_from(Recompute.words()), tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4])))


@settings(max_examples=80, deadline=None)
@given(shapes, base_layout)
def test_memory_never_rises_with_parallelism_or_recompute(model, kw):
    if model.heads % kw["tp"] or model.kv_heads % kw["tp"]:
        kw["tp"] = 1
    ref = total(model, layout.single(**kw))
    # parts are rounded up to whole bytes, hence the 1e-6 tolerance; ZeRO-1 -> 2 shards gradients
    # only when gas = 1 (ZeRO-2 keeps a second partition per later micro-step), so compare ZeRO-2 at gas 1.
    # A bf16 pipeline without ZeRO runs DeepSpeed's BF16_Optimizer, itself partitioned over DP, which
    # holds no reduce buckets: ZeRO-1's optimizer can hold more (measured, test_deepspeed_optimizers_real)
    # DeepSpeed's pipeline engine runs ZeRO 0 and 1 only (pipe/engine.py: "ZeRO-2 and ZeRO-3 are
    # incompatible with pipeline parallelism"; rule engine_pipeline_zero): no higher stage to compare
    pipelined = kw["pp"] > 1 and kw["zero"] + 1 not in layout.Training(engine="megatron-deepspeed").engine.pipeline_zero_stages
    if kw["zero"] < 3 and not (kw["zero"] == 1 and kw["gas"] > 1) and not (kw["zero"] == 0 and kw["pp"] > 1) \
            and not pipelined:
        assert total(model, layout.single(**{**kw, "zero": kw["zero"] + 1})) <= ref * (1 + 1e-6)
    if kw["tp"] < 8 and model.heads % (2 * kw["tp"]) == 0 and model.kv_heads % (2 * kw["tp"]) == 0:
        assert total(model, layout.single(**{**kw, "tp": 2 * kw["tp"]})) <= ref * (1 + 1e-6)
    if model.layers % (2 * kw["pp"]) == 0 and kw["gas"] >= 2 * kw["pp"]:
        assert total(model, layout.single(**{**kw, "pp": 2 * kw["pp"]})) <= ref * (1 + 1e-6)
    r = Recompute.parse(kw["recompute"], "--recompute")
    if r < Recompute.FULL:
        assert total(model, layout.single(**{**kw, "recompute": Recompute(r + 1).word})) <= ref * (1 + 1e-6)


@settings(max_examples=60, deadline=None)
@given(shapes, base_layout)
def test_memory_never_falls_with_batch_or_sequence(model, kw):
    if model.heads % kw["tp"] or model.kv_heads % kw["tp"]:
        kw["tp"] = 1
    ref = total(model, layout.single(**kw))
    assert total(model, layout.single(**{**kw, "mbs": kw["mbs"] + 1})) >= ref
    longer = layout.Training(engine="megatron-deepspeed", seq_len=2048, zero_config=FREEING)
    assert total(model, layout.single(**kw), longer) >= ref


def test_torchtitan_context_parallel_keeps_the_gathered_kv():
    # FlexAttention under torchtitan's CP keeps the all-gathered K and V (measured on 2 gloo ranks:
    # tests/test_torch_cp_real.py): Llama-3-8B, s 8192 over cp 4, 2048 local tokens: 3 more shards of
    # K and V (1024 wide each, bf16) per layer, 2048 x 3 x 2 x 2048 bytes; none under Megatron's ring
    m = lookup("llama-3-8b")
    lay = layout.single(cp=4)
    tt = layout.Training(seq_len=8192, engine="torchtitan")
    assert activations.cp_gathered_kv_bytes(m, tt, lay)[0] == 2048 * 3 * 2 * 2048
    assert activations.cp_gathered_kv_bytes(m, layout.Training(seq_len=8192, engine="megatron"), lay)[0] == 0


def test_deepspeed_zero0_step_holds_fp32_gradients_twice():
    # DeepSpeed 0.19.8 runtime/fp16/fused_optimizer.py FP16_Optimizer.step (ZeRO disabled, bf16, the ds_config's
    # AdamW = FusedAdam): [p.grad.to(fp32) for p in group] then _flatten_dense_tensors of that list: the list and
    # the flat buffer, 4 + 4 bytes per parameter, beside the bf16 gradients; Llama-2-7B on one rank
    m = lookup("llama-2-7b")
    lay = layout.single()
    got = memory.deepspeed_step_grad_copies(Stage(m, layout.Training(engine="deepspeed"), lay, 0))[0]
    assert got == 8 * 6_738_415_616
    fp32 = memory.deepspeed_step_grad_copies(Stage(m, layout.Training(engine="deepspeed", precision="fp32"), lay, 0))[0]
    assert fp32 == 0  # no 16-bit optimizer wrapper in fp32
