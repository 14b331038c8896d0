"""`planner check` on Accelerate inputs, against Accelerate's own code: an Accelerate YAML whose
deepspeed_config carries keys Accelerate drops (a nested zero_optimization block), the legacy
top-level `fp16`, and `accelerate launch --config_file ...` lines. Accelerate's side is its own loader
(config_args.py load_config_from_file), launch parser and _validate_launch_command, the environment
prepare_deepspeed_cmd_env hands the training process, and the DeepSpeedPlugin built from it."""

import io
import json
import os
import sys

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from planner import cli, ds_config  # noqa: E402

config_args = pytest.importorskip("accelerate.commands.config.config_args")
accel_launch = pytest.importorskip("accelerate.commands.launch")
accel_launch_utils = pytest.importorskip("accelerate.utils.launch")
accel_utils = pytest.importorskip("accelerate.utils")

PRECISION = {"no": "fp32", "fp16": "fp16", "bf16": "bf16"}  # Accelerate's mixed_precision -> the planner's name

# seeds of issue 33: DeepSpeed's own config keys written under Accelerate's deepspeed_config section
NESTED = """compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
deepspeed_config:
  zero_optimization:
    stage: 3
    offload_optimizer:
      device: cpu
  bf16:
    enabled: true
  train_micro_batch_size_per_gpu: 1
  gradient_accumulation_steps: 1
mixed_precision: bf16
num_processes: 8
num_machines: 1
"""
PLUGIN = """compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
deepspeed_config:
  zero_stage: 3
  gradient_accumulation_steps: 1
mixed_precision: bf16
num_machines: 1
"""


def run(*argv):
    """The CLI in process, without DeepSpeed's own verdict (a child process)."""
    out, err = io.StringIO(), io.StringIO()
    old, sys.stderr = sys.stderr, err
    try:
        code = cli.main([*argv, "--no-deepspeed"], out=out)
    finally:
        sys.stderr = old
    return code, out.getvalue(), err.getvalue()


def accelerate_launch(argv, monkeypatch):
    """What `accelerate launch ARGV train.py` starts, by Accelerate's own code, without starting it:
    (use_deepspeed, num_processes, mixed_precision, DeepSpeedPlugin or None)."""
    args = accel_launch.launch_command_parser().parse_args([*argv, "train.py"])
    args, defaults, mp_from_config = accel_launch._validate_launch_command(args)
    if not (args.use_deepspeed and not args.cpu):
        return False, args.num_processes, args.mixed_precision, None
    # accelerate.commands.launch.launch_command, verbatim
    fields = list(defaults.deepspeed_config.keys()) if defaults else []
    if mp_from_config:
        fields.append("mixed_precision")
    args.deepspeed_fields_from_accelerate_config = ",".join(fields)
    _, env = accel_launch_utils.prepare_deepspeed_cmd_env(args)
    for key, value in env.items():
        if key.startswith("ACCELERATE_"):
            monkeypatch.setenv(key, value)
    return True, args.num_processes, env["ACCELERATE_MIXED_PRECISION"], accel_utils.DeepSpeedPlugin()


def plugin_fields():
    """The keys `accelerate launch` reads from deepspeed_config: its parser's DeepSpeed arguments."""
    parser = accel_launch.launch_command_parser()
    group = next(g for g in parser._action_groups if g.title == "DeepSpeed Arguments")
    return {a.dest for a in group._group_actions}


def test_plugin_keys_are_accelerates_own():
    assert set(ds_config.PLUGIN_KEYS) == plugin_fields()


def test_a_nested_zero_block_is_dropped_and_named(tmp_path, monkeypatch):
    path = tmp_path / "nested.yaml"
    path.write_text(NESTED)
    monkeypatch.chdir(tmp_path)
    loaded = config_args.load_config_from_file(str(path))
    dropped = set(loaded.deepspeed_config) - plugin_fields()
    assert dropped == {"zero_optimization", "bf16", "train_micro_batch_size_per_gpu"}
    deepspeed, processes, precision, plugin = accelerate_launch(["--config_file", str(path)], monkeypatch)
    assert deepspeed and plugin.zero_stage == 2 and plugin.offload_optimizer_device == "none"  # not the block's 3/cpu
    for argv in (["--config", str(path)], ["--accelerate-launch", "accelerate launch --config_file nested.yaml train.py"]):
        code, out, err = run("check", *argv, "--model", "llama-3-8b", "--json")
        assert code in (0, 1), err
        d = json.loads(out)
        lay = d["estimate"]["layout"]
        assert (lay["zero"], lay["offload_optimizer"]) == (plugin.zero_stage, plugin.offload_optimizer_device)
        assert d["estimate"]["training"]["precision"] == PRECISION[precision]
        assert lay["dp"] == processes
        notes = [f for f in d["findings"] if f["kind"] == "config" and "deepspeed_config." in f["message"]]
        assert {key for key in dropped for f in notes if f"deepspeed_config.{key} " in f["message"]} == dropped
        zero = next(f for f in notes if "deepspeed_config.zero_optimization " in f["message"])
        assert zero["severity"] == "warning"
        for words in (f"ZeRO stage {plugin.zero_stage} from zero_stage's default", "deepspeed_config_file",
                      "zero_stage: 3", "offload_optimizer_device: cpu"):
            assert words in zero["message"], zero["message"]


@pytest.mark.parametrize("top", ["fp16: true\n", "fp16: false\n", "fp16: true\nmixed_precision: bf16\n",
                                 "fp16: true\nmixed_precision: 'no'\n", "mixed_precision: fp16\n", ""])
def test_the_legacy_fp16_key_reads_as_accelerate_reads_it(tmp_path, monkeypatch, top):
    path = tmp_path / "acc.yaml"
    path.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n"
                    "  zero_stage: 2\n  gradient_accumulation_steps: 1\nnum_processes: 8\nnum_machines: 1\n" + top)
    loaded = config_args.load_config_from_file(str(path))  # process_config folds the legacy key in
    _, _, precision, _ = accelerate_launch(["--config_file", str(path)], monkeypatch)
    assert precision == (loaded.mixed_precision or "no")
    code, out, err = run("check", "--config", str(path), "--model", "llama-3-8b", "--json")
    assert code in (0, 1), err
    d = json.loads(out)
    assert d["estimate"]["training"]["precision"] == PRECISION[precision]
    legacy = [f for f in d["findings"] if "top-level fp16" in f["message"]]
    if top.startswith("fp16: true") and "mixed_precision" in top and precision != "fp16":
        assert [f["severity"] for f in legacy] == ["warning"]  # fp16 given, but mixed_precision wins
    elif top == "fp16: true\n":
        assert [f["severity"] for f in legacy] == ["info"]
    else:
        assert legacy == []


def write_launch_yaml(tmp_path, kind="DEEPSPEED", processes=None):
    text = PLUGIN.replace("DEEPSPEED", kind) + (f"num_processes: {processes}\n" if processes else "")
    (tmp_path / "ds.yaml").write_text(text)


@pytest.mark.parametrize("flags, processes", [
    ("--config_file ds.yaml --num_processes 8", None),
    ("--config_file ds.yaml --use_deepspeed --num_processes 8", None),
    ("--config_file ds.yaml --use_deepspeed --zero_stage 1 --mixed_precision fp16 --num_processes 8", None),
    ("--config_file ds.yaml --zero-stage 0 --num_processes 4", None),
    ("--config_file ds.yaml", 16),
    ("--config_file ds.yaml --num_processes 8", 16),
    ("--use_deepspeed --config_file ds.yaml", 8),
])
def test_a_launch_line_reads_its_config_file_as_accelerate_does(tmp_path, monkeypatch, flags, processes):
    write_launch_yaml(tmp_path, processes=processes)
    monkeypatch.chdir(tmp_path)  # --config_file is relative to the current directory, as in Accelerate
    deepspeed, n, precision, plugin = accelerate_launch(flags.split(), monkeypatch)
    assert deepspeed
    code, out, err = run("check", "--accelerate-launch", f"accelerate launch {flags} train.py --lr 1e-4",
                         "--model", "llama-3-8b", "--json")
    assert code in (0, 1), err
    d = json.loads(out)
    lay = d["estimate"]["layout"]
    assert (lay["zero"], lay["dp"]) == (plugin.zero_stage, n)
    assert d["estimate"]["training"]["precision"] == PRECISION[precision]


def test_a_launch_without_a_process_count_asks_for_gpus(tmp_path, monkeypatch):
    write_launch_yaml(tmp_path)
    monkeypatch.chdir(tmp_path)
    for flags in ("--config_file ds.yaml", "--config_file ds.yaml --use_deepspeed"):
        with pytest.raises(ValueError, match="num_processes"):  # Accelerate refuses it too
            accelerate_launch(flags.split(), monkeypatch)
        code, out, err = run("check", "--accelerate-launch", f"accelerate launch {flags} train.py",
                             "--model", "llama-3-8b")
        assert code == 2 and out == "" and err.startswith("planner: error: --gpus: required") and "None" not in err
        assert len(err.strip().splitlines()) == 1
        code, out, err = run("check", "--accelerate-launch", f"accelerate launch {flags} train.py",
                             "--model", "llama-3-8b", "--gpus", "8", "--json")
        assert code in (0, 1) and json.loads(out)["estimate"]["layout"]["dp"] == 8, err


@pytest.mark.parametrize("kind, flags", [
    ("MULTI_GPU", "--config_file ds.yaml --num_processes 8"),
    ("MULTI_GPU", "--config_file ds.yaml --use_deepspeed --num_processes 8"),
    ("DEEPSPEED", "--config_file ds.yaml --multi_gpu --num_processes 8"),
    ("DEEPSPEED", "--config_file ds.yaml --use_fsdp --num_processes 8"),
])
def test_only_a_launch_that_starts_deepspeed_is_checked(tmp_path, monkeypatch, kind, flags):
    write_launch_yaml(tmp_path, kind)
    monkeypatch.chdir(tmp_path)
    deepspeed, *_ = accelerate_launch(flags.split(), monkeypatch)
    code, out, err = run("check", "--accelerate-launch", f"accelerate launch {flags} train.py",
                         "--model", "llama-3-8b")
    if deepspeed:
        assert code in (0, 1), err
    else:
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "not a DeepSpeed launch" in err


def test_conflicting_paradigm_flags_are_refused_like_accelerate(tmp_path, monkeypatch):
    write_launch_yaml(tmp_path)
    monkeypatch.chdir(tmp_path)
    flags = "--config_file ds.yaml --use_deepspeed --multi_gpu --num_processes 8"
    with pytest.raises(ValueError, match="only use one of"):
        accelerate_launch(flags.split(), monkeypatch)
    code, out, err = run("check", "--accelerate-launch", f"accelerate launch {flags} train.py", "--model", "llama-3-8b")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("section, top", [
    ("  zero_stage: 3\n", ""), ("", "mixed_precision: bf16\n"), ("  zero3_init_flag: true\n", ""),
    ("  gradient_accumulation_steps: 2\n", "mixed_precision: 'no'\n")])
def test_plugin_fields_beside_a_deepspeed_config_file(tmp_path, monkeypatch, section, top):
    (tmp_path / "ds_config.json").write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 3}}))
    path = tmp_path / "acc.yaml"
    path.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n"
                    f"  deepspeed_config_file: {tmp_path / 'ds_config.json'}\n{section}num_processes: 8\n{top}")
    try:
        accelerate_launch(["--config_file", str(path)], monkeypatch)
        refused = False
    except ValueError as exc:
        refused = "deepspeed_config_file" in str(exc)
    code, out, err = run("check", "--config", str(path), "--model", "llama-3-8b", "--json")
    assert code in (0, 1), err
    errors = [f for f in json.loads(out)["findings"] if "DeepSpeedPlugin refuses" in f["message"]]
    assert [f["severity"] for f in errors] == (["error"] if refused else [])


def test_a_group_setting_zero_does_not_have_is_not_sent_to_a_boolean():
    """DeepSpeed 0.19.8's DeepSpeedZeroConfig has no process-group field beside sub_group_size (a
    parameter-count chunk) and zero_hpz_partition_size; reduce_scatter, the nearest name, is a boolean."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from planner.ds_rules import config_findings

    fields = DeepSpeedZeroConfig.model_fields
    assert fields["reduce_scatter"].annotation is bool and "reduce_scatter_groups" not in fields
    assert [k for k in fields if "group" in k or "hpz" in k] == ["sub_group_size", "zero_hpz_partition_size"]
    text = " ".join(f.message for f in config_findings({"zero_optimization": {"stage": 3, "reduce_scatter_groups": 2}}, 1))
    assert "did you mean 'reduce_scatter'" not in text and "zero_hpz_partition_size" in text


ZERO3 = """compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
mixed_precision: bf16
num_processes: 16
deepspeed_config:
  zero_stage: 3
"""


@pytest.mark.parametrize("yaml_flag, line, env, want", [
    ("  zero3_init_flag: true\n", "", "false", True),  # the YAML's beats the environment
    ("  zero3_init_flag: true\n", "--zero3_init_flag false", None, False),  # the line beats the YAML
    ("", "", "false", False),  # neither: the environment the launch inherits
    ("", "", None, None),  # unset: DeepSpeedPlugin turns it on under ZeRO-3
])
def test_zero3_init_flag_comes_from_where_accelerate_takes_it(tmp_path, monkeypatch, yaml_flag, line, env, want):
    (tmp_path / "z3.yaml").write_text(ZERO3 + yaml_flag)
    monkeypatch.chdir(tmp_path)
    if env is None:
        monkeypatch.delenv("ACCELERATE_DEEPSPEED_ZERO3_INIT", raising=False)
    else:
        monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO3_INIT", env)
    ours = ds_config.from_accelerate_launch(f"accelerate launch --config_file z3.yaml {line} train.py")[0]
    _, _, _, plugin = accelerate_launch(["--config_file", "z3.yaml", *line.split()], monkeypatch)
    assert ours.zero3_init_flag is want
    assert plugin.zero3_init_flag == (True if want is None else want)  # DeepSpeedPlugin: unset is on at ZeRO-3
    code, out, err = run("check", "--accelerate-launch", f"accelerate launch --config_file z3.yaml {line} train.py",
                         "--model", "llama-3-70b", "--json")
    load = [f for f in json.loads(out)["findings"] if "zero.Init" in f["message"]]
    # 70B in bf16 is 141 GB a rank at load without zero.Init: out of memory on an 80 GB H100
    assert [f["severity"] for f in load] == ([] if plugin.zero3_init_flag else ["error"]), (code, err)


def test_a_launch_argument_nested_in_deepspeed_config_is_applied_not_dropped(tmp_path, monkeypatch):
    # _validate_launch_command copies every key of the section onto the launch arguments: a nested
    # mixed_precision then wins over the top-level one
    (tmp_path / "mp.yaml").write_text(ZERO3.replace("mixed_precision: bf16", "mixed_precision: fp16")
                                      + "  mixed_precision: bf16\n")
    monkeypatch.chdir(tmp_path)
    _, _, precision, plugin = accelerate_launch(["--config_file", "mp.yaml"], monkeypatch)
    assert precision == "bf16"
    for argv in (["--config", "mp.yaml"], ["--accelerate-launch", "accelerate launch --config_file mp.yaml t.py"]):
        code, out, err = run("check", *argv, "--model", "llama-3-8b", "--json")
        d = json.loads(out)
        assert d["estimate"]["training"]["precision"] == PRECISION[precision], err
        note = next(f for f in d["findings"] if "deepspeed_config.mixed_precision" in f["message"])
        assert note["severity"] == "info" and "drops" not in note["message"] and "'bf16'" in note["message"]


def test_a_nested_process_count_wins_as_in_accelerate(tmp_path, monkeypatch):
    (tmp_path / "np.yaml").write_text(ZERO3 + "  num_processes: 8\n")  # top-level 16, nested 8
    monkeypatch.chdir(tmp_path)
    _, processes, _, _ = accelerate_launch(["--config_file", "np.yaml"], monkeypatch)
    assert processes == 8
    assert ds_config.from_accelerate_launch("accelerate launch --config_file np.yaml t.py")[1] == processes
    assert ds_config.accelerate_num_processes(tmp_path / "np.yaml") == processes


def test_launch_arguments_the_planner_reads_are_accelerates():
    assert set(ds_config.LAUNCH_ARGS) <= {a.dest for a in accel_launch.launch_command_parser()._actions}


def test_without_config_file_the_default_config_is_read(tmp_path, monkeypatch):
    """accelerate launch with no --config_file reads $HF_HOME/accelerate/default_config.yaml
    (commands/config/config_args.py default_config_file, fixed when Accelerate is imported: set here
    in its modules as HF_HOME sets it for the planner)."""
    default = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    default.parent.mkdir(parents=True)
    default.write_text(ZERO3)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert ds_config.default_accelerate_config() == default
    monkeypatch.setattr(accel_launch, "default_config_file", str(default))
    monkeypatch.setattr(config_args, "default_config_file", str(default))
    deepspeed, processes, _, plugin = accelerate_launch([], monkeypatch)
    assert deepspeed and (processes, plugin.zero_stage) == (16, 3)
    ds, n = ds_config.from_accelerate_launch("accelerate launch train.py")
    assert (ds["zero_optimization"]["stage"], n) == (plugin.zero_stage, processes)


def test_a_relative_deepspeed_config_file_is_opened_from_the_launch_directory(tmp_path, monkeypatch):
    # DeepSpeedPlugin opens it from the working directory: found only beside the YAML, it is a warning
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "ds.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 1,
                                                          "zero_optimization": {"stage": 1}}))
    (tmp_path / "cfg" / "acc.yaml").write_text("distributed_type: DEEPSPEED\nnum_processes: 8\n"
                                               "deepspeed_config:\n  deepspeed_config_file: ds.json\n")
    monkeypatch.chdir(tmp_path)
    ds, _ = ds_config.load_config("cfg/acc.yaml")
    assert ds["zero_optimization"]["stage"] == 1
    assert any("working directory" in f.message and f.severity == "warning" for f in ds.notes)
    monkeypatch.chdir(tmp_path / "cfg")  # launched from the YAML's folder: found, nothing to say
    ds, _ = ds_config.load_config("acc.yaml")
    assert not any("working directory" in f.message for f in ds.notes)
