"""Memory per GPU rank: model states (planner/states.py), activations, logits, engine buffers and
overheads, assembled per moment of a step.

Every per-stage term is a small function of one context (planner/stage.py Stage: model, training,
layouts, stage) over arrays, so the search and `planner estimate` run the same formulas. Three moments of a step are modelled (PHASES:
forward/backward, the optimizer step, and the gradient reduction where an engine copies reduced
gradients beside the full ones); the breakdown reports what is live at the largest, so its parts
add up to the total. Bytes are int-valued float64 arrays.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from planner import activations as A, fp8
from planner.engines import Buffers, Modules
from planner.grouping import Grouped, Lazy, codes_of, grouped_stages
from planner.hardware import Cluster
from planner.layout import Layouts, Training, among
from planner.model import ModelSpec
from planner.options import Offload, Recompute
from planner.modules import autocasts_fp32_params, block_modules
from planner.pipeline import blocks_on_stage, first_routed_stage
from planner.sharding import rank_params
from planner.engines.deepspeed.memory import (deepspeed_bf16_optimizer, deepspeed_compact_fp32_grads,
                                              deepspeed_reduce_buckets, deepspeed_reduction_transient_bytes,
                                              deepspeed_step_grad_copies, deepspeed_straddle_bytes,
                                              zero3_live_param_bytes)
from planner.engines.fsdp.memory import fsdp_unsharded_unit_bytes
from planner.states import grad_bytes, grads_freed, host_bytes, optimizer_bytes, optimizer_step_copy_bytes, weight_bytes
from planner.stage import Stage

BREAKDOWN_KEYS = ("params", "grads", "optimizer", "activations", "logits", "buffers", "overhead")
PHASES = ("forward/backward", "optimizer step", "gradient reduction")
"""The moments of a step whose memory is modelled; the peak is the largest."""


@lru_cache(maxsize=None)
def coefficients(section: str, calibration=None) -> dict:
    """Named coefficient values of data/coefficients.json (each with its source there), with a
    calibration profile's fitted values in their place (planner/calibration.py)."""
    from planner.calibration import coefficient_values

    return coefficient_values(section, calibration)


# ---------------------------------------------------------------------------------------------
# engine buffers (DeepSpeed 0.19 runtime/zero/stage_1_and_2.py and stage3.py; FSDP2)


def reduction_copy_bytes(s: Stage) -> tuple:
    """(gradients, buffers) at the accumulation boundary's reduction where the engine copies reduced
    gradients into a new partition while the full ones are still held (DeepSpeed ZeRO-1: the full
    16-bit gradient, the new grads_in_partition with its straddling parameters, the reduce buckets;
    measured: the worst rank's transient equals it to the byte); FSDP2: the root unit's reduce-scatter
    after autograd has finished, beside the sharded gradients (fsdp_unsharded_unit_bytes 'reduction');
    zeros elsewhere."""
    model, training, lay, stage = s
    if training.engine.buffers is Buffers.FSDP:
        # torch 2.13 _fsdp_state.py _root_post_backward_final_callback: the root's post_backward runs after
        # the last autograd node, the activations freed (measured: tests/test_fsdp_transients_real.py)
        buffers = fsdp_unsharded_unit_bytes(s, moment="reduction")
        sharded = grad_bytes(s, at_step=True)
        return np.where(buffers > 0, sharded, 0.0), buffers
    bf16_opt = deepspeed_bf16_optimizer(training, lay)
    on = among(lay.zero, training.engine.reduction_copy) & (lay.offload_optimizer == Offload.NONE) & ~bf16_opt \
        & ~deepspeed_compact_fp32_grads(training, lay)  # copy_grads_in_partition returns early
    grads = grad_bytes(s) + grad_bytes(s, at_step=True)
    buffers = deepspeed_straddle_bytes(s, at_step=True) + deepspeed_reduce_buckets(training, lay)
    # BF16_Optimizer at the boundary (DeepSpeed 0.19.8 engine.py buffered_allreduce_fallback ->
    # allreduce_bucket): each param group's whole fp32 gradient buffer is cast to the bf16
    # communication_data_type for the all-reduce, 2 B/param beside the gradients (measured exact:
    # tests/test_deepspeed_transients_real.py); none when it accumulates in bf16 (no cast)
    cast = np.where(bf16_opt & training.zero_config.fp32_grad_accum, 2.0 * sum(rank_params(s)), 0.0)
    return np.where(on, grads, np.where(cast > 0, grad_bytes(s), 0.0)), \
        np.where(on, buffers, cast)


def engine_buffers(s: Stage) -> tuple:
    """(buffers during forward/backward, extra buffers during the optimizer step), bytes.
    allgather_bucket_size allocates nothing in DeepSpeed 0.19: runtime/utils.py
    all_gather_dp_groups gathers into the flat 16-bit buffer with all_gather_into_tensor."""
    model, training, lay, stage = s
    kind = training.engine.buffers
    if kind is Buffers.DEEPSPEED:
        zero3 = lay.zero == 3
        fwd = np.where(zero3, zero3_live_param_bytes(s),
                       deepspeed_straddle_bytes(s, at_step=False))
        fwd = fwd + deepspeed_reduce_buckets(training, lay)
        # ZeRO-2, DeepSpeed 0.19.8 stage_1_and_2.py average_tensor -> allreduce_and_scatter -> allreduce_bucket:
        # self.flatten (torch.cat) of a bucket whose slices go to >= 2 partitions (one holding a partition
        # edge; one slice is a view), w x the bucket's elements beside grads_in_partition and the buckets
        # (a bucket is full to within one parameter; measured full: tests/test_deepspeed_transients_real.py)
        dense, expert = rank_params(s)
        rank = dense + expert
        w = training.precision.element_bytes
        contiguous = training.zero_config.contiguous_gradients | (lay.offload_optimizer > Offload.NONE)
        bucket = training.zero_config.reduce_bucket_size
        # bucket >= the model: one reduction (backward epilogue), its w x P flat copy made before
        # grads_in_partition exists: only what exceeds the partition and its straddle shows (measured)
        single = np.maximum(0.0, w * rank - grad_bytes(s)
                            - deepspeed_straddle_bytes(s, at_step=False))
        # the compact fp32 partition exists before it (average_tensor: _get_compact_grad_partition_slice)
        compact = deepspeed_compact_fp32_grads(training, lay)
        flat = np.where(bucket < rank, w * bucket, np.where(compact, w * rank, single))
        flat = np.where((lay.zero == 2) & contiguous & (lay.zero_ranks > 1), flat, 0.0)
        fwd = fwd + deepspeed_reduction_transient_bytes(s, flat)
        step = deepspeed_step_grad_copies(s) \
            + np.where(zero3, 0.0, deepspeed_straddle_bytes(s, at_step=True))
        # BF16_Optimizer all-reduces its flat gradient buffer in place: no ZeRO buckets or copies
        bf16_opt = deepspeed_bf16_optimizer(training, lay)
        return np.where(bf16_opt, 0.0, fwd), np.where(bf16_opt, 0.0, step)
    if kind is Buffers.FSDP:
        # optimizer step: FSDP2 allocates nothing (torch 2.13 fully_shard has no optimizer hook; measured 0 B
        # beside AdamW's own temporaries, tests/test_fsdp_transients_real.py), AdamW its foreach temporary
        return fsdp_unsharded_unit_bytes(s), optimizer_step_copy_bytes(s)
    return 0.0 * lay.tp, 0.0 * lay.tp  # Megatron's grads live in its contiguous grad buffer (counted in grads)


# ---------------------------------------------------------------------------------------------
# overheads


def process_groups(lay: Layouts) -> np.ndarray:
    """NCCL communicators one rank belongs to: world, and TP/DP/PP/CP/EP groups larger than one."""
    return 1 + (lay.tp > 1) + (lay.zero_ranks > 1) + (lay.pp > 1) + (lay.cp > 1) + (lay.ep > 1)


UB_COMMUNICATORS = 12
"""TransformerEngine 2.20.2 pytorch/module/base.py initialize_ub: one Userbuffers communicator for
each GEMM of a block its default `methods` name: ring_exchange qkv_fprop, fc1_fprop, proj_dgrad,
fc2_dgrad; pipeline proj_fprop, fc2_fprop; bulk qkv_dgrad, qkv_wgrad, fc1_dgrad, fc1_wgrad;
external proj_wgrad, fc2_wgrad."""


def userbuffers_bytes(model: ModelSpec, training: Training, lay: Layouts) -> np.ndarray:
    """Bytes of TransformerEngine's Userbuffers under Megatron --tp-comm-overlap, outside PyTorch's
    allocator: each of the UB_COMMUNICATORS communicators (tex.CommOverlap, tex.CommOverlapP2P)
    holds a buffer of initialize_ub's `shape`, "the global shape of the input tensor to a
    te.TransformerLayer forward pass, with the sequence and batch dimensions collapsed" (its
    docstring): sequence x micro-batch / cp by hidden, in the 16-bit dtype (TE 2.20.2
    csrc/extensions/comm_gemm_overlap.cpp get_buffer: the whole buffer is that shape, a rank's
    chunk 1/tp of it). Allocated once for every block. None without the flag, TP or SP, as
    mp_comm.tp_pass_exposed_s."""
    on = training.tp_comm_overlap & (lay.sequence_parallel > 0) & (lay.tp > 1)
    shape = training.seq_len * lay.mbs / lay.cp * model.hidden
    return np.where(on, UB_COMMUNICATORS * shape * training.precision.element_bytes, 0.0)


def reserved_bytes(allocated_bytes, coef: dict, expandable: bool = False) -> np.ndarray:
    """The caching allocator's reserved peak for an allocated peak (what torch.cuda.max_memory_reserved
    reports against max_memory_allocated): block rounding and the segments that changing activation
    sizes fragment (c10/cuda/CUDACachingAllocator.cpp), a named fraction calibration fits; with
    expandable segments (Training.expandable_segments) one segment per stream grows in place, and the
    cached blocks split across segments that make most of that fraction do not arise."""
    key = "allocator_fragmentation_expandable" if expandable else "allocator_fragmentation"
    return np.ceil(allocated_bytes * (1.0 + coef[key]))


# ---------------------------------------------------------------------------------------------
# the rank


# the fields each group of terms reads; step time groups by the activations' set too (timing.py), so
# that grouping of the candidates is computed once for both (rank_order is step time's alone: where the
# ranks sit moves no byte)
# accumulates (grouping.DERIVED: gas > 1): the model states read the micro-batch count only so
# (states.grad_bytes, grads_freed, host_bytes; engines/deepspeed/memory.py deepspeed_straddle_bytes),
# so candidates that differ only in the micro-batch size share one evaluation
# recompute: ZeRO-3's gathered parameters while a checkpoint recomputes (zero3_live_param_bytes)
STATE_FIELDS = ("tp", "pp", "dp", "cp", "ep", "etp", "accumulates", "zero", "offload_optimizer", "offload_params",
                "rank_order", "recompute")
ACTIVATION_FIELDS = ("tp", "pp", "dp", "cp", "ep", "etp", "gas", "mbs", "recompute", "recompute_layers", "sequence_parallel", "vpp",
                     "schedule", "rank_order")


def _stage(where, model: ModelSpec, training: Training, lay: Layouts):
    """'first' / 'second' / 'last' / 'routed' (pipeline.first_routed_stage) stage of each candidate, or an
    explicit stage array."""
    if isinstance(where, str) and where == "routed":
        return first_routed_stage(model.dense_layers, model.layers, lay.pp, training.pipeline_edge_layers)
    named = {"first": 0 * lay.pp, "last": lay.pp - 1, "second": np.minimum(1, lay.pp - 1)}
    return named.get(where, where) if isinstance(where, str) else where


def _states_part(model, cluster, training, lay, where) -> dict:
    s = Stage(model, training, lay, _stage(where, model, training, lay))
    fwd, step = engine_buffers(s)
    # Transformer Engine's FP8 weight copies sit beside the 16-bit weights all step (planner/fp8.py)
    weights = weight_bytes(s) + fp8.weight_cache_bytes(s)
    parts = {"params": weights, "grads": grad_bytes(s),
             "step_grads": grad_bytes(s, at_step=True),
             "optimizer": optimizer_bytes(s), "fwd_buffers": fwd, "step_buffers": step}
    parts["reduce_grads"], parts["reduce_buffers"] = reduction_copy_bytes(s)
    parts = {k: np.ceil(v) for k, v in parts.items()}
    coef = coefficients("memory", cluster.calibration)
    held = parts["params"] + parts["optimizer"]
    freed = grads_freed(training, lay)
    # DeepSpeed's forward/backward buffers are its gradients' (reduce buckets, partition straddles,
    # ZeRO-2's flat copy): a step freed them with the gradients (stage_1_and_2.py _release_ipg_buffers),
    # so they come back with them; but not the casts, norm copies and clones of the largest parameter's
    # reduction, which is lm_head's, at backward's start beside the activations; FSDP2's are gathered
    # parameters, held from backward's start
    early = np.ceil(deepspeed_reduction_transient_bytes(s, 0.0))
    grad_buffers = np.where(freed & (training.engine.buffers is Buffers.DEEPSPEED),
                            np.maximum(parts["fwd_buffers"] - early, 0.0), 0.0)
    return {**parts, "fwd_states": held + parts["fwd_buffers"] - grad_buffers, "grads_freed": freed * 1.0,
            "grad_buffers": grad_buffers,
            "step_states": held + parts["step_grads"] + parts["step_buffers"],
            "reduce_states": np.where(parts["reduce_grads"] > 0, held + parts["reduce_grads"] + parts["reduce_buffers"], 0.0),
            "fixed_overhead": coef["cuda_context_bytes"] + coef["nccl_bytes_per_group"] * process_groups(lay),
            # one host's ranks share its RAM: a DGX node, or an NVL72 compute tray (Cluster.gpus_per_host)
            "cpu_per_node": host_bytes(s) * cluster.gpus_per_host}


def loss_bytes_per_logit(model: ModelSpec, training: Training, coef: dict) -> float:
    """Peak bytes per logit of the modules' loss: Megatron's own VocabParallelCrossEntropy
    (logits_bytes_per_element), llm-foundry's fused cross-entropy on 16-bit logits
    (fused_cross_entropy_bytes_per_logit), else aten cross_entropy on fp32 logits, which transformers'
    ForCausalLMLoss and torchtitan's cross_entropy_loss call (aten_cross_entropy_bytes_per_logit)."""
    key = {Modules.MEGATRON: "logits_bytes_per_element", Modules.LLM_FOUNDRY: "fused_cross_entropy_bytes_per_logit"}
    return coef[key.get(block_modules(model, training), "aten_cross_entropy_bytes_per_logit")]


def _activation_part(model, training, lay, where, coef) -> dict:
    s = Stage(model, training, lay, _stage(where, model, training, lay))
    if block_modules(model, training) is Modules.HF_LIGER:
        logits = np.ceil(liger_fused_loss_bytes(s))
    else:
        logits = np.ceil(A.logits_bytes(s, loss_bytes_per_logit(model, training, coef)))
    acts = np.ceil(A.stage_activation_bytes(s) + autocast_weight_bytes(s))
    return {"activations": acts, "logits": logits, "total": acts + logits,
            "host": A.stage_host_activation_bytes(s),
            "userbuffers": userbuffers_bytes(model, training, lay)}  # outside the allocator: overhead


def liger_fused_loss_bytes(s: Stage) -> np.ndarray:
    """Last stage: Liger's fused linear cross-entropy in place of logits (liger_kernel 0.8.5
    ops/fused_linear_cross_entropy.py fused_linear_cross_entropy_forward): it never holds the BT x V
    logits, only one chunk of chunk_size rows (_CHUNK_MEM_CONST 1: next_power_of_2(ceil(BT /
    ceil(V / H))), at most BT) in the input's dtype, beside the gradients it computes in forward and
    keeps for backward: grad_input (BT x H, the input's dtype), grad_weight (V x H, the weight's dtype:
    accum_dtype None) and the fp32 per-token loss."""
    model, training, lay, stage = s
    e, h, v = training.precision.element_bytes, model.hidden, model.vocab
    tokens = np.asarray(training.seq_len / lay.cp * lay.mbs, dtype=np.float64)
    inc = np.ceil(v / h)
    rows = np.minimum(2.0 ** np.ceil(np.log2(np.ceil(tokens / inc))), tokens)
    held = e * rows * v / lay.tp + e * tokens * h + e * v * h / lay.tp + 4.0 * tokens
    return (stage == lay.pp - 1) * held


def autocast_weight_bytes(s: Stage) -> np.ndarray:
    """The 16-bit weight copies autograd keeps from forward to backward where autocast casts fp32
    parameters: Composer's FSDP 'DEFAULT' mixed precision gathers fp32 parameters (composer/distributed/
    mosaic_parallelism.py get_mixed_precision: param_dtype fp32), so each F.linear under autocast casts
    its weight (aten autocast cached_cast) and saves the cast for its input gradient; FSDP frees the
    gathered fp32 unit after forward, not the cast. Every block that runs forward with grad keeps its
    copy (a checkpointed block keeps none until its recompute), and the unembedding keeps wte's (tied
    in MPT). llm-foundry's modules only (planner/modules.py); 0 elsewhere."""
    model, training, lay, stage = s
    if not autocasts_fp32_params(model, training):
        return 0.0 * lay.tp
    sums, e = model.sums, training.precision.element_bytes
    blocks = sum(n for _, n in blocks_on_stage(model, lay, stage, training.pipeline_edge_layers))
    kept_blocks = np.where(lay.recompute == Recompute.FULL, 1, blocks)  # the one recomputing block
    block = (sums.block_split + sums.expert_split) / lay.tp + sums.block_replicated + sums.expert_replicated
    head = np.where(stage == lay.pp - 1, (sums.first_split if sums.tied else sums.output) / lay.tp, 0.0)
    return e * (kept_blocks * block + head)


class _Stage:
    """One pipeline stage of every candidate: the moments of a step (PHASES), the largest one's
    total, and its parts on demand (states and activations each evaluated per distinct combination
    of the fields they read)."""

    def __init__(self, cluster, training, states: Grouped, acts: Grouped):
        coef = coefficients("memory", cluster.calibration)
        self.states, self.acts = states, acts
        grads = self.states["grads"] + self.states["grad_buffers"]
        acts, freed = self.acts["total"], self.states["grads_freed"] > 0
        # where the step freed the gradients, backward starts with every activation and no gradient
        # and ends with every gradient and no activation; in between one shrinks as the other grows
        self.grads_at_end = freed & (grads > acts)
        fwd = self.states["fwd_states"] + np.where(freed, np.maximum(grads, acts), grads + acts)
        step, reduce = self.states["step_states"], self.states["reduce_states"]
        # PHASES: 0 forward/backward, 1 optimizer step, 2 gradient reduction (the first largest wins)
        self.phase = np.where(reduce > np.maximum(fwd, step), 2, (step > fwd).astype(np.int64))
        self.moments = (fwd, step, reduce)  # allocated bytes at each of PHASES (reduce 0: no such moment)
        self.allocated = np.maximum(np.maximum(fwd, step), reduce)
        self.outside, self.coef, self.capacity = np.ceil(self.states["fixed_overhead"] + self.acts["userbuffers"]), \
            coef, cluster.gpu.memory_bytes
        self.expandable = bool(training.expandable_segments)
        self.required, self.reserved, self.total = self._held(self.allocated, self.outside)

    def _held(self, allocated, outside) -> tuple:
        """(required, reserved, total) for an allocated peak: the caching allocator reserves beyond what
        is allocated while the device has room, and at the device's limit frees its cached segments and
        retries before it raises OOM (c10/cuda/CUDACachingAllocator.cpp DeviceCachingAllocator::malloc:
        release_available_cached_blocks, release_cached_blocks): the reserve grows up to the memory
        left, and a fit needs the allocated peak."""
        reserved = np.maximum(np.minimum(reserved_bytes(allocated, self.coef, self.expandable), self.capacity - outside),
                              allocated)
        return allocated + outside, reserved, reserved + outside

    def moment(self, phase: int, key: str, i=None):
        """'allocated', 'required', 'reserved' or 'total' (as RANK_COLUMNS) as if moment `phase` (an
        index into PHASES) were the peak, for every candidate (i None) or candidate i. Only the reported
        records ask (api.layout_record's memory.phases): the search reads the peak's alone."""
        allocated = self.moments[phase] if i is None else self.moments[phase].flat[i]
        outside = self.outside if i is None else np.broadcast_to(self.outside, self.phase.shape).flat[i]
        if key == "allocated":
            return allocated
        return dict(zip(("required", "reserved", "total"), self._held(allocated, outside)))[key]

    def part(self, key: str, i=None, phase=None):
        """One breakdown part at moment `phase` (an index into PHASES; None: the peak), for every
        candidate (i None) or candidate i."""
        def get(src, k):
            return src[k] if i is None else src.at(k, i)

        at = phase
        phase = (self.phase if i is None else self.phase.flat[i]) if at is None else at

        def by_phase(fwd, step, reduce):
            return np.select([phase == 1, phase == 2], [step, reduce], fwd)

        if key in ("params", "optimizer"):
            return get(self.states, key)
        at_end = self.grads_at_end if i is None else self.grads_at_end.flat[i]
        if key == "grads":
            fwd = np.where((get(self.states, "grads_freed") > 0) & ~at_end, 0.0, get(self.states, "grads"))
            return by_phase(fwd, get(self.states, "step_grads"), get(self.states, "reduce_grads"))
        if key in ("activations", "logits"):
            return np.where((phase > 0) | at_end, 0.0, get(self.acts, key))
        if key == "buffers":
            fwd = get(self.states, "fwd_buffers") - np.where(at_end, 0.0, get(self.states, "grad_buffers"))
            return by_phase(fwd, get(self.states, "step_buffers"),
                            get(self.states, "reduce_buffers"))
        assert key == "overhead", key
        total = self.moment(at, "total", i) if at is not None else self.total if i is None else self.total.flat[i]
        return total - sum(self.part(k, i, at) for k in BREAKDOWN_KEYS[:-1])


def _stages(model, cluster, training, lay, wheres: tuple, codes) -> list:
    """A _Stage for each of `wheres` (_stage's names or stage arrays), their states and activations
    each evaluated for all of them at once (grouping.grouped_stages)."""
    coef = coefficients("memory", cluster.calibration)

    def stages_of(sub):
        return [_stage(where, model, training, sub) for where in wheres]

    states = grouped_stages(codes, STATE_FIELDS, lambda sub, stage: _states_part(model, cluster, training, sub, stage),
                            lay, stages_of)
    acts = grouped_stages(codes, ACTIVATION_FIELDS, lambda sub, stage: _activation_part(model, training, sub, stage, coef),
                          lay, stages_of)
    return [_Stage(cluster, training, s, a) for s, a in zip(states, acts)]


def rank_memory(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts, stage=None):
    """Peak GPU bytes of one rank of `stage` (default: the larger of the first and last stage,
    which hold the most: embedding and most in-flight micro-batches, or output layer and logits;
    with dense-first blocks also the first stage of routed blocks only).

    Returns a Lazy mapping for every candidate: 'required' (the device bytes the fit is decided on:
    the allocated peak plus the CUDA context and NCCL buffers outside the allocator), 'total' (what
    the device holds then: the allocator's reserve, up to the memory left, plus those), 'allocated'
    and 'reserved' (the peaks torch.cuda.max_memory_allocated / max_memory_reserved report),
    'cpu_per_node', 'phase' (an index into PHASES), and each of BREAKDOWN_KEYS on demand."""
    def column(s: _Stage, key: str, i):
        if key == "cpu_per_node":  # model states and cpu-checkpointed activations of one host's ranks
            ranks = cluster.gpus_per_host
            return s.states[key] + ranks * s.acts["host"] if i is None else \
                s.states.at(key, i) + ranks * s.acts.at("host", i)
        return getattr(s, key) if i is None else getattr(s, key).flat[i]

    def at_phase(s: _Stage, key: str, i):  # PHASE_COLUMNS: 'forward/backward:activations' etc.
        name, column = key.split(":")
        p = PHASES.index(name)
        return s.part(column, i, p) if column in BREAKDOWN_KEYS else s.moment(p, column, i)

    if stage is not None:
        one = _stages(model, cluster, training, lay, (stage,), None)[0]
        return Lazy({**{k: (lambda i, k=k: column(one, k, i)) for k in RANK_COLUMNS},
                     **{k: (lambda i, k=k: one.part(k, i)) for k in BREAKDOWN_KEYS},
                     **{k: (lambda i, k=k: at_phase(one, k, i)) for k in PHASE_COLUMNS}})
    codes = codes_of(lay)
    # with dense-first blocks the first all-routed stage may hold the most (first_routed_stage); where
    # the first and last stage give blocks up to the embedding and the loss, the second may
    # (pipeline.max_layers_on_stage: Maverick on 32 stages, one dense block on stage 0, a routed one on 1)
    more = (("second",) if training.pipeline_edge_layers else ()) + (("routed",) if model.dense_layers else ())
    stages = _stages(model, cluster, training, lay, ("first", "last") + more, codes)
    pick = np.argmax(np.stack([s.required for s in stages]), axis=0)  # the first largest wins

    def choose(f, i):
        if i is not None:
            return f(stages[pick.flat[i]])
        values = [f(s) for s in stages]
        return np.choose(pick, np.broadcast_arrays(*values)) if len(values) > 2 else np.where(pick == 1, *values[::-1])

    return Lazy({**{k: (lambda i, k=k: choose(lambda s: column(s, k, i), i)) for k in RANK_COLUMNS},
                 **{k: (lambda i, k=k: choose(lambda s: s.part(k, i), i)) for k in BREAKDOWN_KEYS},
                 **{k: (lambda i, k=k: choose(lambda s: at_phase(s, k, i), i)) for k in PHASE_COLUMNS}})


RANK_COLUMNS = ("total", "required", "allocated", "reserved", "phase", "cpu_per_node")
"""The whole-rank figures rank_memory returns beside the breakdown: `total` what the device holds at
the peak (the allocator's reserve, up to the device's memory, plus the CUDA context and NCCL's
buffers), `required` what must fit (the allocated peak plus those; _Stage)."""
PHASE_COLUMNS = tuple(f"{name}:{key}" for name in PHASES
                      for key in ("total", "required", "allocated", "reserved") + BREAKDOWN_KEYS)
"""rank_memory's figures at every moment of PHASES, 'forward/backward:activations' and so on: each
as if that moment were the peak, of the same rank (the stage whose peak is largest). Computed only
where read (the reported records): the search reads the peak's alone. A moment whose 'allocated' is
0 is not modelled for that candidate (the gradient reduction, where no engine copy is made)."""


def per_stage(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts) -> list[dict]:
    """Memory of every pipeline stage of a one-layout `lay`, all stages in one vectorized pass."""
    assert lay.size == 1
    p = int(lay.pp[0])
    stages = lay.take(np.zeros(p, dtype=np.int64))
    mem = rank_memory(model, cluster, training, stages, np.arange(p))
    columns = {k: mem[k] for k in mem}
    return [{k: (int(v[i]) if k == "phase" else float(v[i])) for k, v in columns.items()} for i in range(p)]
