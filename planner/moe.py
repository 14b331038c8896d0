"""Mixture-of-experts routing under an expert capacity: how many expert rows ((token, expert)
pairs, padding included) each token of a micro-batch costs the routed experts.

Dropless routing (transformers' sparse MoE blocks, torchtitan, Megatron-core by default) costs k
rows per token, top-k. With a capacity factor C each expert takes at most `expert_capacity`
tokens from each rank's micro-batch: padded to it (DeepSpeed-MoE always, Megatron-core with
--moe-pad-expert-input-to-capacity) every expert runs exactly its capacity whatever the routing,
E x capacity rows in all, about k C per token; unpadded (Megatron-core alone), the tokens past an
expert's capacity skip it, so on average no more rows than dropless: min(k, E capacity / T).
The factor scales what the planner counts per routed row: expert GEMMs (planner/compute.py), the
routed experts' saved activations (planner/activations.py) and the EP all-to-all
(planner/timing.py ep_all_to_all_s). Model FLOPs (MFU) keep the k useful rows.
"""

from __future__ import annotations

import numpy as np

from planner.engines import Modules, MoeCapacity

DEEPSPEED_MOE_CAPACITY_FACTOR = 1.0  # DeepSpeed 0.19.8 moe/layer.py MoE.__init__ capacity_factor=1.0
DEEPSPEED_MOE_MIN_CAPACITY = 4  # DeepSpeed 0.19.8 moe/layer.py MoE.__init__ min_capacity=4


def capacity_settings(training) -> tuple:
    """(capacity factor or None for dropless, padded to capacity, minimum capacity, the float type
    the capacity is computed in) of the engine's MoE layer with the user's --moe-capacity-factor
    and --moe-pad-to-capacity."""
    kind, factor = training.engine.moe_capacity, training.moe_capacity_factor
    if kind is MoeCapacity.DEEPSPEED_MOE:  # DeepSpeed 0.19.8 moe/sharded_moe.py MOELayer: always [E, capacity, M]
        factor = DEEPSPEED_MOE_CAPACITY_FACTOR if factor is None else factor
        return factor, True, DEEPSPEED_MOE_MIN_CAPACITY, np.float32  # _capacity: torch.tensor(C * k), float32
    if kind is MoeCapacity.MEGATRON:  # megatron-core 0.16.1 moe_utils.py get_capacity: Python floats, no minimum
        return factor, bool(training.moe_pad_to_capacity), 0, np.float64
    return None, False, 0, np.float64


def expert_capacity(tokens, experts: int, k: int, capacity_factor: float, min_capacity: int = 0, dtype=np.float64):
    """Tokens each expert takes from one rank's `tokens` routed tokens. DeepSpeed 0.19.8
    moe/sharded_moe.py _capacity, which top2gating/topkgating call with capacity_factor * k
    (top1gating with k = 1), in float32 (`dtype`: its capacity_factor is a float32 tensor);
    megatron-core 0.16.1 moe_utils.py get_capacity(num_tokens * topk, E, C) is the same ceil
    without a minimum, in float64 (its ((S k) / E) C may round across an integer where this
    (S / E)(C k) does not: one token, at exact ties only)."""
    # DeepSpeed 0.19.8 moe/sharded_moe.py _capacity: max(ceil(S / E * (C k)), min_capacity)
    share = (np.asarray(tokens, dtype=np.float64) / experts).astype(dtype)
    return np.maximum(np.ceil(share * dtype(capacity_factor * k)), min_capacity).astype(np.float64)


def routed_per_token(model, training, lay, tokens) -> np.ndarray:
    """Expert rows per token of one rank's micro-batch of `tokens` tokens (1 for a dense MLP): k
    dropless; E capacity / T padded to capacity; min(k, E capacity / T) dropping unpadded. T is
    what one rank's router sees: the micro-batch, split over TP under sequence parallelism
    (megatron-core 0.16.1 moe/moe_layer.py MoELayer.forward routes the [s/tp, b, h] shard, and
    needs SP with TP in training; the dispatcher gathers the tp shards' capacities and each expert
    GEMM splits over expert TP, which model_parallel_config.py defaults to tp: a rank's expert work
    is E capacity rows-worth either way)."""
    factor, padded, minimum, dtype = capacity_settings(training)
    k = float(model.experts_per_token)
    if model.architecture == "llama4" and training.engine.modules is Modules.HUGGING_FACE and model.experts > 1:
        # transformers 5.25 Llama4TextMoe.forward: hidden_states.repeat(E, 1) scaled by the router's
        # sigmoid scores (0 for the unchosen), then Llama4TextExperts' bmm over all E experts: every
        # token runs through every expert (measured: tests/test_activations_llama4.py)
        return float(model.experts)
    if model.experts == 1 or factor is None:  # a scalar: dense and dropless layouts cost no array work here
        return k
    router_tokens = tokens / np.where(lay.sequence_parallel > 0, lay.tp, 1).astype(np.float64)
    rows = model.experts * expert_capacity(router_tokens, model.experts, model.experts_per_token, factor, minimum,
                                           dtype)
    # megatron-core 0.16.1 moe_utils.py apply_router_token_dropping: unpadded keeps routing_map AND capacity_mask
    return rows / router_tokens if padded else np.minimum(rows / router_tokens, k)
