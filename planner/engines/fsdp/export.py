"""FSDP's export: the fsdp_config block of an Accelerate config for FSDP2 (Accelerate 1.16's
FullyShardedDataParallelPlugin fields). planner/export.py writes it into the Accelerate YAML."""

from __future__ import annotations

from planner.hardware import Cluster
from planner.layout import Training


def fsdp_plugin_config(cluster: Cluster, training: Training, row: dict) -> dict:
    stage = row["zero"]
    # FSDP2 (fully_shard) has no NO_SHARD: ZeRO 0 without tp/cp uses FSDP1 NO_SHARD (DDP-like);
    # ZeRO 2/3 use FSDP2, where reshard_after_forward False/True is SHARD_GRAD_OP/FULL_SHARD
    # (FullyShardedDataParallelPlugin.__post_init__ requires a bool for version 2).
    version = 1 if stage == 0 and row["tp"] == 1 and row["cp"] == 1 else 2
    strategy = {3: "FULL_SHARD", 2: "SHARD_GRAD_OP"}.get(stage, "NO_SHARD")
    cfg: dict = {"fsdp_version": version}
    if version == 1:
        cfg["fsdp_sharding_strategy"] = strategy  # FSDP1 only; deprecated for FSDP2
        cfg["fsdp_use_orig_params"] = True
    else:
        cfg["fsdp_reshard_after_forward"] = stage == 3  # FULL_SHARD if True, SHARD_GRAD_OP if False
    cfg.update({
        # TRANSFORMER_BASED_WRAP without class names wraps the model's _no_split_modules (transformers)
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        # FSDP CPU offload moves parameters, gradients and the optimizer step to the host; NVMe is
        # not an FSDP option (the nearest is CPU)
        "fsdp_offload_params": row["offload_optimizer"] != "none" or row["offload_params"] != "none",
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_sync_module_states": True,  # required by cpu_ram_efficient_loading (utils/launch.py)
        # accelerate's FSDP checkpointing wraps every decoder layer; a partial plan is the train
        # script's every_n_layers call instead (launch.sh says which, hf_checkpointing_line)
        "fsdp_activation_checkpointing": row["recompute"] == "full" and not row["recompute_layers"]
                                         and not training.zero_config.cpu_checkpointing,
    })
    return cfg
