"""What deepspeed.checkpointing keeps of each checkpointed layer, on 2 gloo ranks under torchrun.

    torchrun --nproc_per_node 2 calibrate/engines/deepspeed_checkpointing_worker.py OUT.json

Megatron-DeepSpeed (--deepspeed-activation-checkpointing) checkpoints its layers with DeepSpeed's
CheckpointFunction, configured with the model-parallel group (here both ranks, mp size 2). Four
Megatron-style blocks (calibrate/engines/megatron_block.py) run forward under it, with and without
partition_activations; rank 0 walks the autograd graph and sums the floating-point storages each
CheckpointFunction keeps for backward (ctx.deepspeed_saved_tensors; a partitioned input's data lives
in its `saved_data`), each storage once; the constant causal mask and the int64 shape records are
not activations. A backward then checks that the gathered inputs recompute.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SEQ, BATCH, HIDDEN, HEADS, FFN, LAYERS = 128, 2, 256, 8, 1024, 4


class ModelParallel:
    """The slice of Megatron's mpu that deepspeed.checkpointing.configure reads."""

    def __init__(self, group):
        import torch.distributed as dist

        self.group, self.dist = group, dist

    def get_model_parallel_rank(self):
        return self.dist.get_rank(self.group)

    def get_model_parallel_world_size(self):
        return self.dist.get_world_size(self.group)

    def get_model_parallel_group(self):
        return self.group

    def get_data_parallel_rank(self):
        return 0

    def get_data_parallel_world_size(self):
        return 1


def kept_per_layer(partition: bool, mpu) -> float:
    import torch
    from deepspeed.runtime.activation_checkpointing import checkpointing

    from calibrate.engines.megatron_block import MegatronStyleBlock

    checkpointing.reset()
    checkpointing.configure(mpu, partition_activations=partition, checkpoint_in_cpu=False,
                            contiguous_checkpointing=False, num_checkpoints=LAYERS, synchronize=False, profile=False)
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(MegatronStyleBlock(HIDDEN, HEADS, FFN, 0.1) for _ in range(LAYERS))
    blocks = blocks.to(torch.bfloat16).train()
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1)
    x = torch.randn(SEQ, BATCH, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    y = x
    for block in blocks:
        y = checkpointing.checkpoint(block, y, causal)
    storages, seen, stack = {}, set(), [y.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for t in getattr(node, "deepspeed_saved_tensors", None) or ():
            held = getattr(t, "saved_data", t) if torch.is_tensor(t) else None
            if held is not None and held.is_floating_point():
                storage = held.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        stack += [n for n, _ in node.next_functions]
    y.float().sum().backward()
    assert x.grad is not None and all(p.grad is not None for p in blocks.parameters())
    return sum(storages.values()) / LAYERS


def main(out: str) -> int:
    import deepspeed
    import torch.distributed as dist

    deepspeed.init_distributed(dist_backend="gloo")
    mpu = ModelParallel(dist.new_group(list(range(dist.get_world_size()))))
    result = {"mp_size": dist.get_world_size(), "seq": SEQ, "batch": BATCH, "hidden": HIDDEN, "heads": HEADS,
              "ffn": FFN, "deepspeed": deepspeed.__version__,
              "kept_per_layer_bytes": {str(p).lower(): kept_per_layer(p, mpu) for p in (False, True)}}
    if dist.get_rank() == 0:
        tmp = Path(out).with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        tmp.replace(out)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
