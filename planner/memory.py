"""Memory per GPU rank: model states, activations, logits, engine buffers and overheads.

Every function takes a `Layouts` (arrays) and a pipeline `stage` (array, broadcast), so the
search and `planner estimate` run the same formulas. Bytes are int-valued float64 arrays.
The peak is taken over two moments of a step (forward/backward vs. optimizer step), and the
breakdown reports what is live at the larger one, so its parts always add up to the total.
"""

from __future__ import annotations

import json
from functools import lru_cache

import numpy as np

from planner.hardware import Cluster
from planner.layout import Layouts, Training, grouped
from planner.model import DATA_DIR, ModelSpec

BREAKDOWN_KEYS = ("params", "grads", "optimizer", "activations", "logits", "buffers", "overhead")


@lru_cache(maxsize=None)
def coefficients(section: str) -> dict:
    """Named coefficient values from data/coefficients.json (calibrated copy preferred)."""
    calibrated = DATA_DIR / "calibration" / "coefficients.json"
    path = calibrated if calibrated.exists() else DATA_DIR / "coefficients.json"
    with open(path) as f:
        raw = json.load(f)
    return {k: v["value"] for k, v in raw[section].items()}


# ---------------------------------------------------------------------------------------------
# what one rank holds of the model


def layers_on_stage(model: ModelSpec, lay: Layouts, stage) -> np.ndarray:
    """Transformer blocks on pipeline stage `stage`: the first L mod p stages take one extra
    (DeepSpeed PipelineModule partition_method='uniform' balances blocks this way; Megatron-core
    takes uneven stages through --decoder-first/last-pipeline-num-layers)."""
    p = lay.pp
    return model.layers // p + (stage < model.layers % p)


def rank_params(model: ModelSpec, lay: Layouts, stage) -> tuple[np.ndarray, np.ndarray]:
    """(dense, expert) parameter elements held by one rank of `stage` before any ZeRO sharding.

    Megatron TP splits q/k/v/MLP matrices by t and keeps norms and row-parallel biases whole
    (Shoeybi et al. 2019 section 3); the embedding is vocab-parallel (split by t) on the first
    stage, the output layer on the last; tied embeddings need a second copy when p > 1
    (Megatron-LM `shared_embedding`). Experts are split over EP ranks (Lepikhin et al. 2020)."""
    t, p = lay.tp, lay.pp
    attn_split, attn_rep = model.attention_params()
    mlp_split, mlp_rep = model.mlp_params()
    router = model.hidden * model.experts if model.experts > 1 else 0
    dense_per_layer = attn_split / t + attn_rep + 2 * model.norm_params + router
    expert_per_layer = (model.experts / lay.ep) * (mlp_split / t + mlp_rep)
    if model.experts == 1:
        dense_per_layer, expert_per_layer = dense_per_layer + expert_per_layer, 0 * expert_per_layer
    n = layers_on_stage(model, lay, stage)
    first = stage == 0
    last = stage == p - 1
    embedding = model.embedding_params / t + model.position_params
    output_copy = np.where(model.tied_embeddings & (p == 1), 0, model.vocab * model.hidden / t)
    dense = n * dense_per_layer + first * embedding + last * (model.norm_params + output_copy)
    return np.ceil(dense), np.ceil(n * expert_per_layer)


def persistent_params_per_layer(model: ModelSpec, lay: Layouts, threshold: int) -> np.ndarray:
    """Elements of a block's tensors smaller than stage3_param_persistence_threshold (kept whole
    on every rank by ZeRO-3: deepspeed/runtime/zero/parameter_offload.py persistence)."""
    h, q, kv, f = model.hidden, model.q_width, model.kv_width, model.ffn
    # (elements, split by TP?) of each bias and norm tensor of one block
    small = [(h, False)] * (2 if model.norm == "rmsnorm" else 4)
    if model.bias or model.qkv_bias:
        small += [(q, True), (kv, True), (kv, True)]
    if model.bias:
        small += [(h, False), (h, False)] + [(f, True)] * (2 if model.ffn_kind == "swiglu" else 1)
    total = 0 * lay.tp
    for numel, split in small:
        local = numel / lay.tp if split else numel + 0 * lay.tp
        total = total + np.where(local < threshold, local, 0)
    return total


def flat_param_sizes(model: ModelSpec, tp: int, pp: int, stage: int, ep: int = 1) -> np.ndarray:
    """Local element counts of one rank's parameters in registration order (Hugging Face / Megatron:
    embedding, then per block q, k, v, o, MLP, the two norms, then final norm and output layer),
    the order DeepSpeed flattens them in."""
    attn = [model.hidden * model.q_width / tp, model.hidden * model.kv_width / tp,
            model.hidden * model.kv_width / tp, model.q_width * model.hidden / tp]
    if model.bias or model.qkv_bias:
        attn += [model.q_width / tp, model.kv_width / tp, model.kv_width / tp]
    attn += [model.hidden] if model.bias else []
    matrices = 3 if model.ffn_kind == "swiglu" else 2
    mlp = [model.hidden * model.ffn / tp] * matrices
    mlp += ([model.ffn / tp] * (matrices - 1) + [model.hidden]) if model.bias else []
    router = [model.hidden * model.experts] if model.experts > 1 else []
    norms = [model.norm_params / (2 if model.norm == "layernorm" else 1)] * (4 if model.norm == "layernorm" else 2)
    block = attn + router + mlp * max(model.experts // ep, 1) + norms
    n = model.layers // pp + (stage < model.layers % pp)
    sizes = list(np.tile(block, n))
    if stage == 0:
        sizes = [model.vocab * model.hidden / tp] + ([model.position_params] if model.position_params else []) + sizes
    if stage == pp - 1:
        sizes += [model.norm_params] + ([] if model.tied_embeddings and pp == 1 else [model.vocab * model.hidden / tp])
    return np.ceil(np.array(sizes, dtype=np.float64))


def _worst_partition_overlap(sizes: np.ndarray, ranks: int) -> float:
    """Largest, over ranks, of the summed full sizes of the parameters overlapping a rank's slice of
    the flat buffer (padded to a multiple of 2 x ranks: stage_1_and_2.py round_robin / alignment)."""
    total = sizes.sum()
    part = np.ceil(total / (2 * ranks)) * 2  # elements per rank
    ends = np.cumsum(sizes)
    starts = ends - sizes
    lo = np.arange(ranks) * part
    first = np.searchsorted(ends, lo, side="right")
    last = np.searchsorted(starts, lo + part, side="left")
    csum = np.concatenate([[0.0], ends])
    return float(np.max(csum[last] - csum[first]))


def deepspeed_grad_partition_excess(model: ModelSpec, lay: Layouts, stage) -> np.ndarray:
    """Elements by which the worst rank's ZeRO-1/2 gradient partition exceeds rank_params/D.

    DeepSpeed 0.19 stage_1_and_2.py copy_grads_in_partition sizes grads_in_partition by the full
    numel of every parameter overlapping the rank's partition, so the parameters straddling its two
    edges count whole (a whole embedding when an edge falls inside it). Evaluated once per distinct
    (tp, pp, stage, D, ep)."""
    stage = np.broadcast_to(stage, lay.tp.shape)
    ranks = lay.dp * lay.cp
    key = np.stack([lay.tp, lay.pp, stage, ranks, lay.ep], axis=-1).reshape(-1, 5)
    uniq, inverse = np.unique(key, axis=0, return_inverse=True)
    excess = np.zeros(len(uniq))
    for j, (t, p, st, d, e) in enumerate(uniq):
        if d > 1:
            sizes = flat_param_sizes(model, int(t), int(p), int(st), int(e))
            excess[j] = _worst_partition_overlap(sizes, int(d)) - sizes.sum() / d
    return excess[inverse.ravel()].reshape(lay.tp.shape)


# ---------------------------------------------------------------------------------------------
# model states


def state_bytes_per_param(training: Training) -> tuple[float, float, float]:
    """(16/32-bit weights, gradients, optimizer incl. fp32 master) bytes per parameter.

    Mixed precision Adam: 2 + 2 + 12 (ZeRO paper section 3: K = 12 for fp32 master, momentum,
    variance). Megatron-LM (docs/source/api-guide/dist_optimizer.md, bytes/param non-distributed
    vs distributed over d): fp16 params + fp16 grads 20 vs 4 + 16/d (the optimizer keeps an fp32
    grad copy with its shard), bf16 params + fp32 main grads 18 vs 6 + 12/d, fp32 16 vs 8 + 8/d.
    FSDP2 reduces fp32 grads (torchtitan MixedPrecisionPolicy reduce_dtype float32). SGD momentum:
    one fp32 state; 8-bit Adam: two 1-byte states (Dettmers et al. 2022); Adafactor: factored
    second moment, O(rows+cols) per matrix (added by model_states)."""
    states = {"adamw": 8.0, "sgd": 4.0, "adam8bit": 2.0, "adafactor": 0.0}[training.optimizer]
    if training.precision == "fp32":
        weight, master = 4.0, 0.0
    elif training.precision == "bf16-pure":
        weight, master, states = 2.0, 0.0, states / 2
    else:
        weight, master = 2.0, 4.0
    grad = weight
    megatron = training.engine == "megatron"
    if (megatron and training.precision == "bf16") or (training.engine == "fsdp" and master):
        grad = 4.0
    if megatron and training.precision == "fp16":
        master += 4.0  # fp32 copy of the fp16 grads, sharded with the optimizer states
    return weight, grad, master + states


def _adafactor_states_per_param(model: ModelSpec) -> float:
    # Shazeer & Stern 2018, section 3: row and column statistics of an n x m matrix, fp32
    return 4.0 * 2.0 / model.hidden


def model_states(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts, stage) -> dict:
    """GPU and CPU bytes of weights, gradients and optimizer states on one rank of `stage`."""
    dense, expert = rank_params(model, lay, stage)
    w, g, o = state_bytes_per_param(training)
    if training.optimizer == "adafactor":
        o = o + _adafactor_states_per_param(model)
    shard_dense = lay.dp * lay.cp  # Megatron/DeepSpeed reduce gradients over dp x cp
    shard_expert = np.maximum(shard_dense // lay.ep, 1)
    z = lay.zero
    zc = training.zero_config

    def sharded(bytes_per_param, on):
        return bytes_per_param * (np.where(on, dense / shard_dense, dense) + np.where(on, expert / shard_expert, expert))

    grads_sharded = z >= 2
    if training.uses_deepspeed and zc.contiguous_gradients:
        # DeepSpeed 0.19 stage_1_and_2.py: contiguous_gradients installs the partitioning hooks
        # for stage 1 too, so ZeRO-1 holds ZeRO-2's gradient memory (deepspeed-behaviour.md)
        grads_sharded = z >= 1
    fp32_master_extra = 0.0
    if training.precision == "fp32" and training.uses_deepspeed:
        fp32_master_extra = 4.0  # DeepSpeed ZeRO-1/2 keep full fp32 weights and an fp32 master partition
    opt_bytes = sharded(o + np.where(z >= 1, fp32_master_extra, 0.0), z >= 1)
    param_bytes = sharded(w, z >= 3)
    grad_bytes = sharded(g, grads_sharded)

    offload_opt = lay.offload_optimizer > 0
    offload_par = lay.offload_params > 0
    # ZeRO-Offload (Ren et al. 2021 section 4): fp32 master, states and fp32 grads live on the host;
    # the GPU keeps 16-bit params and only the reduce buckets for gradients
    # NVMe (ZeRO-Infinity) keeps only staging buffers in host memory
    cpu_opt = np.where(lay.offload_optimizer == 1, opt_bytes + sharded(4.0, True), 0.0)
    cpu_par = np.where(lay.offload_params == 1, param_bytes, 0.0)
    return {
        "params": np.where(offload_par, 0.0, param_bytes),
        "grads": np.where(offload_opt, 0.0, grad_bytes),
        "optimizer": np.where(offload_opt, 0.0, opt_bytes),
        "cpu": cpu_opt + cpu_par,
        "rank_params": dense + expert,
    }


# ---------------------------------------------------------------------------------------------
# activations: Korthikanti et al. 2022 section 4, derived tensor by tensor


def activation_bytes_per_layer(model: ModelSpec, training: Training, lay: Layouts, recompute=None) -> np.ndarray:
    """Bytes one transformer block keeps for backward, per micro-batch, on one rank (see _layer_terms)."""
    recompute = lay.recompute if recompute is None else recompute
    whole, stored, layer_input = _layer_terms(model, training, lay)
    return np.select([recompute == 0, recompute == 1], [whole, stored], layer_input)


def _layer_terms(model: ModelSpec, training: Training, lay: Layouts) -> tuple:
    """Bytes one transformer block keeps for backward, per micro-batch, on one rank.

    With GeLU 4h MLP, MHA and dropout this is exactly Korthikanti 2022 Table 2:
    sbh(34 + 5as/h) unsplit, sbh(10 + 24/t + 5as/(ht)) with TP, sbh(34/t + 5as/(ht)) with SP,
    minus the 5as/h term under selective recompute, and 2sbh under full recompute.
    Returns (no recompute, selective recompute, full recompute) bytes."""
    t = lay.tp.astype(np.float64)
    s = training.seq_len / lay.cp  # context parallelism splits the sequence
    b = lay.mbs
    h, q, kv, f, a = model.hidden, model.q_width, model.kv_width, model.ffn, model.heads
    e = 4.0 if training.precision == "fp32" else 2.0  # activation element bytes
    sbh = s * b * h
    rep = np.where(lay.sequence_parallel > 0, t, 1.0)  # SP splits the 'replicated' regions too
    mask = 1.0 if model.dropout else 0.0  # 1-byte dropout masks

    # replicated regions: 2 norm inputs, qkv input, MLP input (Korthikanti section 4.1)
    replicated = (4 * e + 2 * mask) * sbh / rep
    # q, k, v kept for QK^T and attention over V; output-projection input a*d
    qkv = e * s * b * (2 * q + 2 * kv) / t
    if model.ffn_kind == "swiglu":
        # Megatron-LM swiglu: saves the fused [gate|up] fc1 output (2f) and the fc2 input (f)
        mlp = 3 * e * s * b * f / t
    else:
        mlp = 2 * e * s * b * f / t  # GeLU input and fc2 input
    mlp = mlp * model.experts_per_token  # each token's activations in its top-k experts
    if training.flash_attention:
        # FlashAttention keeps the output (already the projection input) and fp32 log-sum-exp
        core = 4.0 * a * s * b / t
    else:
        # softmax output (e), dropout mask (1 B) and dropout output (e) per score: a s^2 b
        core = (e + (1 + e) * mask) * a * s * s * b / t
    stored = replicated + qkv + mlp
    full_layer = stored + core
    layer_input = e * sbh / rep  # the only tensor full recompute keeps
    return full_layer, stored, layer_input


def microbatches_in_flight(lay: Layouts, stage) -> np.ndarray:
    """Micro-batches whose activations a stage holds at its peak, in units of that stage's layers.

    1F1B: min(p - i, m) (Narayanan 2021 section 2.2.1); interleaved with v chunks:
    min(v p + p - 2i - 1, v m) chunks of L/(p v) layers (Megatron-LM schedules.py warm-up count;
    stage 0 matches Korthikanti's factor 1 + (p-1)/(p v)); GPipe: all m."""
    p, v, m = lay.pp, lay.vpp, lay.gas
    one_f_one_b = np.minimum(p - stage, m)
    interleaved = np.minimum(v * p + p - 2 * stage - 1, v * m) / v
    gpipe = m
    return np.select([lay.schedule == 1, lay.schedule == 2], [interleaved, gpipe], one_f_one_b)


def activations(model: ModelSpec, training: Training, lay: Layouts, stage) -> tuple[np.ndarray, np.ndarray]:
    """(activation bytes, logits bytes) on one rank of `stage` at the backward peak."""
    t = lay.tp.astype(np.float64)
    s = training.seq_len / lay.cp
    b = lay.mbs
    e = 4.0 if training.precision == "fp32" else 2.0
    rep = np.where(lay.sequence_parallel > 0, t, 1.0)
    n_layers = layers_on_stage(model, lay, stage)
    in_flight = microbatches_in_flight(lay, stage)
    whole, stored, layer_input = _layer_terms(model, training, lay)
    full, selective = lay.recompute == 2, lay.recompute == 1
    kept = np.select([full, selective], [layer_input, stored], whole) * n_layers * in_flight
    # recomputation in backward materialises, for one block and micro-batch at a time, what it
    # dropped: the whole block under full recompute, the attention core under selective
    working = np.select([full, selective], [whole, whole - stored], 0.0)
    first, last = stage == 0, stage == lay.pp - 1
    # embedding dropout mask (Korthikanti section 4.3), per in-flight micro-batch, first stage
    embed = first * (1.0 if model.dropout else 0.0) * s * b * model.hidden / rep * np.ceil(in_flight)
    # final norm input and output-layer input, one micro-batch, last stage
    head = last * 2 * e * s * b * model.hidden / rep
    logits = last * coefficients("memory")["logits_bytes_per_element"] * s * b * model.vocab / t
    return kept + working + embed + head, logits


# ---------------------------------------------------------------------------------------------
# engine buffers and overheads


def engine_buffers(model: ModelSpec, training: Training, lay: Layouts, states: dict, stage) -> tuple:
    """(buffers during forward/backward, extra buffers during the optimizer step), bytes.

    DeepSpeed 0.19 (deepspeed-behaviour.md, stage_1_and_2.py setup_buckets, stage3.py):
    ZeRO-1/2 allocate reduce_bucket_size elements (x2 with overlap_comm); at the step they hold a
    flattened 16-bit gradient copy and an fp32 gradient partition (2 + 20/D B/param, not 2 + 14/D).
    ZeRO-3 holds one reduce bucket, gathered parameters kept alive by the reuse distance (the whole
    model with the 1e9 defaults), persistent small parameters, and an fp32 gradient chunk of
    min(sub_group_size, partition) at the step. FSDP: two gathered units (current + prefetch).
    allgather_bucket_size allocates nothing: runtime/utils.py all_gather_dp_groups gathers into the
    flat 16-bit buffer with all_gather_into_tensor whenever the backend has it (NCCL does)."""
    zc = training.zero_config
    z = lay.zero
    w = 4.0 if training.precision == "fp32" else 2.0
    rank = states["rank_params"]
    shard = lay.dp * lay.cp
    partition = rank / shard
    n_layers = np.maximum(layers_on_stage(model, lay, stage), 1)
    layer_rank = rank / n_layers  # average block (embedding stages slightly above)
    # DeepSpeedZeroConfig: overlap_comm None resolves to True for stage 3, False otherwise
    overlap_12 = bool(zc.overlap_comm) if zc.overlap_comm is not None else False
    zeros = 0.0 * rank
    if training.uses_deepspeed:
        # the gradient partition's straddling parameters (ZeRO-1/2 with DeepSpeed's gradient hooks)
        hooks = (z == 2) | ((z == 1) & zc.contiguous_gradients)
        straddle = np.where(hooks & (lay.offload_optimizer == 0),
                            deepspeed_grad_partition_excess(model, lay, stage) * w, 0.0)
        # stage_1_and_2.py setup_buckets / stage3.py __init__: torch.empty(reduce_bucket_size) whatever the model size
        contiguous = zc.contiguous_gradients | (lay.offload_optimizer > 0)  # stage_1_and_2.py: or cpu_offload
        bucket_12 = np.where(contiguous, zc.reduce_bucket_size * w * (1 + overlap_12), 0.0)
        bucket_3 = np.where(zc.contiguous_gradients, zc.reduce_bucket_size * w, 0.0)  # one buffer, allocated at init
        step_12 = np.where(lay.offload_optimizer > 0, 0.0, partition * (w + 4.0))
        live = np.minimum(np.minimum(rank, zc.stage3_max_live_parameters),
                          np.maximum(zc.stage3_max_reuse_distance, layer_rank + zc.stage3_prefetch_bucket_size))
        working = np.maximum(live, np.minimum(rank, layer_rank + zc.stage3_prefetch_bucket_size))
        persistent = persistent_params_per_layer(model, lay, zc.stage3_param_persistence_threshold) * n_layers
        fwd_3 = (working + persistent) * w + bucket_3
        step_3 = np.where(lay.offload_optimizer > 0, 0.0, np.minimum(zc.sub_group_size, partition) * 4.0)
        fwd = np.select([z == 3, z >= 1], [fwd_3, bucket_12 + straddle], zeros)
        step = np.select([z == 3, z >= 1], [step_3, step_12 + straddle], zeros)
    elif training.engine == "fsdp":
        fwd = np.where(z >= 2, 2 * layer_rank * w, zeros)  # FSDP2 unit + prefetch of the next one
        step = zeros
    else:
        fwd, step = zeros, zeros  # Megatron's grads live in its contiguous grad buffer (counted in grads)
    return fwd, step


def process_groups(lay: Layouts) -> np.ndarray:
    """NCCL communicators one rank belongs to: world, and TP/DP/PP/CP/EP groups larger than one."""
    return 1 + (lay.tp > 1) + (lay.dp * lay.cp > 1) + (lay.pp > 1) + (lay.cp > 1) + (lay.ep > 1)


# ---------------------------------------------------------------------------------------------
# the rank


STATE_FIELDS = ("tp", "pp", "dp", "cp", "ep", "zero", "offload_optimizer", "offload_params")
ACTIVATION_FIELDS = ("tp", "pp", "cp", "mbs", "gas", "recompute", "sequence_parallel", "vpp", "schedule")


def _stage(where, lay: Layouts):
    """'first' / 'last' pipeline stage of each candidate, or an explicit stage array."""
    return {"first": 0 * lay.pp, "last": lay.pp - 1}.get(where, where) if isinstance(where, str) else where


def _states_part(model, cluster, training, lay, where) -> dict:
    stage = _stage(where, lay)
    states = model_states(model, cluster, training, lay, stage)
    fwd, step = engine_buffers(model, training, lay, states, stage)
    parts = {"params": states["params"], "grads": states["grads"], "optimizer": states["optimizer"],
             "fwd_buffers": fwd, "step_buffers": step}
    return {**{k: np.ceil(v) for k, v in parts.items()}, "cpu": states["cpu"], "groups": process_groups(lay)}


def _activation_part(model, training, lay, where) -> dict:
    acts, logits = activations(model, training, lay, _stage(where, lay))
    return {"activations": np.ceil(acts), "logits": np.ceil(logits)}


def rank_memory(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts, stage=None) -> dict:
    """Peak GPU bytes of one rank of `stage` (default: the larger of the first and last stage,
    which hold the most: embedding and most in-flight micro-batches, or output layer and logits).

    Returns {key: array} for BREAKDOWN_KEYS, 'total', 'cpu_per_node' and 'phase'
    (0: forward/backward peak, 1: optimizer-step peak). Model states and activations depend on
    different layout fields, so each is evaluated once per distinct combination of its fields."""
    if stage is None:
        codes = lay.codes()
        first = _combine(model, cluster, training, lay, "first", codes)
        last = _combine(model, cluster, training, lay, "last", codes)
        pick = last["total"] > first["total"]
        return {k: np.where(pick, last[k], first[k]) for k in first}
    return _combine(model, cluster, training, lay, stage, None)


def _combine(model, cluster, training, lay, where, codes) -> dict:
    """Both phases of a step on one stage, their larger peak, and the overheads on top."""
    if codes is None:
        states = _states_part(model, cluster, training, lay, where)
        acts = _activation_part(model, training, lay, where)
    else:
        states = grouped(codes, STATE_FIELDS, lambda sub: _states_part(model, cluster, training, sub, where))
        acts = grouped(codes, ACTIVATION_FIELDS, lambda sub: _activation_part(model, training, sub, where))
    coef = coefficients("memory")
    fwd_peak = acts["activations"] + acts["logits"] + states["fwd_buffers"]
    phase = (states["step_buffers"] > fwd_peak).astype(np.int64)
    out = {
        "params": states["params"], "grads": states["grads"], "optimizer": states["optimizer"],
        "activations": np.where(phase, 0.0, acts["activations"]), "logits": np.where(phase, 0.0, acts["logits"]),
        "buffers": np.where(phase, states["step_buffers"], states["fwd_buffers"]),
    }
    tensors = sum(out.values())
    out["overhead"] = np.ceil(coef["cuda_context_bytes"] + coef["nccl_bytes_per_group"] * states["groups"]
                              + coef["allocator_fragmentation"] * tensors)
    out = {k: np.broadcast_to(v, lay.tp.shape) for k, v in out.items()}
    out["total"] = sum(out[k] for k in BREAKDOWN_KEYS)
    out["cpu_per_node"] = np.broadcast_to(states["cpu"] * min(cluster.gpus_per_node, cluster.num_gpus), lay.tp.shape)
    out["phase"] = np.broadcast_to(phase, lay.tp.shape)
    return out


def per_stage(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts) -> list[dict]:
    """Memory of every pipeline stage of a one-layout `lay`."""
    assert lay.size == 1
    return [
        {k: (float(v.flat[0]) if k != "phase" else int(v.flat[0]))
         for k, v in rank_memory(model, cluster, training, lay, np.array([i])).items()}
        for i in range(int(lay.pp[0]))
    ]
