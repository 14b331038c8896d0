"""Worker: torchtitan's context parallelism for FlexAttention on 2 gloo ranks (cp = 2): what the
attention keeps for backward on each rank.

torchtitan 0.3.0 (distributed/context_parallel/api.py apply_cp_to_forward, FlexAttention branch)
wraps each attention module's forward: k and v made contiguous, all-gathered along the sequence
over the CP group with torch's flex_cp_allgather (torch 2.13 distributed/tensor/experimental/
_context_parallel/_cp_custom_ops.py: two blocking all_gather_single calls; backward reduce-scatters
their gradients), then FlexAttention runs the local queries against the whole K and V. This worker
calls the same torch op and flex_attention (eagerly: torchtitan compiles it; both save the same
tensors, calibrate/engines/torchtitan_sac.py) on the local q, k, v of a [b, heads, s/cp, d] shard, and
counts by storage what one forward saves (calibrate.benches.saved.counting; the local q, k, v leaves are
excluded, as the projections that make them keep their own inputs). Forward only: the CPU has no
FlexAttention backward (its refusal is lifted for the forward, as calibrate/engines/torchtitan_sac.py does).
Usage: python -m torch.distributed.run --nproc_per_node 2 -m calibrate.engines.torch_cp_worker \
    '{"shapes": [[1, 4, 2, 64, 32]]}'   # batch, heads, kv heads, local tokens, head dim
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

from calibrate.benches.saved import counting
from calibrate.harness.worker_io import write_result


def measure(shape) -> dict:
    import torch.nn.attention.flex_attention as fa
    from torch.distributed.tensor.experimental._context_parallel._cp_custom_ops import flex_cp_allgather

    batch, heads, kv_heads, local, head_dim = shape
    group = dist._get_process_group_name(dist.group.WORLD)
    fa._validate_device = lambda *args, **kwargs: None  # forward only: nothing here runs backward
    q = torch.randn(batch, heads, local, head_dim, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(batch, kv_heads, local, head_dim, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(batch, kv_heads, local, head_dim, dtype=torch.bfloat16, requires_grad=True)
    with counting([q, k, v]) as counter:
        whole_k, whole_v = flex_cp_allgather(k.contiguous(), v.contiguous(), 2, group)
        out = fa.flex_attention(q, whole_k, whole_v, enable_gqa=kv_heads != heads)
    table = [list(x) for x in counter.table()]
    return {"shape": list(shape), "rank": dist.get_rank(), "cp": dist.get_world_size(),
            "saved_bytes": counter.total_bytes, "table": table, "out_shape": list(out.shape),
            "gathered_k_shape": list(whole_k.shape)}


def main(cfg: dict) -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    write_result({"rank": dist.get_rank(), "runs": [measure(tuple(s)) for s in cfg["shapes"]]})
    dist.barrier()  # no rank tears gloo down while the other still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {"shapes": [[1, 4, 2, 64, 32]]})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as calibrate/engines/torch_tp_worker.py: skip the process group's static destructors
