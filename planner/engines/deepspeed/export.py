"""DeepSpeed's export: the ds_config.json of a layout, only keys DeepSpeed 0.19.8 declares.
planner/export.py writes it beside the launch files."""

from __future__ import annotations

from planner.engines import Launcher
from planner.hardware import Cluster
from planner.layout import Training
from planner.model import ModelSpec


DS_CONFIG = "ds_config.json"
DS_DEFAULTS = {
    "nvme_path": "/local_nvme",          # DeepSpeed offload nvme_path (nvme offload only)
    "lr": 3e-4,                          # optimizer learning-rate placeholder
    "weight_decay": 0.1,
    "betas": [0.9, 0.95],
    "eps": 1e-8,
    "steps_per_print": 10,
    "ds_config": None,                   # dict deep-merged into ds_config.json last (escape hatch)
}
"""ds_config.json's settings no layout decides, each overridable through export's `extra`."""


def deepspeed_config(model: ModelSpec, cluster: Cluster, training: Training, row: dict,
                     opts: dict | None = None) -> dict:
    """The ds_config.json dict (only keys DeepSpeed 0.19 declares)."""
    opts = {**DS_DEFAULTS, **(opts or {})}
    stage = row["zero"]
    mbs, gas, dp = row["mbs"], row["gas"], row["dp"]
    cfg: dict = {
        # deepspeed/runtime/config.py _batch_assertion: train_batch_size must equal
        # micro x accumulation x world size, where the world size is mpu.get_data_parallel_world_size()
        # when an mpu is passed (Megatron-DeepSpeed passes its mpu, so TP/PP/CP ranks are excluded)
        # and dist.get_world_size() otherwise (plain DeepSpeed: tp = pp = cp = 1, so world == dp).
        "train_batch_size": mbs * gas * dp,
        "train_micro_batch_size_per_gpu": mbs,
        "gradient_accumulation_steps": gas,
        "steps_per_print": int(opts["steps_per_print"]),
        "wall_clock_breakdown": False,
        "gradient_clipping": 1.0,
    }

    cfg.update(_precision_sections(training, stage))
    cfg["zero_optimization"] = _zero_section(training, row, opts)
    cfg.update(_optimizer_sections(training, row, opts))
    if row["recompute"] != "none" and (training.engine.launcher is Launcher.MEGATRON_DEEPSPEED or row["pp"] > 1):
        cfg["activation_checkpointing"] = _checkpointing_section(training, row)
    if isinstance(opts.get("ds_config"), dict):
        _deep_merge(cfg, opts["ds_config"])
    return cfg




def _precision_sections(training: Training, stage: int) -> dict:
    """bf16, data_types and fp16."""
    cfg: dict = {}
    # deepspeed/runtime/precision_config.py (DeepSpeedBF16Config / DeepSpeedFP16Config)
    bf16 = {"enabled": training.precision in ("bf16", "bf16-pure")}
    if training.precision == "bf16-pure" and stage >= 1:
        # no fp32 master copy: bf16 master weights/grads and bf16 Adam moments. DeepSpeed's
        # _do_error_check allows both only with ZeRO 1-3 (rules.py pure_bf16_needs_zero refuses stage 0)
        bf16["bf16_master_weights_and_grads"] = True
        bf16["bf16_optimizer_states"] = True
    cfg["bf16"] = bf16
    if training.zero_config.fp32_grad_accum:
        # runtime/config.py get_data_types_params: data_types.grad_accum_dtype (DtypeEnum "fp32")
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    if training.precision == "fp16":
        # dynamic loss scaling with DeepSpeed's documented defaults (FP16_FORMAT in precision_config.py):
        # loss_scale 0 = dynamic, initial scale 2**16, window 1000, hysteresis 2, floor 1
        cfg["fp16"] = {"enabled": True, "auto_cast": False, "loss_scale": 0, "initial_scale_power": 16,
                       "loss_scale_window": 1000, "hysteresis": 2, "consecutive_hysteresis": False,
                       "min_loss_scale": 1}
    else:
        cfg["fp16"] = {"enabled": False}
    return cfg


def _zero_section(training: Training, row: dict, opts: dict) -> dict:
    """zero_optimization: deepspeed/runtime/zero/config.py DeepSpeedZeroConfig (extra='forbid')."""
    zc, stage = training.zero_config, row["zero"]
    zero: dict = {"stage": stage}
    if stage >= 1:
        # overlap_comm None -> DeepSpeed resolves it to (stage == 3) in overlap_comm_valid; write it resolved
        zero["overlap_comm"] = bool(zc.overlap_comm) if zc.overlap_comm is not None else stage == 3
        zero["contiguous_gradients"] = bool(zc.contiguous_gradients)
        zero["reduce_bucket_size"] = int(zc.reduce_bucket_size)
        if stage in (1, 2):
            zero["allgather_bucket_size"] = int(zc.allgather_bucket_size)  # ZeRO-1/2 param all-gather
        if stage == 3:
            # the stage3_* names are pydantic aliases of prefetch_bucket_size etc. in DeepSpeedZeroConfig
            zero["stage3_prefetch_bucket_size"] = int(zc.stage3_prefetch_bucket_size)
            zero["stage3_max_live_parameters"] = int(zc.stage3_max_live_parameters)
            zero["stage3_max_reuse_distance"] = int(zc.stage3_max_reuse_distance)
            zero["stage3_param_persistence_threshold"] = int(zc.stage3_param_persistence_threshold)
        zero["sub_group_size"] = int(zc.sub_group_size)
        if row["offload_optimizer"] != "none":
            # zero/offload_config.py DeepSpeedZeroOffloadOptimizerConfig: device cpu|nvme, nvme_path, pin_memory
            zero["offload_optimizer"] = _offload(row["offload_optimizer"], opts["nvme_path"])
            if row["offload_optimizer"] == "nvme":  # the buffers planned in host memory (states.host_bytes)
                zero["offload_optimizer"]["buffer_count"] = int(zc.nvme_optimizer_buffer_count)
        if stage == 3 and row["offload_params"] != "none":
            # DeepSpeedZeroOffloadParamConfig (ZeRO-3 only)
            zero["offload_param"] = _offload(row["offload_params"], opts["nvme_path"])
            if row["offload_params"] == "nvme":
                zero["offload_param"].update(buffer_count=int(zc.nvme_param_buffer_count),
                                             buffer_size=int(zc.nvme_param_buffer_size),
                                             max_in_cpu=int(zc.nvme_params_in_cpu))
    return zero


def _optimizer_sections(training: Training, row: dict, opts: dict) -> dict:
    """optimizer and the ZeRO switches a client optimizer needs."""
    cfg: dict = {}
    stage = row["zero"]
    # optimizer: deepspeed/runtime/config.py DEEPSPEED_OPTIMIZERS; engine._configure_basic_optimizer
    offload = row["offload_optimizer"] != "none"
    if training.optimizer == "adamw":
        # With offload_optimizer DeepSpeed builds DeepSpeedCPUAdam(adamw_mode=True) from type "AdamW"
        # itself (engine.get_optimizer_configuration: zero_use_cpu_optimizer()); there is no separate
        # "CPUAdam" type. Without offload the same type gives FusedAdam(adam_w_mode=True).
        # torch_adam false keeps DeepSpeed's own kernels instead of torch.optim.AdamW.
        cfg["optimizer"] = {"type": "AdamW", "params": {
            "lr": float(opts["lr"]), "betas": [float(b) for b in opts["betas"]], "eps": float(opts["eps"]),
            "weight_decay": float(opts["weight_decay"]), "torch_adam": False}}
    elif training.optimizer == "sgd":
        # not a DeepSpeed optimizer: the engine falls back to getattr(torch.optim, "SGD")
        cfg["optimizer"] = {"type": "SGD", "params": {"lr": float(opts["lr"]), "momentum": 0.9,
                                                      "weight_decay": float(opts["weight_decay"])}}
    # adafactor / adam8bit: no DeepSpeed type; the script passes its own optimizer to
    # deepspeed.initialize / accelerator.prepare, so no "optimizer" section.
    if training.optimizer != "adamw" and stage >= 1:
        # engine._do_optimizer_sanity_check asserts unless this is set for non-Adam optimizers
        cfg["zero_allow_untested_optimizer"] = True
    if training.optimizer in ("adafactor", "adam8bit") and offload:
        # engine._configure_optimizer raises for a client optimizer under ZeRO-Offload unless false
        cfg["zero_force_ds_cpu_optimizer"] = False
    return cfg


def _checkpointing_section(training: Training, row: dict) -> dict:
    """activation_checkpointing, where something reads it (Megatron-DeepSpeed, the pipeline engine)."""
    # deepspeed/runtime/activation_checkpointing/config.py. The section switches nothing on: DeepSpeed
    # 0.19.8 parses it (runtime/config.py DeepSpeedConfig.activation_checkpointing_config) and only
    # deepspeed.checkpointing.configure(mpu, deepspeed_config=...) reads it (checkpointing.py
    # _configure_using_config_file), for deepspeed.checkpointing.checkpoint: Megatron-DeepSpeed's
    # --deepspeed-activation-checkpointing (whose store_true flags then override every key:
    # megatron/initialize.py setup_deepspeed_random_and_activation_checkpointing, f4157be) and
    # PipelineModule's activation_checkpoint_func. DeepSpeedEngine never reads it, so a Hugging Face
    # model at pp 1 gets none (its recompute is activation_checkpointing_enable: launch.sh, plan.json).
    # partition_activations splits the saved layer inputs over the tensor-parallel group, so it is
    # written only where tp > 1 (planner/activations.py checkpoint_partitions, timing.py checkpoint_restore_s)
    zc = training.zero_config
    return {
        "partition_activations": zc.partition_activations and row["tp"] > 1,
        "cpu_checkpointing": zc.cpu_checkpointing,
        "contiguous_memory_optimization": False,
        "synchronize_checkpoint_boundary": False,
        "profile": False,
    }


def _offload(device: str, nvme_path) -> dict:
    out = {"device": device, "pin_memory": True}
    if device == "nvme":
        out["nvme_path"] = str(nvme_path)
    return out


def _deep_merge(base: dict, over: dict) -> None:
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _deep_merge(base[k], v)
        else:
            base[k] = v
