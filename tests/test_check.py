"""`planner check`: the config doctor. Its key lists against DeepSpeed's own config classes, its
verdicts on configs in the shapes people publish (DeepSpeed's docs, Accelerate, Megatron-DeepSpeed
scripts) and on broken ones against DeepSpeed's own DeepSpeedConfig, its prediction against
`planner estimate` of the same run."""

import io
import json
import os
import sys
from pathlib import Path

import pytest

from planner import cli, ds_rules

os.environ.setdefault("DS_ACCELERATOR", "cpu")
GiB = 2**30


def run(*argv, deepspeed=False):
    """The CLI in process; `check` without DeepSpeed's own verdict (a child process) unless asked."""
    if argv[:1] == ("check",) and not deepspeed:
        argv = (*argv, "--no-deepspeed")
    out, err = io.StringIO(), io.StringIO()
    old, sys.stderr = sys.stderr, err
    try:
        code = cli.main(list(argv), out=out)
    finally:
        sys.stderr = old
    return code, out.getvalue(), err.getvalue()


def write(tmp_path, name, doc) -> str:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


# DeepSpeed's docs, ZeRO tutorial (docs/_tutorials/zero.md, "ZeRO-3 Offload" example config)
DS_DOCS_ZERO3_OFFLOAD = {
    "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
    "zero_optimization": {"stage": 3, "contiguous_gradients": True, "stage3_max_live_parameters": 1e9,
                          "stage3_max_reuse_distance": 1e9, "stage3_prefetch_bucket_size": 1e7,
                          "stage3_param_persistence_threshold": 1e5, "reduce_bucket_size": 1e7, "sub_group_size": 1e9,
                          "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}}
# Hugging Face's ds_config_zero2.json (transformers docs, "DeepSpeed" page): the "auto" style
HF_ZERO2_AUTO = {
    "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "allgather_partitions": True, "allgather_bucket_size": 2e8, "overlap_comm": True,
                          "reduce_scatter": True, "reduce_bucket_size": "auto", "contiguous_gradients": True},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False}
# Megatron-DeepSpeed examples_deepspeed/pretrain_llama2_distributed.sh writes this ds_config (ZeRO-1, bf16)
MEGATRON_DS_SCRIPT = {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 1,
                      "zero_optimization": {"stage": 1}, "bf16": {"enabled": True}}


def test_key_lists_are_deepspeeds_own():
    zc = pytest.importorskip("deepspeed.runtime.zero.config")
    oc = pytest.importorskip("deepspeed.runtime.zero.offload_config")
    names = set()
    for name, f in zc.DeepSpeedZeroConfig.model_fields.items():
        names |= {name} | ({f.alias} if f.alias else set())
    assert set(ds_rules.ZERO_KEYS) == names
    assert set(ds_rules.OFFLOAD_KEYS["offload_optimizer"]) == set(oc.DeepSpeedZeroOffloadOptimizerConfig.model_fields)
    assert set(ds_rules.OFFLOAD_KEYS["offload_param"]) == set(oc.DeepSpeedZeroOffloadParamConfig.model_fields)
    # every top-level key the doctor knows is a string DeepSpeed's own code reads
    import deepspeed

    source = "".join(p.read_text(errors="ignore") for p in Path(deepspeed.__file__).parent.rglob("*.py"))
    missing = [k for k in ds_rules.TOP_LEVEL_KEYS if f'"{k}"' not in source and f"'{k}'" not in source]
    assert not missing
    # and every key runtime/config.py looks up is one the doctor knows, or a key of a section it reads
    # (optimizer/scheduler type and params, torch_autocast dtype, ..., which these patterns also catch)
    import re

    from deepspeed.runtime import config as ds_runtime_config

    code = Path(ds_runtime_config.__file__).read_text()
    constants = set().union(*(re.findall(p, code) for p in (r"get_scalar_param\(param_dict,\s*([A-Z_0-9]+)",
                                                              r"param_dict\.get\(([A-Z_0-9]+)", r"([A-Z_0-9]+) in param_dict",
                                                              r"param_dict\[([A-Z_0-9]+)\]")))
    read = {getattr(ds_runtime_config, c) for c in constants if isinstance(getattr(ds_runtime_config, c, None), str)}
    section_keys = {"type", "params", "dtype", "lower_precision_safe_modules", "legacy_fusion", "log_level",
                    "vocabulary_size"}
    assert read - section_keys <= set(ds_rules.TOP_LEVEL_KEYS), sorted(read - section_keys - set(ds_rules.TOP_LEVEL_KEYS))
    assert {"expert_parallel", "managed_gradient_accumulation", "disable_python_gc"} <= read


def test_autoep_is_read_and_reported():
    # DeepSpeed 0.19.8 reads "expert_parallel" (runtime/config.py get_expert_parallel_config); its AutoEP fails to
    # initialize with transformers 5.25 (tests/test_engines.py, slow): an error finding, not "ignored"
    ds = {"train_batch_size": 4, "expert_parallel": {"enabled": True, "autoep_size": 2}, "disable_python_gc": 0}
    found = ds_rules.config_findings(ds, 1)
    assert not any("not one DeepSpeed reads" in f.message for f in found)
    assert [f.severity for f in found] == ["error"] and "AutoEP" in found[0].message


def deepspeed_refuses(ds: dict) -> bool:
    """DeepSpeed 0.19's own DeepSpeedConfig on one process (data-parallel size 1)."""
    from deepspeed.runtime.config import DeepSpeedConfig

    try:
        DeepSpeedConfig(json.loads(json.dumps(ds)))
        return False
    except Exception:  # pydantic ValidationError, AssertionError, ...: DeepSpeed will not start
        return True


@pytest.mark.parametrize("name, ds", [
    ("docs-zero3-offload", DS_DOCS_ZERO3_OFFLOAD),
    ("megatron-ds-zero1", {**MEGATRON_DS_SCRIPT, "train_batch_size": 4}),
    ("typo-in-zero", {"train_batch_size": 4, "zero_optimization": {"stage": 2, "overlap_com": True}}),
    ("typo-in-offload", {"train_batch_size": 4, "zero_optimization": {"stage": 3, "offload_optimizer": {"devce": "cpu"}}}),
    ("batch-mismatch", {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}),
    ("fp16-and-bf16", {"train_batch_size": 4, "fp16": {"enabled": True}, "bf16": {"enabled": True}}),
    ("ignored-top-level", {"train_batch_size": 4, "zero_optimisation": {"stage": 3}}),
])
def test_config_errors_are_the_ones_deepspeed_raises(name, ds):
    pytest.importorskip("deepspeed")
    found = ds_rules.config_findings(ds, 1)
    _, _, _, batch_found = ds_rules.batch(ds, 1, None)
    errors = [f for f in found + batch_found if f.severity == "error"]
    assert bool(errors) == deepspeed_refuses(ds), [f.message for f in found + batch_found]
    if name == "ignored-top-level":  # DeepSpeed starts, silently without ZeRO: the doctor says so
        assert any("did you mean 'zero_optimization'" in f.message for f in found)
    if name == "typo-in-zero":
        assert "did you mean 'overlap_comm'" in errors[0].message


def test_prediction_is_estimate_of_the_same_run(tmp_path):
    # Megatron-DeepSpeed's script config on 16 GPUs with --tp 4 --pp 2: dp = 16/(4*2) = 2,
    # gas = 32 / (4 * 2) = 4
    path = write(tmp_path, "ds_config.json", MEGATRON_DS_SCRIPT)
    code, text, _ = run("check", "--config", path, "--model", "llama-2-13b", "--gpus", "16", "--tp", "4", "--pp", "2",
                        "--json")
    d = json.loads(text)
    est = d["estimate"]
    assert est["layout"]["dp"] == 2 and est["layout"]["gas"] == 4 and est["layout"]["mbs"] == 4
    _, same, _ = run("estimate", "--model", "llama-2-13b", "--gpus", "16", "--tp", "4", "--pp", "2", "--zero", "1",
                     "--mbs", "4", "--gbs", "32", "--engine", "megatron-deepspeed", "--json")
    same = json.loads(same)
    assert est["memory"]["gpu_bytes"] == same["memory"]["gpu_bytes"]
    assert est["time"]["step_s"] == pytest.approx(same["time"]["step_s"], rel=1e-12)
    assert code == (0 if d["ok"] else 1)


def test_zero2_nvme_offload_is_checked_as_the_cpu_offload_deepspeed_runs(tmp_path):
    # DeepSpeed 0.19.8 stage_1_and_2.py: any offload_optimizer device sets cpu_offload (no NVMe below ZeRO-3)
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
          "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}}}
    path = write(tmp_path, "ds_config.json", ds)
    code, text, _ = run("check", "--config", path, "--model", "llama-2-7b", "--gpus", "8", "--json")
    d = json.loads(text)
    assert d["estimate"]["layout"]["offload_optimizer"] == "cpu"
    assert any(f["severity"] == "warning" and "as cpu" in f["message"] for f in d["findings"])
    _, same, _ = run("estimate", "--model", "llama-2-7b", "--gpus", "8", "--zero", "2", "--offload-optimizer", "cpu",
                     "--mbs", "1", "--gbs", "8", "--json")
    assert d["estimate"]["memory"]["cpu_bytes_per_node"] == json.loads(same)["memory"]["cpu_bytes_per_node"] > 0


def test_zero3_nvme_buffers_are_read_from_the_config(tmp_path):
    # offload_optimizer.buffer_count 8 (default 4) and offload_param.buffer_size 2e8 (default 1e8):
    # Llama-2-7B over 8 ranks, a partition of 6,738,415,616 / 8 = 842,301,952 (< sub_group_size 1e9),
    # so each rank pins 4 more fp32 buffers of it and 5 x (2e8 - 100,000,256) more bf16 elements (each
    # buffer rounded up to 1,024 B, partitioned_param_swapper.py _io_aligned_numel: 1e8 -> 100,000,256)
    def host_per_node(optimizer: dict, param: dict) -> float:
        ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
              "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme", **optimizer},
                                    "offload_param": {"device": "nvme", "nvme_path": "/nvme", **param}}}
        path = write(tmp_path, "ds_config.json", ds)
        _, text, _ = run("check", "--config", path, "--model", "llama-2-7b", "--gpus", "8", "--json")
        return json.loads(text)["estimate"]["memory"]["cpu_bytes_per_node"]

    more = host_per_node({"buffer_count": 8}, {"buffer_size": 200_000_000}) - host_per_node({}, {})
    assert more == pytest.approx(8 * (4 * 842_301_952 * 4 + 5 * (200_000_000 - 100_000_256) * 2), rel=1e-12)


def test_zero_infinity_reuse_buffer_is_named_with_the_sub_group_size_that_shrinks_it(tmp_path):
    # Llama-3-70B's parameters on NVMe over 16 ranks spill past max_in_cpu 1e9 (a 4.4e9 partition):
    # DeepSpeed 0.19.8 pins the largest sub-group's full parameters, 16,217,554,944 elements (the
    # arithmetic in tests/test_memory.py) x 2 B, on every rank
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
          "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"},
                                "offload_param": {"device": "nvme", "nvme_path": "/nvme"}}}
    _, text, _ = run("check", "--config", write(tmp_path, "ds_config.json", ds), "--model", "llama-3-70b",
                     "--gpus", "16", "--json")
    reuse = [f for f in json.loads(text)["findings"] if "full parameters" in f["message"]]
    assert len(reuse) == 1 and reuse[0]["value"] == 16_217_554_944 * 2
    assert "sub_group_size 100,000,000 frees" in reuse[0]["message"]


def test_a_pipelined_nvme_swapper_is_said_to_be_timed_as_the_sequential_one(tmp_path):
    # stage3.py _configure_tensor_swapping: pipeline_read or pipeline_write picks PipelinedOptimizerSwapper
    def findings(swapper: dict) -> list:
        ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
              "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme", **swapper}}}
        _, text, _ = run("check", "--config", write(tmp_path, "ds_config.json", ds), "--model", "llama-2-7b",
                         "--gpus", "8", "--json")
        return [f for f in json.loads(text)["findings"] if "pipeline_read" in f["message"]]
    assert len(findings({"pipeline_read": True})) == 1 and findings({}) == []


def test_out_of_memory_names_fixes_with_the_memory_they_free(tmp_path):
    # Llama-3-8B, ZeRO-2, micro-batch 4 of 4096 tokens without activation checkpointing on 80 GB:
    # activations alone are ~25 GiB per sequence (Korthikanti 2022 eq. 2: 34sbh + 5as^2b/ flash-attention's sbh terms)
    ds = {"train_batch_size": 256, "train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": True},
          "zero_optimization": {"stage": 2}}
    code, text, _ = run("check", "--config", write(tmp_path, "c.json", ds), "--model", "llama-3-8b", "--gpus", "16",
                        "--json")
    d = json.loads(text)
    assert code == 1 and not d["ok"]
    memory = [f for f in d["findings"] if f["kind"] == "memory"]
    assert memory[0]["severity"] == "error" and memory[0]["value"] > 80e9
    fixes = {f["message"].split(" frees")[0]: f for f in memory[1:]}
    recompute = fixes["fix: recompute full (activation checkpointing every layer)"]
    # what recompute frees is what `estimate` says the two runs differ by
    base = json.loads(run("estimate", "--model", "llama-3-8b", "--gpus", "16", "--zero", "2", "--mbs", "4", "--gbs",
                          "256", "--json")[1])["memory"]["required_bytes"]
    full = json.loads(run("estimate", "--model", "llama-3-8b", "--gpus", "16", "--zero", "2", "--mbs", "4", "--gbs",
                          "256", "--recompute", "full", "--json")[1])["memory"]["required_bytes"]
    assert recompute["frees_bytes"] == base - full and "(fits)" in recompute["message"]
    better = d["better"]
    assert better is not None and better["changes"]


def test_zero3_memory_fix_lowers_both_knobs(tmp_path):
    """DeepSpeed 0.19.8 keeps gathered what the reuse distance covers whatever max_live says
    (tests/test_deepspeed_zero3_live.py), so the fix lowers both: Llama-2-7B under ZeRO-3 on 8 GPUs of
    40 GiB, the 1e9 defaults to 1e8 frees (1e9 - 1e8) x 2 B of gathered bf16 weights, 1.8 GB, of what
    must fit (max_live alone would free (1e9 - 1e9 / 2) x 2 B = 1.0 GB)."""
    ds = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
          "zero_optimization": {"stage": 3}}
    code, text, _ = run("check", "--config", write(tmp_path, "c.json", ds), "--model", "llama-2-7b", "--gpus", "8",
                        "--gpu", "a100-40gb", "--gpu-memory-gib", "40", "--seq-len", "4096", "--json")
    fixes = [f for f in json.loads(text)["findings"] if "stage3_max_live_parameters" in f["message"]]
    assert len(fixes) == 1 and "stage3_max_reuse_distance 100,000,000" in fixes[0]["message"]
    assert fixes[0]["frees_bytes"] == pytest.approx(1.8e9, rel=1e-3)


def test_zero3_recompute_that_gathers_twice_names_the_knobs_that_keep_the_block(tmp_path):
    """Llama-3.1-405B under ZeRO-3 with DeepSpeed's 1e9 defaults and every block recomputed: the recompute
    releases gate_proj and what runs before it, 1,443,889,152 of a block's 3,187,703,808 elements (45 %;
    the norms, under stage3_param_persistence_threshold, stay whole), before the backward uses them (sharding.recompute_fetches, counted on the real engine); knobs of
    3.2e9 keep the block, for (3.2e9 - 1e9) x 2 B more of gathered weights."""
    ds = {"train_batch_size": 512, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
          "zero_optimization": {"stage": 3}}
    code, text, _ = run("check", "--config", write(tmp_path, "z3.json", ds), "--model", "llama-3.1-405b", "--gpus",
                        "512", "--gpu", "h100-sxm", "--seq-len", "4096", "--recompute", "full", "--json")
    found = [f for f in json.loads(text)["findings"] if "gathers" in f["message"]]
    assert len(found) == 1 and "45%" in found[0]["message"] and "3,200,000,000" in found[0]["message"]
    # gate_proj 16384 x 53248, o_proj and q_proj 16384^2, k_proj and v_proj 1024 x 16384
    assert found[0]["value"] == pytest.approx((872_415_232 + 2 * 268_435_456 + 2 * 16_777_216) / 3_187_703_808)
    assert found[0]["gain"] > 1.0 and "(fits)" in found[0]["message"]
    # without recompute nothing is gathered twice
    code, text, _ = run("check", "--config", write(tmp_path, "z3.json", ds), "--model", "llama-3.1-405b", "--gpus",
                        "512", "--gpu", "h100-sxm", "--seq-len", "4096", "--recompute", "none", "--json")
    assert not [f for f in json.loads(text)["findings"] if "gathers" in f["message"]]


def test_auto_values_resolve_as_transformers_does(tmp_path):
    # transformers integrations/deepspeed.py trainer_config_finalize: reduce_bucket_size = hidden^2
    # (Llama-3-8B: 4096^2 = 16,777,216); the micro-batch from the script (--mbs 2), accumulation 1
    code, text, _ = run("check", "--config", write(tmp_path, "z2.json", HF_ZERO2_AUTO), "--model", "llama-3-8b",
                        "--gpus", "8", "--mbs", "2", "--recompute", "full", "--json")
    d = json.loads(text)
    assert d["estimate"]["training"]["zero_config"]["reduce_bucket_size"] == 4096 * 4096
    assert d["estimate"]["layout"]["mbs"] == 2 and d["estimate"]["layout"]["gas"] == 1
    assert d["estimate"]["layout"]["offload_optimizer"] == "cpu"
    assert d["estimate"]["training"]["precision"] == "bf16"  # "bf16": {"enabled": "auto"} listed first
    assert sum(f["kind"] == "auto" for f in d["findings"]) >= 3


def test_accelerate_yaml(tmp_path):
    # the shape `accelerate config` writes for DeepSpeed (accelerate/commands/config/cluster.py)
    yaml_text = ("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n"
                 "  gradient_accumulation_steps: 4\n  offload_optimizer_device: cpu\n  offload_param_device: none\n"
                 "  zero3_init_flag: false\n  zero_stage: 2\nmixed_precision: bf16\nnum_machines: 1\n"
                 "num_processes: 8\nuse_cpu: false\n")
    code, text, _ = run("check", "--config", write(tmp_path, "acc.yaml", yaml_text), "--model", "llama-3-8b",
                        "--gpus", "8", "--mbs", "1", "--recompute", "full", "--json")
    d = json.loads(text)
    assert d["source"] == "accelerate"
    lay = d["estimate"]["layout"]
    assert (lay["zero"], lay["offload_optimizer"], lay["gas"], lay["mbs"]) == (2, "cpu", 4, 1)
    assert d["estimate"]["training"]["precision"] == "bf16"


@pytest.mark.parametrize("content, suffix, words", [
    ("{not json", ".json", "--config: "),
    ("[1, 2]", ".json", "not a DeepSpeed config object"),
    ("a: [1, 2\n", ".yaml", "not valid YAML"),
    ("compute_environment: LOCAL_MACHINE\n", ".yaml", "no deepspeed_config section"),
    ('{"train_batch_size": 8, "zero_optimization": {"stage": 7}}', ".json", "zero_optimization.stage"),
    ('{"zero_optimization": {"stage": 1}}', ".json", "train_batch_size or train_micro_batch_size_per_gpu"),
    ('{"train_batch_size": 8, "optimizer": "adam"}', ".json", "optimizer must be an object"),
    ('{"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_param": "cpu"}}', ".json",
     "zero_optimization.offload_param must be an object"),
])
def test_bad_configs_are_one_line(tmp_path, content, suffix, words):
    code, text, err = run("check", "--config", write(tmp_path, "bad" + suffix, content), "--model", "llama-3-8b",
                          "--gpus", "8")
    assert code == 2 and text == "" and len(err.strip().splitlines()) == 1 and words in err


def test_contradictory_flags_are_one_line(tmp_path):
    path = write(tmp_path, "c.json", MEGATRON_DS_SCRIPT)
    code, _, err = run("check", "--config", path, "--model", "llama-3-8b", "--gpus", "12", "--tp", "8")
    assert code == 2 and err.startswith("planner: error: --gpus: 12 is not divisible by --tp*--pp = 8")
    code, _, err = run("check", "--config", path, "--model", "llama-3-8b", "--gpus", "8", "--mbs", "2")
    assert code == 2 and "--mbs" in err


def test_accelerate_launch_flags_read_like_the_yaml(tmp_path):
    # the same plugin as test_accelerate_yaml, given as accelerate/commands/launch.py flags
    launch = ("accelerate launch --use_deepspeed --zero_stage 2 --offload_optimizer_device cpu "
              "--gradient_accumulation_steps 4 --mixed_precision bf16 --num_processes 8 train.py --lr 1e-4")
    code, text, _ = run("check", "--accelerate-launch", launch, "--model", "llama-3-8b", "--mbs", "1",
                        "--recompute", "full", "--json")
    d = json.loads(text)
    lay = d["estimate"]["layout"]
    assert (lay["zero"], lay["offload_optimizer"], lay["gas"], lay["mbs"], lay["dp"]) == (2, "cpu", 4, 1, 8)
    assert d["estimate"]["training"]["precision"] == "bf16"
    code, _, err = run("check", "--accelerate-launch", launch, "--model", "llama-3-8b", "--gpus", "16")
    assert code == 2 and "--num_processes 8" in err
    code, _, err = run("check", "--accelerate-launch", "accelerate launch train.py", "--model", "llama-3-8b",
                       "--gpus", "8")
    assert code == 2 and "--use_deepspeed" in err
    code, _, err = run("check", "--model", "llama-3-8b", "--gpus", "8")
    assert code == 2 and "--config" in err


def test_deepspeeds_own_verdict_is_a_finding(tmp_path, monkeypatch):
    pytest.importorskip("deepspeed")
    typo = {"train_batch_size": 8, "zero_optimization": {"stage": 2, "overlap_com": True}}
    code, text, _ = run("check", "--config", write(tmp_path, "typo.json", typo), "--model", "llama-3-8b", "--gpus", "8",
                        "--json", deepspeed=True)
    native = [f for f in json.loads(text)["findings"] if "own DeepSpeedConfig" in f["message"]]
    assert len(native) == 1 and native[0]["severity"] == "error" and "overlap_com" in native[0]["message"]
    # Hugging Face's "auto" config, with the values the planner resolved written in, is accepted
    code, text, _ = run("check", "--config", write(tmp_path, "auto.json", HF_ZERO2_AUTO), "--model", "llama-3-8b",
                        "--gpus", "8", "--mbs", "1", "--recompute", "full", "--json", deepspeed=True)
    native = [f for f in json.loads(text)["findings"] if "own DeepSpeedConfig" in f["message"]]
    assert native[0]["severity"] == "info" and "accepts it" in native[0]["message"]
    # where DeepSpeed is not installed, the answer says so
    from planner import deepspeed_native

    monkeypatch.setattr(deepspeed_native, "installed", lambda: False)
    code, text, _ = run("check", "--config", write(tmp_path, "t.json", typo), "--model", "llama-3-8b", "--gpus", "8",
                        "--json", deepspeed=True)
    assert any("not installed" in f["message"] for f in json.loads(text)["findings"])


# hostile configs: any mix of DeepSpeed's keys with values of the wrong kind answers or refuses in one line
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from(["auto", "cpu", "nvme", "none", "", "2", "fp32", "adamw"]),
                    st.lists(st.integers(0, 3), max_size=3), st.dictionaries(st.sampled_from(["enabled", "device", "type"]),
                                                                            st.sampled_from([True, "auto", "cpu", 3]),
                                                                            max_size=2))
_ZERO = st.dictionaries(st.sampled_from(["stage", "reduce_bucket_size", "offload_optimizer", "offload_param",
                                         "stage3_max_live_parameters", "overlap_comm", "sub_group_size",
                                         "stage3_prefetch_bucket_size", "contigous_gradients"]), _VALUES, max_size=4)
_GOOD_ZERO = st.dictionaries(st.sampled_from(["reduce_bucket_size", "stage3_max_live_parameters", "sub_group_size",
                                              "stage3_prefetch_bucket_size", "allgather_bucket_size"]),
                             st.sampled_from([1, 5e8, 1e9, 2**40, "auto"]), max_size=2)
_OFFLOAD = st.dictionaries(st.sampled_from(["offload_optimizer", "offload_param"]),
                           st.fixed_dictionaries({"device": st.sampled_from(["cpu", "nvme", "none", "gpu", "auto"])}),
                           max_size=2)
# a config that reads, then zero to two keys made hostile (else every example stops at the first check)
_CONFIGS = st.builds(
    lambda stage, zero, offload, hostile_zero, hostile: {
        "train_batch_size": 64, "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage, **zero, **offload, **hostile_zero}, **hostile},
    st.integers(0, 3), _GOOD_ZERO, _OFFLOAD, st.one_of(st.just({}), _ZERO),
    st.dictionaries(st.sampled_from(["train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                                     "bf16", "fp16", "optimizer", "data_types", "gradient_clipping", "zero_optimisation"]),
                    _VALUES, max_size=2))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=_CONFIGS)
def test_hostile_configs_answer_or_refuse_in_one_line(tmp_path, config):
    text = json.dumps(config, allow_nan=True)  # NaN and Infinity are not JSON: the reader refuses them
    code, out, err = run("check", "--config", write(tmp_path, "h.json", text), "--model", "llama-3-8b", "--gpus", "8",
                         "--json")
    assert code in (0, 1, 2), (config, err)
    if code == 2:
        assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("planner: error: "), (config, err)
    else:
        json.loads(out)


_LAUNCH_WORDS = st.lists(st.sampled_from(
    ["--use_deepspeed", "--zero_stage", "--zero_stage=3", "--offload_optimizer_device", "cpu", "nvme", "gpu",
     "--gradient_accumulation_steps", "4", "0", "-1", "x", "--mixed_precision", "bf16", "fp8", "--num_processes", "8",
     "16", "--deepspeed_config_file", "missing.json", "train.py", "'", '"', "--", "1e9"]), max_size=10)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=_LAUNCH_WORDS)
def test_hostile_accelerate_launch_lines_answer_or_refuse_in_one_line(words):
    code, out, err = run("check", "--accelerate-launch", "accelerate launch " + " ".join(words), "--model", "llama-3-8b",
                         "--json")
    assert code in (0, 1, 2), (words, err)
    if code == 2:
        assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("planner: error: "), (words, err)


@pytest.mark.parametrize("old, new", [("cpu_offload", "offload_optimizer"), ("cpu_offload_param", "offload_param")])
def test_deprecated_offload_keys_run_as_deepspeed_reads_them(tmp_path, old, new):
    """DeepSpeed 0.19.8 zero/config.py: cpu_offload / cpu_offload_param true become {new}.device cpu
    (config_utils.py _process_deprecated_field); the check predicts that run and says so."""
    zc = pytest.importorskip("deepspeed.runtime.zero.config")
    zero = {"stage": 3, old: True}
    assert str(getattr(zc.DeepSpeedZeroConfig(**zero), new).device) in ("cpu", "OffloadDeviceEnum.cpu")
    ds = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
          "zero_optimization": zero}
    code, text, _ = run("check", "--config", write(tmp_path, "c.json", ds), "--model", "llama-3-8b", "--gpus", "8",
                        "--seq-len", "2048", "--json")
    d = json.loads(text)
    layout_key = {"offload_optimizer": "offload_optimizer", "offload_param": "offload_params"}[new]
    est = d["estimate"]
    assert est["layout"][layout_key] == "cpu" and est["memory"]["cpu_bytes_per_node"] > 0
    assert any(old in f["message"] and "deprecated" in f["message"] for f in d["findings"])
    with pytest.raises(Exception):  # DeepSpeed refuses the deprecated key beside its replacement
        zc.DeepSpeedZeroConfig(**{"stage": 3, old: True, new: {"device": "cpu"}})
    both = dict(ds, zero_optimization={"stage": 3, old: True, new: {"device": "cpu"}})
    code, _, err = run("check", "--config", write(tmp_path, "both.json", both), "--model", "llama-3-8b", "--gpus", "8")
    assert code == 2 and old in err and len(err.strip().splitlines()) == 1


def test_deepspeed_judges_the_batch_the_user_wrote(tmp_path):
    """DeepSpeed 0.19.8 runtime/config.py _batch_assertion on the user's own keys: 4096 != 8 x 85 x 6 refuses
    the config; the planner asks DeepSpeed about them as written, filling only "auto" ones (as transformers'
    fill_match does), and DeepSpeed's own refusal is reported."""
    pytest.importorskip("deepspeed")
    ds = {"train_batch_size": 4096, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 85,
          "bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}
    code, text, _ = run("check", "--config", write(tmp_path, "c.json", ds), "--model", "llama-3-8b", "--gpus", "6",
                        "--seq-len", "2048", "--json", deepspeed=True)
    native = [f for f in json.loads(text)["findings"] if "own DeepSpeedConfig" in f["message"]]
    assert len(native) == 1 and "refuses it" in native[0]["message"] and "4096 != 8 * 85 * 6" in native[0]["message"]
    assert native[0]["severity"] == "error" and code == 1


def test_zero3_oom_fixes_offer_parameter_offload_and_smaller_buckets(tmp_path):
    """Llama-3-70B under ZeRO-3 on 8 GPUs at micro-batch 2 does not fit; beside recompute and the optimizer's
    offload the fixes name parameter offload (stage3.py offload_param: the fp16 partition waits in host
    memory) and a reduce_bucket_size 10x smaller: DeepSpeed's bf16 gradient bucket of 5e8 elements
    becomes 5e7, (5e8 - 5e7) x 2 B = 0.9 GB freed."""
    ds = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
          "zero_optimization": {"stage": 3}}
    code, text, _ = run("check", "--config", write(tmp_path, "c.json", ds), "--model", "llama-3-70b", "--gpus", "8",
                        "--seq-len", "4096", "--json")
    fixes = {f["message"].split(" frees")[0]: f for f in json.loads(text)["findings"] if f["message"].startswith("fix:")}
    assert code == 1 and "fix: offload_param to cpu" in fixes
    assert fixes["fix: reduce_bucket_size 50,000,000"]["frees_bytes"] == pytest.approx((5e8 - 5e7) * 2, rel=1e-3)
    # and the allocator setting PyTorch's own OOM message names (CUDACachingAllocator.cpp)
    assert any("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in m for m in fixes)


def test_stage_1_2_gather_settings_do_nothing_under_zero3(tmp_path):
    """DeepSpeed 0.19.8 engine.py _configure_zero_optimizer hands allgather_bucket_size and allgather_partitions
    to the stage 1/2 optimizer only: read from its source, and flagged under stage 3."""
    import inspect

    engine = pytest.importorskip("deepspeed.runtime.engine")
    source = inspect.getsource(engine.DeepSpeedEngine._configure_zero_optimizer)
    stage3 = source[source.index("ZeroStageEnum.weights"):]
    assert "allgather_bucket_size" in source and "allgather_bucket_size" not in stage3
    assert "allgather_partitions" not in stage3
    ds = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
          "zero_optimization": {"stage": 3, "allgather_bucket_size": 5e8, "allgather_partitions": True}}
    _, text, _ = run("check", "--config", write(tmp_path, "c.json", ds), "--model", "llama-3-8b", "--gpus", "8", "--json")
    idle = [f for f in json.loads(text)["findings"] if "does nothing under stage 3" in f["message"]]
    assert sorted(f["message"].split(" ")[0] for f in idle) == ["zero_optimization.allgather_bucket_size",
                                                               "zero_optimization.allgather_partitions"]


def test_activation_checkpointing_keys_are_deepspeeds_own(tmp_path):
    """DeepSpeed 0.19.8 runtime/activation_checkpointing/config.py: the ACT_CHKPT_* keys are all it reads;
    'contiguous_checkpointing' is none of them and is ignored."""
    cfg = pytest.importorskip("deepspeed.runtime.activation_checkpointing.config")
    theirs = {v for k, v in vars(cfg).items() if k.startswith("ACT_CHKPT_") and k != "ACT_CHKPT" and isinstance(v, str)
              and not k.endswith("_DEFAULT")}
    assert theirs == set(ds_rules.ACTIVATION_CHECKPOINTING_KEYS)
    ds = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
          "zero_optimization": {"stage": 1}, "activation_checkpointing": {"contiguous_checkpointing": True}}
    _, text, _ = run("check", "--config", write(tmp_path, "c.json", ds), "--model", "llama-3-8b", "--gpus", "8", "--json")
    assert any("activation_checkpointing.contiguous_checkpointing is not a key DeepSpeed reads" in f["message"]
               for f in json.loads(text)["findings"])


def test_a_check_without_a_gpu_count_asks_for_it(tmp_path):
    ds = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}
    for argv in (["--config", write(tmp_path, "c.json", ds)],
                 ["--accelerate-launch", "accelerate launch --use_deepspeed --zero_stage 2 train.py"]):
        code, _, err = run("check", *argv, "--model", "llama-3-8b")
        assert code == 2 and err.startswith("planner: error: --gpus: required") and "None" not in err


def test_an_accelerate_yaml_gives_the_gpu_count(tmp_path):
    """`accelerate launch --config_file` starts the YAML's num_processes (Accelerate's own loader reads it);
    check takes that count where --gpus is not given."""
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    text = ("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n"
            "  gradient_accumulation_steps: 1\n  offload_optimizer_device: none\nmixed_precision: bf16\n"
            "num_processes: 8\nnum_machines: 1\n")
    path = write(tmp_path, "acc.yaml", text)
    assert config_args.load_config_from_file(path).num_processes == 8
    code, out, err = run("check", "--config", path, "--model", "llama-3-8b", "--json")
    assert code in (0, 1) and json.loads(out)["estimate"]["cluster"]["num_gpus"] == 8, err
