"""The training settings recommend tries beside its first search (planner/refine.py runs them): the
pipeline's edge split, DeepSpeed's ZeRO-3 live-parameter knobs lowered or raised, TP communication
overlap, Megatron's recompute modules, DeepSpeed's overlap_comm for ZeRO-1/2, and the smallest
offloaded optimizer share; and the pipeline split a layout estimate is given needs."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from planner import layout, memory, rules
from planner.engines import Buffers, Modules
from planner.errors import InputError
from planner.hardware import Cluster
from planner.layout import Training
from planner.model import ModelSpec
from planner.pipeline import interleaved_layers
from planner.options import Offload
from planner.sharding import block_params
from planner.search import SearchResult, VPP_CHOICES, divisors


def edge_layers_choice(model: ModelSpec, cluster: Cluster, training: Training) -> Training:
    """`training` with the pipeline split that lets more of the searched interleavings divide, where
    the engine lets the embedding and the loss count as a block each and its interleaving divides
    the layer slots (Megatron-LM --account-for-embedding/loss-in-pipeline-split: pipeline.
    interleaved_layers): the number of (pp, vpp > 1) pairs, pp dividing the GPUs, whose pp x vpp
    divides the slots, with and without; more wins, a tie keeps the engine's default. Llama 3
    405B's 126 blocks become 128 slots (pp 16 x vpp 2 as Meta ran it, Dubey et al. 2024 section
    3.3.2); Llama 3 70B's 80 stay 80. A rule on divisibility, not a second search: both splits
    cost the same otherwise (one block moved between the edge stages and the embedding's)."""
    engine = training.engine
    if not engine.pipeline_edge_choice or engine.modules is not Modules.MEGATRON:
        return training
    pps = [p for p in divisors(cluster.num_gpus) if 1 < p <= model.layers]

    def pairs(edges):
        slots = model.layers + 2 * edges
        return sum(slots % (p * v) == 0 for p in pps for v in VPP_CHOICES if v > 1 and p * v <= slots)

    default = engine.pipeline_edge_layers
    best = 1 - default if pairs(1 - default) > pairs(default) else default
    return training if best == training.pipeline_edge_layers else replace(training, pipeline_edge_layers=best)


def edges_the_layout_needs(spec: ModelSpec, clus: Cluster, train: Training, lay, free: bool) -> Training:
    """`train` with the embedding and the loss counted as pipeline layers where the user left the
    split free and the stated pp x vpp divides the blocks evenly only that way, or runs only that
    way: Megatron-LM asserts that the layers plus one each for --account-for-embedding/loss-in-
    pipeline-split divide by the stages (training/arguments.py); NVIDIA's recipes set both for such
    layouts (NeMo 2 recipes/llama31_405b.py pretrain_recipe defaults, 126 blocks over pp 8 x vpp 8;
    qwen3_235b_a22b.py, 94 blocks over pp 8 x vpp 12). Without them an uneven split needs a
    --pipeline-model-parallel-layout of its own."""
    if not free or not train.engine.pipeline_edge_choice or train.pipeline_edge_layers:
        return train
    edges = replace(train, pipeline_edge_layers=1)
    chunks = int(lay.pp[0] * lay.vpp[0])
    if chunks > 1 and spec.layers % chunks and interleaved_layers(spec, edges) % chunks == 0:
        return edges
    try:
        rules.check_single(spec, clus, train, lay)
        return train
    except InputError:
        try:
            rules.check_single(spec, clus, edges, lay)
        except InputError:
            return train  # the first rule's message stands
        return edges


def lean_zero3_training(model: ModelSpec, training: Training) -> Training | None:
    """`training` with DeepSpeed's ZeRO-3 live-parameter knobs lowered to what keeps one submodule
    prefetched beside the one computing: stage3_max_live_parameters = stage3_max_reuse_distance =
    2 x the largest block submodule, in tens of millions (DeepSpeed 0.19 zero/config.py: "Smaller
    values use less memory, but perform more communication"; partitioned_param_coordinator.py
    fetch_sub_module prefetches only under max_live_parameters). Memory falls to the current block
    and the prefetch bucket (engines/deepspeed/memory.py zero3_live_param_bytes); the backward gathers again what the
    forward, and under full recompute the recompute, released (engines/deepspeed/timing.py zero3_gather_s). None where
    the engine has no such knobs or they are not lower."""
    zc = training.zero_config
    if training.engine.buffers is not Buffers.DEEPSPEED or 3 not in training.engine.zero_stages:
        return None
    lean = -(-2 * model.largest_block_module_params // 10_000_000) * 10_000_000
    lean = max(lean, zc.stage3_prefetch_bucket_size)
    if lean >= min(zc.stage3_max_live_parameters, zc.stage3_max_reuse_distance):
        return None
    return replace(training, zero_config=replace(zc, stage3_max_live_parameters=lean, stage3_max_reuse_distance=lean))


def roomy_zero3_training(model: ModelSpec, training: Training) -> Training | None:
    """`training` with DeepSpeed's ZeRO-3 live-parameter knobs raised so that a recomputed block
    keeps what its recompute gathered until its backward: stage3_max_live_parameters =
    stage3_max_reuse_distance = the largest block's elements (one rank of TP 1), in hundreds of
    millions. With a prefetch bucket the prefetcher then passes every module's backward use before
    the module is released (sharding.recompute_fetches: the module and the rest of the block under
    max_live), so the backward gathers nothing twice (engines/deepspeed/timing.py zero3_gather_s), for the block held
    gathered meanwhile (engines/deepspeed/memory.py zero3_live_param_bytes). None where the engine has no such knobs,
    nothing prefetches, or the knobs are already that high."""
    zc = training.zero_config
    if training.engine.buffers is not Buffers.DEEPSPEED or 3 not in training.engine.zero_stages \
            or zc.stage3_prefetch_bucket_size <= 0:
        return None
    one = layout.single(dp=1, zero=3)
    roomy = -(-int(block_params(model, training, one)[0]) // 100_000_000) * 100_000_000
    if roomy <= min(zc.stage3_max_live_parameters, zc.stage3_max_reuse_distance):
        return None
    return replace(training, zero_config=replace(zc, stage3_max_live_parameters=roomy, stage3_max_reuse_distance=roomy))


def tp_overlap_training(model: ModelSpec, training: Training, result: SearchResult) -> Training | None:
    """`training` with Megatron's --tp-comm-overlap on where the engine runs it (Engine.tp_comm_overlap:
    TransformerEngine Userbuffers) and some candidate of `result` has TP > 1 with sequence
    parallelism that fits (its buffers only add memory: memory.userbuffers_bytes); else None. The
    flag is one for the whole launch: it hides a share of each TP collective behind its GEMM and
    takes SMs from the GEMM (engines/megatron/timing.py ub_pass_exposed_s), so whether it pays depends on the layout
    and the GPU. MLA blocks get none (mp_comm.tp_pass_exposed_s)."""
    valid = result.valid
    if training.tp_comm_overlap or not training.engine.tp_comm_overlap or model.kv_lora_rank > 0:
        return None
    if not np.any((valid.tp > 1) & (valid.sequence_parallel > 0) & np.asarray(result.eval.fits)):
        return None
    return replace(training, tp_comm_overlap=True)


def recompute_module_trainings(model: ModelSpec, training: Training) -> list[Training]:
    """`training` with Megatron's selective recompute widened beyond the attention core, where the
    user left --recompute-modules alone and the model has modules of the kinds it lists (MLA, MoE):
    first the output-discarding ones, which rerun no GEMM but MLA's up projections (the experts'
    activation, the norms and MLA's up projections: moe_act, layernorm, mla_up_proj; NVIDIA's
    DeepSeek-V3 H100 launch recomputes mla_up_proj, Megatron-Bridge's GPT-OSS H100 recipe layernorm
    and moe_act),
    then the routed and dense MLPs too (moe, mlp: NeMo's DeepSeek-V3 H100 recipe lists
    mla_up_proj, mlp, moe), each a search of the selective layouts of its own. None without them."""
    if not training.engine.recompute_modules_choice or training.recompute_modules != layout.DEFAULT_RECOMPUTE_MODULES \
            or not (model.experts > 1 or model.kv_lora_rank):
        return []
    moe_act = model.experts > 1 and training.moe_grouped_gemm  # megatron-core needs grouped experts for it
    cheap = ("core_attn",) + (("moe_act",) if moe_act else ()) + ("layernorm",) \
        + (("mla_up_proj",) if model.kv_lora_rank else ())
    heavy = cheap + (("moe",) if model.experts > 1 else ()) + (("mlp",) if model.moe_layers != model.layers else ())
    return [replace(training, recompute_modules=m) for m in (cheap, heavy)]


def overlap_comm_rows(training: Training, result: SearchResult) -> tuple:
    """(`training` with DeepSpeed's overlap_comm on, the candidates of `result` it changes) where the
    user left overlap_comm unset and the engine leaves ZeRO-1/2 without it (DeepSpeed 0.19.8
    zero/config.py overlap_comm_valid: None -> stage == 3); else (None, empty). With it, stage_1_and_2.py
    reduces each bucket on its reduction_stream under the backward and setup_buckets allocates a second
    reduce_bucket_size buffer (engines/deepspeed/memory.py deepspeed_reduce_buckets): faster where the second buffer fits,
    which the caller decides by evaluating these rows again."""
    none = np.zeros(0, dtype=np.int64)
    if training.zero_config.overlap_comm is not None or not training.engine.overlap_flag or not training.engine.deepspeed:
        return None, none
    valid, ev = result.valid, result.eval
    zero12 = layout.among(valid.zero, (1, 2)) & ~layout.among(valid.zero, training.engine.overlap_default)
    # it hides only the reduction and the gradients' copies to the host (timing.grad_overlaps,
    # optimizer_time.offload_s): where no fitting ZeRO-1/2 candidate has either, nothing changes
    t, fits = ev.time, np.asarray(ev.fits)
    hidden_s = np.asarray(t["breakdown"]["dp_comm"]) + np.asarray(t["breakdown"]["offload"])
    if not np.any(zero12 & fits & (hidden_s > 0)):
        return None, none
    rows = np.flatnonzero(zero12)  # all: the hints compare neighbours that do not fit (binding_constraint)
    return replace(training, zero_config=replace(training.zero_config, overlap_comm=True)), rows


OFFLOAD_FRACTION_STEP = 0.05
"""Grid of the optimizer offload share recommend chooses (lean_offload_training)."""


def lean_offload_training(model: ModelSpec, cluster: Cluster, training: Training, result: SearchResult,
                          headroom: float) -> Training | None:
    """`training` with the smallest share of the optimizer offloaded, on a grid of
    OFFLOAD_FRACTION_STEP, at which the fastest fitting layout, one that offloads its optimizer,
    still fits, where the engine can offload part of it (Engine.offload_hybrid_optimizer:
    megatron-core --optimizer-offload-fraction). The share kept on the GPU adds its memory
    (states.optimizer_bytes, affine in the share) and takes it off the host's step and copies
    (optimizer_time.optimizer_s, offload_s), which the GPU runs beside it: the smallest share that fits is
    that layout's fastest. None where the fastest layout keeps its optimizer, the engine offloads
    whole, or no smaller share fits."""
    if not training.engine.offload_hybrid_optimizer or not result.order.size:
        return None
    i = int(result.order[0])
    if result.valid.offload_optimizer[i] == Offload.NONE:
        return None
    one = result.valid.take(np.array([i]))
    capacity = cluster.gpu.memory_bytes * (1.0 - headroom)

    def total(share: float) -> float:
        return float(memory.rank_memory(model, cluster, replace(training, optimizer_offload_fraction=share), one)["required"][0])

    whole, least = total(1.0), total(OFFLOAD_FRACTION_STEP)
    per_share = (least - whole) / (1.0 - OFFLOAD_FRACTION_STEP)  # GPU bytes per unit of share kept there
    needed = 1.0 - (capacity - whole) / per_share if per_share > 0 else OFFLOAD_FRACTION_STEP
    steps = max(1, int(np.ceil(round(needed / OFFLOAD_FRACTION_STEP, 9))))
    for k in range(steps, steps + 3):  # the allocator's rounding may want one step more
        share = round(k * OFFLOAD_FRACTION_STEP, 6)
        if share >= 1.0:
            return None
        if total(share) <= capacity:
            return replace(training, optimizer_offload_fraction=share)
    return None
