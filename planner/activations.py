"""Activation memory: what each recompute policy, pipeline stage and the output layer keep of the
saved-tensor list of a block (planner/saved/: each module implementation's own list).

After Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models")
section 4, generalized tensor by tensor to GQA, SwiGLU, RMSNorm, MoE and FlashAttention; with
GeLU 4h MLP, multi-head attention and dropout the Megatron list sums to their Table 2 exactly:
sbh(34 + 5as/h) unsplit, sbh(10 + 24/t + 5as/(ht)) with TP, sbh(34/t + 5as/(ht)) with SP.
"""

from __future__ import annotations

import numpy as np

from planner import fp8
from planner.engines import Buffers, Modules, SelectivePolicy
from planner.layout import Layouts, Training
from planner.model import ModelSpec
from planner.moe import routed_per_token
from planner.options import Fp8Recipe, Recompute, RecomputeMethod
from planner.pipeline import blocks_on_stage, microbatches_in_flight, p2p_buffers
from planner.sharding import expert_tp
from planner.saved import saved_tensors
from planner.saved.base import ROWS, SP, TP, WHOLE
from planner.saved.hf_gpt import hf_layer_norm_saved
from planner.saved.hf_llama import hf_rms_norm_saved
from planner.saved.torchtitan import torchtitan_topk_saved
from planner.stage import Stage


def layer_bytes(model: ModelSpec, training: Training, lay: Layouts) -> tuple:
    """(every saved tensor, without what selective recompute drops, the block input alone) bytes of
    one block for one micro-batch on one rank: what no, selective and full recompute keep. Selective
    drops the attention core's internals (Korthikanti 2022 section 5), and under Megatron what else
    Training.recompute_modules lists (Saved.dropped_by)."""
    t = lay.tp.astype(np.float64)
    s = training.seq_len / lay.cp  # context parallelism splits the sequence
    tokens = s * lay.mbs
    sp = np.where(lay.sequence_parallel > 0, t, 1.0)
    rows_split = t / expert_tp(training, lay)
    whole, stored = 0.0, 0.0
    modules = set(training.recompute_modules)
    fp8_input = {"": 1.0, "own": fp8.saved_input_scale(training, False), "shared": fp8.saved_input_scale(training, True)}
    for x in saved_tensors(model, training, s, routed_per_token(model, training, lay, tokens), lay.mbs):
        part = tokens * x.bytes_per_token / {TP: t, SP: sp, WHOLE: 1.0, ROWS: rows_split}[x.split] * fp8_input[x.gemm_input]
        whole = whole + part
        dropped = (x.core and "core_attn" in modules) or not modules.isdisjoint(x.dropped_by)
        stored = stored + (0.0 if dropped else part)
    whole = whole + cp_gathered_kv_bytes(model, training, lay)
    return whole, stored, boundary_bytes(model, training, lay) / checkpoint_partitions(training, lay)


def cp_gathered_kv_bytes(model: ModelSpec, training: Training, lay: Layouts) -> np.ndarray:
    """Where the engine all-gathers K and V over the CP ranks (Engine.cp_gathers_kv), the attention
    keeps them whole for backward: cp - 1 more sequence chunks of K and V than its own, one
    micro-batch on one rank (FlexAttention saves its key and value inputs; counted on 2 gloo ranks
    in tests/test_torch_cp_real.py). 0 elsewhere, and under selective or full recompute, where the
    gather reruns in backward instead (kept_per_layer keeps no attention input)."""
    if not training.engine.cp_gathers_kv:
        return 0.0 * lay.tp
    tokens = training.seq_len / lay.cp * lay.mbs
    return tokens * (lay.cp - 1) * training.precision.element_bytes * (model.kv_width + model.v_width) / lay.tp


def boundary_bytes(model: ModelSpec, training: Training, lay: Layouts) -> np.ndarray:
    """One micro-batch's hidden states on one rank (split by t under SP): a block's input, all full
    recompute keeps of it, and what a pipeline stage sends to the next."""
    tokens = training.seq_len / lay.cp * lay.mbs
    return tokens * training.precision.element_bytes * model.hidden / np.where(lay.sequence_parallel > 0, lay.tp, 1.0)


def checkpoint_partitions(training: Training, lay: Layouts) -> np.ndarray:
    """Parts a checkpointed layer input is split into: t where deepspeed.checkpointing partitions
    activations (DeepSpeed 0.19 runtime/activation_checkpointing/checkpointing.py
    partition_activations: each rank keeps numel / mp_size of the input, gathered back in
    backward), else 1."""
    zc = training.zero_config
    return np.where(training.engine.deepspeed_checkpointing and zc.partition_activations, lay.tp, 1).astype(np.float64)


def offloads_checkpoints(engine) -> bool:
    """Whether the engine can keep checkpointed inputs on the host (--cpu-checkpointing):
    deepspeed.checkpointing's cpu_checkpointing (checkpointing.py partition_activations /
    get_cpu_activations_for_backward, buffer_device 'cpu'); on Hugging Face modules transformers 5.25
    activation_checkpointing_enable(offload=True): torch.autograd.graph.save_on_cpu(pin_memory=True)
    around each checkpoint, whose non-reentrant frame saves the layer's inputs through
    _NoopSaveInputs in the outer graph, where those hooks move them."""
    return engine.deepspeed_checkpointing or engine.modules is Modules.HUGGING_FACE


def checkpoints_on_host(training: Training) -> bool:
    """--cpu-checkpointing: the checkpointed inputs are copied to the host in forward and back in
    backward (offloads_checkpoints)."""
    return offloads_checkpoints(training.engine) and training.zero_config.cpu_checkpointing


def checkpoint_copies_block(training: Training, lay: Layouts) -> np.ndarray:
    """Whether the host copies of checkpointed inputs hold up the compute stream: deepspeed.checkpointing
    copies partitioned inputs synchronously (over t > 1 ranks, as the planner exports it; unpartitioned
    ones go through an asynchronous side-stream engine, _get_cpu_offload_engine); save_on_cpu copies on
    the current stream (torch/autograd/graph.py pack_to_cpu copy_ and unpack_from_cpu .to, non_blocking
    to and from pinned memory, ordered with the kernels around them). Hugging Face modules on one stage
    take transformers' save_on_cpu; DeepSpeed's pipeline of them checkpoints through deepspeed.checkpointing
    (pipe/module.py PipelineModule activation_checkpoint_func=checkpointing.checkpoint)."""
    transformers_offload = (training.engine.modules is Modules.HUGGING_FACE) & (lay.pp == 1)
    return checkpoints_on_host(training) & ((checkpoint_partitions(training, lay) > 1) | transformers_offload)


def op_sac_matmuls(model: ModelSpec) -> list[tuple]:
    """(name, input width, output width, output split over TP, kept) of a torchtitan block's matmuls
    in the order they run, widths per token: torchtitan 0.3.0 models/llama3 fuses wq, wk and wv
    (fuse_qkv=True), then wo, w1, w3, w2; SelectiveAC (distributed/activation_checkpoint.py) counts
    the aten.mm calls and recomputes every second one (mm_count % 2 == 0), so wqkv, w1 and w2 keep
    their outputs. A row-parallel output (wo, w2) is a partial sum, whole on every TP rank.
    MoE blocks (models/common/moe.py MoE): the router gate's mm is forced to recompute
    (force_recompute_mm_shapes_by_fqns ['moe.router.gate']) without counting; the routed experts'
    torch._grouped_mm is neither an mm nor on the save list (the partitioner's
    compute_intensive_ops), so all three recompute, uncounted, each a token's k rows; the shared
    experts' w1, w3, w2 count on from wo: w1 and w2 keep.
    MLA (models/deepseek_v3/model.py Attention.forward, DeepSeek-V3's dense-first and MoE blocks):
    wq, or wq_a and wq_b, then wkv_a, wkv_b, wo, each an mm that counts, so the MLP's parity follows
    the query path: with wq, wq, wkv_b, w1, w2 (or shared w1, w2) keep; with wq_a, wq_a, wkv_a, wo,
    w3 (or shared w3) keep. The down projections are replicated over TP (deepseek_v3/sharding.py):
    wq_a's and wkv_a's outputs are whole on every rank."""
    h, q, kv, f, k = model.hidden, model.q_width, model.kv_width, model.ffn, model.experts_per_token
    if model.kv_lora_rank:
        r, c, dr = model.q_lora_rank, model.kv_lora_rank, model.qk_rope_head_dim
        dn, dv = model.dim_per_head - dr, model.v_head_dim or model.dim_per_head
        run = [("wq_a", h, r, False, True), ("wq_b", r, q, True, True)] if r else [("wq", h, q, True, True)]
        run += [("wkv_a", h, c + dr, False, True), ("wkv_b", c, model.heads * (dn + dv), True, True),
                ("wo", model.attention_out_width, h, False, True)]
    else:
        run = [("wqkv", h, q + 2 * kv, True, True), ("wo", q, h, False, True)]
    if model.experts == 1:
        w = model.mlp_width_per_token
        run += [("w1", h, w, True, True), ("w3", h, w, True, True), ("w2", w, h, False, True)]
    else:
        fs = model.shared_expert_ffn
        run += [("router gate", h, model.experts, False, False), ("experts w1 (grouped_mm)", h, k * f, True, False),
                ("experts w3 (grouped_mm)", h, k * f, True, False), ("experts w2 (grouped_mm)", k * f, h, False, False)]
        if fs:
            run += [("shared w1", h, fs, True, True), ("shared w3", h, fs, True, True),
                    ("shared w2", fs, h, False, True)]
    out, counted = [], 0
    for name, n_in, n_out, split, counts in run:
        counted += counts
        out.append((name, n_in, n_out, split, counts and counted % 2 == 1))
    return out


def op_sac_bytes(model: ModelSpec, training: Training, lay: Layouts) -> np.ndarray:
    """What torchtitan's op-level selective checkpointing keeps of one block per micro-batch: the
    checkpointed block's input, the kept matmul outputs (op_sac_matmuls), FlexAttention's outputs
    (the flex_attention op is on the save list: out, and the fp32 logsumexp and max_scores per
    head), in an MoE block torch.topk's values and indices (on the save list: torchtitan_topk_saved)
    and, with SP, the two reduce-scatters' outputs. Equals the bytes torchtitan 0.3.0's own
    Llama3Model, Qwen3 MoE model and DeepSeekV3Model (MLA) leave allocated per block (python -m
    calibrate.engines.torchtitan_sac, calibrate.engines.torchtitan_moe, calibrate.engines.torchtitan_mla;
    tests/test_activations_real.py, tests/test_activations_torchtitan_moe.py,
    tests/test_activations_torchtitan_mla.py). torchao's float8 linears change none of it (their
    autograd function saves the 16-bit input, and the policy sees their matmul as aten.mm) but
    for tensorwise scaling's amax scalars on the save list (aten.max: TORCHAO_TENSORWISE_AMAX_BYTES;
    python -m calibrate.engines.torchtitan_float8)."""
    e, t = training.precision.element_bytes, lay.tp.astype(np.float64)
    sp = np.where(lay.sequence_parallel > 0, t, 1.0)
    tokens = training.seq_len / lay.cp * lay.mbs
    h, o, a = model.hidden, model.attention_out_width, model.heads  # o: the flex output's width (MLA: a dv)
    per_token = e * h / sp + e * o / t + 8.0 * a / t + (sp > 1) * 2 * e * h / t
    for _, _, width, split, kept in op_sac_matmuls(model):
        per_token = per_token + kept * e * width / (t if split else 1.0)
    if model.experts > 1:
        per_token = per_token + sum(x.bytes_per_token for x in torchtitan_topk_saved(model))
    tensorwise = fp8.library(training) == fp8.TORCHAO and training.fp8_recipe is Fp8Recipe.TENSORWISE
    amax = tensorwise * TORCHAO_TENSORWISE_AMAX_BYTES * sum("grouped_mm" not in x[0] for x in op_sac_matmuls(model))
    return tokens * per_token + amax


TORCHAO_TENSORWISE_AMAX_BYTES = 4.0
"""What SelectiveAC keeps of each torchao tensorwise float8 linear beyond its 16-bit self: fp32 amax
scalars of its casts (torchao 0.18 float8/float8_utils.py tensor_to_amax: torch.max(torch.abs(x)), an
aten.max that torchtitan 0.3.0's _get_default_save_ops marks MUST_SAVE: 'always save the absolute
maximum used to compute the scaling factor'; rowwise takes torch.amax, not on the list). Measured on
torchtitan's own block: 20 B a Llama block of 5 linears (data/references/torchtitan_float8_cpu.json)."""


def kept_per_layer(model: ModelSpec, training: Training, lay: Layouts, recompute=None) -> np.ndarray:
    """Bytes one block keeps for backward per micro-batch under the layout's recompute policy
    (what 'selective' keeps is the engine's policy)."""
    recompute = lay.recompute if recompute is None else recompute
    whole, stored, layer_input = layer_bytes(model, training, lay)
    if training.engine.selective_policy is SelectivePolicy.OP_SAC:
        stored = op_sac_bytes(model, training, lay)
    return np.select([recompute == Recompute.NONE, recompute == Recompute.SELECTIVE], [whole, stored], layer_input)


def recomputed_layers(lay: Layouts, n_layers, chunks) -> np.ndarray:
    """Of `n_layers` in `chunks` model chunks, those run under full recompute: every one, or with
    the block method the first recompute_layers of each chunk (megatron-core 0.16.1
    transformer/transformer_block.py TransformerBlock._checkpointed_forward: each TransformerBlock
    is one pipeline stage's chunk); none under the other policies."""
    block = (lay.recompute_layers > 0) & (lay.recompute_method == RecomputeMethod.BLOCK)
    some = np.minimum(lay.recompute_layers * chunks, n_layers)
    return np.where(lay.recompute == Recompute.FULL, np.where(block, some, n_layers), 0)


def checkpoints(lay: Layouts, n_layers, chunks) -> np.ndarray:
    """Checkpointed inputs `n_layers` blocks in `chunks` model chunks keep under full recompute:
    one per recomputed layer, or with the uniform method one per group of recompute_layers layers
    of a chunk (_checkpointed_forward 'uniform': checkpoint_handler(custom(l, l + N)) from l = 0
    in steps of N, the last group possibly shorter)."""
    uniform = (lay.recompute_layers > 0) & (lay.recompute_method == RecomputeMethod.UNIFORM)
    per_chunk = np.ceil(n_layers / np.maximum(chunks, 1))
    groups = chunks * np.ceil(per_chunk / np.maximum(lay.recompute_layers, 1))
    return np.where(uniform & (lay.recompute == Recompute.FULL), groups, recomputed_layers(lay, n_layers, chunks))


def kept_bytes(model: ModelSpec, training: Training, lay: Layouts, n_layers) -> np.ndarray:
    """What `n_layers` blocks of a stage keep for backward per micro-batch: each what the policy
    keeps, except the layers that full recompute skips under --recompute-layers, which keep all."""
    whole = layer_bytes(model, training, lay)[0]
    full = lay.recompute == Recompute.FULL
    policy_layers = np.where(full, recomputed_layers(lay, n_layers, lay.vpp), n_layers)
    kept = np.where(full, checkpoints(lay, n_layers, lay.vpp), policy_layers)  # one input per checkpoint
    return kept * kept_per_layer(model, training, lay) + (n_layers - policy_layers) * whole \
        - host_checkpoint_bytes(model, training, lay, n_layers)


def host_checkpoint_bytes(model: ModelSpec, training: Training, lay: Layouts, n_layers) -> np.ndarray:
    """The checkpointed layer inputs of `n_layers` blocks that wait in host memory instead
    (checkpoints_on_host), per micro-batch."""
    if not checkpoints_on_host(training):
        return 0.0 * lay.tp
    return checkpoints(lay, n_layers, lay.vpp) * layer_bytes(model, training, lay)[2]


def recompute_working_bytes(model: ModelSpec, training: Training, lay: Layouts) -> np.ndarray:
    """Recomputation in backward materialises, for one checkpoint and micro-batch at a time, what it
    dropped: the whole block under full recompute (recompute_layers blocks at once with the uniform
    method: the group's forward reruns before its backward), what selective recompute did not keep."""
    whole = layer_bytes(model, training, lay)[0]
    selective = whole - kept_per_layer(model, training, lay, Recompute.SELECTIVE + 0 * lay.recompute)
    uniform = (lay.recompute_layers > 0) & (lay.recompute_method == RecomputeMethod.UNIFORM)
    group = np.where(uniform, lay.recompute_layers, 1)
    return np.select([lay.recompute == Recompute.FULL, lay.recompute == Recompute.SELECTIVE],
                     [group * whole, np.maximum(selective, 0.0)], 0.0)


def embedding_dropout_bytes(s: Stage) -> np.ndarray:
    """First stage: the embedding dropout's 1-byte mask per in-flight micro-batch (Korthikanti
    section 4.3)."""
    model, training, lay, stage = s
    if not model.dropout:
        return 0.0 * lay.tp
    tokens = training.seq_len / lay.cp * lay.mbs
    sp = np.where(lay.sequence_parallel > 0, lay.tp, 1.0)
    in_flight = microbatches_in_flight(lay.pp, lay.vpp, lay.gas, lay.schedule, stage)
    return (stage == 0) * tokens * model.hidden / sp * np.ceil(in_flight)


def head_input_bytes(s: Stage) -> np.ndarray:
    """Last stage: the final norm's saved tensors and the output layer's input, one micro-batch
    (Korthikanti section 4.3: the output layer's activations are kept for the micro-batch in its
    backward; a Hugging Face model's final LlamaRMSNorm keeps what its blocks' norms keep)."""
    model, training, lay, stage = s
    tokens = training.seq_len / lay.cp * lay.mbs
    sp = np.where(lay.sequence_parallel > 0, lay.tp, 1.0)
    e, h = training.precision.element_bytes, model.hidden
    if training.engine.modules is Modules.HUGGING_FACE and model.architecture in ("llama", "deepseek_v3", "llama4"):
        # LlamaRMSNorm, DeepseekV3RMSNorm, Llama4TextRMSNorm: the same eager norm
        per_token = sum(x.bytes_per_token for x in hf_rms_norm_saved(e, h, "final")) + e * h
    elif training.engine.modules is Modules.HUGGING_FACE and model.architecture in ("gpt2", "gpt_neox"):
        # GPT2Model ln_f / GPTNeoXModel final_layer_norm (nn.LayerNorm) and lm_head's input (transformers 5)
        per_token = sum(x.bytes_per_token for x in hf_layer_norm_saved(e, h, "final norm")) + e * h
    else:
        per_token = 2 * e * h
    # each MTP depth (ModelSpec.mtp_layers): its enorm and hnorm inputs, eh_proj's 2h input, its final
    # norm's input and the output layer's (megatron-core 0.16.1 multi_token_prediction.py
    # MultiTokenPredictionLayer.forward), its block counted with the stage's blocks
    per_token = per_token + model.mtp_layers * 6 * e * h
    return (stage == lay.pp - 1) * tokens * per_token / sp


def logits_bytes(s: Stage, bytes_per_element: float) -> np.ndarray:
    """Last stage: the vocab-parallel logits of one micro-batch (and of each MTP depth), split by t,
    at `bytes_per_element` per logit (Megatron-core tensor_parallel/cross_entropy.py: 16-bit logits, their fp32 copy and
    the fp32 softmax it saves for backward: 2 + 4 + 4). An engine computing the loss over sequence
    chunks holds one chunk's logits and an fp32 gradient buffer of the hidden states (torchtitan
    components/loss.py ChunkedLossWrapper: GradAccumulator(dtype=torch.float32) of [B, L, D])."""
    model, training, lay, stage = s
    tokens = training.seq_len / lay.cp * lay.mbs
    chunks = training.loss_chunks
    held = bytes_per_element * tokens / chunks * model.vocab / lay.tp
    if chunks > 1:
        held = held + 4.0 * tokens * model.hidden
    # each MTP depth's logits and loss stay for the backward beside the model's own (megatron-core
    # 0.16.1 models/gpt/gpt_model.py _postprocess: process_mtp_loss before the output layer's loss)
    return (stage == lay.pp - 1) * held * (1 + model.mtp_layers)


def stage_host_activation_bytes(s: Stage) -> np.ndarray:
    """Host bytes of one rank of `stage`: its checkpointed inputs in flight under cpu_checkpointing."""
    model, training, lay, stage = s
    in_flight = microbatches_in_flight(lay.pp, lay.vpp, lay.gas, lay.schedule, stage)
    blocks = blocks_on_stage(model, lay, stage, training.pipeline_edge_layers)
    return sum(host_checkpoint_bytes(block, training, lay, n) for block, n in blocks) * in_flight


def stage_activation_bytes(s: Stage) -> np.ndarray:
    """Activation bytes on one rank of `stage` at its backward peak: what each block keeps, times
    its blocks and the micro-batches in flight, the engine's pipeline receive buffers, plus the
    recompute working set of its largest block and the first/last-stage extras. Dense-first and
    routed blocks are each counted as what they are (--recompute-layers then applies to each kind
    apart, an approximation where a stage holds both)."""
    model, training, lay, stage = s
    in_flight = microbatches_in_flight(lay.pp, lay.vpp, lay.gas, lay.schedule, stage)
    blocks = blocks_on_stage(model, lay, stage, training.pipeline_edge_layers)
    kept = sum(kept_bytes(block, training, lay, n) for block, n in blocks) * in_flight
    if training.engine.pipeline_p2p_buffers:
        kept = kept + p2p_buffers(lay.pp, lay.vpp, lay.gas, lay.schedule, stage) * boundary_bytes(model, training, lay)
    pipe = deepspeed_pipe_buffer_bytes(s)
    working = np.max([np.where(n > 0, recompute_working_bytes(block, training, lay), 0.0) for block, n in blocks], axis=0)
    return (kept + pipe["held"] + working + pipe["backward"] + embedding_dropout_bytes(s)
            + head_input_bytes(s))


def deepspeed_pipe_buffer_bytes(s: Stage) -> dict:
    """What DeepSpeed's PipelineEngine (0.19.8 runtime/pipe/engine.py; the pp > 1 engine of deepspeed and
    megatron-deepspeed) keeps of the stage boundary beyond the blocks' saved tensors, one rank of
    `stage`, bytes of boundary_bytes b, m micro-batches in flight (microbatches_in_flight: TrainSchedule,
    num_pipe_buffers = min(stages - stage_id, micro_batches)). Its p2p is partitioned over the TP ranks
    where t > 1 (__init__: is_pipe_partitioned / is_grad_partitioned = is_model_parallel and the ds_config
    pipeline's pipe_partitioned / grad_partitioned, both True by default: runtime/config.py).
    'outputs': _exec_forward_pass stores each stage output with its graph in pipe_buffers['outputs']
    until _exec_backward_pass frees it, every stage but the last (whose output, the logits, logits_bytes
    counts): m b, or with t > 1 the PartitionedTensor's part, m b / t (first_output.data = torch.zeros(1)).
    'inputs': a later stage without partitioning keeps each received tensor (_exec_recv_activations:
    pipe_recv_buf.clone()) in pipe_buffers['inputs'] while the stage runs on a .clone() of it (the
    first block's input, counted with it): m b more; partitioned, part_input.full() replaces it (none).
    'persistent': pipe_recv_buf (later stages) and grad_layer (stages before the last), one b each,
    or each a b / t part. 'backward': with t > 1, a micro-batch's backward restores its output whole
    (output_tensors[buffer_id].data = part_output.full()) and its gradient (part_grad.full()): 2 b.
    'model_outputs': the last stage's _exec_backward_pass returns after backward(loss) without freeing
    pipe_buffers['outputs'][buffer_id], so the model outputs of the last 2 micro-batches (its
    num_pipe_buffers, max(2, min(1, m)); kept across steps: _reserve_pipe_buffers only extends) stay
    beside the next one's loss: min(m, 2) x the logits, vocab-parallel, fp32 under Megatron's modules
    (Megatron-DeepSpeed gpt_model.py GPTModelPipe: the float16_to_fp32 layer ends the pipe; its
    vocab_parallel_cross_entropy works in place, so the tensor held is that fp32 buffer), else 16-bit.
    'held' = outputs + inputs + persistent + model_outputs, beside the blocks; 'backward' beside the
    recompute."""
    model, training, lay, stage = s
    zero = 0.0 * lay.tp
    if training.engine.buffers is not Buffers.DEEPSPEED:
        return {"outputs": zero, "inputs": zero, "persistent": zero, "model_outputs": zero, "held": zero,
                "backward": zero}
    b = boundary_bytes(model, training, lay)
    on = lay.pp > 1
    split = lay.tp > 1  # engine.py __init__: is_pipe_partitioned = is_model_parallel and pipe_partitioned (default True)
    part = np.where(split, lay.tp, 1.0)  # utils.py PartitionedTensor: numel / slice-parallel (TP) group size
    in_flight = microbatches_in_flight(lay.pp, lay.vpp, lay.gas, lay.schedule, stage)
    later, before_last = on & (stage > 0), on & (stage < lay.pp - 1)
    # engine.py _exec_forward_pass: pipe_buffers['outputs'][buffer_id] = outputs (the part where partitioned)
    outputs = np.where(before_last, in_flight * b / part, 0.0)
    # engine.py _exec_recv_activations: recvd = pipe_recv_buf.clone() kept; _exec_forward_pass runs on its .clone()
    inputs = np.where(later & ~split, in_flight * b, 0.0)
    # engine.py: pipe_recv_buf (_exec_recv_activations) and grad_layer (_exec_recv_grads), kept for the run
    persistent = (later * 1.0 + before_last * 1.0) * b / part
    # engine.py _exec_backward_pass: part_output.full() and part_grad.full() of the micro-batch in its backward
    backward = np.where(before_last & split, 2.0 * b, 0.0)
    # Megatron-DeepSpeed gpt_model.py GPTModelPipe: float16_to_fp32 last; else the 16-bit lm_head output
    logit_bytes = 4.0 if training.engine.modules is Modules.MEGATRON else training.precision.element_bytes
    logits = training.seq_len / lay.cp * lay.mbs * model.vocab / lay.tp * logit_bytes
    # engine.py _exec_backward_pass returns early on the last stage: its 2 pipe buffers keep their outputs
    model_outputs = np.where(on & (stage == lay.pp - 1), np.minimum(lay.gas, 2) * logits, 0.0)
    return {"outputs": outputs, "inputs": inputs, "persistent": persistent, "model_outputs": model_outputs,
            "held": outputs + inputs + persistent + model_outputs, "backward": backward}
