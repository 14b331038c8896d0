"""Write ready-to-run launch configs for one planned layout.

`emit(out_dir, model, cluster, training, layout_row)` writes, atomically:

* ``ds_config.json``        DeepSpeed config (engines deepspeed and megatron-deepspeed)
* ``accelerate_config.yaml`` Accelerate config (DEEPSPEED, FSDP or MEGATRON_LM)
* ``launch.sh``             the launch commands (accelerate / deepspeed / torchrun), executable
* ``megatron_args.txt``     Megatron arguments, one per line (Megatron engines, or tp/pp/cp > 1)
* ``plan.json``             what the planner assumed (planner/plan_file.py), read back by `planner check DIR`

Pure stdlib: no torch, deepspeed, yaml or accelerate import (the YAML is written by hand). The
files are checked against DeepSpeed 0.19 and Accelerate 1.16 by tests/test_export.py, which load
them with those libraries' own loaders.

Sources of the keys (paths relative to the installed packages):

* DeepSpeed: deepspeed/runtime/config.py (batch keys, optimizer, gradient_clipping, ...),
  deepspeed/runtime/zero/config.py and zero/offload_config.py (``zero_optimization``: pydantic
  models with ``extra='forbid'``, so every key below is one DeepSpeed declares),
  deepspeed/runtime/precision_config.py (``bf16``/``fp16``, also ``extra='forbid'``),
  deepspeed/runtime/activation_checkpointing/config.py (``activation_checkpointing``).
* Accelerate: accelerate/commands/config/config_args.py (ClusterConfig fields),
  accelerate/commands/launch.py (how ``deepspeed_config``/``fsdp_config``/``megatron_lm_config``
  keys become launch arguments), accelerate/utils/dataclasses.py (DeepSpeedPlugin,
  FullyShardedDataParallelPlugin).
* Megatron-LM: megatron/training/arguments.py; Megatron-DeepSpeed: megatron/arguments.py.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from planner import plan_file
from planner.data import atomic_write
from planner.engines import Launcher
from planner.errors import InputError
from planner.hardware import Cluster
from planner.layout import Training, single
from planner.model import ModelSpec
from planner.rules import check_single

DS_CONFIG = "ds_config.json"
ACCELERATE_CONFIG = "accelerate_config.yaml"
LAUNCH = "launch.sh"
MEGATRON_ARGS = "megatron_args.txt"

_ROW_KEYS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "zero", "offload_optimizer", "offload_params",
             "mbs", "gas", "recompute", "recompute_layers", "recompute_method", "sequence_parallel", "rank_order")

# keys of `extra` that change the files; any other key is copied into launch.sh as a comment line
EXTRA_DEFAULTS = {
    "train_script": "train.py",          # the user's training script (accelerate / deepspeed lines)
    "megatron_script": "pretrain_gpt.py",  # Megatron-LM / Megatron-DeepSpeed entry point
    "nvme_path": "/local_nvme",          # DeepSpeed offload nvme_path (nvme offload only)
    "lr": 3e-4,                          # optimizer learning-rate placeholder
    "weight_decay": 0.1,
    "betas": [0.9, 0.95],
    "eps": 1e-8,
    "steps_per_print": 10,
    "master_port": 29500,
    "ds_config": None,                   # dict deep-merged into ds_config.json last (escape hatch)
}


# ---------------------------------------------------------------------------------------------
# public entry point

def emit(out_dir, model: ModelSpec, cluster: Cluster, training: Training, layout_row: dict,
         extra: dict | None = None) -> list[Path]:
    """Write the launch configs for `layout_row` (a `Layouts.row(i)` dict) into `out_dir`.

    Returns the written paths in writing order. Existing files of the same names are replaced
    atomically (temp file in `out_dir`, then os.replace); other files are left alone. Raises
    InputError if the layout breaks a planner rule, or "--emit: ..." if `out_dir` cannot be
    created or written.
    """
    files = render(model, cluster, training, layout_row, extra, check_only=True)  # bad input fails before mkdir
    out = Path(out_dir).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise InputError(f"--emit: {str(out)!r} exists and is not a directory") from None
    except OSError as exc:
        raise InputError(f"--emit: cannot create directory {str(out)!r}: {exc.strerror or exc}") from None
    if not out.is_dir():
        raise InputError(f"--emit: {str(out)!r} exists and is not a directory")
    out = out.resolve()
    files = render(model, cluster, training, layout_row, extra, directory=out)
    # the plan last: `planner check DIR` reads the model, sequence and recompute no config file states
    row = normalise_row(layout_row)
    files.append((plan_file.PLAN, plan_file.render(model, cluster, training, row, recompute_where(model, training, row)),
                  0o644))
    written = []
    for name, text, mode in files:
        path = out / name
        atomic_write(path, text, mode, flag="--emit")
        written.append(path)
    return written


def render(model: ModelSpec, cluster: Cluster, training: Training, layout_row: dict, extra: dict | None = None,
           directory: Path | None = None, check_only: bool = False) -> list[tuple[str, str, int]]:
    """The launch configs of `layout_row` as (file name, text, mode), in writing order, without
    writing anything (the app's downloads). Paths inside the files point into `directory`, or are
    bare file names when it is None. check_only: raise on bad input, return []."""
    row = normalise_row(layout_row)
    opts = dict(EXTRA_DEFAULTS)
    opts.update(extra or {})
    check_row(model, cluster, training, row)
    if training.engine.launcher is Launcher.TORCHTITAN:  # its trainer's own overrides (planner/export_torchtitan.py)
        from planner import export_torchtitan

        script = export_torchtitan.launch_script(model, cluster, training, row, opts["master_port"],
                                                 allocator_environment(training))
        fp8_config = export_torchtitan.fp8_module(model, training)
        extra_files = [] if fp8_config is None else [(export_torchtitan.FP8_MODULE + ".py", fp8_config, 0o644)]
        return [] if check_only else [(LAUNCH, script, 0o755), *extra_files]
    if check_only:
        return []
    ds_path = Path(DS_CONFIG) if directory is None else directory / DS_CONFIG
    files: list[tuple[str, str, int]] = []
    if training.engine.deepspeed:
        ds = deepspeed_config(model, cluster, training, row, opts)
        files.append((DS_CONFIG, json.dumps(ds, indent=2) + "\n", 0o644))
    if accelerate_drives(training, row):
        files.append((ACCELERATE_CONFIG, accelerate_yaml(model, cluster, training, row, ds_path), 0o644))
    files.append((LAUNCH, launch_script(model, cluster, training, row, opts), 0o755))
    if _wants_megatron(training, row):
        args = megatron_args(model, training, row, ds_config_path=str(ds_path))
        files.append((MEGATRON_ARGS, "".join(a + "\n" for a in args), 0o644))
    return files


# ---------------------------------------------------------------------------------------------
# DeepSpeed

def deepspeed_config(model: ModelSpec, cluster: Cluster, training: Training, row: dict,
                     opts: dict | None = None) -> dict:
    """The ds_config.json dict (only keys DeepSpeed 0.19 declares)."""
    opts = {**EXTRA_DEFAULTS, **(opts or {})}
    zc = training.zero_config
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

    # precision: deepspeed/runtime/precision_config.py (DeepSpeedBF16Config / DeepSpeedFP16Config)
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

    # zero_optimization: deepspeed/runtime/zero/config.py DeepSpeedZeroConfig (extra='forbid')
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
            if row["offload_optimizer"] == "nvme":  # the buffers planned in host memory (memory.host_bytes)
                zero["offload_optimizer"]["buffer_count"] = int(zc.nvme_optimizer_buffer_count)
        if stage == 3 and row["offload_params"] != "none":
            # DeepSpeedZeroOffloadParamConfig (ZeRO-3 only)
            zero["offload_param"] = _offload(row["offload_params"], opts["nvme_path"])
            if row["offload_params"] == "nvme":
                zero["offload_param"].update(buffer_count=int(zc.nvme_param_buffer_count),
                                             buffer_size=int(zc.nvme_param_buffer_size),
                                             max_in_cpu=int(zc.nvme_params_in_cpu))
    cfg["zero_optimization"] = zero

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

    if row["recompute"] != "none" and (training.engine.launcher is Launcher.MEGATRON_DEEPSPEED or row["pp"] > 1):
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
        cfg["activation_checkpointing"] = {
            "partition_activations": zc.partition_activations and row["tp"] > 1,
            "cpu_checkpointing": zc.cpu_checkpointing,
            "contiguous_memory_optimization": False,
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        }

    if isinstance(opts.get("ds_config"), dict):
        _deep_merge(cfg, opts["ds_config"])
    return cfg


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


# ---------------------------------------------------------------------------------------------
# Accelerate

def accelerate_config(model: ModelSpec, cluster: Cluster, training: Training, row: dict,
                      ds_config_path) -> dict:
    """The accelerate_config.yaml content as a dict (ClusterConfig fields)."""
    nodes = cluster.num_hosts  # Accelerate's machines are hosts (an NVL72 rack: 18 of 4 GPUs)
    mixed = "fp8" if training.fp8_recipe else {"bf16": "bf16", "bf16-pure": "bf16", "fp16": "fp16", "fp32": "no"}[training.precision]
    cfg: dict = {"compute_environment": "LOCAL_MACHINE", "debug": False}
    if training.engine.deepspeed:
        cfg["distributed_type"] = "DEEPSPEED"
        ds: dict = {
            # accelerate/utils/launch.py exports it as ACCELERATE_DEEPSPEED_CONFIG_FILE; DeepSpeedPlugin
            # opens it from the training process's working directory, so write it absolute.
            "deepspeed_config_file": str(ds_config_path),
            # DeepSpeedPlugin.zero3_init_flag: build the model under deepspeed.zero.Init (stage 3 only;
            # Accelerate warns and ignores it for other stages)
            "zero3_init_flag": row["zero"] == 3,
        }
        if nodes > 1:
            # accelerate launch: DEEPSPEED_MULTINODE_LAUNCHERS[1] = "standard" runs torchrun on every
            # node (the default "pdsh" needs passwordless ssh and a hostfile)
            ds["deepspeed_multinode_launcher"] = "standard"
        cfg["deepspeed_config"] = ds
        # No mixed_precision key: with deepspeed_config_file, accelerate launch adds a config-file
        # mixed_precision to ACCELERATE_CONFIG_DS_FIELDS and DeepSpeedPlugin._deepspeed_config_checks
        # then raises ValueError. AcceleratorState.mixed_precision reads bf16/fp16 from ds_config.json.
    elif training.engine.launcher is Launcher.FSDP:
        cfg["distributed_type"] = "FSDP"
        cfg["fsdp_config"] = _fsdp_config(cluster, training, row)
        if (row["tp"] > 1 or row["cp"] > 1) and cfg["fsdp_config"]["fsdp_version"] == 2:
            # accelerate/utils/launch.py prepare_extend_env_parallelism_config (FSDP2 only); keys are
            # copied verbatim to launch args, so they carry the parallelism_config_ prefix
            shard = row["dp"] if row["zero"] > 0 else 1
            cfg["parallelism_config"] = {
                "parallelism_config_dp_replicate_size": row["dp"] // shard,
                "parallelism_config_dp_shard_size": shard,
                "parallelism_config_tp_size": row["tp"],
                "parallelism_config_cp_size": row["cp"],
            }
        cfg["mixed_precision"] = mixed
        if training.fp8_recipe is not None:
            # accelerate 1.16 commands/launch.py --fp8_backend te (fp8_config keys gain the fp8_ prefix):
            # utils/transformer_engine.py convert_model swaps nn.Linear for te.Linear, TERecipeKwargs
            # builds DelayedScaling (fp8_format HYBRID by default)
            cfg["fp8_config"] = {"backend": "TE", "fp8_format": "HYBRID"}
    else:  # megatron
        cfg["distributed_type"] = "MEGATRON_LM"
        # accelerate/commands/launch.py "Megatron-LM Arguments" (megatron_lm_* names)
        mlm = {
            "megatron_lm_tp_degree": row["tp"],
            "megatron_lm_pp_degree": row["pp"],
            "megatron_lm_num_micro_batches": row["gas"],
            "megatron_lm_sequence_parallelism": bool(row["sequence_parallel"]),
            "megatron_lm_recompute_activations": row["recompute"] != "none",
            "megatron_lm_use_distributed_optimizer": row["zero"] >= 1,
            "megatron_lm_gradient_clipping": 1.0,
        }
        if row["recompute"] != "none":
            mlm["megatron_lm_recompute_granularity"] = row["recompute"]
        if row["recompute"] == "full":  # accelerate utils/dataclasses.py MegatronLMPlugin recompute_method
            mlm["megatron_lm_recompute_method"], mlm["megatron_lm_recompute_num_layers"] = _recompute_method(row)
        if row["cp"] > 1:
            mlm["megatron_lm_context_parallel_size"] = row["cp"]
        if row["ep"] > 1:
            mlm["megatron_lm_expert_model_parallel_size"] = row["ep"]
        cfg["megatron_lm_config"] = mlm
        cfg["mixed_precision"] = mixed
    if training.compile:
        # accelerate/commands/config/config_args.py ClusterConfig.dynamo_config: accelerate launch sets
        # ACCELERATE_DYNAMO_BACKEND and Accelerator.prepare torch.compiles the model with Inductor
        cfg["dynamo_config"] = {"dynamo_backend": "INDUCTOR"}
    cfg.update({
        "machine_rank": 0,
        "main_training_function": "main",
        "num_machines": nodes,
        "num_processes": cluster.num_gpus,  # total processes over all machines (ClusterConfig)
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
    })
    return cfg


def _fsdp_config(cluster: Cluster, training: Training, row: dict) -> dict:
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


def accelerate_yaml(model, cluster, training, row, ds_config_path) -> str:
    cfg = accelerate_config(model, cluster, training, row, ds_config_path)
    head = ("# Accelerate config written by planner.export; load with\n"
            "#   accelerate launch --config_file accelerate_config.yaml <script>\n")
    if cfg.get("distributed_type") == "MEGATRON_LM" and row["offload_optimizer"] != "none":
        # accelerate utils/dataclasses.py MegatronLMPlugin has no megatron_lm_* key for it
        head += ("# the optimizer offload (--optimizer-cpu-offload --optimizer-offload-fraction\n"
                 "# --use-precision-aware-optimizer, megatron_args.txt) has no key here: pass it in\n"
                 "# MegatronLMPlugin(other_megatron_args=...)\n")
    return head + _to_yaml(cfg)


_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./-]*$")
_YAML_SPECIAL = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "none", "~"}


def _yaml_scalar(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    s = str(v)
    if _PLAIN.match(s) and s.lower() not in _YAML_SPECIAL:
        return s
    # a JSON string is a valid YAML double-quoted scalar (e.g. 'no' would otherwise load as False)
    return json.dumps(s)


def _to_yaml(d: dict, indent: int = 0) -> str:
    lines = []
    pad = "  " * indent
    for k, v in d.items():
        if isinstance(v, dict):
            lines.append(f"{pad}{k}:\n" + _to_yaml(v, indent + 1) if v else f"{pad}{k}: {{}}\n")
        elif isinstance(v, (list, tuple)):
            lines.append(f"{pad}{k}: [" + ", ".join(_yaml_scalar(x) for x in v) + "]\n")
        else:
            lines.append(f"{pad}{k}: {_yaml_scalar(v)}\n")
    return "".join(lines)


# ---------------------------------------------------------------------------------------------
# Megatron

def _wants_megatron(training: Training, row: dict) -> bool:
    return training.engine.megatron or max(row["tp"], row["pp"], row["cp"]) > 1


def megatron_args(model: ModelSpec, training: Training, row: dict, ds_config_path: str = DS_CONFIG) -> list[str]:
    """Megatron arguments, one "--flag [value]" string each.

    Names are Megatron-LM's (megatron/training/arguments.py); with engine megatron-deepspeed the
    few that Megatron-DeepSpeed names differently use its names (megatron/arguments.py there).
    """
    mds = training.engine.launcher is Launcher.MEGATRON_DEEPSPEED
    t, p, c, e, v = row["tp"], row["pp"], row["cp"], row["ep"], row["vpp"]
    a: list[str] = [f"--tensor-model-parallel-size {t}", f"--pipeline-model-parallel-size {p}"]
    if v > 1:
        a.append(f"--num-layers-per-virtual-pipeline-stage {model.layers // (p * v)}")
    if c > 1:
        # Megatron-LM context parallelism; Megatron-DeepSpeed's sequence split is DeepSpeed-Ulysses
        a.append(f"--ds-sequence-parallel-size {c}" if mds else f"--context-parallel-size {c}")
    if model.experts > 1:
        a.append(f"--num-experts {model.experts}")
        a.append(f"--topk {model.experts_per_token}" if mds else f"--moe-router-topk {model.experts_per_token}")
        if model.shared_expert_ffn and not mds:  # Megatron-LM training/arguments.py (Qwen-MoE style)
            a.append(f"--moe-shared-expert-intermediate-size {model.shared_expert_ffn}")
        if not mds:
            # megatron-core 0.16.1 TransformerConfig moe_token_dispatcher_type defaults to "allgather"; the
            # planner times MoEAlltoAllTokenDispatcher (timing.ep_all_to_all_s, timing.moe_count_sync_s),
            # which NVIDIA's own MoE recipes set (megatron-bridge 0.3.1 recipes/qwen/qwen3_moe.py, deepseek_v3.py)
            a.append("--moe-token-dispatcher-type alltoall")
        if model.moe_layers != model.layers and not mds:
            # megatron-core 0.16.1 TransformerConfig moe_layer_freq (a per-layer 0/1 pattern, which
            # Megatron-LM's --moe-layer-freq evaluates); --ffn-hidden-size is then the dense blocks'
            # width (--moe-ffn-hidden-size the experts', _megatron_shape_args)
            pattern = f"([0]*{model.dense_layers}+[1]*{model.moe_layers})" if model.moe_layer_step == 1 else \
                "[" + ",".join(str(int(model.is_routed(i))) for i in range(model.layers)) + "]"
            a.append(f"--moe-layer-freq {pattern}")
        # Megatron-LM training/arguments.py, megatron-core 0.16.1 TransformerConfig moe_expert_capacity_factor and
        # moe_pad_expert_input_to_capacity; Megatron-DeepSpeed's own capacity argument is not written (unread)
        if training.moe_capacity_factor is not None and not mds:
            a.append(f"--moe-expert-capacity-factor {training.moe_capacity_factor!r}")
            if training.moe_pad_to_capacity:
                a.append("--moe-pad-expert-input-to-capacity")
    if e > 1:
        a.append(f"--moe-expert-parallel-size {e}" if mds else f"--expert-model-parallel-size {e}")
    if row.get("etp") and row["etp"] != t and not mds:  # megatron-core model_parallel_config.py
        a.append(f"--expert-tensor-parallel-size {row['etp']}")
    if row["sequence_parallel"]:
        a.append("--sequence-parallel")
    a += [f"--micro-batch-size {row['mbs']}",
          f"--global-batch-size {row['mbs'] * row['gas'] * row['dp']}",  # Megatron derives gas from it
          f"--seq-length {training.seq_len}",
          f"--max-position-embeddings {max(training.seq_len, model.max_positions)}",
          f"--num-layers {model.layers}",
          f"--hidden-size {model.hidden}",
          f"--num-attention-heads {model.heads}"]
    # Megatron-DeepSpeed f4157be megatron/arguments.py _add_network_size_args has no --group-query-attention
    if model.kv_heads < model.heads and mds:
        a.append(f"--num-key-value-heads {model.kv_heads}")
    elif model.kv_heads < model.heads:
        a += ["--group-query-attention", f"--num-query-groups {model.kv_heads}"]
    if model.head_dim and model.head_dim != model.hidden // model.heads and not model.kv_lora_rank:
        a.append(f"--kv-channels {model.head_dim}")
    a.append(f"--ffn-hidden-size {model.dense_ffn if model.moe_layers != model.layers and not mds else model.ffn}")
    if model.kv_lora_rank and not mds:  # megatron-core 0.16.1 MLATransformerConfig fields
        a += ["--multi-latent-attention", f"--kv-lora-rank {model.kv_lora_rank}",
              f"--qk-head-dim {model.dim_per_head - model.qk_rope_head_dim}",
              f"--qk-pos-emb-head-dim {model.qk_rope_head_dim}", f"--v-head-dim {model.v_head_dim or model.dim_per_head}"]
        a += [f"--q-lora-rank {model.q_lora_rank}"] if model.q_lora_rank else []
    if model.ffn_kind == "swiglu":
        a.append("--swiglu")
    a += _megatron_shape_args(model, mds)
    if training.optimizer == "sgd":
        a.append("--optimizer sgd")
    if mds:
        # DeepSpeed owns ZeRO here (deepspeed.add_config_arguments + Megatron-DeepSpeed --zero-stage)
        a += ["--deepspeed", f"--deepspeed_config {ds_config_path}", f"--zero-stage {row['zero']}"]
        if p == 1:
            a.append("--no-pipeline-parallel")  # plain DeepSpeed engine instead of PipelineModule
        if row["recompute"] != "none":
            a.append("--deepspeed-activation-checkpointing")  # uses ds_config activation_checkpointing
            # megatron/initialize.py _set_deepspeed_activation_checkpointing passes args.partition_activations
            # to deepspeed.checkpointing.configure, which sets it over the config's key: the flag decides
            if training.zero_config.partition_activations and row["tp"] > 1:
                a.append("--partition-activations")
            if training.zero_config.cpu_checkpointing:
                # passed as checkpoint_in_cpu to the same configure call, over the config's cpu_checkpointing
                # (store_true: without it DeepSpeed keeps the checkpointed inputs on the GPU)
                a.append("--checkpoint-in-cpu")
    else:
        if row["zero"] >= 1:
            a.append("--use-distributed-optimizer")  # Megatron's ZeRO-1-like optimizer-state sharding
        if row["offload_optimizer"] != "none":
            # megatron-core 0.16.1 OptimizerConfig optimizer_cpu_offload, optimizer_offload_fraction
            # (Training.optimizer_offload_fraction) and use_precision_aware_optimizer, under which the
            # HybridDeviceOptimizer steps the 16-bit shards and the GPU keeps no fp32 main parameter
            # (distrib_optimizer.py _build_model_and_main_param_groups); the flags spelled as Megatron-LM
            # spells OptimizerConfig's fields (its training/arguments.py is not in the wheel: unread)
            a += ["--optimizer-cpu-offload", f"--optimizer-offload-fraction {training.optimizer_offload_fraction!r}"]
        if row["offload_optimizer"] != "none" or training.precision == "bf16-pure":
            a.append("--use-precision-aware-optimizer")
        if training.precision == "bf16-pure":  # Engine.precision_aware_optimizer: bf16 grads and moments
            a += ["--main-grads-dtype bf16", "--exp-avg-dtype bf16", "--exp-avg-sq-dtype bf16"]
        # the overlaps the planner's step time assumes (timing.py overlapped_dp_s); Megatron-LM
        # training/arguments.py: --overlap-param-gather needs --use-distributed-optimizer
        if row["rank_order"] == "tp-cp-pp-dp":  # training/initialize.py: order 'tp-cp-ep-pp-dp'
            a.append("--use-tp-pp-dp-mapping")
        if training.pipeline_edge_layers and row["pp"] > 1:  # the embedding and the loss count as a block each
            a += ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
        if not training.overlap_p2p and row["pp"] > 1 and row["vpp"] > 1:
            a.append("--no-overlap-p2p-communication")  # on by default with interleaving
        if training.grad_reduce_in_bf16:
            a.append("--grad-reduce-in-bf16")  # training/arguments.py: main grads and their reduction in bf16
        if training.tp_comm_overlap and row["sequence_parallel"]:
            a.append("--tp-comm-overlap")  # needs --sequence-parallel and TransformerEngine
        if bool(training.overlaps_grad_reduce(row["zero"])):
            a.append("--overlap-grad-reduce")
            if row["zero"] >= 1:
                a.append("--overlap-param-gather")
    if row["recompute"] == "selective":
        a.append("--recompute-granularity selective")
    elif row["recompute"] == "full":
        method, layers = _recompute_method(row)
        a += ["--recompute-granularity full", f"--recompute-method {method}", f"--recompute-num-layers {layers}"]
    if training.precision in ("bf16", "bf16-pure"):
        a.append("--bf16")
    elif training.precision == "fp16":
        a.append("--fp16")
    if training.fp8_recipe is not None:
        # Megatron-LM d98e8a6 transformer_config.py: fp8 (--fp8-format) has no default and switches FP8
        # on; 'hybrid' is e4m3 forward and e5m2 gradients, what NeMo's FP8 recipes run
        a += ["--fp8-format hybrid", f"--fp8-recipe {training.fp8_recipe}"]
        if training.fp8_param_gather and row["zero"] >= 1:  # arguments.py: only with the distributed optimizer
            a.append("--fp8-param-gather")
    if training.flash_attention:
        # Megatron-DeepSpeed f4157be megatron/arguments.py: --use-flash-attn is --use-flash-attn-v1, whose
        # ParallelAttention asserts flash_attn_unpadded_func (flash-attn 1.x); v2 is flash_attn_varlen_func
        a.append("--use-flash-attn-v2" if mds else "--use-flash-attn")
    return a


# ---------------------------------------------------------------------------------------------
# launch.sh


def megatron_environment(cluster: Cluster, training: Training, row: dict) -> list[str]:
    """The environment Megatron's TP overlaps the plan assumes need: kernels issued in the order
    called, so each async all-gather or reduce-scatter starts before the GEMM it hides behind
    (megatron-core 0.16.1 tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication:
    "requires that the environment variable CUDA_DEVICE_MAX_CONNECTIONS=1"); and, for
    --tp-comm-overlap below compute capability 9.0, Userbuffers over CUDA IPC (TransformerEngine
    2.20.2 pytorch/module/base.py initialize_ub raises without CUDA multicast unless UB_SKIPMC=1)."""
    lines = []
    # Megatron-LM d98e8a6 training/arguments.py validate_args asserts it for TP or CP before compute capability 10
    if row["tp"] > 1 or row["cp"] > 1:
        lines.append("export CUDA_DEVICE_MAX_CONNECTIONS=1  # TP/CP collectives ordered before the GEMMs they hide")
        if training.tp_comm_overlap and row["sequence_parallel"] and cluster.gpu.compute_capability < 9.0:
            lines.append("export UB_SKIPMC=1  # --tp-comm-overlap: no CUDA multicast before compute capability 9.0")
    return lines


def allocator_environment(training: Training) -> list[str]:
    """The allocator setting the plan assumed (Training.expandable_segments; memory.reserved_bytes)."""
    if not training.expandable_segments:
        return []
    return ["export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # the allocator's reserve the plan assumed"]


def accelerate_drives(training: Training, row: dict) -> bool:
    """Whether `accelerate launch` can run the layout. Not a DeepSpeed layout with TP, PP or CP:
    Accelerate's DeepSpeed integration is data-parallel only (accelerate 1.x DeepSpeedPlugin sets
    train_batch_size = micro-batch x accumulation x num_processes, which DeepSpeed's _batch_assertion
    refuses where the data-parallel world is smaller), and a pipeline's PipelineEngine allows train_batch()
    alone (DeepSpeed 0.19.8 runtime/pipe/engine.py PipelineEngine.forward/backward/step raise
    PipelineError), which Accelerate's backward and step call."""
    return not (training.engine.deepspeed and row["tp"] * row["pp"] * row["cp"] > 1)


def launch_script(model: ModelSpec, cluster: Cluster, training: Training, row: dict,
                  opts: dict | None = None) -> str:
    opts = {**EXTRA_DEFAULTS, **(opts or {})}
    # launcher nodes are hosts: an NVL72 rack is 18 hosts of 4 GPUs (Cluster.gpus_per_host)
    nodes, per_node = cluster.num_hosts, cluster.gpus_per_host
    # the Megatron launch lines need a Megatron engine; for an FSDP layout with tp/cp > 1
    # megatron_args.txt only records the equivalent Megatron arguments
    megatron = training.engine.megatron
    ds = training.engine.deepspeed
    default = "torchrun" if megatron else ("deepspeed" if ds else "accelerate")
    q = shlex.quote

    lines = [
        "#!/usr/bin/env bash",
        "# Launch commands written by planner.export.",
        f"# model: {_one_line(model.name)} (L={model.layers} h={model.hidden} heads={model.heads}"
        f" kv_heads={model.kv_heads} ffn={model.ffn})",
        f"# cluster: {cluster.num_gpus} x {_one_line(cluster.gpu.name)}, {nodes} node(s) of {per_node}",
        "# layout: " + " ".join(f"{k}={row[k]}" for k in _ROW_KEYS)
        + f" gbs={row['mbs'] * row['gas'] * row['dp']}",
        f"# training: engine={training.engine.name} precision={training.precision} optimizer={training.optimizer}"
        f" seq_len={training.seq_len} flash_attention={training.flash_attention}",
    ]
    lines += hf_checkpointing_line(model, training, row)
    if training.engine.launcher is Launcher.DEEPSPEED and row["pp"] > 1:
        # deepspeed/runtime/pipe/module.py PipelineModule._partition_layers: the default 'parameters'
        # balances parameter counts, so the embedding's stage takes fewer blocks than the plan's even split
        lines.append("# pipeline: the train script builds PipelineModule(..., partition_method='type:<decoder layer "
                     "class>') so the blocks split evenly over the stages, as planned")
    for k, v in (opts or {}).items():
        if k not in EXTRA_DEFAULTS:
            lines.append(f"# {_one_line(k)}: {_one_line(v)}")
    lines += [
        "#",
        f"# Usage: [LAUNCHER={'accelerate|' if accelerate_drives(training, row) else ''}"
        f"{'deepspeed|' if ds else ''}{'torchrun' if megatron else ''}] "
        "./launch.sh [script args]",
        "# Multi-node: run on every node with NODE_RANK=<0..N-1> and MASTER_ADDR=<node 0>"
        + (" (deepspeed: a hostfile of '<host> slots=<gpus>' lines instead)" if ds else "") + ".",
        "set -euo pipefail",
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        f'TRAIN_SCRIPT="${{TRAIN_SCRIPT:-{opts["train_script"]}}}"',
        f'LAUNCHER="${{LAUNCHER:-{default}}}"',
        'NODE_RANK="${NODE_RANK:-0}"',
        'MASTER_ADDR="${MASTER_ADDR:-localhost}"',
        f'MASTER_PORT="${{MASTER_PORT:-{int(opts["master_port"])}}}"',
    ]
    env = (megatron_environment(cluster, training, row) if megatron else []) + allocator_environment(training)
    if env and ds and nodes > 1:
        # deepspeed/launcher/runner.py: remote ranks get only EXPORT_ENVS' prefixes (MLFLOW, PYTHON, MV2,
        # UCX) and the lines of .deepspeed_env (in ~ or the working directory)
        lines.append("# deepspeed on several nodes: put the exports below as NAME=VALUE lines in ./.deepspeed_env")
    lines += env
    if megatron:
        lines.append(f'MEGATRON_SCRIPT="${{MEGATRON_SCRIPT:-{opts["megatron_script"]}}}"')
        margs = megatron_args(model, training, row, ds_config_path="$HERE/" + DS_CONFIG)
        lines.append("MEGATRON_ARGS=(")
        for arg in margs:
            flag, _, value = arg.partition(" ")
            value = f'"{value}"' if value.startswith("$HERE") else (q(value) if value else "")
            lines.append(f"  {flag} {value}".rstrip())
        lines.append(")")
    lines += ["", 'case "$LAUNCHER" in', "  accelerate)"]
    multi = (' --machine_rank "$NODE_RANK" --main_process_ip "$MASTER_ADDR" --main_process_port "$MASTER_PORT"'
             if nodes > 1 else "")
    if accelerate_drives(training, row):
        lines.append(f'    exec accelerate launch --config_file "$HERE/{ACCELERATE_CONFIG}"{multi} "$TRAIN_SCRIPT" "$@"')
    else:
        lines.append('    echo "launch.sh: accelerate runs DeepSpeed data parallel only, not this TP/PP/CP layout;'
                     ' use LAUNCHER=deepspeed" >&2; exit 2')
    lines.append("    ;;")
    if ds:
        hostfile = '"${HOSTFILE:-$HERE/hostfile}"'
        target = '"$MEGATRON_SCRIPT" "${MEGATRON_ARGS[@]}"' if megatron else \
            f'"$TRAIN_SCRIPT" --deepspeed --deepspeed_config "$HERE/{DS_CONFIG}"'
        lines += ["  deepspeed)",
                  "    # --num_gpus is per node (deepspeed/launcher/runner.py)",
                  f"    exec deepspeed --num_gpus {per_node} --num_nodes {nodes} --hostfile {hostfile}"
                  f' --master_port "$MASTER_PORT" {target} "$@"',
                  "    ;;"]
    if megatron:
        lines += ["  torchrun)",
                  f"    exec torchrun --nproc_per_node {per_node} --nnodes {nodes} --node_rank \"$NODE_RANK\""
                  ' --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT"'
                  ' "$MEGATRON_SCRIPT" "${MEGATRON_ARGS[@]}" "$@"',
                  "    ;;"]
    lines += ['  *) echo "launch.sh: unknown LAUNCHER=$LAUNCHER" >&2; exit 2 ;;', "esac", ""]
    return "\n".join(lines)


def hf_checkpointing_line(model: ModelSpec, training: Training, row: dict) -> list[str]:
    """What the train script must call for the plan's recompute on Hugging Face modules, where no
    config file switches it: transformers 5.25 PreTrainedModel.activation_checkpointing_enable
    (every_n_layers=k checkpoints layers 0, k, 2k, ...: ceil(L / k) of them; offload=True keeps their
    inputs in pinned host memory, --cpu-checkpointing). Under accelerate's FSDP recompute of every
    layer on the device is fsdp_activation_checkpointing instead."""
    if not training.engine.recompute_every_n or row["recompute"] != "full":
        return []
    if row["pp"] > 1:
        # DeepSpeed's pipeline: deepspeed/runtime/pipe/module.py PipelineModule checkpoints its layers; by
        # default every one with parameters (_is_checkpointable), the embedding too, whose reentrant
        # checkpoint of token ids gets no gradient (DeepSpeed's own comment there): the decoder layers only
        return ["# recompute: the train script builds PipelineModule(..., activation_checkpoint_interval=1,"
                " checkpointable_layers=['<decoder layer class>']) (deepspeed.checkpointing: ds_config"
                " activation_checkpointing applies once it calls deepspeed.checkpointing.configure(None,"
                " deepspeed_config=...); the embedding and head stay unchecked, as planned)"]
    n = row["recompute_layers"] or model.layers
    offload = training.zero_config.cpu_checkpointing
    if training.engine.launcher is Launcher.FSDP and n == model.layers and not offload:
        return ["# recompute: accelerate's fsdp_activation_checkpointing checkpoints every decoder layer"]
    k = -(-model.layers // n)  # rules.every_n_layers_broken: ceil(L / ceil(L / N)) == N
    return [f"# recompute: the train script calls model.activation_checkpointing_enable(every_n_layers={k}"
            f"{', offload=True' if offload else ''}) (transformers >= 5.25): {n} of {model.layers} decoder layers"
            f" checkpointed{', their inputs in pinned host memory' if offload else ''}"]


def recompute_where(model: ModelSpec, training: Training, row: dict) -> str | None:
    """Where the plan's recompute is switched on, for plan.json (no DeepSpeed config key does it)."""
    if row["recompute"] == "none":
        return None
    launcher = training.engine.launcher
    if launcher is Launcher.TORCHTITAN:
        return f"launch.sh TORCHTITAN_ARGS: the trainer's activation-checkpoint:{row['recompute']} subcommand"
    if training.engine.megatron:
        text = "launch.sh MEGATRON_ARGS (megatron_args.txt): --recompute-granularity " + row["recompute"]
        if launcher is Launcher.MEGATRON_DEEPSPEED:
            text += (" with --deepspeed-activation-checkpointing, whose flags override ds_config.json's "
                     "activation_checkpointing keys")
        return text
    line = hf_checkpointing_line(model, training, row)
    where = line[0].removeprefix("# recompute: ") if line else f"the train script ({row['recompute']} recompute)"
    return where + "; ds_config.json has no switch for it (DeepSpeedEngine does not read activation_checkpointing)" \
        if training.engine.deepspeed and row["pp"] == 1 else where


def _one_line(v) -> str:
    return " ".join(str(v).split())


# ---------------------------------------------------------------------------------------------
# helpers

def _megatron_shape_args(model: ModelSpec, mds: bool = False) -> list[str]:
    """The model's shape where Megatron-LM's defaults differ (its arguments map one to one onto
    megatron-core 0.16.1 transformer/transformer_config.py TransformerConfig: normalization
    'LayerNorm', add_bias_linear True, add_qkv_bias False, qk_layernorm False, hidden_dropout and
    attention_dropout 0.1, moe_ffn_hidden_size; models/gpt/gpt_model.py GPTModel
    share_embeddings_and_output_weights, position_embedding_type 'learned_absolute'). `mds`:
    Megatron-DeepSpeed f4157be megatron/arguments.py's spellings (_add_network_size_args: normalization
    'layernorm', --use-rotary-position-embeddings, which validate_args makes drop the learned
    positions; it has no q/k/v-only bias, QK norm or MoE width of its own)."""
    a = []
    if model.norm == "rmsnorm":
        a.append("--normalization rmsnorm" if mds else "--normalization RMSNorm")
    if model.positions == "rotary":
        a.append("--use-rotary-position-embeddings" if mds else "--position-embedding-type rope")
    if not model.bias:
        a.append("--disable-bias-linear")
        if model.qkv_bias and not mds:
            a.append("--add-qkv-bias")
    if model.qk_norm and not mds:
        a.append("--qk-layernorm")
    if not model.tied_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    if not model.dropout:
        a += ["--attention-dropout 0.0", "--hidden-dropout 0.0"]
    if model.experts > 1 and not mds:
        a.append(f"--moe-ffn-hidden-size {model.ffn}")
    return a


def _recompute_method(row: dict) -> tuple:
    """Megatron's full recompute: the first N layers of each chunk ('block', --recompute-layers) or
    every layer in checkpoints of N ('uniform'), else every layer on its own ('uniform' chunks of 1)."""
    if not row.get("recompute_layers"):
        return ("uniform", 1)
    return (row.get("recompute_method") or "block", row["recompute_layers"])


def normalise_row(layout_row: dict) -> dict:
    """A layout as Layouts.row(i) gives it (or a dict with at least tp, pp, dp, zero, mbs, gas), every
    other field at its default and each value of the type the exports write."""
    if not isinstance(layout_row, dict):
        raise InputError(f"--emit: layout must be a dict like Layouts.row(i), got {type(layout_row).__name__}")
    missing = [k for k in ("tp", "pp", "dp", "zero", "mbs", "gas") if k not in layout_row]
    if missing:
        raise InputError(f"--emit: layout is missing {', '.join(missing)}")
    row = {"cp": 1, "ep": 1, "etp": None, "vpp": 1, "offload_optimizer": "none", "offload_params": "none",
           "recompute": "none", "recompute_layers": None, "recompute_method": None, "sequence_parallel": False,
           "schedule": None, "rank_order": "tp-cp-dp-pp", **layout_row}
    for k in ("tp", "pp", "dp", "cp", "ep", "vpp", "zero", "mbs", "gas"):
        row[k] = int(row[k])
    row["sequence_parallel"] = bool(row["sequence_parallel"])
    for k in ("offload_optimizer", "offload_params", "recompute"):
        row[k] = str(row[k]).lower()
    return row


def check_row(model, cluster, training, row) -> None:
    """The planner's own validity rules (InputError naming the flag), so no file describes an
    impossible job."""
    lay = single(tp=row["tp"], pp=row["pp"], dp=row["dp"], cp=row["cp"], ep=row["ep"], etp=row["etp"], vpp=row["vpp"],
                 zero=row["zero"], offload_optimizer=row["offload_optimizer"],
                 offload_params=row["offload_params"], mbs=row["mbs"], gas=row["gas"],
                 recompute=row["recompute"], recompute_layers=row["recompute_layers"],
                 recompute_method=row["recompute_method"] or "block",
                 sequence_parallel=row["sequence_parallel"], schedule=row.get("schedule"), rank_order=row["rank_order"])
    check_single(model, cluster, training, lay)
