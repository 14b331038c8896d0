"""Worker: does DeepSpeed's AutoEP (ds_config "expert_parallel", DeepSpeed 0.19.8 module_inject/auto_ep.py)
split a Hugging Face Mixtral's experts over 2 gloo ranks (DS_ACCELERATOR=cpu) with the installed
transformers? Run under DeepSpeed's launcher (calibrate/harness/launch.py, launcher="deepspeed") with the
ds_config as its argument; each rank trains 2 steps and writes the MoE block's class and its experts'
parameter shapes, or the exception deepspeed.initialize raised. tests/test_engines.py reads it: the
planner's `deepspeed` engine offers --ep > 1 only once this launches (planner/engines/
expert_parallel).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported

from calibrate.engines.deepspeed_worker import run_and_leave  # noqa: E402
from calibrate.harness.worker_io import device, write_result  # noqa: E402

MIXTRAL = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 256,
           "max_position_embeddings": 64}


def main(ds: dict) -> None:
    import deepspeed
    import transformers

    deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl")
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(transformers.MixtralConfig(**MIXTRAL))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    try:
        engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=ds)
    except Exception as exc:  # the finding itself: recorded, not raised
        write_result({"initialized": False, "error": f"{type(exc).__name__}: {exc}"[:500],
                      "transformers": transformers.__version__, "deepspeed": deepspeed.__version__})
        return
    ids = torch.randint(0, MIXTRAL["vocab_size"], (1, 16), device=device())
    for _ in range(2):
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
    block = engine.module.model.layers[0].mlp
    write_result({"initialized": True, "block": type(block).__name__,
                  "params": {n: list(getattr(p, "ds_shape", p.shape)) for n, p in block.named_parameters()},
                  "transformers": transformers.__version__, "deepspeed": deepspeed.__version__})


if __name__ == "__main__":
    run_and_leave(main)
