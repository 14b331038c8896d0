"""What megatron-core's DistributedDataParallel holds for gradients, on the CPU (one gloo rank).

    python -m calibrate.engines.megatron_grad_buffer

Wraps a two-Linear bf16 module (12,448 parameters) in megatron-core's DistributedDataParallel with
the distributed optimizer, once with grad_reduce_in_fp32 (what Megatron-LM sets for bf16) and once
without, and prints, as JSON, each parameter's main_grad dtype and size and each buffer's grad_data
dtype and size (distributed/param_and_grad_buffer.py _ParamAndGradBuffer: one contiguous buffer for
the rank's whole model, allocated on torch.cuda.current_device(), here pointed at the CPU).
tests/test_engines.py reads it against the planner's Megatron gradient bytes.
"""

from __future__ import annotations

import json
import os
import socket
import sys


def measure() -> dict:
    import torch

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    torch.distributed.init_process_group("gloo")
    torch.cuda.current_device = lambda: "cpu"  # the buffer's device, with no CUDA
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer import TransformerConfig

    import megatron.core

    parallel_state.initialize_model_parallel()
    config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, bf16=True,
                               params_dtype=torch.bfloat16)
    module = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 64)).to(torch.bfloat16)
    out = {"megatron_core": megatron.core.__version__, "params": sum(p.numel() for p in module.parameters())}
    for fp32 in (True, False):
        ddp = DistributedDataParallel(config, DistributedDataParallelConfig(
            grad_reduce_in_fp32=fp32, use_distributed_optimizer=True), module)
        out[f"grad_reduce_in_fp32={fp32}"] = {
            "main_grad": {n: [str(p.main_grad.dtype), p.main_grad.numel()] for n, p in ddp.module.named_parameters()},
            "buffers": [[str(b.grad_data.dtype), b.grad_data.numel(), b.grad_data.element_size()] for b in ddp.buffers]}
    return out


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")
    print(json.dumps(measure()))
    sys.stdout.flush()
    os._exit(0)
