"""Step time, FLOPs and throughput of candidate layouts, vectorized over `Layouts`.

Every function takes (model, cluster, training, lay) and returns arrays of lay's shape, so the
search times ~1e6 candidates in one pass. The step is assembled from per-micro-batch work on the
slowest pipeline stage (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
GPU Clusters", sections 2-3) plus per-step communication, offload and the optimizer update:

    step = m*(compute + recompute + exposed TP) + bubble + PP p2p + exposed DP + offload + optimizer + other

Every breakdown part is exposed (critical-path) seconds, non-negative, and they sum to step_s.
FLOP counts follow the paper convention (full, non-causal s^2 attention; Narayanan eq. 3, PaLM
appendix B); times use what the kernels really do (FlashAttention skips masked blocks).
"""

from __future__ import annotations

import numpy as np

from planner.hardware import GPU, Cluster
from planner.layout import Layouts, Training, grouped
from planner.memory import coefficients, layers_on_stage, rank_params, state_bytes_per_param
from planner.model import ModelSpec

BREAKDOWN_KEYS = ("compute", "recompute", "tp_comm", "dp_comm", "pp_comm", "pp_bubble", "offload", "optimizer", "other")
MEGATRON_DDP_BUCKET = 40_000_000  # megatron.core DistributedDataParallelConfig: bucket_size = max(40M, 1M * dp)


def peak_flops_per_s(gpu: GPU, training: Training) -> float:
    """Dense peak of the GEMM dtype (bf16-pure computes in bf16; fp32 without TF32, PyTorch default)."""
    return gpu.peak_flops_per_s["bf16" if training.precision.startswith("bf16") else training.precision]


def _act_bytes(training: Training) -> float:
    return 4.0 if training.precision == "fp32" else 2.0


def _gemm_widths(model: ModelSpec, fused: bool) -> tuple[list, list]:
    """(attention, one expert's MLP) forward GEMMs of a block as FLOPs per token before the TP split.
    Megatron fuses q|k|v and gate|up into one column-parallel GEMM (megatron/core/transformer
    attention.py linear_qkv, mlp.py linear_fc1); Hugging Face modules run them separately."""
    h, q, kv, f = model.hidden, model.q_width, model.kv_width, model.ffn
    attn = ([2 * h * (q + 2 * kv)] if fused else [2 * h * q, 2 * h * kv, 2 * h * kv]) + [2 * q * h]
    if model.ffn_kind == "swiglu":  # Shazeer 2020: gate, up, down
        mlp = ([2 * h * 2 * f] if fused else [2 * h * f, 2 * h * f]) + [2 * f * h]
    else:
        mlp = [2 * h * f, 2 * f * h]
    return attn, mlp


# ---------------------------------------------------------------------------------------------
# FLOPs


def flops_per_step(model: ModelSpec, training: Training, lay: Layouts) -> dict:
    """Model FLOPs (fwd + 2x bwd, no recompute) and hardware FLOPs (plus the recomputed forward)
    of one step of the whole job, derived GEMM by GEMM; equals Narayanan 2021 eq. 3 for GPT shapes."""
    attn, mlp = _gemm_widths(model, fused=True)
    router = 2 * model.hidden * model.experts if model.experts > 1 else 0
    # per token forward: projections + top-k experts' MLP + router (active parameters only)
    gemm = sum(attn) + model.experts_per_token * sum(mlp) + router
    # QK^T and AV: 2*s*q each per token, full s^2 as in Narayanan eq. 3 and PaLM appendix B (12*L*h*s)
    core = 4.0 * training.seq_len * model.q_width
    logits = 2.0 * model.hidden * model.vocab
    tokens = (lay.gbs * training.seq_len).astype(np.float64)
    model_flops = 3.0 * tokens * (model.layers * (gemm + core) + logits)  # backward = 2x forward
    # Korthikanti 2022 section 6.3: full recompute reruns the block forward, selective the attention core
    extra = np.select([lay.recompute == 2, lay.recompute == 1], [gemm + core, core], 0.0)
    return {"model_flops": model_flops, "hardware_flops": model_flops + tokens * model.layers * extra}


# ---------------------------------------------------------------------------------------------
# collectives


def ring_time_s(nbytes, n, bus_bytes_per_s, kind="all_reduce", latency_s=0.0, count=1):
    """NCCL ring collective over n ranks (nccl-tests PERFORMANCE.md: busbw = algbw * 2(n-1)/n for
    all-reduce, (n-1)/n for all-gather/reduce-scatter): steps*latency per call + bytes*factor/busbw."""
    n = np.asarray(n, dtype=np.float64)
    steps = (2.0 if kind == "all_reduce" else 1.0) * (n - 1)
    time = count * steps * latency_s + nbytes * steps / np.maximum(n, 1) / bus_bytes_per_s
    return np.where((n > 1) & (np.asarray(nbytes) > 0), time, 0.0)


def group_bus_bytes_per_s(cluster: Cluster, stride, n, coef: dict) -> np.ndarray:
    """Achievable bus bandwidth of a group of n ranks spaced `stride` apart (Megatron rank order
    tp, cp, dp, pp: DP stride = t). Inside a node: NVLink busbw. Across nodes NCCL runs one ring per
    NIC (rail), so k members per node move k NICs' worth (hierarchical), capped by NVLink."""
    gpu, G = cluster.gpu, cluster.gpus_per_node
    intra = gpu.intra_node_bytes_per_s * coef["bus_efficiency_intra_node"]
    members_per_node = np.clip(G // np.maximum(stride, 1), 1, np.maximum(n, 1))
    inter = members_per_node * gpu.inter_node_bytes_per_s * coef["bus_efficiency_inter_node"]
    return np.where(stride * n > G, np.minimum(intra, inter), intra)


def group_latency_s(cluster: Cluster, stride, n, coef: dict) -> np.ndarray:
    """Per-step ring latency: NVLink hop inside a node, network hop when the group spans nodes."""
    spans = stride * n > cluster.gpus_per_node
    return np.where(spans, coef["collective_latency_s"], coef["collective_latency_intra_node_s"])


def _p2p_bytes_per_s(cluster: Cluster, crosses_nodes, coef: dict) -> np.ndarray:
    """One GPU's send bandwidth: its NVLink, or its own NIC when the peer is on another node."""
    gpu = cluster.gpu
    return np.where(crosses_nodes, gpu.inter_node_bytes_per_s * coef["bus_efficiency_inter_node"],
                    gpu.intra_node_bytes_per_s * coef["bus_efficiency_intra_node"])


# ---------------------------------------------------------------------------------------------
# per micro-batch work on one rank of the slowest stage


def _microbatch(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts, c: dict,
                detail: bool = False) -> dict:
    """Seconds of one micro-batch on one rank of the slowest stage (compute, recompute, exposed TP/EP/CP)."""
    gpu = cluster.gpu
    peak, e = peak_flops_per_s(gpu, training), _act_bytes(training)
    hbm = gpu.hbm_bytes_per_s * c["hbm_efficiency"]  # attainable bandwidth of memory-bound kernels
    h, q, kv, f, a, s = model.hidden, model.q_width, model.kv_width, model.ffn, model.heads, training.seq_len
    t = lay.tp.astype(np.float64)
    cp = lay.cp.astype(np.float64)
    T = lay.mbs * s / cp  # tokens per micro-batch on one rank (context parallelism splits the sequence)
    rep = np.where(lay.sequence_parallel > 0, t, 1.0)  # Korthikanti 2022 s.4.2.2: SP splits norms/dropout too
    full, selective = lay.recompute == 2, lay.recompute == 1
    E, k = model.experts, model.experts_per_token
    flash = training.flash_attention
    drop = 1.0 if model.dropout else 0.0

    # GEMMs: eff = emax*F/(F + F_half), so time = F/(peak*eff) = (F + F_half)/(peak*emax) per GEMM
    attn, mlp = _gemm_widths(model, fused=training.engine in ("megatron", "megatron-deepspeed"))
    rate, f_half = peak * c["gemm_efficiency_max"], c["gemm_half_efficiency_flops"]
    local_experts = np.maximum(E // lay.ep, 1)  # each holds T*k*ep/E rows (Lepikhin et al. 2020, GShard)
    gemm_fwd = (T / t * (sum(attn) + k * sum(mlp)) + f_half * (len(attn) + len(mlp) * local_experts)) / rate
    if E > 1:
        gemm_fwd = gemm_fwd + (2.0 * T * h * E + f_half) / rate  # router, replicated over TP
    # attention core QK^T + AV: 4*T*s*q/t FLOPs; causal FlashAttention skips the masked half
    # (Dao 2023, FlashAttention-2 s.3.1.1) and its backward runs 5 matmuls to the forward's 2 (s.3.1.2)
    core_flops = 4.0 * T * s * q / t * (0.5 if flash else 1.0)
    core_fwd = core_flops / (peak * (gpu.attention_efficiency or c["attention_efficiency"]))
    core_bwd = core_fwd * (2.5 if flash else 2.0)
    if not flash:
        # unfused a*s^2 score tensors per rank (Megatron FusedScaleMaskSoftmax + dropout): fwd writes S,
        # softmax reads/writes it, AV reads P (4e) [+ dropout r/w and 1-byte mask]; bwd: dP write,
        # softmax-grad reads dP,P writes dS, two GEMMs read dS, dV reads P (7e) [+ dropout grad]
        scores = lay.mbs * (a / t) * (s / cp) * s
        core_fwd = core_fwd + scores * (4 * e + drop * (2 * e + 1)) / hbm
        core_bwd = core_bwd + scores * (7 * e + drop * (2 * e + 1)) / hbm
    # elementwise, bytes per token (Megatron fused kernels): 2 norms (r+w) + 2 residual adds with
    # bias-dropout (r x, r residual, w, 1-byte mask) in the replicated region (Korthikanti Table 2's
    # 10sbh); the activation function (GeLU r f, w f; SwiGLU r 2f, w f) and rotary (r+w q, k) split by t
    act = (2 if model.ffn_kind == "gelu" else 3) * e * f * k
    rope = 2 * e * (q + kv) if model.positions == "rotary" else 0.0
    replicated = (10 * e + 2 * drop) * h
    if training.engine in ("deepspeed", "fsdp"):
        replicated, act, rope = _eager_elementwise_bytes(model, e)
    elem_fwd = T * (replicated / rep + (act + rope) / t) / hbm
    elem_bwd = 1.5 * elem_fwd  # backward reads grad-out and saved input, writes grad-in: 3 tensors vs 2
    layer_fwd = gemm_fwd + core_fwd + elem_fwd
    layer_bwd = 2.0 * gemm_fwd + core_bwd + elem_bwd  # dgrad + wgrad GEMMs of each forward GEMM

    # last stage: logits GEMM (vocab-parallel, V/t) and fp32 cross entropy (Megatron
    # vocab_parallel_cross_entropy: upcast e->4, max, exp, sum, grad, downcast: 2e + 32 bytes/logit)
    logits = (2.0 * T * h * model.vocab / t + f_half) / rate
    head = 3.0 * logits + T * model.vocab / t * (2 * e + 32) / hbm
    n = layers_on_stage(model, lay, 0)  # the first stages take the remainder layers: the max
    compute = n * (layer_fwd + layer_bwd) + head
    recompute = n * np.select([full, selective], [layer_fwd, core_fwd], 0.0)

    # TP: 2 all-reduces of T*h*e forward, 2 backward, 2 more in a recomputed forward (Shoeybi 2019;
    # Korthikanti 2022 s.4.2.2: SP's reduce-scatter + all-gather move the same bytes)
    intra_bw = gpu.intra_node_bytes_per_s * c["bus_efficiency_intra_node"]
    ar = ring_time_s(T * h * e, t, intra_bw, "all_reduce", c["collective_latency_intra_node_s"])
    tp = (4.0 + 2.0 * full) * ar * (1.0 - c["tp_overlap_fraction"])
    if E > 1:  # EP all-to-all dispatch + combine of T*k tokens, fwd and bwd (GShard s.3; Megatron-core MoE)
        ep = lay.ep.astype(np.float64)
        a2a_bw = _p2p_bytes_per_s(cluster, lay.tp * lay.cp * lay.ep > cluster.gpus_per_node, c)
        a2a = np.where(ep > 1, (ep - 1) * c["p2p_latency_s"] + T * k * h * e * (ep - 1) / ep / a2a_bw, 0.0)
        tp = tp + (4.0 + 2.0 * full) * a2a
    # CP ring attention (Liu et al. 2023; Megatron-core context parallel): cp-1 K/V chunk passes per
    # forward, K/V and dK/dV in backward, overlapped with the attention core; only the excess shows
    kv_pass = (cp - 1) * (c["p2p_latency_s"] + 2.0 * T * kv / t * e
                          / _p2p_bytes_per_s(cluster, lay.tp * lay.cp > cluster.gpus_per_node, c))
    cp_fwd = np.maximum(kv_pass - core_fwd, 0.0)
    cp_comm = cp_fwd * (1.0 + (full | selective)) + np.maximum(2.0 * kv_pass - core_bwd, 0.0)
    tp_comm = n * (tp + cp_comm)
    out = {"compute": compute, "recompute": recompute, "tp_comm": tp_comm, "slot": compute + recompute + tp_comm}
    if detail:  # one block's seconds with its exposed TP all-reduces (Korthikanti 2022 Table 4 quantities)
        two_ar = 2 * ar * (1.0 - c["tp_overlap_fraction"])
        out.update(fwd_s=layer_fwd + two_ar, bwd_s=layer_bwd + two_ar,
                   recompute_s=np.select([full, selective], [layer_fwd + two_ar, core_fwd], 0.0))
    return out


def _eager_elementwise_bytes(model: ModelSpec, e: float) -> tuple:
    """(replicated, activation-function, rotary) forward bytes per token of one block run as eager
    PyTorch modules, as DeepSpeed and FSDP train Hugging Face models (transformers modeling_llama):
    RMSNorm upcasts to fp32, squares, means, scales, downcasts and multiplies by the weight
    (r e+w 4, r 4+w 4, r 4, r 4+w 4, r 4+w e, r e+w e = 28 + 4e per element, two per block; LayerNorm
    is one fused kernel, 2e); two residual adds (3e each) and dropout (r e, w e, 1-byte mask);
    act_fn(gate) * up (2e + 3e per element; GeLU 2e); apply_rotary_pos_emb on q and k
    (q*cos, rotate_half's slice+cat, *sin, add: 2e + 2e + 2e + 3e); the attention output's
    transpose-reshape copy (2e per q element)."""
    h, q, kv, f = model.hidden, model.q_width, model.kv_width, model.ffn
    norm = (28 + 4 * e) if model.norm == "rmsnorm" else 2 * e
    drop = (2 * e + 1) * 2 if model.dropout else 0.0
    replicated = (2 * norm + 2 * 3 * e + drop) * h
    act = (5 * e if model.ffn_kind == "swiglu" else 2 * e) * f * model.experts_per_token
    rope = 9 * e * (q + kv) if model.positions == "rotary" else 0.0
    return replicated, act, rope + 2 * e * q


def layer_times(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts) -> dict:
    """Forward, backward and recompute seconds of one transformer block per micro-batch on one rank."""
    mb = _microbatch(model, cluster, training, lay, coefficients("time"), detail=True)
    return {k: mb[k] for k in ("fwd_s", "bwd_s", "recompute_s")}


# ---------------------------------------------------------------------------------------------
# the step


def step_time(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts) -> dict:
    """{'step_s', 'breakdown': {BREAKDOWN_KEYS: exposed seconds}, 'throughput': {...}} per candidate.

    Each part depends on a few fields only, so it is evaluated once per distinct combination of
    those fields and gathered back (the same formulas; ~1e6 candidates in a fraction of a second)."""
    c = coefficients("time")
    codes = lay.codes()
    per_step = grouped(codes, ("tp", "pp", "dp", "cp", "ep", "gas", "zero", "offload_optimizer", "offload_params"),
                        lambda sub: _per_step(model, cluster, training, sub, c))
    pipe = grouped(codes, ("tp", "pp", "dp", "cp", "ep", "gas", "mbs", "recompute", "sequence_parallel", "vpp",
                            "schedule"), lambda sub: _pipeline(model, cluster, training, sub, c))
    # overlapped communication hides only behind the compute it overlaps with; the excess is exposed
    busy = pipe["compute"] + pipe["recompute"]
    dp_comm = per_step["dp_exposed"] + np.maximum(per_step["dp_hideable"] - busy, 0.0)
    breakdown = {
        "compute": pipe["compute"], "recompute": pipe["recompute"], "tp_comm": pipe["tp_comm"],
        "dp_comm": dp_comm, "pp_comm": pipe["pp_comm"], "pp_bubble": pipe["pp_bubble"],
        "offload": per_step["offload"], "optimizer": per_step["optimizer"],
        "other": np.full(lay.tp.shape, max(float(c["step_overhead_s"]), 0.0)),
    }
    step_s = sum(breakdown[key] for key in BREAKDOWN_KEYS)
    rates = _rates(cluster, training, step_s, pipe["samples"], pipe["model_flops_per_gpu"], pipe["hardware_flops_per_gpu"])
    return {"step_s": step_s, "breakdown": breakdown, "throughput": rates}


def _pipeline(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts, c: dict) -> dict:
    """Per-step compute, TP, bubble and p2p seconds (m micro-batches on the slowest stage), and FLOPs."""
    p, m = lay.pp, lay.gas.astype(np.float64)
    mb = _microbatch(model, cluster, training, lay, c)
    # bubble (p-1)/m of the ideal m slots, (p-1)/(v m) interleaved (Narayanan 2021 s.2.2.1-2.2.2)
    v = np.where(lay.schedule == 1, lay.vpp, 1)
    # p2p of T*h*e per micro-batch per chunk, fwd + bwd, on the critical path of (v m + p - 1) slots;
    # split by t under SP or Megatron's scatter/gather over the TP ranks' NICs (Narayanan 2021 s.4.1)
    split = (lay.sequence_parallel > 0) | (training.engine == "megatron")
    tokens = lay.mbs * training.seq_len / lay.cp
    p2p_bytes = tokens * (model.hidden * _act_bytes(training)) / np.where(split, lay.tp, 1)
    p2p = c["p2p_latency_s"] + p2p_bytes / _p2p_bytes_per_s(cluster, lay.world > cluster.gpus_per_node, c)
    flops = flops_per_step(model, training, lay)
    gpus = lay.world
    return {"compute": m * mb["compute"], "recompute": m * mb["recompute"], "tp_comm": m * mb["tp_comm"],
            "pp_bubble": (p - 1) / v * mb["slot"], "pp_comm": np.where(p > 1, 2.0 * (v * m + p - 1) * p2p, 0.0),
            "samples": lay.gbs, "model_flops_per_gpu": flops["model_flops"] / gpus,
            "hardware_flops_per_gpu": flops["hardware_flops"] / gpus}


def _per_step(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts, c: dict) -> dict:
    """Exposed DP/ZeRO communication, offload traffic and the optimizer update of one step."""
    gpu, G = cluster.gpu, cluster.gpus_per_node
    zc = training.zero_config
    ds = training.uses_deepspeed
    m = lay.gas.astype(np.float64)
    z = lay.zero
    n_layers = layers_on_stage(model, lay, 0)
    # what one rank of the heavier end stage holds, and its ZeRO partition
    d0, expert = rank_params(model, lay, 0 * lay.pp)
    dense = np.maximum(d0, rank_params(model, lay, lay.pp - 1)[0])
    w, g, o = state_bytes_per_param(training)  # grads: 16-bit for DeepSpeed, fp32 for Megatron/FSDP
    n_dp = lay.dp * lay.cp  # gradients reduce over dp x cp (Megatron-core, DeepSpeed with sequence parallel)
    n_edp = np.maximum(n_dp // lay.ep, 1)
    bw_dp = group_bus_bytes_per_s(cluster, lay.tp, n_dp, c)
    bw_edp = group_bus_bytes_per_s(cluster, lay.tp * lay.ep, n_edp, c)
    lat = group_latency_s(cluster, lay.tp, n_dp, c)
    partition = np.where(z >= 1, dense / n_dp + expert / n_edp, dense + expert)

    # gradient reduction: all-reduce (ZeRO-0) or reduce-scatter (ZeRO-1/2/3), in buckets
    if ds:
        bucket = zc.reduce_bucket_size
    elif training.engine == "fsdp":
        bucket = np.maximum((dense + expert) / np.maximum(n_layers, 1), 1)  # one FSDP unit per block
    else:
        bucket = np.maximum(MEGATRON_DDP_BUCKET, 1_000_000 * n_dp)
    kind_ar = z == 0

    def reduce(elems, n, bw):
        calls = np.ceil(elems / bucket)
        return np.where(kind_ar, ring_time_s(elems * g, n, bw, "all_reduce", lat, calls),
                        ring_time_s(elems * g, n, bw, "reduce_scatter", lat, calls))

    grad_reduce = reduce(dense, n_dp, bw_dp) + reduce(expert, n_edp, bw_edp)
    # DeepSpeed stage_1_and_2.py reduce_ready_partitions_and_remove_grads: ZeRO-2 reduces every
    # micro-step (partition_gradients), ZeRO-1/0 at the accumulation boundary; ZeRO-3/FSDP every micro-step
    every_micro = (z == 3) | ((z == 2) & (ds or training.engine == "fsdp"))
    grad_reduce = grad_reduce * np.where(every_micro, m, 1.0)
    # overlap_comm None -> True for stage 3 (DeepSpeedZeroConfig); Megatron-LM --overlap-grad-reduce
    # is off by default (megatron/training/arguments.py); FSDP overlaps reduce-scatter with backward
    if ds:
        overlap = (z == 3) if zc.overlap_comm is None else np.full(z.shape, bool(zc.overlap_comm))
    else:
        overlap = np.full(z.shape, training.engine == "fsdp")
    hidden_frac = np.where(overlap, c["dp_overlap_fraction_with_overlap"], c["dp_overlap_fraction"])
    # ZeRO-1/2 (and Megatron's distributed optimizer): all-gather updated 16-bit params after the step
    # DeepSpeed 0.19 runtime/utils.py all_gather_dp_groups: with all_gather_into_tensor (NCCL) one call
    # per parameter group, allgather_bucket_size unused; Megatron gathers per DDP bucket
    ag_calls = 1.0 if ds else np.ceil((dense + expert) / bucket)
    param_gather = np.where((z == 1) | (z == 2), ring_time_s(dense * w, n_dp, bw_dp, "all_gather", lat, ag_calls)
                            + ring_time_s(expert * w, n_edp, bw_edp, "all_gather", lat, ag_calls), 0.0)
    # ZeRO-3: params gathered in forward and again in backward every micro-step (ZeRO paper s.7),
    # one coalesced all-gather per submodule (DeepSpeed fetch_sub_module; FSDP: one per block)
    per_layer = sum(len(x) for x in _gemm_widths(model, fused=training.engine == "megatron-deepspeed"))
    modules = n_layers * (1 if training.engine == "fsdp" else per_layer) + 2
    z3_gather = 2.0 * m * (ring_time_s(dense * w, n_dp, bw_dp, "all_gather", lat, modules)
                           + ring_time_s(expert * w, n_edp, bw_edp, "all_gather", lat, modules))
    z3_gather = np.where(z == 3, z3_gather, 0.0)
    # what overlap may hide (step_time caps it by the compute it runs under) and what stays exposed
    zf = c["zero3_gather_overlap_fraction"]
    dp_hideable = hidden_frac * grad_reduce + zf * z3_gather
    dp_exposed = (1 - hidden_frac) * grad_reduce + param_gather + (1 - zf) * z3_gather

    # optimizer on the GPU, memory-bound (Megatron-LM MixedPrecisionOptimizer.step, DeepSpeed alike):
    # unscale + inf check (r+w grads), grad norm (r), FusedAdam (r grads, r+w master and states),
    # copy to 16-bit params (w), zero the grad buffer (w): 5g + 2o + w bytes per partition parameter
    offload_opt = lay.offload_optimizer > 0
    node_gpus = min(G, cluster.num_gpus)
    gpu_step = partition * (5 * g + 2 * o + w) / (gpu.hbm_bytes_per_s * c["hbm_efficiency"])
    # ZeRO-Offload (Ren et al. 2021 s.4-5): DeepSpeedCPUAdam on the node's cores shared by its GPUs
    cpu_adam = partition * node_gpus / c["cpu_adam_params_per_s"]
    optimizer = np.where(offload_opt, cpu_adam, gpu_step)
    # grads go down as fp32 (stage_1_and_2.py async_inplace_copy_grad_to_fp32_buffer_from_gpu upcasts on
    # the GPU before the copy), overlapped with backward like the bucketed reduce (Ren et al. 2021 s.5.1);
    # with accumulation ZeRO-1/2 round-trip 16-bit grads through the CPU each micro-step
    # (async_accumulate_grad_in_cpu_via_gpu); ZeRO-3 offloads each micro-step's partition;
    # updated 16-bit params come back up, not overlapped (no delayed parameter update)
    pcie = gpu.pcie_bytes_per_s
    grads_down = np.where(z == 3, m * partition * 4.0, partition * 4.0 + (m > 1) * (2 * m - 1) * partition * w)
    offload = np.where(offload_opt, (1 - c["dp_overlap_fraction_with_overlap"]) * grads_down / pcie
                       + partition * w / pcie, 0.0)
    # ZeRO-Infinity NVMe (Rajbhandari et al. 2021 s.6): states read + written per step, pipelined with CPU Adam
    nvme_bw = gpu.nvme_bytes_per_s_per_node / node_gpus
    nvme_io = 2.0 * partition * o / nvme_bw
    offload = offload + np.where(lay.offload_optimizer == 2, np.maximum(nvme_io - cpu_adam, 0.0), 0.0)
    # ZeRO-3 param offload: the partition goes up before each gather (fwd, bwd), prefetched like the
    # gathers; a GPU optimizer's updated partition goes back down once
    param_up = partition * w / pcie + np.where(lay.offload_params == 2, partition * w / nvme_bw, 0.0)
    offload = offload + np.where(lay.offload_params > 0, 2.0 * m * param_up * (1 - c["zero3_gather_overlap_fraction"])
                                 + (~offload_opt) * partition * w / pcie, 0.0)
    return {"dp_exposed": dp_exposed, "dp_hideable": dp_hideable, "offload": offload, "optimizer": optimizer}


def throughput(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts, step_s) -> dict:
    """Tokens/s, samples/s, per-GPU model and hardware TFLOP/s, MFU and HFU of a given step time."""
    flops = flops_per_step(model, training, lay)
    gpus = lay.world
    return _rates(cluster, training, step_s, lay.gbs, flops["model_flops"] / gpus, flops["hardware_flops"] / gpus)


def _rates(cluster: Cluster, training: Training, step_s, samples, model_flops_per_gpu, hardware_flops_per_gpu) -> dict:
    # MFU excludes the recompute FLOPs, HFU includes them (Korthikanti 2022 s.6.3); peak of the GEMM dtype
    peak = peak_flops_per_s(cluster.gpu, training)
    per_s = 1.0 / step_s
    samples_per_s = samples * per_s
    model_per_gpu, hardware_per_gpu = model_flops_per_gpu * per_s, hardware_flops_per_gpu * per_s
    return {"tokens_per_s": samples_per_s * training.seq_len, "samples_per_s": samples_per_s,
            "model_tflops_per_gpu": model_per_gpu * 1e-12, "hardware_tflops_per_gpu": hardware_per_gpu * 1e-12,
            "mfu": model_per_gpu / peak, "hfu": hardware_per_gpu / peak}


def time_to_train(step_s, tokens_per_step, tokens, num_gpus, price_per_gpu_hour=None) -> dict:
    """Days, GPU-hours and (with a price) cost of training on `tokens` tokens."""
    seconds = np.asarray(step_s, dtype=np.float64) * (np.asarray(tokens, dtype=np.float64) / tokens_per_step)
    gpu_hours = seconds * num_gpus / 3600.0
    return {"days": seconds / 86400.0, "gpu_hours": gpu_hours,
            "cost": None if price_per_gpu_hour is None else gpu_hours * price_per_gpu_hour}
