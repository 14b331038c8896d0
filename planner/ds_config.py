"""A user's DeepSpeed config read the way DeepSpeed 0.19.8 and Accelerate read it: from a
ds_config.json, an Accelerate YAML or an `accelerate launch` command line (sources beside each).
What DeepSpeed refuses or ignores in it, and its batch keys and "auto" values resolved, are
planner/ds_rules.py; the check that predicts and diagnoses the run is planner/doctor.py.
"""

from __future__ import annotations

import os
from pathlib import Path

from planner.ds_rules import FLAG, Finding, _closest
from planner.errors import InputError


def load_config(path) -> tuple[dict, str]:
    """(DeepSpeed config dict, where it came from) from a ds_config.json or an Accelerate YAML whose
    deepspeed_config names a file or gives the plugin fields (accelerate/commands/launch.py
    --zero_stage, --offload_optimizer_device, ...)."""
    from planner.data import read_json

    p = Path(str(path))
    if p.suffix.lower() in (".yaml", ".yml"):
        return _from_accelerate(p), "accelerate"
    doc = read_json(p, FLAG)
    if not isinstance(doc, dict):
        raise InputError(f"{FLAG}: {str(p)!r} holds a JSON {type(doc).__name__}, not a DeepSpeed config object")
    return doc, "deepspeed"


def accelerate_num_processes(path) -> int | None:
    """The Accelerate YAML's num_processes (accelerate/commands/config/config_args.py ClusterConfig: the
    total processes `accelerate launch` starts), or None where it gives none."""
    return yaml_num_processes(_yaml_doc(Path(path)))


def yaml_num_processes(doc: dict) -> int | None:
    """num_processes as the launch reads the YAML: a num_processes nested in deepspeed_config is
    copied onto the arguments after the top-level one (commands/launch.py _validate_launch_command
    walks ClusterConfig's fields in order, deepspeed_config after num_processes), so it wins."""
    nested = _processes((doc.get("deepspeed_config") or {}).get("num_processes"))
    return nested if nested is not None else _processes(doc.get("num_processes"))


def _processes(n) -> int | None:
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


# accelerate 1.16 commands/launch.py launch_command_parser, "DeepSpeed Arguments": the only keys of an
# Accelerate YAML's deepspeed_config that reach DeepSpeed. _validate_launch_command copies every key of the
# section onto the launch arguments, and utils/launch.py prepare_deepspeed_cmd_env passes on these only
PLUGIN_KEYS = (
    "deepspeed_config_file", "zero_stage", "offload_optimizer_device", "offload_param_device",
    "offload_optimizer_nvme_path", "offload_param_nvme_path", "gradient_accumulation_steps", "gradient_clipping",
    "zero3_init_flag", "zero3_save_16bit_model", "deepspeed_hostfile", "deepspeed_exclusion_filter",
    "deepspeed_inclusion_filter", "deepspeed_multinode_launcher", "deepspeed_moe_layer_cls_names")


# accelerate 1.16 commands/launch.py launch_command_parser: launch arguments other than the plugin
# fields that a key nested in deepspeed_config sets (_validate_launch_command copies every key of a
# dict section onto the arguments the command line left alone); the ones the planner reads
LAUNCH_ARGS = ("mixed_precision", "num_processes", "num_machines")


class AccelerateConfig(dict):
    """The ds_config `accelerate launch` hands DeepSpeed, with `notes`: findings on what Accelerate
    dropped or reinterpreted on the way (config_findings reports them first), and `zero3_init_flag`:
    DeepSpeedPlugin's flag as the launch passes it (None: unset, which DeepSpeedPlugin turns on
    under ZeRO-3)."""

    def __init__(self, ds: dict, notes: list, zero3_init_flag: bool | None = None):
        super().__init__(ds)
        self.notes = list(notes)
        self.zero3_init_flag = zero3_init_flag


def truth(value, flag: str) -> bool | None:
    """accelerate 1.16 utils/environment.py str_to_bool, the reading of ACCELERATE_DEEPSPEED_ZERO3_INIT
    (None stays None)."""
    if value is None:
        return None
    word = str(value).lower()
    if word in ("y", "yes", "t", "true", "on", "1"):
        return True
    if word in ("n", "no", "f", "false", "off", "0"):
        return False
    raise InputError(f"{flag}: {value!r} is not true or false (Accelerate's str_to_bool: true/false, yes/no, on/off, 1/0)")


def zero3_init_flag(line, section: dict) -> bool | None:
    """zero3_init_flag as DeepSpeedPlugin gets it: the launch line's, else the YAML's, else the
    ACCELERATE_DEEPSPEED_ZERO3_INIT of the environment the launch inherits (utils/launch.py
    prepare_deepspeed_cmd_env sets it only from a given flag; dataclasses.py DeepSpeedPlugin reads it)."""
    for value, where in ((line, "--zero3_init_flag"), (section.get("zero3_init_flag"), "deepspeed_config.zero3_init_flag"),
                         (os.environ.get("ACCELERATE_DEEPSPEED_ZERO3_INIT"), "ACCELERATE_DEEPSPEED_ZERO3_INIT")):
        if value is not None:
            return truth(value, where)
    return None


def default_accelerate_config() -> Path:
    """The config `accelerate launch` reads without --config_file (accelerate 1.16
    commands/config/config_args.py default_config_file): $HF_HOME (else $XDG_CACHE_HOME/huggingface,
    else ~/.cache/huggingface) /accelerate/default_config.yaml."""
    home = os.environ.get("HF_HOME", os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
    return Path(os.path.expanduser(home)) / "accelerate" / "default_config.yaml"


def _effective_precision(doc: dict, line):
    """mixed_precision as the launch runs it: the line's; else a mixed_precision nested in
    deepspeed_config, which _validate_launch_command copies onto the arguments before it falls back
    to the top-level key; else the YAML's (yaml_mixed_precision)."""
    if line:
        return line
    nested = (doc.get("deepspeed_config") or {}).get("mixed_precision")
    return nested if nested is not None else yaml_mixed_precision(doc)


def _read_yaml(path: Path, flag: str) -> dict:
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml is a dependency
        raise InputError(f"{flag}: reading an Accelerate YAML needs pyyaml (pip install pyyaml)") from None
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{flag}: cannot read {str(path)!r} ({exc.strerror or exc})") from None
    if len(raw) > 2**20:
        raise InputError(f"{flag}: {str(path)!r} is larger than 1 MiB; not an Accelerate config")
    try:
        doc = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise InputError(f"{flag}: {str(path)!r} is not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise InputError(f"{flag}: {str(path)!r} is not an Accelerate config (a YAML mapping)")
    if not isinstance(doc.get("deepspeed_config", {}) or {}, dict):
        raise InputError(f"{flag}: {str(path)!r}: deepspeed_config must be a mapping")
    return doc


def _yaml_doc(path: Path) -> dict:
    doc = _read_yaml(path, FLAG)
    if not isinstance(doc.get("deepspeed_config"), dict):
        raise InputError(f"{FLAG}: {str(path)!r} has no deepspeed_config section (an Accelerate config for DeepSpeed)")
    return doc


def yaml_mixed_precision(doc: dict):
    """mixed_precision as Accelerate reads the YAML: the legacy top-level `fp16: true` stands for 'fp16'
    where no mixed_precision key is given (accelerate 1.16 config_args.py BaseConfig.process_config)."""
    if "mixed_precision" in doc:
        return doc["mixed_precision"]
    return "fp16" if doc.get("fp16") else None


def _accelerate_notes(doc: dict, plugin: dict, mixed_precision, where: str, line_precision: bool) -> list:
    """Findings on what Accelerate drops or reinterprets in the YAML `doc`; `plugin`/`mixed_precision`
    are what the launch runs with (the YAML's, or the command line's where it gives them)."""
    out = []
    if "fp16" in doc and not line_precision:
        if "mixed_precision" not in doc and doc["fp16"]:
            out.append(Finding("config", "info", f"{where}: top-level fp16: {doc['fp16']!r} is Accelerate's legacy key: "
                               "it runs mixed_precision fp16 (config_args.py BaseConfig.process_config); predicted so"))
        elif doc["fp16"] and str(mixed_precision).lower() != "fp16":
            out.append(Finding("config", "warning", f"{where}: top-level fp16: {doc['fp16']!r} is ignored: Accelerate "
                               f"reads the legacy key only where no mixed_precision is given, and mixed_precision is "
                               f"{doc['mixed_precision']!r} (config_args.py BaseConfig.process_config)"))
    file = plugin.get("deepspeed_config_file")
    stage = plugin.get("zero_stage")
    # accelerate 1.16 utils/dataclasses.py DeepSpeedPlugin._deepspeed_config_checks: beside a deepspeed_config_file
    # these fields of the YAML (launch_command passes their names on) make the plugin raise
    clash = [k for k in ("gradient_accumulation_steps", "gradient_clipping", "zero_stage", "offload_optimizer_device",
                         "offload_param_device", "offload_param_nvme_path", "offload_optimizer_nvme_path",
                         "zero3_save_16bit_model") if k in (doc.get("deepspeed_config") or {})]
    if not line_precision and yaml_mixed_precision(doc) is not None:
        clash.append("mixed_precision")
    if file and clash:
        out.append(Finding("config", "error", f"{where}: deepspeed_config_file with {', '.join(clash)} in the Accelerate "
                           "config: Accelerate's DeepSpeedPlugin refuses it ('When using `deepspeed_config_file`, the "
                           "following accelerate config variables will be ignored'); set them in the ds_config.json "
                           "and remove them from the YAML"))
    for key, value in (doc.get("deepspeed_config") or {}).items():
        if key in PLUGIN_KEYS:
            continue
        if key in LAUNCH_ARGS:
            said = f"{key} {value!r}" if key != "mixed_precision" or not line_precision else \
                "nothing (the command line's --mixed_precision wins)"
            out.append(Finding("config", "info", f"{where}: deepspeed_config.{key} is a launch argument, not a plugin "
                               f"field: `accelerate launch` copies it onto its arguments (commands/launch.py "
                               f"_validate_launch_command) and runs with {said}; the top-level key is the usual place"))
            continue
        severity = "warning"
        if key in ("fp16", "bf16") and isinstance(value, dict) and (value.get("enabled") is True) == (
                str(mixed_precision).lower() == key):
            severity = "info"  # dropped, but mixed_precision runs what it asks for
        if file:
            instead, fix = f"DeepSpeed reads {key} from deepspeed_config_file {str(file)!r} only", "move it into that file"
        elif key == "zero_optimization":
            instead = (f"ZeRO stage {stage} from zero_stage" if stage is not None else
                       "ZeRO stage 2 from zero_stage's default (DeepSpeedPlugin.__post_init__)")
            fields = [f"zero_stage: {value['stage']}"] if isinstance(value, dict) and "stage" in value else []
            for part in ("offload_optimizer", "offload_param"):
                device = (value.get(part) or {}).get("device") if isinstance(value, dict) else None
                if isinstance(device, str):
                    fields.append(f"{part}_device: {device}")
            fix = ("move the block into a ds_config.json named by deepspeed_config_file" +
                   (f", or use the plugin fields {', '.join(fields)}" if fields else ""))
        elif key in ("fp16", "bf16", "bfloat16"):
            instead = f"the precision of mixed_precision ({mixed_precision or 'no'})"
            fix = "set the top-level mixed_precision (bf16 or fp16) instead"
        elif key in ("train_batch_size", "train_micro_batch_size_per_gpu"):
            instead = f"{key} 'auto', filled from the script's batch size"
            fix = "set the batch size in the script, or move the key into a ds_config.json named by deepspeed_config_file"
        else:
            instead, fix = "DeepSpeed's default", "move it into a ds_config.json named by deepspeed_config_file"
        out.append(Finding("config", severity, f"{where}: deepspeed_config.{key} is not an Accelerate DeepSpeed plugin "
                           f"field{_closest(key, PLUGIN_KEYS)}: `accelerate launch` drops it and runs {instead}; {fix}"))
    return out


def _from_accelerate(path: Path) -> dict:
    doc = _yaml_doc(path)
    precision = _effective_precision(doc, None)
    section = doc["deepspeed_config"]
    ds, notes = plugin_config(section, precision, str(path))
    return AccelerateConfig(ds, notes + _accelerate_notes(doc, section, precision, str(path), False),
                            zero3_init_flag(None, section))


def plugin_config(plugin: dict, mixed_precision, yaml_path: str | None) -> tuple[dict, list]:
    """(ds_config, findings): the ds_config Accelerate builds from its DeepSpeed plugin fields
    (accelerate/utils/dataclasses.py DeepSpeedPlugin.__post_init__), or the deepspeed_config_file they
    name. DeepSpeedPlugin opens a relative file from the training processes' working directory, the
    launch's (HfDeepSpeedConfig), not the YAML's folder: found only beside the YAML, it is read from
    there with a warning."""
    if plugin.get("deepspeed_config_file"):
        name = Path(str(plugin["deepspeed_config_file"]))
        beside = Path(yaml_path).parent / name if yaml_path and not name.is_absolute() else None
        if not name.is_absolute() and not name.exists() and beside is not None and beside.exists():
            return load_config(beside)[0], [Finding(
                "config", "warning", f"{yaml_path}: deepspeed_config_file {str(name)!r} is relative: Accelerate opens "
                f"it from the launch's working directory ({Path.cwd()} here, where it is missing), not the YAML's "
                f"folder; read from {str(beside)!r}: launch from that folder, or write the path absolute")]
        return load_config(name)[0], []
    zero = {"stage": plugin.get("zero_stage") if plugin.get("zero_stage") is not None else 2}
    for part, key in (("offload_optimizer", "offload_optimizer_device"), ("offload_param", "offload_param_device")):
        if plugin.get(key) not in (None, "none"):
            zero[part] = {"device": plugin[key]}
    accumulation = plugin.get("gradient_accumulation_steps")
    ds = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
          "gradient_accumulation_steps": 1 if accumulation is None else accumulation, "zero_optimization": zero}
    # utils/launch.py prepare_deepspeed_cmd_env: PrecisionType(args.mixed_precision.lower())
    precision = str(mixed_precision).lower()
    if precision in ("bf16", "fp16"):
        ds[precision] = {"enabled": True}
    return ds, []


def from_accelerate_launch(command: str) -> tuple[dict, int | None]:
    """(ds_config, processes) of an `accelerate launch ...` command line that starts DeepSpeed, read as
    accelerate 1.16 commands/launch.py _validate_launch_command reads it: the --config_file YAML gives
    the defaults (distributed_type, deepspeed_config, mixed_precision, num_processes), the flags on the
    line win where given; the script and its own arguments are ignored. processes is None where
    neither gives num_processes."""
    import argparse
    import shlex

    flag = "--accelerate-launch"
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise InputError(f"{flag}: cannot split the command line ({exc})") from None

    class Quiet(argparse.ArgumentParser):
        def error(self, message):
            raise InputError(f"{flag}: {message}")

    p = Quiet(add_help=False)

    def add(name, **kw):  # commands/utils.py _StoreAction: each --a_b flag is also --a-b
        p.add_argument(name, *([name.replace("_", "-")] if "_" in name else []), **kw)

    paradigms = ("--use_deepspeed", "--use_fsdp", "--use_megatron_lm", "--multi_gpu", "--tpu", "--cpu")
    for name in paradigms:
        add(name, action="store_true")
    for name in ("--config_file", "--mixed_precision", "--deepspeed_config_file", "--offload_optimizer_device",
                 "--offload_param_device", "--zero3_init_flag"):
        add(name, type=str)
    for name in ("--zero_stage", "--gradient_accumulation_steps", "--num_processes", "--num_machines"):
        add(name, type=int)
    args, _ = p.parse_known_args(words)
    if sum(bool(getattr(args, k)) for k in ("multi_gpu", "cpu", "tpu", "use_deepspeed", "use_fsdp")) > 1:
        # _validate_launch_command's first sanity check
        raise InputError(f"{flag}: only one of --cpu, --multi_gpu, --tpu, --use_deepspeed, --use_fsdp at a time "
                         "(accelerate launch refuses the line)")
    # without --config_file Accelerate reads its default config where one exists (not with --cpu)
    default = default_accelerate_config()
    if args.config_file is None and not args.cpu and default.is_file():
        args.config_file = str(default)
    doc = _read_yaml(Path(args.config_file), flag) if args.config_file else {}  # relative to the cwd, as Accelerate
    kind = doc.get("distributed_type")
    if args.config_file and kind is None:  # config_args.py BaseConfig.process_config
        raise InputError(f"{flag}: --config_file {args.config_file!r} has no distributed_type (Accelerate refuses it)")
    chosen = any(getattr(args, name[2:]) for name in paradigms[:-1])
    # _validate_launch_command: without a paradigm flag on the line, the file's distributed_type decides;
    # launch_command starts DeepSpeed only without --cpu. A bare --deepspeed_config_file (no --config_file)
    # is taken as DeepSpeed, as Accelerate's default config file (not read here) would have to say
    deepspeed = (args.use_deepspeed or (not chosen and str(kind) == "DEEPSPEED")
                 or (not args.config_file and not chosen and args.deepspeed_config_file is not None))
    if args.cpu:  # launch_command: `args.use_deepspeed and not args.cpu`
        raise InputError(f"{flag}: --cpu runs the script on the CPU: not a DeepSpeed launch")
    if not deepspeed:
        other = [name for name in paradigms[1:-1] if getattr(args, name[2:])]
        said = (f" ({other[0]} on it overrides --config_file's distributed_type)" if other and args.config_file else
                f" and --config_file's distributed_type is {kind}" if args.config_file else "")
        raise InputError(f"{flag}: no --use_deepspeed in the command{said}: not a DeepSpeed launch")
    section = doc.get("deepspeed_config") or {}
    keys = ("deepspeed_config_file", "zero_stage", "offload_optimizer_device", "offload_param_device",
            "gradient_accumulation_steps")
    # a flag given on the line wins (args.nondefault); the YAML's section fills the rest
    plugin = {k: getattr(args, k) if getattr(args, k) is not None else section.get(k) for k in keys}
    line_precision = bool(args.mixed_precision)
    precision = _effective_precision(doc, args.mixed_precision)
    ds, notes = plugin_config(plugin, precision, None)
    notes += _accelerate_notes(doc, plugin, precision, f"--config_file {args.config_file}", line_precision) if doc else []
    processes = args.num_processes if args.num_processes is not None else yaml_num_processes(doc)
    return AccelerateConfig(ds, notes, zero3_init_flag(args.zero3_init_flag, section)), processes
