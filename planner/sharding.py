"""What one rank holds of the model: parameters after TP/PP/EP, bytes per parameter by precision,
optimizer and engine, and how ZeRO stages shard them over the data-parallel ranks."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from planner.engines import ExpertTP, Modules
from planner.layout import Layouts, Training
from planner.model import ModelSpec
from planner.options import Optimizer, Precision
from planner.pipeline import blocks_on_stage, first_layer_on_stage
from planner.tensors import FIRST, LAST, local_numel
from planner.stage import Stage


def rank_params(s: Stage) -> tuple[np.ndarray, np.ndarray]:
    """(dense, expert) parameter elements held by one rank of `stage` before any ZeRO sharding
    (_rank_params): counted once per context, and once per model, training and stage array of
    the candidates (Layouts.memo) for the contexts the terms build alike."""
    model, training, lay, stage = s
    return s.memo("rank_params", lambda: lay.memo("rank_params", (model, training, stage), lambda: _rank_params(s)))


def _rank_params(s: Stage) -> tuple[np.ndarray, np.ndarray]:
    """(dense, expert) parameter elements held by one rank of `stage` before any ZeRO sharding,
    summed from the model's tensor list (planner/tensors.py ParamSums).

    Megatron TP splits q/k/v/MLP matrices by t and keeps norms and row-parallel biases whole
    (Shoeybi et al. 2019 section 3); the embedding is vocab-parallel (split by t) on the first
    stage, the output layer on the last; tied embeddings need a second copy when p > 1
    (Megatron-LM `shared_embedding`). Experts are split over EP ranks (Lepikhin et al. 2020), and
    over TP where the engine splits them (expert_tp)."""
    model, training, lay, stage = s
    sums = model.sums
    t, p = lay.tp, lay.pp
    dense, expert = 0.0, 0.0
    for block, n in blocks_on_stage(model, lay, stage, training.pipeline_edge_layers):
        block_dense, block_expert = _block_params(block, training, lay)
        dense, expert = dense + n * block_dense, expert + n * block_expert
    first, last = stage == 0, stage == p - 1
    embedding = sums.first_split / t + sums.first_replicated
    output = np.where(sums.tied & (p == 1), 0, sums.output / t)
    dense = dense + first * embedding + last * (sums.last_replicated + output)
    if model.mtp_layers:  # the MTP depths besides their blocks: eh_proj column-parallel, norms whole,
        # and an embedding copy where the last stage is not the first (ModelSpec.mtp_layers)
        norms = model.mtp_extra_params - 2 * model.hidden * model.hidden
        extra = model.mtp_layers * (2 * model.hidden * model.hidden / t + norms)
        dense = dense + last * (extra + np.where(p > 1, embedding, 0))
    return np.ceil(dense), np.ceil(expert)


def expert_tp(training: Training, lay: Layouts) -> np.ndarray:
    """TP ranks a routed expert's split matrices divide over: the layout's etp, else the engine's
    default (planner/engines/base.py ExpertTP): t where experts split like the dense layers
    (megatron-core 0.16.1 model_parallel_config.py expert_tensor_parallel_size defaults to the TP
    size), 1 where they stay whole (DeepSpeed 0.19 moe/layer.py enable_expert_tensor_parallelism
    False) or EP takes their place (torchtitan 0.3.0 with expert_parallel_degree > 1). The FLOPs
    and activations per rank are the same either way: whole experts on 1/t of the tokens or 1/t of
    each expert on all of them."""
    kind = training.engine.expert_tp
    if kind is ExpertTP.BY_EP:
        default = np.where(lay.ep > 1, 1, lay.tp)
    elif kind is ExpertTP.WHOLE:
        default = np.ones_like(lay.tp)
    else:  # SPLIT, CHOICE
        default = lay.tp
    return np.where(lay.etp > 0, lay.etp, default)


def expert_folds(training: Training) -> bool:
    """Whether expert parallelism folds over the TP ranks experts are not split over (ExpertTP
    CHOICE, BY_EP), so the expert ranks etp x ep x edp cover the dense tp x cp x dp."""
    return training.engine.expert_tp in (ExpertTP.CHOICE, ExpertTP.BY_EP)


def expert_dp(training: Training, lay: Layouts) -> np.ndarray:
    """Expert-data-parallel ranks, which hold the same experts and reduce (and ZeRO-shard) their
    gradients: tp cp dp / (etp ep) where EP folds over TP (megatron-core parallel_state.py
    expert_data_parallel group; torchtitan efsdp), else dp cp / ep."""
    if expert_folds(training):
        return np.maximum(lay.tp * lay.zero_ranks // (expert_tp(training, lay) * lay.ep), 1)
    return np.maximum(lay.zero_ranks // lay.ep, 1)


def _block_params(block: ModelSpec, training: Training, lay: Layouts) -> tuple:
    """(dense, expert) parameter elements of one block of this kind on one rank."""
    s = block.sums
    local_experts = np.maximum(block.experts // lay.ep, 1) / block.experts
    return (s.block_split / lay.tp + s.block_replicated,
            local_experts * (s.expert_split / expert_tp(training, lay) + s.expert_replicated))


def block_params(model: ModelSpec, training: Training, lay: Layouts) -> np.ndarray:
    """Parameter elements of the largest transformer block on one rank (its TP shard, its local
    experts): a routed one, or a dense-first one where EP leaves few experts per rank."""
    return np.maximum(*[sum(_block_params(block, training, lay)) for block in (model, model.dense_block)])


def fetch_unit(model: ModelSpec, training: Training, tensor) -> str:
    """The module ZeRO-3 gathers `tensor` with: its own, or the whole MoE block where DeepSpeed makes
    that a leaf (0.19.8 runtime/zero/leaf_module_config.py DEFAULT_LEAF_MODULE_CLASSES: transformers'
    Mixtral, Qwen2-MoE and Qwen3-MoE sparse MoE blocks, the Llama-layout MoE models here; measured: a
    Mixtral's router and experts gathered together, tests/test_deepspeed_zero3_live.py)."""
    name = tensor.module
    leaf = (training.engine.modules is Modules.HUGGING_FACE and model.architecture == "llama" and model.experts > 1
            and ".mlp." in name)
    return name[:name.index(".mlp.") + len(".mlp")] if leaf else name


def _module_params(model: ModelSpec, tensors, experts: int, training: Training, lay: Layouts) -> dict:
    """{fetch unit: elements one rank holds of its tensors} in registration order (tied ones left out)."""
    per_module: dict = {}
    for t in tensors:
        if not t.tied:
            split = expert_tp(training, lay) if t.expert else lay.tp
            unit = fetch_unit(model, training, t)
            per_module[unit] = per_module.get(unit, 0.0) + local_numel(t, split, experts, lay.ep)
    return per_module


def _block_kinds(model: ModelSpec) -> list:
    return [(model.block_tensors(), model.experts), (model.dense_block.block_tensors(), model.dense_block.experts)]


def block_fetches(model: ModelSpec, training: Training) -> int:
    """Gathers ZeRO-3 makes per block of Hugging Face modules: one per fetch unit holding a matrix
    (norms, 1-D, stay whole: persistent)."""
    return len({fetch_unit(model, training, t) for t in model.block_tensors() if len(t.shape) > 1})


def largest_module_params(model: ModelSpec, training: Training, lay: Layouts, blocks_only: bool = False) -> np.ndarray:
    """Elements one rank holds of the largest module's own tensors, after TP and EP: what ZeRO-3
    gathers for one submodule (DeepSpeed 0.19.8 partitioned_param_coordinator.py fetch_sub_module:
    iter_params(current_submodule, recurse=False)); a block's modules alone, or with the embedding
    and the output layer (a tied output layer is the embedding's module)."""
    kinds = _block_kinds(model)
    if not blocks_only:
        kinds.append((model.tensors_at(FIRST) + model.tensors_at(LAST), model.experts))
    best = 0.0 * lay.tp
    for tensors, experts in kinds:
        for numel in _module_params(model, tensors, experts, training, lay).values():
            best = np.maximum(best, numel)
    return np.ceil(best)


def largest_tensor_params(s: Stage) -> np.ndarray:
    """Elements one rank holds of the largest single parameter tensor on `stage`, after TP and EP
    (DeepSpeed 0.19.8 stage_1_and_2.py __init__: largest_param_numel, the max of param.numel()
    over the rank's 16-bit groups); the embedding and output layer count on their stages only."""
    model, training, lay, stage = s
    stage = np.asarray(stage)
    best = 0.0 * lay.tp
    for tensors, experts in _block_kinds(model):
        for t in tensors:
            best = np.maximum(best, local_numel(t, expert_tp(training, lay) if t.expert else lay.tp, experts, lay.ep))
    for tensors, on in ((model.tensors_at(FIRST), stage == 0), (model.tensors_at(LAST), stage == lay.pp - 1)):
        for t in tensors:
            if not t.tied:
                best = np.maximum(best, np.where(on, local_numel(t, lay.tp), 0.0))
    return np.ceil(best)


def oversized_tensor_params(s: Stage, threshold) -> np.ndarray:
    """Elements, counted whole, of the tensors of more than `threshold` elements that one rank's
    ZeRO-1/2 partition of `stage` overlaps at most. The flat buffer runs embedding, blocks, output layer
    (DeepSpeed 0.19.8 stage_1_and_2.py flattens each group's parameters in order), so a partition of
    a data-parallel group larger than one holds at most one edge, the blocks' such tensors by their
    share of the blocks' elements, and one more straddling its end."""
    model, training, lay, stage = s
    def over(tensors, experts):
        total, top = 0.0 * lay.tp, 0.0 * lay.tp
        for t in tensors:
            if not t.tied:
                n = local_numel(t, expert_tp(training, lay) if t.expert else lay.tp, experts, lay.ep)
                total, top = total + np.where(n > threshold, n, 0.0), np.maximum(top, np.where(n > threshold, n, 0.0))
        return total, top

    stage = np.asarray(stage)
    blocks, density, straddle = 0.0 * lay.tp, 0.0 * lay.tp, 0.0 * lay.tp
    for block, count in blocks_on_stage(model, lay, stage, training.pipeline_edge_layers):
        total, top = over(block.block_tensors(), block.experts)
        blocks = blocks + count * total
        density = np.maximum(density, total / np.maximum(sum(_block_params(block, training, lay)), 1.0))
        straddle = np.maximum(straddle, top)
    first = np.where(stage == 0, over(model.tensors_at(FIRST), model.experts)[0], 0.0)
    last = np.where(stage == lay.pp - 1, over(model.tensors_at(LAST), model.experts)[0], 0.0)
    partition = sum(rank_params(s)) / lay.zero_ranks
    window = np.maximum(first, last) + density * partition + straddle
    everything = blocks + first + last
    return np.ceil(np.where(lay.zero_ranks > 1, np.minimum(everything, window), everything))


def _forward_units(model: ModelSpec, tensors, experts: int, training: Training, lay: Layouts) -> list:
    """(all, gathered) elements one rank holds of each fetch unit of a block, in the order its forward
    runs them: registration order, with the units of 1-D tensors only (norms) moved where they run,
    the first before everything and the others before the MLP (Hugging Face registers a decoder
    layer's norms after self_attn and mlp); `gathered` leaves out the tensors under
    stage3_param_persistence_threshold (persistent_params)."""
    threshold = training.zero_config.stage3_param_persistence_threshold
    units: dict = {}
    for t in (t for t in tensors if not t.tied):
        local = local_numel(t, expert_tp(training, lay) if t.expert else lay.tp, experts, lay.ep)
        entry = units.setdefault(fetch_unit(model, training, t), {"all": 0.0, "gathered": 0.0, "norm": True,
                                                                   "mlp": False})
        entry["all"] = entry["all"] + local
        entry["gathered"] = entry["gathered"] + np.where(local < threshold, 0.0, local)
        entry["norm"] &= len(t.shape) == 1
        entry["mlp"] |= t.gemm in ("fc1", "fc2", "router")
    order = list(units.values())
    norms = [u for u in order if u["norm"]]
    rest = [u for u in order if not u["norm"]]
    mlp = next((i for i, u in enumerate(rest) if u["mlp"]), len(rest))
    ordered = norms[:1] + rest[:mlp] + norms[1:] + rest[mlp:]
    return [(u["all"] + 0.0 * lay.tp, u["gathered"] + 0.0 * lay.tp) for u in ordered]


def recompute_fetches(model: ModelSpec, training: Training, lay: Layouts) -> dict:
    """What DeepSpeed ZeRO-3 gathers while a checkpointed block is recomputed in the backward
    (0.19.8 partitioned_param_coordinator.py; counted on 2 gloo ranks, tests/test_deepspeed_zero3_live.py):
    {"regather": elements one rank of the first stage all-gathers a second time in a micro-batch's
    backward where every block is recomputed, "working": the most elements of one block gathered at
    once meanwhile}. The recompute fetches the block's modules in forward order; release_sub_module
    then frees each (__params_to_release) unless its backward use comes within
    stage3_max_reuse_distance elements of the trace (kept), or the prefetcher has already passed that
    use (__most_recent_step_id_param_fetched_for), which it has where the module and the rest of the
    block fit under stage3_max_live_parameters (what it holds then is zero3_ahead_params'). Between a
    module's recompute and its backward run the block's later modules twice, forward then backward,
    less the block's last module where a non-reentrant checkpoint (transformers 5.25's default)
    recomputes after that module's backward hook fetched it, so the last module is held throughout;
    a reentrant one (deepspeed.checkpointing's CheckpointFunction) recomputes first. The last module
    is never fetched twice. Nothing is fetched again under FSDP2, which unshards the whole unit
    before its backward recomputes."""
    zc = training.zero_config
    prefetching = zc.stage3_prefetch_bucket_size > 0 and zc.stage3_max_live_parameters > 0
    reentrant = training.engine.deepspeed_checkpointing
    regather, working = 0.0 * lay.tp, 0.0 * lay.tp
    for block, count in blocks_on_stage(model, lay, 0 * lay.pp, training.pipeline_edge_layers):
        units = _forward_units(model, block.block_tensors(), block.experts, training, lay)
        (last, last_gathered), others = units[-1], units[:-1]
        after, kept, largest_released = 0.0 * lay.tp, 0.0 * lay.tp, 0.0 * lay.tp
        for size, gathered in reversed(others):
            released = 2.0 * (after + last) - last * (not reentrant) >= zc.stage3_max_reuse_distance
            passed = prefetching & (after + last + size <= zc.stage3_max_live_parameters)
            regather = regather + count * np.where(released & ~passed, gathered, 0.0)
            kept = kept + np.where(released, 0.0, gathered)
            largest_released = np.maximum(largest_released, np.where(released, gathered, 0.0))
            after = after + size
        held = np.maximum(last_gathered + kept, largest_released) if reentrant else \
            last_gathered + np.maximum(kept, largest_released)
        working = np.maximum(working, held)
    if training.engine.zero3_fetch_per_block:
        regather = 0.0 * regather
    return {"regather": np.ceil(regather), "working": np.ceil(working)}


def persistent_params(model: ModelSpec, training: Training, lay: Layouts, threshold: int, stage) -> np.ndarray:
    """Elements of the stage's block tensors smaller than stage3_param_persistence_threshold on this
    rank: ZeRO-3 keeps them whole on every rank (deepspeed/runtime/zero/parameter_offload.py
    mark_persistent_parameters: ds_numel <= param_persistence_threshold)."""
    total = 0.0 * lay.tp
    for block, n in blocks_on_stage(model, lay, stage, training.pipeline_edge_layers):
        for t in block.block_tensors():
            split = expert_tp(training, lay) if t.expert else lay.tp
            local = t.numel / split if t.tp_dim is not None else t.numel + 0 * lay.tp
            if t.expert:
                local = local * np.maximum(block.experts // lay.ep, 1) / block.experts
            total = total + n * np.where(local < threshold, local, 0)
    return total


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of each model state on a rank that holds the whole of it."""

    weights: float
    """16/32-bit weights the forward reads."""
    grads: float
    """Gradients as accumulated and reduced."""
    optimizer: float
    """Optimizer states, fp32 master weights and any fp32 gradient copy the optimizer keeps."""
    moment: float = 0.0
    """One of Adam's two moments (0 for the other optimizers): what a foreach step's temporary holds."""


def state_bytes(training: Training) -> StateBytes:
    """Bytes per parameter by precision, optimizer and engine.

    Mixed precision Adam: 2 + 2 + 12 (ZeRO paper section 3: K = 12 for fp32 master, momentum,
    variance). Megatron-LM (docs/source/api-guide/dist_optimizer.md, bytes/param non-distributed
    vs distributed over d): fp16 params + fp16 grads 20 vs 4 + 16/d (the optimizer keeps an fp32
    grad copy with its shard), bf16 params + fp32 main grads 18 vs 6 + 12/d, fp32 16 vs 8 + 8/d.
    FSDP2 reduces fp32 grads (torchtitan MixedPrecisionPolicy reduce_dtype float32). SGD momentum:
    one fp32 state; 8-bit Adam: two 1-byte states (Dettmers et al. 2022); Adafactor: factored
    second moment, O(rows+cols) per matrix (adafactor_state_bytes_per_param)."""
    engine, precision = training.engine, training.precision
    states = {Optimizer.ADAMW: 8.0, Optimizer.SGD: 4.0, Optimizer.ADAM8BIT: 2.0, Optimizer.ADAFACTOR: 0.0}[training.optimizer]
    if precision is Precision.FP32:
        weight, master = 4.0, 0.0
    elif precision is Precision.BF16_PURE:
        # 16-bit moments; Megatron's precision-aware optimizer keeps the fp32 master's low 16 bits
        # (Engine.precision_aware_optimizer), the others no master at all
        weight, master, states = 2.0, 2.0 * engine.precision_aware_optimizer, states / 2
    else:
        weight, master = 2.0, 4.0
    grad = weight
    if engine.fp16_grad_copy and precision is Precision.FP16:
        master += 4.0  # fp16 grads stay fp16; an fp32 copy is sharded with the optimizer states
    elif engine.fp32_grads and precision.has_master_copy and not training.grad_reduce_in_bf16:
        grad = 4.0
    return StateBytes(weight, grad, master + states, states / 2 if training.optimizer is Optimizer.ADAMW else 0.0)


def adafactor_state_bytes_per_param(model: ModelSpec) -> float:
    # Shazeer & Stern 2018, section 3: row and column statistics of an n x m matrix, fp32
    return 4.0 * 2.0 / model.hidden


def optimizer_bytes_per_param(model: ModelSpec, training: Training) -> float:
    """Optimizer bytes per parameter, Adafactor's factored statistics included."""
    extra = adafactor_state_bytes_per_param(model) if training.optimizer is Optimizer.ADAFACTOR else 0.0
    return state_bytes(training).optimizer + extra


# ---------------------------------------------------------------------------------------------
# DeepSpeed ZeRO-1/2: the gradient partition counts the parameters straddling its edges whole


def _worst_partition_overlap(sizes: np.ndarray, ends: np.ndarray, ranks: int) -> float:
    """Largest, over ranks, of the summed full sizes of the parameters overlapping a rank's slice of
    the flat buffer (padded to a multiple of 2 x ranks: stage_1_and_2.py round_robin / alignment).
    A slice holding no parameter's start lies inside one parameter, so only the slices holding a
    start (at most one per parameter, whatever the rank count) and the largest parameter compete."""
    total = ends[-1]
    part = np.ceil(total / (2 * ranks)) * 2  # elements per rank
    starts = ends - sizes
    # np.unique without return_* would import numpy.ma (numpy 2 checks for masked arrays): 20 ms cold
    lo = np.unique(np.minimum(starts // part, ranks - 1), return_inverse=True)[0] * part
    first = np.searchsorted(ends, lo, side="right")
    last = np.searchsorted(starts, lo + part, side="left")
    csum = np.concatenate([[0.0], ends])
    return float(max(np.max(csum[last] - csum[first]), sizes.max()))


@lru_cache(maxsize=1024)
def _flat(model: ModelSpec, tp: int, n_layers: int, first: bool, last: bool, ep: int, etp: int, start: int) -> tuple:
    """(sizes, running ends) of a rank's flat parameter buffer, cached across evaluations (middle
    stages with as many blocks share one)."""
    sizes = model.flat_sizes(tp, n_layers, first, last, ep, etp, start)
    return sizes, np.cumsum(sizes)


EXACT_TENSORS = 20_000
"""Tensors per stage up to which the straddling excess is computed exactly (every real model: 126
layers of Llama-3.1-405B are ~1,100)."""


def _per_stage_flat(s: Stage, where, value, count: int = 1) -> np.ndarray:
    """value(flat key, zero ranks) -> `count` floats for each candidate `where` is true (0
    elsewhere), from the flat parameter list of its stage (_flat(*flat key)), evaluated once per
    distinct (tp, blocks, first or last stage, zero ranks, ep, expert tp, first block): shape
    (count, *lay.shape)."""
    model, training, lay, stage = s
    stage = np.broadcast_to(stage, lay.shape)
    where = np.ones(lay.shape, dtype=bool) if where is None else np.broadcast_to(where, lay.shape)
    out = np.zeros((count, *lay.shape))
    rows = np.flatnonzero(where.ravel())
    if not rows.size:
        return out
    n_layers = model.layers // lay.pp + (stage < model.layers % lay.pp)  # flat_local_sizes' split
    start = first_layer_on_stage(model.layers, lay.pp, stage) if model.moe_layers != model.layers else 0 * lay.tp
    columns = (lay.tp, n_layers, stage == 0, stage == lay.pp - 1, lay.zero_ranks, lay.ep, expert_tp(training, lay), start)
    key = np.stack([np.broadcast_to(a, lay.shape).ravel()[rows].astype(np.int64) for a in columns], axis=-1)
    uniq, inverse = np.unique(key, axis=0, return_inverse=True)
    values = np.zeros((count, len(uniq)))
    for j, (t, n, first, last, d, e, etp, begin) in enumerate(uniq):
        values[:, j] = value((model, int(t), int(n), bool(first), bool(last), int(e), int(etp), int(begin)), int(d))
    out.reshape(count, -1)[:, rows] = values[:, inverse.ravel()]
    return out


def deepspeed_grad_partition_excess(s: Stage, where=None) -> np.ndarray:
    """Elements by which the worst rank's ZeRO-1/2 gradient partition exceeds rank_params/D, for the
    candidates `where` is true (all by default; 0 elsewhere).

    DeepSpeed 0.19 stage_1_and_2.py copy_grads_in_partition sizes grads_in_partition by the full
    numel of every parameter overlapping the rank's partition, so the parameters straddling its two
    edges count whole (a whole embedding when an edge falls inside it). The flat order is the
    model's tensor list. Past EXACT_TENSORS tensors on a stage (thousands of layers) it takes the
    bound of two whole largest tensors."""
    model, training, lay, stage = s
    return _per_stage_flat(s, where, _grad_partition_excess)[0]


@lru_cache(maxsize=4096)
def _grad_partition_excess(flat_key: tuple, d: int) -> float:
    """deepspeed_grad_partition_excess of one flat buffer (_flat(*flat_key)) over d ranks, cached:
    a recommend's searches under several engines share most buffers."""
    if d <= 1:
        return 0.0
    sizes, ends = _flat(*flat_key)
    if sizes.size > EXACT_TENSORS:
        return 2 * sizes.max()  # the worst partition overhangs by less than a tensor at each edge
    return _worst_partition_overlap(sizes, ends, d) - ends[-1] / d


# ---------------------------------------------------------------------------------------------
# DeepSpeed ZeRO-3 sub-groups and ZeRO-Infinity's swap space (DeepSpeed 0.19.8 runtime/zero/stage3.py,
# runtime/swap_tensor/): measured by calibrate/engines/deepspeed_nvme.py


AIO_MIN_BYTES = 2**20
"""swap_tensor/utils.py MIN_AIO_BYTES (the swappers take max(it, aio block_size), 1 MiB by default):
a smaller tensor or optimizer sub-group is never swapped and stays in host memory."""
AIO_ALIGNED_BYTES = 1024
"""swap_tensor/utils.py AIO_ALIGNED_BYTES x aio intra_op_parallelism (default 1): swap buffers
round each tensor up to it (_io_aligned_numel)."""


def aio_aligned(elements, element_bytes: int):
    """Elements rounded up to the swap alignment (optimizer_utils.py _io_aligned_numel)."""
    step = AIO_ALIGNED_BYTES // element_bytes
    return np.ceil(np.asarray(elements, dtype=np.float64) / step) * step


def _sub_groups(sizes: np.ndarray, ranks: int, sub_group_size: int) -> list:
    """(partition elements, first tensor, end) of each ZeRO-3 sub-group over one rank's parameters in
    registration order (stage3.py _create_fp16_sub_groups: a sub-group closes once its partitions
    reach sub_group_size, so it overshoots by up to one tensor; each tensor's partition is its numel
    padded to the ranks, partition_parameters.py _partition_param). One searchsorted a sub-group."""
    ends = np.concatenate([[0.0], np.cumsum(np.ceil(sizes / ranks))])
    groups, i = [], 0
    while i < sizes.size:
        j = min(max(int(np.searchsorted(ends, ends[i] + sub_group_size, side="left")), i + 1), sizes.size)
        groups.append((ends[j] - ends[i], i, j))
        i = j
    return groups


def zero3_swap_elements(s: Stage, where=None) -> dict:
    """What sizes ZeRO-Infinity's host buffers, per candidate (elements; 0 where `where` is false):
    'largest': the partition of the largest sub-group (the optimizer swapper's buffers hold one of
    its tensors each, optimizer_utils.py OptimizerSwapper.__init__ largest_numel); 'unswapped': the
    partition elements of sub-groups under AIO_MIN_BYTES in fp32, whose master, states and fp32
    gradient stay on the host (stage3.py _swappable_optimizer_subgroup); 'reuse': the aligned FULL
    elements of the largest sub-group's parameters where a sub-group's 16-bit partition does not fit
    offload_param.max_in_cpu (stage3.py _create_fp16_partitions_with_defragmentation: flat_offset +
    total_elements <= the CPU buffer, else the sub-group lives on NVMe and
    reserve_partitioned_swap_space takes [t.ds_numel for t in the largest sub-group]: full numels,
    not partitions, as measured)."""
    model, training, lay, stage = s
    zc, w = training.zero_config, training.precision.element_bytes

    def walk(flat_key, d):
        sizes, _ = _flat(*flat_key)
        partition = float(np.ceil(sizes / d).sum())
        spills = partition > zc.nvme_params_in_cpu  # the sub-groups fill the CPU buffer in order
        if partition / zc.sub_group_size > EXACT_TENSORS:  # beyond real models: no sub-group under 1 MiB,
            largest = min(partition, zc.sub_group_size - 1 + float(np.ceil(sizes.max() / d)))  # one tensor over
            return largest, 0.0, largest * d * spills
        groups = _sub_groups(sizes, d, zc.sub_group_size)
        size, first, end = max(groups, key=lambda g: g[0])  # the first of the largest
        reuse = float(aio_aligned(sizes[first:end], w).sum()) if spills else 0.0
        return size, sum(g[0] for g in groups if g[0] * 4 < AIO_MIN_BYTES), reuse

    return dict(zip(("largest", "unswapped", "reuse"), _per_stage_flat(s, where, walk, 3)))
