"""The real engines, each case run as its users launch it: DeepSpeed (deepspeed_*), PyTorch FSDP2
(fsdp_*), PyTorch's own TP/PP/CP (torch_*), torchtitan (torchtitan_*), Megatron (megatron_*), whole
training steps (step_cases, step_worker); *_cases hold the harness's cases and the planner's
predictions, *_worker the ranks' side, *_cli the engines' own argument parsers."""
