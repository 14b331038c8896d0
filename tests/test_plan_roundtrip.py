"""--emit DIR then `planner check DIR`: the check reads DIR/plan.json and answers what the recommend
or estimate that wrote the directory answered (issue 33, item 9). A consistency test between two code
paths: the search's record of the chosen layout, and the doctor's prediction from the emitted files."""

import json
import os

import pytest

from planner import plan_file
from test_check import run  # noqa: E402  the CLI in process (check without DeepSpeed's child process)

os.environ.setdefault("DS_ACCELERATOR", "cpu")

ENGINES = ("deepspeed", "megatron-deepspeed", "megatron", "fsdp", "torchtitan")


def figures(record: dict) -> tuple:
    mem = record["memory"]
    return mem["verdict"], mem["fits"], mem["required_bytes"], mem["gpu_bytes"], record["throughput"]["tokens_per_s"]


def check_dir(directory, *flags) -> dict:
    code, out, err = run("check", str(directory), "--no-deepspeed", "--json", *flags)
    assert code in (0, 1), err
    answer = json.loads(out)
    assert answer["plan"] == str(directory / "plan.json")
    return answer


@pytest.mark.parametrize("engine", ENGINES)
def test_recommend_then_check_agree(tmp_path, engine):
    code, out, err = run("recommend", "--model", "llama-3-8b", "--gpus", "8", "--engine", engine, "--top", "1",
                         "--emit", str(tmp_path), "--json")
    assert code == 0, err
    answer = json.loads(out)
    chosen = answer["clear_fit"] or answer["layouts"][0]  # the layout --emit wrote (cli.cmd_recommend)
    assert str(tmp_path / "plan.json") in chosen["emitted"]
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["schema"] == plan_file.SCHEMA and plan["training"]["engine"] == engine
    assert plan["layout"]["recompute"] == chosen["layout"]["recompute"]
    answer = check_dir(tmp_path)
    assert figures(answer["estimate"]) == figures(chosen)
    assert answer["estimate"]["layout"] == chosen["layout"]
    assert answer["source"] == ("deepspeed" if engine in ("deepspeed", "megatron-deepspeed") else "plan")


# layouts where the config cannot say what the plan assumed: full recompute, TP with sequence
# parallelism and checkpointed inputs in host memory, a DeepSpeed pipeline, partial recompute
ESTIMATES = [
    ("deepspeed", ["--zero", "3", "--recompute", "full", "--mbs", "4", "--gbs", "64"]),
    ("deepspeed", ["--zero", "1", "--pp", "2", "--recompute", "full", "--gbs", "64"]),
    ("megatron-deepspeed", ["--tp", "2", "--zero", "1", "--recompute", "full", "--partition-activations",
                            "--cpu-checkpointing", "--gbs", "64"]),
    ("megatron", ["--tp", "2", "--pp", "2", "--vpp", "2", "--zero", "1", "--recompute", "selective", "--gbs", "64"]),
    ("fsdp", ["--zero", "3", "--recompute", "full", "--recompute-layers", "16", "--mbs", "2", "--gbs", "64"]),
    ("torchtitan", ["--zero", "3", "--recompute", "full", "--mbs", "2", "--gbs", "64"]),
    # FP8 GEMMs: the recipe and Megatron's FP8 parameters are in the plan, not in a DeepSpeed config
    ("megatron", ["--zero", "0", "--precision", "fp8", "--fp8-recipe", "tensorwise", "--recompute", "full", "--gbs", "64"]),
    ("torchtitan", ["--zero", "3", "--precision", "fp8", "--recompute", "full", "--mbs", "2", "--gbs", "64"]),
]


@pytest.mark.parametrize("engine,flags", ESTIMATES)
def test_estimate_then_check_agree(tmp_path, engine, flags):
    code, out, err = run("estimate", "--model", "llama-3-8b", "--gpus", "8", "--seq-len", "8192", "--engine", engine,
                         *flags, "--emit", str(tmp_path), "--json")
    assert code == 0, err
    estimate = json.loads(out)
    answer = check_dir(tmp_path)
    assert figures(answer["estimate"]) == figures(estimate)
    planned, checked = dict(estimate["training"]), dict(answer["estimate"]["training"])
    if planned["zero_config"]["overlap_comm"] is None:  # ds_config.json writes DeepSpeed's resolved default
        checked["zero_config"]["overlap_comm"] = None
    assert checked == planned
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["training"]["seq_len"] == 8192 and plan["recompute_where"]  # where recompute is switched on


def test_the_issue_case_keeps_its_recompute(tmp_path):
    """70B on 16 GPUs: recommend writes a full-recompute layout; checking ds_config.json alone assumed
    none and answered 554 GiB per GPU. With the plan beside it, the check agrees with recommend."""
    code, out, _ = run("recommend", "--params", "70e9", "--gpus", "16", "--top", "1", "--emit", str(tmp_path), "--json")
    assert code == 0
    answer = json.loads(out)
    chosen = answer["clear_fit"] or answer["layouts"][0]
    assert chosen["layout"]["recompute"] == "full"
    code, out, err = run("check", "--config", str(tmp_path / "ds_config.json"), "--params", "70e9", "--gpus", "16",
                         "--no-deepspeed", "--json")
    assert code == 0, err
    assert figures(json.loads(out)["estimate"]) == figures(chosen)
    # no DeepSpeed key switches a Hugging Face model's recompute on: the plan and launch.sh say where
    assert "activation_checkpointing" not in json.loads((tmp_path / "ds_config.json").read_text())
    assert "activation_checkpointing_enable(every_n_layers=1)" in (tmp_path / "launch.sh").read_text()


def test_flags_on_the_check_line_win_over_the_plan(tmp_path):
    base = ["--model", "llama-3-8b", "--gpus", "8", "--engine", "fsdp", "--zero", "3", "--mbs", "2", "--gbs", "64"]
    code, _, _ = run("estimate", *base, "--recompute", "full", "--emit", str(tmp_path))
    assert code == 0
    planned = check_dir(tmp_path)["estimate"]
    code, out, _ = run("estimate", *base, "--recompute", "none", "--seq-len", "2048", "--json")
    without = json.loads(out)
    flagged = check_dir(tmp_path, "--recompute", "none", "--seq-len", "2048")["estimate"]
    assert figures(flagged) == figures(without) != figures(planned)


def test_megatron_deepspeed_checkpoints_in_cpu_by_its_flag(tmp_path):
    """Megatron-DeepSpeed passes its store_true --checkpoint-in-cpu to deepspeed.checkpointing.configure
    over the config's cpu_checkpointing (megatron/initialize.py), so the plan's host checkpoints need it."""
    code, _, _ = run("estimate", "--model", "llama-3-8b", "--gpus", "8", "--engine", "megatron-deepspeed", "--tp", "2",
                     "--zero", "1", "--recompute", "full", "--cpu-checkpointing", "--emit", str(tmp_path))
    assert code == 0
    args = (tmp_path / "megatron_args.txt").read_text().split("\n")
    assert "--deepspeed-activation-checkpointing" in args and "--checkpoint-in-cpu" in args
    assert json.loads((tmp_path / "ds_config.json").read_text())["activation_checkpointing"]["cpu_checkpointing"]


@pytest.mark.parametrize("text,message", [
    (None, "holds no plan.json or ds_config.json"),
    ('{"schema": "other/2", "model": {}}', "is not a planner plan (schema 'other/2'"),
    ('{"schema": "planner-plan/1", ', "is not valid JSON"),
    ('{"schema": "planner-plan/1", "model": {"layers": 2}, "cluster": {}, "training": {}, "layout": {}}', "model:"),
])
def test_bad_plans_are_one_line_and_exit_2(tmp_path, text, message):
    if text is not None:
        (tmp_path / "plan.json").write_text(text)
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = run("check", str(tmp_path), "--no-deepspeed", "--emit", str(tmp_path / "out"))
    assert code == 2 and not out and message in err and err.startswith("planner: error: --config:")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_directory_and_config_together_is_an_input_error(tmp_path):
    code, _, err = run("check", str(tmp_path), "--config", str(tmp_path / "ds_config.json"))
    assert code == 2 and "not both" in err


def test_every_way_of_naming_the_directory_agrees(tmp_path):
    code, out, _ = run("estimate", "--model", "llama-3-8b", "--gpus", "8", "--zero", "2", "--mbs", "2", "--gbs", "64",
                       "--recompute", "full", "--emit", str(tmp_path), "--json")
    assert code == 0
    planned = figures(json.loads(out))
    for name in ("ds_config.json", "accelerate_config.yaml", "plan.json", "launch.sh"):
        code, out, err = run("check", "--config", str(tmp_path / name), "--no-deepspeed", "--json")
        assert code == 0, err
        assert figures(json.loads(out)["estimate"]) == planned, name


def test_an_edited_config_is_checked_as_edited(tmp_path):
    """What the DeepSpeed config states (batch, ZeRO stage) comes from the config, the rest from the plan."""
    code, _, _ = run("estimate", "--model", "llama-3-8b", "--gpus", "8", "--zero", "2", "--mbs", "2", "--gbs", "64",
                     "--recompute", "full", "--emit", str(tmp_path))
    assert code == 0
    path = tmp_path / "ds_config.json"
    ds = json.loads(path.read_text())
    ds.update(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=8)
    ds["zero_optimization"]["stage"] = 3
    path.write_text(json.dumps(ds))
    layout = check_dir(tmp_path)["estimate"]["layout"]
    assert (layout["mbs"], layout["gas"], layout["zero"], layout["recompute"]) == (1, 8, 3, "full")
