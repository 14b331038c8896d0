"""Which layouts are valid: the structural rules every engine shares, and the engine rules,
generated from the engine records (planner/engines/). Vectorized over `Layouts`; a single
layout raises the first broken rule's message, naming its flag."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from planner import fp8
from planner.activations import offloads_checkpoints
from planner.engines import ENGINES, Buffers, Engine, ExpertTP, Launcher, MoeCapacity
from planner.errors import InputError
from planner.hardware import Cluster
from planner.layout import Layouts, Training, among
from planner.model import ModelSpec
from planner.sharding import expert_dp, expert_folds, expert_tp
from planner.options import Fp8Recipe, Offload, Optimizer, Precision, RankOrder, Recompute, RecomputeMethod, Schedule
from planner.pipeline import interleaved_layers

DIVISIBILITY, TOPOLOGY, ENGINE_RULE = "divisibility", "topology", "engine rule"
"""Rejection groups the search counts."""


@dataclass(frozen=True)
class Rule:
    """One validity rule."""

    name: str
    group: str
    """DIVISIBILITY, TOPOLOGY or ENGINE_RULE."""
    broken: Callable
    """(model, cluster, training, layouts) -> bool array: candidates breaking the rule."""
    message: Callable
    """(model, cluster, training) -> the one-line error naming the flag."""
    refuses: Callable | None = None
    """For a rule every layout breaks or none (refused()): (model, cluster, training) -> bool."""


def _whole(name: str, refuses: Callable, message: Callable) -> Rule:
    """An engine rule that no layout changes: the model, cluster and training break it or not."""
    return Rule(name, ENGINE_RULE, lambda m, cl, tr, l: np.full(l.shape, bool(refuses(m, cl, tr))), message, refuses)


def refused(model: ModelSpec, cluster: Cluster, training: Training) -> str | None:
    """The message of the first rule that refuses every layout whatever it is, or None."""
    broken = (r for r in RULES if r.refuses and r.refuses(model, cluster, training))
    return next((r.message(model, cluster, training) for r in broken), None)


def compiled_block_measured(model) -> bool:
    """Whether torch.compile of this model's Hugging Face blocks was measured (calibrate/benches/hf_compiled.py)."""
    return model.architecture == "llama" and model.experts == 1 and not model.qk_norm


def _names(engines) -> str:
    return " or ".join(e.name for e in engines) or "none"


def _stages(stages) -> str:
    return ", ".join(str(z) for z in stages)


def _schedules_broken(engine: Engine, lay: Layouts) -> np.ndarray:
    allowed = [int(s) for s in engine.pipeline_schedules]
    interleaves = Schedule.INTERLEAVED in engine.pipeline_schedules
    # torch 2.13 distributed/pipelining/schedules.py ScheduleInterleavedZeroBubble.__init__: the micro-
    # batches must be a multiple of the rounds, max(1, m // p)
    rounds = np.maximum(1, lay.gas // np.maximum(lay.pp, 1))
    zb_broken = (lay.schedule == Schedule.ZB_H1) & (lay.gas % rounds != 0)
    return (lay.pp > 1) & (~among(lay.schedule, allowed) | ((lay.vpp > 1) & (not interleaves)) | zb_broken)


def stages_by_weight_exist(weights, stages) -> np.ndarray:
    """Whether some pipeline_parallel_layers_per_stage n gives ceil(weights / n) == stages, as
    torchtitan 0.3.0 distributed/pipeline_parallel.py counts num_virtual_stages: n from
    ceil(weights / stages) up to below weights / (stages - 1)."""
    smallest = -(-weights // np.maximum(stages, 1))
    return (stages <= 1) | (smallest * (stages - 1) < weights)


def every_n_layers_broken(model: ModelSpec, training: Training, lay: Layouts) -> np.ndarray:
    """--recompute-layers N an engine that checkpoints every k-th layer cannot launch: N must be
    ceil(L / k) for some k, which holds exactly when k = ceil(L / N) gives it back (for any k with
    ceil(L / k) = N, L / N <= k, so ceil(L / N) <= k and ceil(L / ceil(L / N)) is N), on one stage,
    with the block count of layers rather than uniform groups."""
    if not training.engine.recompute_every_n:
        return np.zeros(lay.size, dtype=bool)
    n = np.maximum(lay.recompute_layers, 1)
    k = -(-model.layers // n)
    expressible = (-(-model.layers // k) == n) & (lay.pp == 1) & (lay.recompute_method == RecomputeMethod.BLOCK)
    return (lay.recompute_layers > 0) & ~expressible


def _ep_ranks_broken(training: Training, lay: Layouts) -> np.ndarray:
    """EP ranks: from the data-parallel ranks (dp % ep), or where EP folds over TP the ranks
    tp x cp x dp / etp (megatron-core parallel_state.py: expert ranks etp x ep x edp)."""
    if expert_folds(training):
        return (lay.tp * lay.cp * lay.dp) % (expert_tp(training, lay) * lay.ep) != 0
    return lay.dp % lay.ep != 0


def _etp_broken(training: Training, lay: Layouts) -> np.ndarray:
    """An explicit etp the engine cannot run (planner/engines/base.py ExpertTP)."""
    kind, etp = training.engine.expert_tp, lay.etp
    allowed = {ExpertTP.CHOICE: (etp == 1) | (etp == lay.tp), ExpertTP.SPLIT: etp == lay.tp,
               ExpertTP.BY_EP: etp == np.where(lay.ep > 1, 1, lay.tp), ExpertTP.WHOLE: etp == 1}[kind]
    return (etp > 0) & ~allowed


def _offload_broken(engine: Engine, lay: Layouts) -> np.ndarray:
    allowed = [Offload.NONE, *engine.offload_devices]
    broken = ~among(lay.offload_optimizer, allowed) | ~among(lay.offload_params, allowed)
    if engine.offload_together:
        broken = broken | (lay.offload_optimizer != lay.offload_params)
    return broken


def _offload_message(engine: Engine) -> str:
    if not engine.offload_devices:
        return (f"--offload-optimizer/--offload-params: --engine {engine.name} has no offload "
                f"(engines with it: {_names(e for e in ENGINES.values() if e.offload_devices)})")
    devices = "/".join(d.word for d in engine.offload_devices)
    together = " for both together" if engine.offload_together else ""
    return f"--offload-optimizer/--offload-params: --engine {engine.name} offloads to {devices}{together}"


RULES: tuple[Rule, ...] = (
    Rule("world", DIVISIBILITY, lambda m, cl, tr, l: l.world != cl.num_gpus,
         lambda m, cl, tr: f"--tp*--pp*--dp*--cp must equal --gpus {cl.num_gpus}"),
    Rule("tp_heads", DIVISIBILITY, lambda m, cl, tr, l: (m.heads % l.tp != 0) | (m.kv_heads % l.tp != 0),
         lambda m, cl, tr: f"--tp: must divide --heads {m.heads} and --kv-heads {m.kv_heads}"),
    Rule("tp_node", TOPOLOGY, lambda m, cl, tr, l: l.tp > cl.gpus_per_node,
         lambda m, cl, tr: f"--tp: must not exceed --gpus-per-node {cl.gpus_per_node} (TP stays inside a node)"),
    # Megatron's edge slots hold the embedding and the loss: a chunk may build no block (megatron-core
    # 0.16.1 transformer_block.py get_num_layers_to_build: num_layers_to_build -= 1, asserted >= 0)
    Rule("pp_layers", DIVISIBILITY, lambda m, cl, tr, l: l.pp * l.vpp > interleaved_layers(m, tr),
         lambda m, cl, tr: f"--pp*--vpp: must not exceed the layer count {interleaved_layers(m, tr)}"
                           + (" (blocks + 2 edge layers)" if interleaved_layers(m, tr) != m.layers else "")),
    # Megatron-LM writes unequal chunks as --pipeline-model-parallel-layout (Engine.pipeline_layout)
    Rule("vpp_divides", DIVISIBILITY,
         lambda m, cl, tr, l: (l.vpp > 1) & (((interleaved_layers(m, tr) % np.maximum(l.pp * l.vpp, 1) != 0)
                                              & (not tr.engine.pipeline_layout)) | (l.pp < 2)),
         lambda m, cl, tr: "--vpp: interleaving needs --pp > 1 and --pp*--vpp dividing the layer count "
                           f"{interleaved_layers(m, tr)}" + (" (blocks + 2 edge layers)" if interleaved_layers(m, tr) != m.layers
                                                             else "")),
    Rule("vpp_stages_by_weight", ENGINE_RULE,
         lambda m, cl, tr, l: (tr.pipeline_edge_layers > 0) & (l.vpp > 2)
                              & ~stages_by_weight_exist(m.layers + 2 * tr.pipeline_edge_layers, l.pp * l.vpp),
         lambda m, cl, tr: f"--vpp: {tr.engine.name} cuts its {m.layers} layers and 2 edge weights into stages of "
                           "pipeline_parallel_layers_per_stage each, and no such size gives --pp x --vpp stages"),
    Rule("cp_seq", DIVISIBILITY, lambda m, cl, tr, l: (tr.seq_len % (2 * l.cp) != 0) & (l.cp > 1),
         lambda m, cl, tr: f"--cp: 2*cp must divide --seq-len {tr.seq_len}"),
    Rule("etp_values", DIVISIBILITY, lambda m, cl, tr, l: _etp_broken(tr, l),
         lambda m, cl, tr: {ExpertTP.CHOICE: "--etp: must be 1 or --tp (megatron-core --expert-tensor-parallel-size)",
                            ExpertTP.BY_EP: "--etp: torchtitan splits experts over --tp without --ep and not at all "
                                            "with it (--etp 1 needs --ep > 1)",
                            ExpertTP.SPLIT: f"--etp: {tr.engine.name} splits experts over all of --tp",
                            ExpertTP.WHOLE: f"--etp: {tr.engine.name} keeps experts whole on every TP rank (--etp 1)",
                            }[tr.engine.expert_tp]),
    Rule("ep_experts", DIVISIBILITY, lambda m, cl, tr, l: (m.experts % l.ep != 0) | _ep_ranks_broken(tr, l),
         lambda m, cl, tr: f"--ep: must divide the expert count {m.experts} and "
                           + ("--tp x --cp x --dp / --etp (EP folds over TP)" if expert_folds(tr) else "--dp")),
    Rule("zero_range", ENGINE_RULE, lambda m, cl, tr, l: (l.zero < 0) | (l.zero > 3),
         lambda m, cl, tr: "--zero: must be one of 0, 1, 2, 3"),
    Rule("offload_params_zero3", ENGINE_RULE, lambda m, cl, tr, l: (l.offload_params > Offload.NONE) & (l.zero != 3),
         lambda m, cl, tr: "--offload-params: needs --zero 3"),
    Rule("engine_offload", ENGINE_RULE, lambda m, cl, tr, l: _offload_broken(tr.engine, l),
         lambda m, cl, tr: _offload_message(tr.engine)),
    # DeepSpeed 0.19.8 engine.py _do_optimizer_sanity_check: without ZeRO, 16-bit weights with a
    # different grad_accum_dtype raise NotImplementedError("unsupported mix of model_dtype and grad_accum_dtype")
    Rule("fp32_accum_needs_zero", ENGINE_RULE,
         lambda m, cl, tr, l: (l.zero == 0) & (tr.engine.buffers is Buffers.DEEPSPEED) & tr.zero_config.fp32_grad_accum
         & (tr.precision in (Precision.BF16, Precision.FP16)),
         lambda m, cl, tr: "--fp32-grad-accum: DeepSpeed has no fp32 gradient accumulation for 16-bit weights "
                           "without ZeRO (engine.py _do_optimizer_sanity_check); use --zero 1 or leave the flag off"),
    Rule("offload_optimizer_zero", ENGINE_RULE, lambda m, cl, tr, l: (l.offload_optimizer > Offload.NONE) & (l.zero == 0),
         lambda m, cl, tr: "--offload-optimizer: needs --zero 1, 2 or 3"),
    # DeepSpeed 0.19.8 stage_1_and_2.py __init__: any offload_optimizer device other than none sets
    # cpu_offload; only stage3.py swaps to NVMe (_configure_tensor_swapping)
    Rule("offload_nvme_zero3", ENGINE_RULE,
         lambda m, cl, tr, l: (l.offload_optimizer == Offload.NVME) & (l.zero < 3) & (tr.engine.buffers is Buffers.DEEPSPEED),
         lambda m, cl, tr: "--offload-optimizer nvme: DeepSpeed swaps to NVMe under --zero 3 only (ZeRO-1/2 keep an "
                           "nvme-offloaded optimizer in host memory, as cpu); use --offload-optimizer cpu or --zero 3"),
    # megatron-core 0.16.1 optimizer_config.py __post_init__: --use-precision-aware-optimizer, which its
    # HybridDeviceOptimizer offload runs under (export.py megatron_args), asserts optimizer == 'adam'
    Rule("hybrid_offload_adamw", ENGINE_RULE,
         lambda m, cl, tr, l: (l.offload_optimizer > Offload.NONE) & tr.engine.offload_hybrid_optimizer
         & (tr.optimizer is not Optimizer.ADAMW),
         lambda m, cl, tr: f"--offload-optimizer: --engine {tr.engine.name} offloads AdamW only (megatron-core's "
                           f"--use-precision-aware-optimizer asserts adam); use --optimizer adamw"),
    # Megatron-LM d98e8a6 training/arguments.py validate_args: with optimizer_cpu_offload, "not
    # args.fp8_param_gather or args.fp8_recipe == 'delayed'"
    Rule("fp8_gather_offload_delayed", ENGINE_RULE,
         lambda m, cl, tr, l: fp8.param_gather(tr, l) & (l.offload_optimizer > Offload.NONE)
         & (tr.fp8_recipe is not Fp8Recipe.DELAYED),
         lambda m, cl, tr: f"--fp8-param-gather: Megatron-LM gathers FP8 parameters beside --offload-optimizer only "
                           f"with --fp8-recipe delayed, got {tr.fp8_recipe}; pass --no-fp8-param-gather or "
                           "--fp8-recipe delayed"),
    # 16-bit states without an fp32 master need sharded optimizers: megatron-core 0.16.1
    # optimizer_config.py __post_init__ (use_precision_aware_optimizer asserts use_distributed_optimizer;
    # Engine.precision_aware_optimizer) and DeepSpeed 0.19.8 runtime/config.py _do_error_check
    # (bf16_master_weights_and_grads and bf16_optimizer_states "only supported with ZeRO Stage 1, 2, or 3")
    Rule("pure_bf16_needs_zero", ENGINE_RULE,
         lambda m, cl, tr, l: (l.zero == 0) & (tr.engine.precision_aware_optimizer or tr.engine.deepspeed)
         & (tr.precision == Precision.BF16_PURE),
         lambda m, cl, tr: f"--precision bf16-pure: --engine {tr.engine.name} keeps bf16 states only in a sharded "
                           "optimizer (" + ("its precision-aware optimizer needs the distributed optimizer"
                                            if tr.engine.precision_aware_optimizer else "DeepSpeed's "
                                            "bf16_master_weights_and_grads needs ZeRO 1-3") + "): use --zero 1"),
    Rule("sp_needs_tp", ENGINE_RULE, lambda m, cl, tr, l: (l.sequence_parallel > 0) & (l.tp < 2),
         lambda m, cl, tr: "--sequence-parallel: needs --tp > 1"),
    Rule("recompute_layers_full", ENGINE_RULE,
         lambda m, cl, tr, l: (l.recompute_layers > 0) & (l.recompute != Recompute.FULL),
         lambda m, cl, tr: "--recompute-layers: needs --recompute full"),
    Rule("recompute_uniform_chunk", ENGINE_RULE,
         lambda m, cl, tr, l: (l.recompute_method == RecomputeMethod.UNIFORM)
                              & (l.recompute_layers > -(-m.layers // np.maximum(l.pp * l.vpp, 1))),
         lambda m, cl, tr: "--recompute-layers: with --recompute-method uniform, at most the layers of one model "
                           "chunk (layers / (pp * vpp))"),
    Rule("recompute_method_layers", ENGINE_RULE,
         lambda m, cl, tr, l: (l.recompute_method == RecomputeMethod.UNIFORM) & (l.recompute_layers == 0),
         lambda m, cl, tr: "--recompute-method: uniform needs --recompute-layers N (the layers per checkpoint)"),
    # torchtitan 0.3.0 config/configs.py TrainingConfig: dtype and mixed_precision_param are float32 or
    # bfloat16; no fp16 loss scaling
    _whole("torchtitan_no_fp16",
           lambda m, cl, tr: tr.engine.launcher is Launcher.TORCHTITAN and tr.precision == Precision.FP16,
           lambda m, cl, tr: "--precision: torchtitan trains in bf16, bf16-pure or fp32, not fp16"),
    # torchtitan 0.3.0's language models (models/common decoder, llama3, qwen3, deepseek_v3) have no dropout
    _whole("torchtitan_no_dropout",
           lambda m, cl, tr: tr.engine.launcher is Launcher.TORCHTITAN and m.dropout,
           lambda m, cl, tr: "--dropout: torchtitan's models train without dropout (--no-dropout plans this model "
                             "so); megatron, megatron-deepspeed, deepspeed and fsdp keep it"),
    # calibrate/benches/hf_compiled.py measured transformers' LlamaDecoderLayer compiled (data/references/hf_compiled_cpu.json)
    _whole("compile_measured", lambda m, cl, tr: tr.compile and not compiled_block_measured(m),
           lambda m, cl, tr: "--compile: measured for transformers' Llama-style dense blocks (Llama, Mistral, Qwen2); "
                             "MoE, per-head q/k norms and the other architectures are not"),
    # megatron-core 0.16.1 GPTModel(mtp_block_spec) builds MTP depths; the other engines' models here none
    # (torchtitan 0.3.0's own models/deepseek_v3/mtp.py is not modelled)
    _whole("mtp_engine", lambda m, cl, tr: m.mtp_layers > 0 and not tr.engine.multi_token_prediction,
           lambda m, cl, tr: f"--mtp-layers: --engine {tr.engine.name} builds no multi-token-prediction depths as "
                             "modelled here; megatron does (--mtp-num-layers)"),
    # megatron-core 0.16.1 transformer_config.py __post_init__: "mla_up_proj in recompute_modules is only
    # supported with multi_latent_attention"
    _whole("recompute_mla_up_proj", lambda m, cl, tr: "mla_up_proj" in tr.recompute_modules and not m.kv_lora_rank,
           lambda m, cl, tr: "--recompute-modules: mla_up_proj needs multi-head latent attention (deepseek-v3); "
                             "this model's attention is not"),
    # transformer_config.py __post_init__: "moe_act in recompute_modules is only supported with
    # moe_grouped_gemm"; "Delayed scaling does not support moe_act and layernorm recompute for fp8"
    _whole("recompute_moe_act", lambda m, cl, tr: "moe_act" in tr.recompute_modules and not tr.moe_grouped_gemm,
           lambda m, cl, tr: "--recompute-modules: moe_act needs --moe-grouped-gemm (megatron-core refuses it without)"),
    _whole("recompute_fp8_delayed",
           lambda m, cl, tr: tr.fp8_recipe is Fp8Recipe.DELAYED and not {"moe_act", "layernorm"}.isdisjoint(tr.recompute_modules),
           lambda m, cl, tr: "--recompute-modules: moe_act and layernorm recompute need --fp8-recipe tensorwise or "
                             "mxfp8, not delayed (megatron-core refuses delayed scaling with them)"),
    _whole("deepspeed_moe_blocks_alike",
           lambda m, cl, tr: (m.moe_layers != m.layers or m.kv_lora_rank > 0)
           and tr.engine.moe_capacity is MoeCapacity.DEEPSPEED_MOE,
           lambda m, cl, tr: f"--engine: {tr.engine.name} mixes no dense blocks in as modelled here (its DeepSpeed-MoE "
                             "layers repeat every --expert-interval blocks, a spelling not read) and has no multi-head "
                             "latent attention; use megatron, "
                             "deepspeed, fsdp or torchtitan"),
    Rule("moe_tp_needs_sp", ENGINE_RULE,
         lambda m, cl, tr, l: (m.experts > 1) & (tr.engine.moe_capacity is MoeCapacity.MEGATRON) & (l.tp > 1)
                              & (l.sequence_parallel == 0),
         lambda m, cl, tr: "--sequence-parallel: megatron-core trains MoE layers with --tp > 1 only with sequence "
                           "parallelism (moe/moe_layer.py MoELayer.forward raises without it)"),
    Rule("batch", DIVISIBILITY, lambda m, cl, tr, l: (l.mbs < 1) | (l.gas < 1),
         lambda m, cl, tr: "--mbs/--gbs: must be positive, with --gbs divisible by --mbs*--dp"),
    # ---- generated from the engine record ----
    Rule("engine_pipeline", ENGINE_RULE, lambda m, cl, tr, l: (l.pp > 1) & (not tr.engine.pipeline),
         lambda m, cl, tr: f"--pp: --engine {tr.engine.name} has no pipeline engine (engines with one: "
                           f"{_names(e for e in ENGINES.values() if e.pipeline)})"),
    Rule("engine_pipeline_zero", ENGINE_RULE,
         lambda m, cl, tr, l: (l.pp > 1) & tr.engine.pipeline & ~among(l.zero, tr.engine.pipeline_zero_stages),
         lambda m, cl, tr: f"--zero: the {tr.engine.name} pipeline engine takes --zero "
                           f"{_stages(tr.engine.pipeline_zero_stages)} when --pp > 1"),
    Rule("engine_schedule", ENGINE_RULE, lambda m, cl, tr, l: _schedules_broken(tr.engine, l),
         lambda m, cl, tr: f"--vpp/--schedule: the {tr.engine.name} pipeline engine runs "
                           f"{', '.join(s.word for s in tr.engine.pipeline_schedules)} only "
                           f"(interleaving: {_names(e for e in ENGINES.values() if Schedule.INTERLEAVED in e.pipeline_schedules)}; "
                           "zb-h1 needs the micro-batches a multiple of max(1, m // p))"),
    Rule("engine_cp_with_sp", ENGINE_RULE,
         lambda m, cl, tr, l: (not tr.engine.cp_with_sp) & (l.cp > 1) & (l.sequence_parallel > 0),
         lambda m, cl, tr: f"--sequence-parallel: --engine {tr.engine.name}'s --cp is DeepSpeed's sequence parallelism "
                           "(--ds-sequence-parallel-size), which Megatron-DeepSpeed refuses beside Megatron's "
                           "(megatron/initialize.py _initialize_distributed); drop one of them"),
    Rule("engine_tensor_parallel", ENGINE_RULE,
         lambda m, cl, tr, l: (not tr.engine.tensor_parallel) & ((l.tp > 1) | (l.cp > 1)),
         lambda m, cl, tr: f"--tp/--cp: --engine {tr.engine.name} has no tensor or context parallelism "
                           f"(engines with it: {_names(e for e in ENGINES.values() if e.tensor_parallel)})"),
    Rule("engine_expert_parallel", ENGINE_RULE, lambda m, cl, tr, l: (l.ep > 1) & (not tr.engine.expert_parallel),
         lambda m, cl, tr: f"--ep: --engine {tr.engine.name} launches no expert parallelism (engines with it: "
                           f"{_names(e for e in ENGINES.values() if e.expert_parallel)})"),
    Rule("engine_partial_recompute", ENGINE_RULE,
         lambda m, cl, tr, l: (l.recompute_layers > 0) & (not tr.engine.partial_recompute),
         lambda m, cl, tr: f"--recompute-layers: --engine {tr.engine.name} recomputes every layer or none "
                           f"(engines with it: {_names(e for e in ENGINES.values() if e.partial_recompute)})"),
    Rule("engine_selective_recompute", ENGINE_RULE,
         lambda m, cl, tr, l: (l.recompute == Recompute.SELECTIVE) & (not tr.engine.selective_recompute),
         lambda m, cl, tr: f"--recompute: --engine {tr.engine.name} checkpoints whole layers (none or full); "
                           f"selective is launched by {_names(e for e in ENGINES.values() if e.selective_recompute)}"),
    Rule("recompute_every_n_layers", ENGINE_RULE, lambda m, cl, tr, l: every_n_layers_broken(m, tr, l),
         lambda m, cl, tr: f"--recompute-layers: --engine {tr.engine.name} recomputes every k-th of the {m.layers} "
                           "layers (transformers activation_checkpointing_enable(every_n_layers=k)): N must be "
                           f"ceil({m.layers}/k) for some k, with --pp 1 and --recompute-method block"),
    _whole("cpu_checkpointing_engine",
           lambda m, cl, tr: tr.zero_config.cpu_checkpointing and not offloads_checkpoints(tr.engine),
           lambda m, cl, tr: f"--cpu-checkpointing: --engine {tr.engine.name} has no host copy of checkpointed inputs "
                             f"(engines with one: {_names(e for e in ENGINES.values() if offloads_checkpoints(e))})"),
    Rule("engine_rank_order", ENGINE_RULE,
         lambda m, cl, tr, l: (l.rank_order == RankOrder.PP_INNER) & (not tr.engine.rank_order_choice),
         lambda m, cl, tr: f"--rank-order: --engine {tr.engine.name} places pipeline stages outermost (tp-cp-dp-pp); "
                           f"tp-cp-pp-dp is {_names(e for e in ENGINES.values() if e.rank_order_choice)}'s "
                           "--use-tp-pp-dp-mapping"),
    # megatron-core 0.16.1 parallel_state.py initialize_model_parallel asserts it unless the order ends in pp
    Rule("rank_order_moe", ENGINE_RULE,
         lambda m, cl, tr, l: (l.rank_order == RankOrder.PP_INNER) & (l.pp > 1) & (m.experts > 1)
                              & (expert_dp(tr, l) != l.dp),
         lambda m, cl, tr: "--rank-order: tp-cp-pp-dp with a pipeline needs the experts' data-parallel size equal "
                           "to --dp (megatron-core: --etp x --ep = --tp x --cp)"),
    Rule("engine_zero", ENGINE_RULE, lambda m, cl, tr, l: ~among(l.zero, tr.engine.zero_stages),
         lambda m, cl, tr: f"--zero: --engine {tr.engine.name} takes --zero {_stages(tr.engine.zero_stages)}"),
)


def violations(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts) -> list:
    """[(rule, bool array of candidates breaking it)] in RULES order."""
    return [(r, np.broadcast_to(np.asarray(r.broken(model, cluster, training, lay), dtype=bool), lay.shape))
            for r in RULES]


def first_violation(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts) -> tuple:
    """(index into `groups` of the first rule each candidate breaks, -1 if valid; groups). A rule is
    judged on the candidates no earlier rule broke: once half of them are out, on those left only."""
    groups = sorted({r.group for r in RULES})
    reason = np.full(lay.size, -1, dtype=np.int64)
    index, left, open_ = np.arange(lay.size), lay, np.ones(lay.size, dtype=bool)
    for rule in RULES:
        broken = np.broadcast_to(np.asarray(rule.broken(model, cluster, training, left), dtype=bool), left.shape)
        broken = broken.ravel() & open_
        if not broken.any():
            continue
        reason[index[broken]] = groups.index(rule.group)
        open_ &= ~broken
        if np.count_nonzero(open_) < 0.5 * open_.size:
            index, left, open_ = index[open_], left.take(open_), np.ones(np.count_nonzero(open_), dtype=bool)
    return reason.reshape(lay.shape), groups


def check_single(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts) -> None:
    """Raise InputError naming the flag of the first rule a one-layout `lay` breaks."""
    assert lay.size == 1
    for rule, mask in violations(model, cluster, training, lay):
        if mask.any():
            raise InputError(rule.message(model, cluster, training))
