"""The train script the emitted launch files start in tests/test_emitted_launch_real.py: one
optimizer step of a small model under the engine the launch starts, and what that engine says about
itself (world size, ZeRO stage, batch, precision), or the settings Accelerate's launcher hands it,
written per rank to $STUB_OUT."""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

WIDTH = 64


def report(facts: dict) -> None:
    rank = int(os.environ["RANK"])
    path = os.path.join(os.environ["STUB_OUT"], f"rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"world": int(os.environ["WORLD_SIZE"]), "rank": rank, **facts}, f)
    os.replace(path + ".tmp", path)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(4)])


def deepspeed_main(config_path: str) -> None:
    """deepspeed launcher: `train.py --local_rank=N --deepspeed --deepspeed_config ds_config.json`."""
    import deepspeed

    with open(config_path) as f:
        cfg = json.load(f)
    # the one key changed: DeepSpeed's FusedAdam is a CUDA kernel (a C++ op built at first use on the
    # CPU accelerator), so torch's AdamW steps here; every other key is the emitted file's
    cfg["optimizer"]["params"]["torch_adam"] = True
    deepspeed.init_distributed(dist_backend="gloo")
    # the plan --emit wrote beside the config: a pipeline layout is built as PipelineModule, as
    # launch.sh's comment asks of the train script
    with open(os.path.join(os.path.dirname(config_path), "plan.json")) as f:
        stages = json.load(f)["layout"]["pp"]
    dtype = torch.bfloat16 if cfg.get("bf16", {}).get("enabled") else torch.float32
    if stages > 1:
        from deepspeed.pipe import PipelineModule

        net = PipelineModule(layers=list(model()), num_stages=stages, partition_method="uniform",
                             loss_fn=lambda out, _: out.float().pow(2).mean())
        engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=cfg)
        batch = [(torch.randn(engine.train_micro_batch_size_per_gpu(), WIDTH, dtype=dtype),
                  torch.zeros(1))] * engine.gradient_accumulation_steps()
        engine.train_batch(iter(batch))
    else:
        net = model()
        engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=cfg)
        for _ in range(engine.gradient_accumulation_steps()):
            loss = engine(torch.randn(engine.train_micro_batch_size_per_gpu(), WIDTH, dtype=dtype)).float().pow(2).mean()
            engine.backward(loss)
            engine.step()
    report({"engine": type(engine).__name__, "zero": engine.zero_optimization_stage(), "bf16": engine.bfloat16_enabled(),
            "stages": getattr(engine, "num_stages", 1), "micro_batch": engine.train_micro_batch_size_per_gpu(),
            "gas": engine.gradient_accumulation_steps(), "train_batch": engine.train_batch_size(),
            "steps": engine.global_steps})


def accelerate_main() -> None:
    """accelerate launch --config_file accelerate_config.yaml train.py: Accelerate's launcher turns
    the YAML into the environment its Accelerator reads in every rank (accelerate/utils/launch.py
    prepare_multi_gpu_env, prepare_deepspeed_cmd_env). Without a GPU the Accelerator itself trains
    undistributed (state.py _prepare_backend finds no accelerator backend), so what is checked on CPU
    is that environment: the engine, its settings and the rank count."""
    keys = ("ACCELERATE_", "FSDP_")
    report({"engine": "accelerate", "env": {k: v for k, v in os.environ.items() if k.startswith(keys)}})


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=0)
    p.add_argument("--deepspeed", action="store_true")
    p.add_argument("--deepspeed_config")
    args, _ = p.parse_known_args()
    if args.deepspeed:
        deepspeed_main(args.deepspeed_config)
        dist.barrier()
        # torch's own advice: the process group torn down before exit, not by the interpreter's teardown
        # (gloo's threads then die with "terminate called without an active exception" now and then)
        dist.destroy_process_group()
    else:
        accelerate_main()
    sys.exit(0)
