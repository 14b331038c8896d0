"""FSDP2's buffer model (torch 2.13 fully_shard): the unsharded units a rank holds while they are
gathered, in forward and backward, and under torchtitan's pipeline the stages' edge units.
planner/memory.py assembles them."""

from __future__ import annotations

import numpy as np

from planner.engines import Modules
from planner.layout import Layouts, Training
from planner.model import ModelSpec

from planner.sharding import block_params, rank_params, state_bytes

from planner.held import deferred_reduction, gathered_param_bytes
from planner.stage import Stage


def fsdp_unsharded_unit_bytes(s: Stage, moment: str = "peak") -> np.ndarray:
    """What FSDP2 (torch 2.13 fully_shard, one unit per block, and the root unit where fully_shard(model)
    keeps a Hugging Face model's embedding, final norm and output layer) holds beyond the model states:
    unsharded parameters, flat all-gather outputs, autograd's unsharded gradients and the
    reduce-scatter buffers, at the largest instant of `moment`: 'forward', 'backward' (autograd
    running), 'peak' (the larger: what engine_buffers books beside the activations) or 'reduction'
    (the root unit's post_backward in the final callback, after autograd: reduction_copy_bytes). Each
    is the exact peak measured on 2 gloo ranks, buffer by buffer (tests/test_fsdp_transients_real.py,
    3 blocks: the middle one shows the steady state; with 2 blocks the backward measured 566,656 B of
    the 658,944 this books). --zero 2 (reshard_after_forward False): what exceeds every unit gathered,
    which weight_bytes books for the whole step. None for --zero 0 and where a pipeline keeps the
    stage gathered (not measured). torchtitan (0.3.0 distributed/fsdp.py apply_fsdp_to_decoder,
    untied) wraps the embedding and [norm, lm_head] as units of their own, the latter not resharded
    after forward, its root holding nothing, and runs lm_head chunk by chunk in its loss
    (components/loss.py ChunkedLossWrapper), each chunk's backward at once: the exact peaks of its
    own model, wrapping and loss on 2 gloo ranks (python -m calibrate.engines.torchtitan_fsdp ->
    data/references/torchtitan_fsdp_cpu.json), tied ([embedding, norm, lm_head] one unit, kept
    gathered like a Hugging Face root) and untied."""
    model, training, lay, stage = s
    sums, t = model.sums, lay.tp
    w = gathered_param_bytes(model, training)  # torch 2.13 _fsdp_api.py MixedPrecisionPolicy.param_dtype (unsharded)
    # torch 2.13 _fsdp_param.py unsharded_grad_data: autograd's gradient, in the parameter's 16-bit dtype
    # (a float8-gathered weight's gradient too: torchao's float8 matmul returns it in high precision)
    g = gathered_param_bytes(model, training, fp8_gather=False)
    r = state_bytes(training).grads  # torch 2.13 _fsdp_api.py MixedPrecisionPolicy.reduce_dtype (fp32, as torchtitan)
    shards = lay.zero_ranks
    block = block_params(model, training, lay)
    dense, expert = rank_params(s)
    rank = dense + expert
    hf_root = training.engine.modules is Modules.HUGGING_FACE
    titan = training.engine.modules is Modules.TORCHTITAN
    tied = sums.tied & (lay.pp == 1)
    # the unit holding the model's edges for the whole step: a Hugging Face model's root (torch 2.13
    # _fully_shard.py fully_shard(model): what no block unit took), or torchtitan's tied [embedding, norm,
    # lm_head] (0.3.0 distributed/fsdp.py apply_fsdp_to_decoder, enable_weight_tying: not resharded after
    # forward)
    held = hf_root | (titan & tied)
    root = held * (sums.first_split / t + sums.first_replicated + sums.last_replicated + np.where(tied, 0, sums.output / t))
    # torch 2.13 _fsdp_state.py _root_post_backward_final_callback: the unit's first gradients stay to the
    # end: the final norm and the output layer (tied: the embedding, by reading, autograd's InputBuffer, not
    # measured); torchtitan's tied unit, whose output gradient its loss reduced already: the final norm
    root_out = held * (sums.last_replicated + hf_root * np.where(tied, sums.first_split, sums.output) / t)
    # torch 2.13 _fsdp_collectives.py foreach_reduce: its loop variable keeps the unit's last unsharded
    # gradient (the output layer, registered last; the final norm when tied) until it returns
    root_last = held * np.where(tied, sums.last_replicated, sums.output / t)
    # forward, torch 2.13 _fsdp_param_group.py wait_for_unshard: the previous unit's all-gather output
    # lives until this unit's copy-out is done (prev_all_gather_state), the root unit gathered for the
    # whole forward; the first block's copy-out (beside the root's all-gather output) or a later block's
    fwd = w * np.maximum(2 * (root + block), root + 3 * block)
    # backward, torch 2.13 _fsdp_param_group.py post_backward: at a middle block's, the root unit and its
    # first gradients, the block's parameters and gradients, the next block prefetched (_backward_prefetch)
    # and the previous unit's reduce_scatter_input (_fsdp_collectives.py foreach_reduce; kept in
    # comm_ctx.reduce_scatter_states until this unit's post_backward)
    bwd = w * root + g * root_out + (2 * w + g + r) * block
    # torch 2.13 _fsdp_state.py _root_post_backward_final_callback, the root's post_backward: first its
    # gathered parameters, all its gradients and the last block's reduce_scatter_input; then
    # (_fsdp_collectives.py foreach_reduce) its reduce_scatter_input in reduce_dtype beside its gradients,
    # or beside its reduce_output and the last gradient
    red = np.maximum(w * root + g * root + r * block,
                     r * root + np.maximum(g * root, r * root / shards + g * root_last))
    red = np.where(held, red, 0.0)
    # --zero 2, torch 2.13 _fsdp_param_group.py reshard (after backward only), beyond every unit gathered:
    # forward, the last two blocks' all-gather outputs (or the first block's copy-out beside the root's
    # all-gather output); backward, a block's gradients beside the root's first ones and the previous
    # block's reduce_scatter_input, that block resharded (g B = w B); the reduction, only the root gathered
    fwd2 = w * np.maximum(2 * block, 2 * (root + block) - rank)
    bwd2 = g * root_out + r * block
    if titan:
        fwd, bwd, red, fwd2, bwd2 = torchtitan_edge_unit_bytes(model, training, lay, block, rank,
                                                               (fwd, bwd, red, fwd2, bwd2))
    red2 = np.maximum(0.0, red - w * rank)
    zero3 = lay.zero >= 3
    by_moment = {"forward": np.where(zero3, fwd, fwd2), "backward": np.where(zero3, bwd, bwd2),
                 "reduction": np.where(zero3, red, red2)}
    by_moment["peak"] = np.maximum(by_moment["forward"], by_moment["backward"])
    on = (lay.zero >= 2) & ~deferred_reduction(training, lay)
    return np.where(on, np.ceil(by_moment[moment]), 0.0)


def torchtitan_edge_unit_bytes(model: ModelSpec, training: Training, lay: Layouts, block, rank, held: tuple) -> tuple:
    """(forward, backward, reduction, forward beyond every unit gathered, backward beyond it) of
    fsdp_unsharded_unit_bytes under torchtitan 0.3.0's wrapping and chunked loss, bytes: untied, the
    embedding E and [norm, lm_head] Hd units (lm = lm_head's elements); tied, the `held` moments of
    its one [embedding, norm, lm_head] unit X, kept gathered like a Hugging Face root, with the loss's;
    blocks B, the rank's P. Each the exact peak of torchtitan's Llama3Model on 2 gloo ranks
    (calibrate/engines/torchtitan_fsdp.py)."""
    s, t = model.sums, lay.tp
    w, g, r = training.precision.element_bytes, training.precision.element_bytes, state_bytes(training).grads
    tied = s.tied & (lay.pp == 1)
    fwd_held, bwd_held, red_held, fwd2_held, bwd2_held = held
    E, lm = s.first_split / t + s.first_replicated, np.where(tied, s.first_split, s.output) / t
    head = np.where(tied, E + s.last_replicated, s.last_replicated + lm)  # the unit lm_head is in
    # the chunks before the last accumulate lm_head's gradient in reduce_dtype while sync is off (torch 2.13
    # _fsdp_param.py to_accumulated_grad_if_needed); foreach_reduce's loop variable keeps it to the end
    acc = np.where(training.loss_chunks > 1, r, g)
    # ChunkedLossWrapper's last chunk: lm_head kept gathered, its accumulated gradient, its reduce_scatter
    # input and output (_fsdp_collectives.py foreach_reduce); then lm_head.reshard(), and in the decoder's
    # backward its unit gathered again for the norm (all-gather output and parameters) beside lm_head's
    # reduce_scatter_input (comm_ctx.reduce_scatter_states)
    loss = w * head + (acc + r + r / lay.zero_ranks) * lm
    regather = r * lm + 2 * w * head
    # untied, forward (torch 2.13 _fsdp_param_group.py wait_for_unshard): each unit's copy-out beside the
    # previous unit's all-gather output (the embedding's; a block's; [norm, lm_head]'s at the final norm)
    fwd = w * np.maximum(np.maximum(2 * E, E + 2 * block), np.maximum(3 * block, block + 2 * head))
    # untied, backward: a middle block as FSDP2's with no root; block 0 with the embedding prefetched
    bwd = np.maximum((2 * w + g + r) * block, w * E + (w + g + r) * block)
    # untied, the final callback: the embedding unit's post_backward (its input needs no gradient)
    red = np.maximum(w * E + g * E + r * block, r * E + g * E + r * E / lay.zero_ranks)
    # reshard_after_forward_policy "never" (--zero 2), untied, beyond every unit gathered: forward, the last
    # block's copy-out before [norm, lm_head] is gathered or [norm, lm_head]'s own; backward, a block's
    # gradients with [norm, lm_head] (resharded by the loss) and the previous block resharded beside that
    # block's reduce_scatter_input
    fwd2 = np.maximum(w * np.maximum(2 * E, 2 * (E + block)) - w * rank,
                      w * np.maximum(2 * block - head, block + head))
    bwd2 = (g + r - w) * block - w * head
    return (np.where(tied, fwd_held, fwd), np.maximum(np.maximum(loss, regather), np.where(tied, bwd_held, bwd)),
            np.where(tied, red_held, red), np.where(tied, fwd2_held, fwd2),
            np.maximum(np.maximum(loss, regather) - w * head, np.where(tied, bwd2_held, bwd2)))
