"""Worker: how many parameter elements DeepSpeed ZeRO-3 holds gathered at once, on 2 gloo ranks
(DS_ACCELERATOR=cpu), run under DeepSpeed's launcher (calibrate/harness/launch.py, launcher="deepspeed").

For every run of the config ({"runs": [{"name", "zero_optimization": {...}, "checkpointing": False, True
(non-reentrant) or "reentrant"}]})
it trains 3 optimizer steps of a Llama whose decoder-layer Linears are far larger than the knobs it
is given (so stage3_max_live_parameters, stage3_max_reuse_distance and stage3_prefetch_bucket_size
decide), and in the last one counts, after every fetch of a submodule (DeepSpeed 0.19.8
partitioned_param_coordinator.py PartitionedParameterCoordinator.fetch_sub_module: the gather of
the submodule's own parameters and the prefetch it starts), the elements of every parameter that
is not NOT_AVAILABLE (gathered or in flight: both have their full buffer) and not persistent.
The largest count, in forward and in backward, is the result: the engine's own tensors, counted.
Beside it, the elements each phase all-gathers (__all_gather_params_'s NOT_AVAILABLE parameters,
prefetches included; a checkpoint's recompute counts as backward).
The first steps record the module trace the prefetcher needs (is_complete_trace).

Usage: python -m calibrate.engines.deepspeed_zero3 (which launches this worker and records the result).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported

from calibrate.engines.deepspeed_worker import run_and_leave  # noqa: E402
from calibrate.harness.worker_io import device, write_result  # noqa: E402

# Linears of 32,768 to 180,224 elements: larger than every knob the runs set, smaller than a layer
LLAMA = {"num_hidden_layers": 3, "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 704, "vocab_size": 512, "tie_word_embeddings": False, "max_position_embeddings": 64}
# transformers 5's Mixtral: the 4 experts of a layer are one module (MixtralExperts, 3-D gate_up_proj and
# down_proj: 4 x (2 x 96 x 128 + 128 x 96) = 147,456 elements), the largest
MIXTRAL = {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
           "intermediate_size": 96, "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 256,
           "tie_word_embeddings": False, "max_position_embeddings": 64}
STEPS = 3


def _one_run(run: dict) -> dict:
    import deepspeed
    import transformers
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator

    torch.manual_seed(0)
    if run.get("model") == "mixtral":
        model = transformers.MixtralForCausalLM(transformers.MixtralConfig(**MIXTRAL))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    if run.get("checkpointing"):
        reentrant = run["checkpointing"] == "reentrant"
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
          "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 10, **run["zero_optimization"]}}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=ds)
    params = [p for p in model.parameters() if not p.ds_persist]
    peak = {"forward": 0, "backward": 0}
    counting = [False]
    original = PartitionedParameterCoordinator.fetch_sub_module

    fetched = {"forward": [0, 0], "backward": [0, 0]}  # [gathered ahead, gathered on demand] modules
    gathered = {"forward": 0, "backward": 0}  # elements all-gathered, prefetches included
    all_gather = PartitionedParameterCoordinator._PartitionedParameterCoordinator__all_gather_params_

    def counted_gather(self, params, forward, quantize=False):
        if counting[0]:  # what __all_gather_params_ itself gathers: the NOT_AVAILABLE ones
            key = "forward" if torch._C._current_graph_task_id() == -1 else "backward"
            gathered[key] += sum(p.ds_numel for p in params if p.ds_status == ZeroParamStatus.NOT_AVAILABLE)
        all_gather(self, params, forward, quantize)

    def counted(self, current_submodule, forward):
        own = [p for p in current_submodule.parameters(recurse=False) if not p.ds_persist]
        ahead = all(p.ds_status != ZeroParamStatus.NOT_AVAILABLE for p in own)
        original(self, current_submodule, forward)
        if counting[0]:
            live = sum(p.ds_numel for p in params if p.ds_status != ZeroParamStatus.NOT_AVAILABLE)
            # a checkpoint's recompute runs inside autograd's backward (a graph task is running)
            key = "forward" if torch._C._current_graph_task_id() == -1 else "backward"
            peak[key] = max(peak[key], live)
            if own:
                fetched[key][0 if ahead else 1] += 1

    PartitionedParameterCoordinator.fetch_sub_module = counted
    PartitionedParameterCoordinator._PartitionedParameterCoordinator__all_gather_params_ = counted_gather
    ids = torch.randint(0, 256, (1, 16), device=device())
    try:
        for step in range(STEPS):
            counting[0] = step == STEPS - 1
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
    finally:
        PartitionedParameterCoordinator.fetch_sub_module = original
        PartitionedParameterCoordinator._PartitionedParameterCoordinator__all_gather_params_ = all_gather
    modules = [(name, sum(p.ds_numel for p in m.parameters(recurse=False)))
               for name, m in model.named_modules() if any(True for _ in m.parameters(recurse=False))]
    engine.destroy()
    return {"name": run["name"], "peak_forward": peak["forward"], "peak_backward": peak["backward"], "modules": modules,
            "modules_gathered_ahead": {k: v[0] for k, v in fetched.items()},
            "modules_gathered_on_demand": {k: v[1] for k, v in fetched.items()}, "elements_gathered": gathered}


def main(cfg: dict) -> None:
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl")
    write_result({"runs": [_one_run(run) for run in cfg["runs"]]})


if __name__ == "__main__":
    run_and_leave(main)
