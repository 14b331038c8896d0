"""Work of one micro-batch on one rank: FLOPs, and the seconds of each kind of kernel.

Each function is one mechanism over `Layouts` arrays and returns seconds per transformer block
(or per micro-batch for the output layer). FLOP counts follow the paper convention (full,
non-causal s^2 attention; Narayanan et al. 2021 eq. 3, PaLM appendix B); times follow what the
kernels do (FlashAttention skips the masked half).
"""

from __future__ import annotations

import numpy as np

from planner.activations import op_sac_matmuls, recomputed_layers
from planner.engines import Modules, SelectivePolicy
from planner.hardware import Cluster
from planner.layout import Layouts, Training
from planner.model import ModelSpec
from planner.modules import autocasts_fp32_params, block_modules
from planner.moe import routed_per_token
from planner.options import Fp8Recipe, Recompute
from planner.saved.llm_foundry import llm_foundry_block_input_scale
from planner.saved.megatron import recomputed_gemms
from planner.stage import Step


def peak_flops_per_s(cluster: Cluster, training: Training) -> float:
    """Dense peak of the block GEMMs' dtype, MFU's denominator (bf16-pure computes in bf16; fp32
    without TF32, PyTorch default; fp8 under an FP8 recipe, as llm-foundry's benchmark tables divide
    their amp_fp8 runs)."""
    return cluster.gpu.peak_flops_per_s[training.gemm_dtype]


def sustained_fraction(cluster: Cluster, c: dict) -> float:
    """The share of the datasheet peak the GPU keeps through a training run, where
    data/coefficients.json has one for the GPU (`<gpu>_sustained_compute_fraction`, fitted on
    published runs: h100_sxm_...), else 1."""
    return float(c.get(cluster.gpu.name.replace("-", "_") + "_sustained_compute_fraction", 1.0))


def compute_flops_per_s(cluster: Cluster, training: Training, c: dict) -> float:
    """The dense rate 16-bit kernels are timed against (attention, the output layer, and the blocks'
    GEMMs without FP8): the datasheet peak of the training dtype times the sustained fraction. MFU
    and HFU stay against the datasheet peak (peak_flops_per_s), as every source reports them."""
    return cluster.gpu.peak_flops_per_s[training.precision.gemm_dtype] * sustained_fraction(cluster, c)


def block_gemm_rate(cluster: Cluster, training: Training, c: dict) -> tuple:
    """(rate, coefficients) the blocks' linear GEMMs run at. Under an FP8 recipe: the FP8 peak with
    FP8's own large-GEMM efficiency (`fp8_gemm_efficiency_max`, or the rowwise kernels'
    `fp8_rowwise_gemm_efficiency_max`), and the same fixed seconds per GEMM as in 16 bits (its
    half-efficiency FLOPs scaled by the peaks' ratio: launch and tile ramp-up do not speed up)."""
    rate = compute_flops_per_s(cluster, training, c)
    if training.fp8_recipe is None:
        return rate, c
    fp8_rate = cluster.gpu.peak_flops_per_s["fp8"] * sustained_fraction(cluster, c)
    return fp8_rate, fp8_gemm_coefficients(c, fp8_rate / rate, training.fp8_recipe is Fp8Recipe.ROWWISE)


def fp8_gemm_coefficients(c: dict, peak_ratio: float, rowwise: bool = False) -> dict:
    """Time coefficients `c` with gemm_s's curve moved to FP8 GEMMs, whose peak is `peak_ratio` times
    the 16-bit one: FP8's own efficiency at large sizes, and the same fixed seconds per GEMM (the
    half-efficiency FLOPs scaled by the ratio)."""
    key = "fp8_rowwise_gemm_efficiency_max" if rowwise else "fp8_gemm_efficiency_max"
    return dict(c, gemm_efficiency_max=c[key], gemm_half_efficiency_flops=c["gemm_half_efficiency_flops"] * peak_ratio)


def hbm_bytes_per_s(cluster: Cluster, c: dict) -> float:
    """Attainable bandwidth of memory-bound kernels (a calibrated fraction of the datasheet)."""
    return cluster.gpu.hbm_bytes_per_s * c["hbm_efficiency"]


def eager_bytes_per_s(cluster: Cluster, c: dict) -> float:
    """Attainable bandwidth of an eager layer's memory-bound kernels (PyTorch's unfused pointwise ops,
    reductions, broadcasts, casts of strided views, cat): each SM keeps a bounded number of their
    loads in flight (Little's law: bandwidth = bytes in flight / latency), so past sm_count x
    eager_bytes_per_s_per_sm (measured on an H200, data/coefficients.json) more HBM bandwidth goes
    unused; below it, as streaming kernels. Plain copies keep more in flight (hbm_bytes_per_s)."""
    sms = cluster.gpu.sm_count
    hbm = hbm_bytes_per_s(cluster, c)
    return min(hbm, sms * c["eager_bytes_per_s_per_sm"]) if sms else hbm


def tokens_per_microbatch(training: Training, lay: Layouts) -> np.ndarray:
    """Tokens of one micro-batch on one rank: context parallelism splits the sequence."""
    return lay.mbs * training.seq_len / lay.cp


# ---------------------------------------------------------------------------------------------
# FLOPs


def flops_per_step(model: ModelSpec, training: Training, lay: Layouts) -> dict:
    """Model FLOPs (fwd + 2x bwd, no recompute) and hardware FLOPs (plus the recomputed forward)
    of one step of the whole job, summed over the model's GEMM list; equals Narayanan 2021 eq. 3
    for GPT shapes. Model FLOPs count each token's k routed experts; hardware FLOPs count the rows
    the experts run, padding to an expert capacity included (planner/moe.py routed_per_token)."""
    tokens = (lay.gbs * training.seq_len).astype(np.float64)
    routed = routed_per_token(model, training, lay, tokens_per_microbatch(training, lay))
    # QK^T (q.k widths) and AV (v widths): 2 s per token each, full s^2 as in Narayanan eq. 3 and
    # PaLM appendix B (12 L h s); MLA's query/key and value head widths differ (DeepSeek-V2 2.1.2)
    core = 2.0 * model.attended_keys(training.seq_len, causal=False) * (model.q_width + model.attention_out_width)
    logits = 2.0 * model.hidden * model.vocab
    core_policy = training.engine.selective_policy is SelectivePolicy.CORE_ATTENTION
    if core_policy:  # Korthikanti 2022 section 6.3, and Megatron's --recompute-modules GEMMs per block kind
        selective = core * ("core_attn" in training.recompute_modules)
    else:  # torchtitan: the matmuls op-level SAC does not keep
        selective = sum(2.0 * n_in * n_out for _, n_in, n_out, _, kept in op_sac_matmuls(model) if not kept)
    # per block kind (routed, dense-first) and its count: an expert GEMM runs `routed` rows per
    # token (GShard: k dropless), its model FLOPs count k
    # MTP depths (ModelSpec.mtp_layers) count as blocks of the last one's kind, the logits once per
    # depth more, and 2h^2 + 3h each (Megatron-LM d98e8a6 training.py num_floating_point_operations)
    mtp = model.mtp_layers
    routed_mtp = mtp if model.mtp_block is model else 0
    proj = 2.0 * mtp * (2 * model.hidden * model.hidden + 3 * model.hidden)
    gemm, run = proj, proj
    kinds = ((model, model.moe_layers + routed_mtp),
             (model.dense_block, model.layers - model.moe_layers + mtp - routed_mtp))
    rerun_modules = 0.0  # FLOPs per token the listed modules rerun (engines/megatron/recompute.py)
    for block, n in kinds:
        gemms = block.gemms(fused=True)
        gemm = gemm + n * sum(g.flops_per_token * (block.experts_per_token if g.expert else 1) for g in gemms)
        run = run + n * sum(g.flops_per_token * (routed if g.expert else 1) for g in gemms)
        if core_policy:
            again = recomputed_gemms(block, training.recompute_modules)
            rerun_modules = rerun_modules + n * sum(g.flops_per_token * (routed if g.expert else 1)
                                                    for g in gemms if g.name in again)
    model_flops = 3.0 * tokens * (gemm + (model.layers + mtp) * core + (1 + mtp) * logits)  # backward = 2x forward
    # full recompute reruns the block forward (the recomputed share of the blocks), selective the
    # attention core
    full_layers = recomputed_layers(lay, model.layers, lay.pp * lay.vpp)
    extra = full_layers / model.layers * (run + model.layers * core) \
        + np.where(lay.recompute == Recompute.SELECTIVE, model.layers * selective + rerun_modules, 0.0)
    padding = 3.0 * (run - gemm)  # capacity padding, forward and backward (planner/moe.py)
    return {"model_flops": model_flops, "hardware_flops": model_flops + tokens * (padding + extra)}


# ---------------------------------------------------------------------------------------------
# seconds per block, per micro-batch


def gemm_s(flops, peak_flops_per_s: float, c: dict, count=1):
    """Seconds of `count` GEMMs of `flops` each: each runs at eff = emax F/(F + F_half) of peak, so
    it takes (F + F_half)/(peak emax) (small-matrix fall-off; coefficients in data/coefficients.json,
    fitted by calibrate's GEMM benchmark)."""
    return (flops + c["gemm_half_efficiency_flops"] * count) / (peak_flops_per_s * c["gemm_efficiency_max"])


def gemm_fwd_s(ctx: Step, only: frozenset | None = None) -> np.ndarray:
    """Forward GEMMs of one block (those named in `only`, where given: Gemm.name). Each GEMM runs at
    eff = emax F/(F + F_half) of peak, so its time is (F + F_half)/(peak emax) (small-matrix fall-off,
    data/coefficients.json). TP splits all but the router; each local expert runs its own GEMMs on T k ep/E routed tokens (Lepikhin et al.
    2020, GShard), i.e. T k FLOPs-worth in total; T k C padded to an expert capacity
    (planner/moe.py routed_per_token). A grouped GEMM (Training.moe_grouped_gemm) is one kernel over
    the local experts' rows: one fall-off for their summed FLOPs. Under FP8 (block_gemm_rate) the
    router stays 16-bit (a plain linear in every engine), and so do torchao's grouped experts
    (torchtitan 0.3.0's Float8LinearConverter converts Linear layers; its experts take a converter
    of their own, Float8GroupedExpertsConverter, off by default)."""
    model, cluster, training, lay, c = ctx
    fp8_peak, fp8_c = block_gemm_rate(cluster, training, c)
    peak = compute_flops_per_s(cluster, training, c)
    T, t = tokens_per_microbatch(training, lay), lay.tp.astype(np.float64)
    expert_kernels = 1 if training.moe_grouped_gemm else np.maximum(model.experts // lay.ep, 1)
    routed = routed_per_token(model, training, lay, T)  # k dropless, E capacity / T padded
    seconds = 0.0
    for g in model.gemms(fused=training.engine.fused_gemms, fused_qkv=training.engine.fused_qkv):
        if only is not None and g.name not in only:
            continue
        flops = T * g.flops_per_token * (routed if g.expert else 1) / (t if g.tp_split else 1.0)
        fp8 = g.tp_split and not (g.expert and training.engine.fp8_library == "torchao")
        seconds = seconds + gemm_s(flops, fp8_peak if fp8 else peak, fp8_c if fp8 else c, expert_kernels if g.expert else 1)
    return seconds


def op_sac_recompute_s(ctx: Step) -> np.ndarray:
    """What torchtitan's op-level selective checkpointing runs again in one block's backward: the
    matmuls it does not keep (planner/activations.py op_sac_matmuls: wo and w3) and the elementwise
    forward (norms, rotary, SiLU and the gate product); the attention and the kept matmuls are not
    rerun."""
    model, cluster, training, lay, c = ctx
    peak, gemm_c = block_gemm_rate(cluster, training, c)
    T, t = tokens_per_microbatch(training, lay), lay.tp.astype(np.float64)
    seconds = elementwise_fwd_s(ctx)
    for _, n_in, n_out, _, kept in op_sac_matmuls(model):
        if not kept:
            seconds = seconds + gemm_s(T * 2.0 * n_in * n_out / t, peak, gemm_c)  # 2 FLOPs per multiply-add
    return seconds


def _fitted(cluster: Cluster, name: str) -> bool:
    """Whether the cluster's calibration profile fitted time coefficient `name`."""
    cal = cluster.calibration
    return cal is not None and any(n == name for _, n, _ in cal.overrides)


def gpu_time_coefficients(cluster: Cluster, c: dict) -> dict:
    """Time coefficients `c` for the cluster's GPU: the large-GEMM ceiling a profile fitted (calibrate's
    GEMM bench) where it has one, else the catalog's measured one for the GPU (GPU.gemm_efficiency_max:
    an MI300X's best bf16 GEMM reaches 51 % of its peak where an H100's reaches 80 %), else the prior."""
    if cluster.gpu.gemm_efficiency_max and not _fitted(cluster, "gemm_efficiency_max"):
        return dict(c, gemm_efficiency_max=cluster.gpu.gemm_efficiency_max)
    return c


def attention_efficiency(cluster: Cluster, c: dict) -> float:
    """Fraction of the 16-bit peak the attention core's matmuls reach: a profile's fitted value
    (calibrate's attention bench on this GPU) where it has one, else the GPU catalog's published
    figure, else the generic prior (data/coefficients.json)."""
    if _fitted(cluster, "attention_efficiency"):
        return c["attention_efficiency"]
    return cluster.gpu.attention_efficiency or c["attention_efficiency"]


def attention_kernel_slowdown(model: ModelSpec, training: Training, c: dict) -> tuple:
    """(forward, backward): how much slower than FlashAttention-2 the job's fused attention kernel runs
    each pass. llm-foundry's MPT blocks as MosaicML benchmarked them (scripts/train/benchmarking/
    submit_benchmarks.py: --attn_impl default 'triton' and image mosaicml/pytorch:1.13.1 from the tables'
    commits b2a43a147, 2023-10, and 5e85bd62d, 2024-01, until 4952183 made 'flash' the default) run
    llmfoundry/models/layers/flash_attn_triton.py, HazyResearch's Triton FlashAttention on
    triton-pre-mlir, which FlashAttention-2 outruns 1.3-2.5x forward and backward together (Dao 2023,
    FlashAttention-2, section 4.1; triton_flash_attention_slowdown). The two passes do not share
    it: 'Triton forward is generally faster than CUDA forward, while Triton backward is generally
    slower than CUDA backward' (the same file's docstring at b2a43a147; CUDA: FlashAttention), so its
    forward runs at triton_flash_attention_fwd_slowdown and its backward, FLASH_BWD_WORK times the
    forward's matmul work, takes the rest of the total. Every other engine's modules run
    FlashAttention-2 or faster kernels: 1."""
    if training.flash_attention and block_modules(model, training) is Modules.LLM_FOUNDRY:
        total, fwd = float(c["triton_flash_attention_slowdown"]), float(c["triton_flash_attention_fwd_slowdown"])
        return fwd, (total * (1.0 + FLASH_BWD_WORK) - fwd) / FLASH_BWD_WORK
    return 1.0, 1.0


FLASH_BWD_WORK = 2.5
"""FlashAttention's backward runs 5 matmuls to its forward's 2 (Dao 2023, FlashAttention-2 section 3.1.2)."""


def attention_matmuls_s(flops_fwd, peak_flops_per_s, efficiency, flash: bool = True) -> tuple:
    """(forward, backward) seconds of the attention core's matmuls, `flops_fwd` forward at
    `efficiency` of peak: FlashAttention's backward runs 5 matmuls to its forward's 2 (FLASH_BWD_WORK),
    an unfused one 4 to 2."""
    fwd = flops_fwd / (peak_flops_per_s * efficiency)
    return fwd, fwd * (FLASH_BWD_WORK if flash else 2.0)


def attention_core_s(ctx: Step) -> tuple:
    """(forward, backward) of QK^T, softmax and AV of one block: 4 T s q/t FLOPs forward (MLA:
    2 T s (a d_qk + a d_v)/t). Causal
    FlashAttention skips the masked half (Dao 2023, FlashAttention-2 section 3.1.1) and its
    backward runs 5 matmuls to the forward's 2 (section 3.1.2), at the GPU's measured
    utilization. Unfused attention also moves the a s^2 score tensors through HBM: forward writes
    S, softmax reads and writes it, AV reads P (4e) [+ dropout r/w and 1-byte mask]; backward
    writes dP, softmax-grad reads dP and P and writes dS, two GEMMs read dS, dV reads P (7e)
    (Megatron FusedScaleMaskSoftmax + dropout)."""
    model, cluster, training, lay, c = ctx
    e = training.precision.element_bytes
    s, flash = training.seq_len, training.flash_attention
    T, t = tokens_per_microbatch(training, lay), lay.tp.astype(np.float64)
    # FlashAttention computes the causal (and windowed) keys only; unfused attention every score
    keys = model.attended_keys(s, causal=True) if flash else float(s)
    flops = 2.0 * T * keys * (model.q_width + model.attention_out_width) / t  # QK^T + AV
    slow_fwd, slow_bwd = attention_kernel_slowdown(model, training, c)
    fwd, bwd = attention_matmuls_s(flops, compute_flops_per_s(cluster, training, c), attention_efficiency(cluster, c), flash)
    fwd, bwd = fwd * slow_fwd, bwd * slow_bwd
    if not flash:
        drop = 1.0 if model.dropout else 0.0
        scores = lay.mbs * (model.heads / t) * (s / lay.cp) * s
        hbm = hbm_bytes_per_s(cluster, c)
        fwd = fwd + scores * (4 * e + drop * (2 * e + 1)) / hbm
        bwd = bwd + scores * (7 * e + drop * (2 * e + 1)) / hbm
    return fwd, bwd


def fused_elementwise_bytes(model: ModelSpec, e: float, routed) -> tuple:
    """(replicated, activation-function, rotary) forward bytes per token of one block with
    Megatron's fused kernels: 2 norms (r+w) + 2 residual adds with bias-dropout (r x, r residual,
    w, 1-byte mask) in the replicated region (Korthikanti Table 2's 10sbh); the activation
    function (GeLU r f, w f; SwiGLU r 2f, w f) over the `routed` expert rows per token
    (planner/moe.py) and rotary (r+w q, k) inside the TP region."""
    act = (2 if model.ffn_kind == "gelu" else 3) * e * model.mlp_width(routed)
    rope = 2 * e * (model.q_width + model.kv_width) if model.positions == "rotary" else 0.0
    drop = 1.0 if model.dropout else 0.0
    return (10 * e + 2 * drop) * model.hidden, act, rope


def eager_elementwise_bytes(model: ModelSpec, e: float, routed) -> tuple:
    """(replicated, activation-function, rotary) forward bytes per token of one block run as eager
    PyTorch modules, as DeepSpeed and FSDP train Hugging Face models (transformers modeling_llama):
    RMSNorm upcasts to fp32, squares, means, scales, downcasts and multiplies by the weight
    (r e+w 4, r 4+w 4, r 4, r 4+w 4, r 4+w e, r e+w e = 28 + 4e per element, two per block; LayerNorm
    is one fused kernel, 2e); two residual adds (3e each) and dropout (r e, w e, 1-byte mask);
    act_fn(gate) * up (2e + 3e per element; GeLU 2e); apply_rotary_pos_emb on q and k
    (q*cos, rotate_half's slice+cat, *sin, add: 2e + 2e + 2e + 3e); the attention output's
    transpose-reshape copy (2e per q element)."""
    h, q, kv = model.hidden, model.q_width, model.kv_width
    norm = (28 + 4 * e) if model.norm == "rmsnorm" else 2 * e
    drop = (2 * e + 1) * 2 if model.dropout else 0.0
    replicated = (2 * norm + 2 * 3 * e + drop) * h
    act = (5 * e if model.ffn_kind == "swiglu" else 2 * e) * model.mlp_width(routed)  # k rows: dropless modules
    rope = 9 * e * (q + kv) if model.positions == "rotary" else 0.0
    return replicated, act, rope + 2 * e * q


def llm_foundry_elementwise_bytes(model: ModelSpec, e: float, routed, residual: float) -> tuple:
    """(replicated, activation-function, rotary) forward bytes per token of llm-foundry's MPT block
    (llm-foundry b2a43a147 models/layers/blocks.py MPTBlock.forward, norm.py LPLayerNorm, ffn.py MPTMLP;
    attn_impl 'triton', the benchmark tables' own, reads q, k and v as views of Wqkv's output: no
    copies): each LPLayerNorm casts the `residual`-byte stream to the autocast dtype (none where the
    two match) and runs one layer_norm kernel (r e, w e); each residual add reads the stream and the
    branch's e-byte output and writes the stream; nn.GELU reads and writes the up projection
    (2e per MLP element); learned positions or ALiBi, no rotary; resid_pdrop 0 launches no dropout."""
    cast = residual + e if residual != e else 0.0
    replicated = 2.0 * (cast + 2.0 * e) + 2.0 * (2.0 * residual + e)
    return replicated * model.hidden, 2.0 * e * model.mlp_width(routed), 0.0


# per parameter of a block and micro-batch, where Composer's FSDP keeps fp32 parameters under autocast
# (mixed_precision 'DEFAULT'): forward, F.linear's autocast cast of the fp32 weight (torch autocast_mode.cpp
# cached_cast: r 4, w 2); backward, ToCopyBackward's cast of its 16-bit gradient back to fp32 (r 2, w 4),
# autograd's accumulation into the fp32 flat gradient (r 4, r 4, w 4) and FSDP's cast of it to the
# 16-bit reduce_dtype before the reduce-scatter (r 4, w 2)
AUTOCAST_CAST_BYTES = (6.0, 6.0 + 12.0 + 6.0)


def autocast_weight_traffic_s(ctx: Step) -> tuple:
    """(forward, backward) seconds one block's unsharded weights cost each micro-batch at HBM rate where
    the job gathers fp32 parameters and autocast casts them for every GEMM: llm-foundry's MPT under
    Composer's FSDP with mixed precision (composer/distributed/mosaic_parallelism.py get_mixed_precision
    'DEFAULT': MixedPrecision(param_dtype=torch.float32, reduce_dtype=<16-bit>), the MP mode of
    MosaicML's benchmark tables; AUTOCAST_CAST_BYTES). The other engines gather 16-bit parameters: 0."""
    model, cluster, training, lay, c = ctx
    if not autocasts_fp32_params(model, training):
        return 0.0, 0.0
    from planner.sharding import block_params

    params = block_params(model, training, lay)  # the TP shard of the block
    hbm = hbm_bytes_per_s(cluster, c)
    return params * AUTOCAST_CAST_BYTES[0] / hbm, params * AUTOCAST_CAST_BYTES[1] / hbm


def eager_layer_bytes(model: ModelSpec, routed) -> tuple | None:
    """((replicated, activation-function, rotary) forward, the same backward) bytes per token of one
    eager Hugging Face block, as measured on transformers' own layer (data/references/eager_ops_cpu.json
    layer_bytes, python -m calibrate.benches.eager_ops: every memory-bound aten operator's reads and writes in
    bf16, per element of the hidden, MLP and key/value widths, the query's counted with the hidden);
    None for blocks not measured. The backward moves about twice the forward's bytes (Llama: 254 per
    hidden element against 104), not 1.5x: autograd's backward of the fp32 RMSNorm chain and of
    rotate_half runs an operator or two per forward one, each reading its saved inputs."""
    from planner.data import catalog

    variant = eager_ops_variant(model)
    if variant is None:
        return None
    measured = catalog("references/eager_ops_cpu.json")["layer_bytes"][variant]

    def widths(c: dict) -> tuple:
        return (c["h"] * model.hidden + c["other"], c["f"] * model.mlp_width(routed), c.get("kv", 0.0) * model.kv_width)

    return widths(measured["forward"]), widths(measured["backward"])


def _elementwise_s(ctx: Step, backward: bool) -> np.ndarray:
    """Memory-bound elementwise kernels of one block at attainable HBM bandwidth (eager ones at
    what eager kernels reach: eager_bytes_per_s); the replicated region splits over t under
    sequence parallelism (Korthikanti 2022 section 4.2.2). Eager bf16 blocks move what their
    measured layer moves (eager_layer_bytes); the others follow the byte lists above, backward 1.5x
    the forward (elementwise_bwd_s)."""
    model, cluster, training, lay, c = ctx
    e = training.precision.element_bytes
    T = tokens_per_microbatch(training, lay)
    routed = routed_per_token(model, training, lay, T)
    # torch.compile fuses each pointwise and reduction region into one kernel (Ansel et al. 2024, 'PyTorch 2',
    # ASPLOS, section 5: Inductor's scheduler fusion): a compiled block moves what fused kernels move
    modules = block_modules(model, training)
    eager = training.engine.eager_elementwise and not training.compile and modules is not Modules.LLM_FOUNDRY
    measured = eager_layer_bytes(model, routed) if eager and e == 2 else None
    if measured is not None:
        replicated, act, rope = measured[backward]
    elif modules is Modules.LLM_FOUNDRY:  # streaming casts, adds and one-kernel norms: full HBM rate
        residual = e * llm_foundry_block_input_scale(model, training)
        replicated, act, rope = ((1.5 if backward else 1.0) * b
                                 for b in llm_foundry_elementwise_bytes(model, e, routed, residual))
    else:
        bytes_of = eager_elementwise_bytes if eager else fused_elementwise_bytes
        scale = 1.5 if backward else 1.0
        replicated, act, rope = (scale * b for b in bytes_of(model, e, routed))
    t = lay.tp.astype(np.float64)
    sp = np.where(lay.sequence_parallel > 0, t, 1.0)
    bandwidth = eager_bytes_per_s(cluster, c) if eager else hbm_bytes_per_s(cluster, c)
    return T * (replicated / sp + (act + rope) / t) / bandwidth


def elementwise_fwd_s(ctx: Step) -> np.ndarray:
    """Forward of one block's memory-bound elementwise kernels (_elementwise_s)."""
    model, cluster, training, lay, c = ctx
    return _elementwise_s(ctx, backward=False)


def elementwise_bwd_s(ctx: Step) -> np.ndarray:
    """Backward of the elementwise kernels: measured for eager blocks; otherwise each reads the
    gradient of its output and its saved input and writes the gradient of its input, three tensors
    to the forward's two (1.5x)."""
    model, cluster, training, lay, c = ctx
    return _elementwise_s(ctx, backward=True)


def eager_ops_variant(model: ModelSpec) -> str | None:
    """Which measured Hugging Face decoder layer (calibrate/benches/eager_ops.py VARIANTS) the block is; None
    for blocks not measured (MoE: transformers loops over the experts a batch routes to)."""
    if model.experts > 1:
        return None
    if model.architecture == "llama":
        return ("llama-qk-norm" if model.qk_norm else "llama-bias" if model.bias
                else "llama-qkv-bias" if model.qkv_bias else "llama")
    if model.architecture == "gpt2":
        return "gpt2" if model.dropout else "gpt2-no-dropout"
    return "gpt_neox" if model.architecture == "gpt_neox" else None


def eager_host_s(model: ModelSpec, training: Training, c: dict) -> tuple:
    """(forward, backward) seconds the host spends dispatching one Hugging Face block: the aten
    operators the real eager layer dispatches in training (counted: data/references/eager_ops_cpu.json,
    python -m calibrate.benches.eager_ops) x eager_op_host_s. Eager PyTorch launches each kernel from the
    host, so a block's GPU time cannot be shorter. Compiled (Training.compile), the block launches
    Inductor's generated kernels and its extern GEMMs and attention instead (counted on the CPU
    backend: data/references/hf_compiled_cpu.json, python -m calibrate.benches.hf_compiled), each from the
    compiled graph's wrapper at a launch's host cost."""
    from planner.data import catalog

    variant = eager_ops_variant(model)
    if variant is None:
        return 0.0, 0.0
    if training.compile:
        row = next(r for r in catalog("references/hf_compiled_cpu.json")["rows"]
                   if (r["kv_heads"] < r["heads"]) == (model.kv_heads < model.heads))
        ops = {p: row[f"{p}_kernels"] + row[f"{p}_extern"] for p in ("forward", "backward")}
    else:
        ops = catalog("references/eager_ops_cpu.json")["layer_ops"][variant]
    return ops["forward"] * c["eager_op_host_s"], ops["backward"] * c["eager_op_host_s"]


def head_s(ctx: Step) -> np.ndarray:
    """Output layer of one micro-batch on the last stage (once more per MTP depth): the
    vocab-parallel logits GEMM (V/t) forward and its two backward GEMMs, and the fp32 cross entropy (Megatron
    vocab_parallel_cross_entropy: upcast e->4, max, exp, sum, grad, downcast: 2e + 32 bytes/logit)."""
    model, cluster, training, lay, c = ctx
    rate, f_half = compute_flops_per_s(cluster, training, c) * c["gemm_efficiency_max"], c["gemm_half_efficiency_flops"]
    T, t, e = tokens_per_microbatch(training, lay), lay.tp.astype(np.float64), training.precision.element_bytes
    logits = (2.0 * T * model.hidden * model.vocab / t + f_half) / rate
    head = 3.0 * logits + T * model.vocab / t * (2 * e + 32) / hbm_bytes_per_s(cluster, c)
    if not model.mtp_layers:
        return head
    # each MTP depth runs the output layer and its loss again, after its eh_proj (2h -> h, column-
    # parallel); its block is timed with the stage's blocks (Megatron-LM d98e8a6 training.py
    # num_floating_point_operations: logits x (mtp_num_layers + 1), 2h^2 per depth)
    proj = (2.0 * T * 2 * model.hidden * model.hidden / t + f_half) / rate
    return (1 + model.mtp_layers) * head + model.mtp_layers * 3.0 * proj
