"""`planner check` guidance: the ZeRO-3 load without deepspeed.zero.Init, what oversized buckets cost,
the closest better config's complete list of changes, and DeepSpeed's overlap_comm in recommend.
Expected values come from the libraries (Accelerate's, DeepSpeed's and transformers' own classes)
or from independent arithmetic, never from the planner's output."""

import json
import os

import pytest

from planner import api, diagnosis, doctor, ds_config, planning

os.environ.setdefault("DS_ACCELERATOR", "cpu")
GiB = 2**30
H200 = {"gpus": 8, "gpu": "h200"}


def llama3_70b_params() -> int:
    """Llama-3-70B's parameter count from transformers' own LlamaForCausalLM, built on the meta device
    (meta-llama/Meta-Llama-3-70B config.json)."""
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    config = tf.LlamaConfig(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                            num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False)
    with torch.device("meta"):
        model = tf.LlamaForCausalLM(config)
    return sum(p.numel() for p in model.parameters())


def accelerate_yaml(tmp_path, flag=None) -> str:
    plugin = {"zero_stage": 3, "offload_optimizer_device": "cpu", "offload_param_device": "cpu"}
    if flag is not None:
        plugin["zero3_init_flag"] = flag
    doc = {"distributed_type": "DEEPSPEED", "mixed_precision": "bf16", "num_processes": 16, "deepspeed_config": plugin}
    path = tmp_path / "accelerate.yaml"
    path.write_text(json.dumps(doc))  # JSON is YAML
    return str(path)


def load_findings(report) -> list:
    return [f for f in report.findings if "zero.Init" in f.message]


def test_accelerates_default_turns_zero_init_on_under_zero3(monkeypatch):
    dc = pytest.importorskip("accelerate.utils.dataclasses")
    monkeypatch.delenv("ACCELERATE_DEEPSPEED_ZERO3_INIT", raising=False)
    plugin = dc.DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    assert plugin.zero3_init_flag is True  # what an unset flag in the YAML becomes


def test_zero3_without_zero_init_loads_the_whole_model_on_every_rank(tmp_path):
    params = llama3_70b_params()
    off = api.check(accelerate_yaml(tmp_path, False), "llama-3-70b", {"gpus": 16, "gpu": "h100-sxm"}, {"seq_len": 4096},
                    deepspeed=False)
    (finding,) = load_findings(off)
    # engine.py _configure_distributed_model: the whole module cast to bf16 and moved to the GPU
    assert finding.severity == "error" and finding.value == params * 2
    assert "zero3_init_flag: true" in finding.message
    assert not off.ok
    # unset: Accelerate turns it on (test above); true: partitioned as made
    for flag in (None, True):
        assert not load_findings(api.check(accelerate_yaml(tmp_path, flag), "llama-3-70b", {"gpus": 16, "gpu": "h100-sxm"},
                                           {"seq_len": 4096}, deepspeed=False))


def test_a_model_that_fits_whole_raises_no_load_finding(tmp_path):
    # llama-3-8b: 8e9 x 2 B fits an 80 GiB GPU and 8 of them a node's host memory
    assert not load_findings(api.check(accelerate_yaml(tmp_path, False), "llama-3-8b", {"gpus": 16, "gpu": "h100-sxm"},
                                       {"seq_len": 4096}, deepspeed=False))


def test_a_plain_ds_config_warns_of_the_load_and_names_hfdeepspeedconfig():
    ds = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
          "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}}
    (finding,) = load_findings(api.check(ds, "llama-3-70b", {"gpus": 16, "gpu": "h100-sxm"}, {"seq_len": 4096},
                                         deepspeed=False))
    assert finding.severity == "warning" and "HfDeepSpeedConfig" in finding.message
    assert finding.value == llama3_70b_params() * 2


def test_the_yaml_flag_is_read_as_accelerate_reads_it(tmp_path, monkeypatch):
    # accelerate/utils/environment.py str_to_bool, after launch.py's str(value).lower()
    from accelerate.utils.environment import str_to_bool

    monkeypatch.delenv("ACCELERATE_DEEPSPEED_ZERO3_INIT", raising=False)
    for value in (False, True, "false", "True", "no", "1"):
        ds, _ = ds_config.load_config(accelerate_yaml(tmp_path, value))
        assert ds.zero3_init_flag is bool(str_to_bool(str(value).lower()))
    assert ds_config.load_config(accelerate_yaml(tmp_path))[0].zero3_init_flag is None


def zero2(**zero) -> dict:
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
            "zero_optimization": {"stage": 2, **zero}}


def test_oversized_reduce_buckets_are_said_to_raise_the_peak():
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    default = DeepSpeedZeroConfig().reduce_bucket_size
    big = 10 * default
    r = api.check(zero2(reduce_bucket_size=big), "llama-2-7b", H200, {"seq_len": 4096}, layout={"recompute": "full"},
                  deepspeed=False)
    (finding,) = [f for f in r.findings if "buckets above" in f.message]
    assert "raise the peak" in finding.message
    # stage_1_and_2.py setup_buckets: one bf16 buffer of reduce_bucket_size elements (overlap_comm off), and at
    # most its flat copy beside it (allreduce_bucket's flatten)
    extra = (big - default) * 2
    assert extra <= finding.frees_bytes <= 2 * extra
    # at DeepSpeed's defaults: nothing said
    r = api.check(zero2(), "llama-2-7b", H200, {"seq_len": 4096}, layout={"recompute": "full"}, deepspeed=False)
    assert not [f for f in r.findings if "buckets above" in f.message]


def test_overlap_comm_costs_one_more_reduce_bucket_and_only_zero_1_2_read_it():
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    assert DeepSpeedZeroConfig(stage=2).overlap_comm is False and DeepSpeedZeroConfig(stage=3).overlap_comm is True
    bucket = 10 * DeepSpeedZeroConfig().reduce_bucket_size  # large enough to hold the backward's peak

    def est(zero, overlap):
        return api.estimate("llama-2-7b", H200, {"seq_len": 4096, "overlap_comm": overlap, "reduce_bucket_size": bucket},
                            {"zero": zero, "dp": 8, "mbs": 2, "recompute": "full"})

    off, on = est(2, False), est(2, True)
    # stage_1_and_2.py setup_buckets: "double buffers" with overlap_comm, bf16 under ZeRO-2
    assert on.memory["required_bytes"] - off.memory["required_bytes"] == bucket * 2
    assert on.throughput["tokens_per_s"] > off.throughput["tokens_per_s"]
    # engine.py: stage 0 builds no ZeRO optimizer, the only reader of overlap_comm
    assert est(0, True).time["step_s"] == est(0, False).time["step_s"]


def test_recommend_turns_overlap_comm_on_for_zero_1_2_and_exports_it(tmp_path):
    rec = api.recommend("llama-2-7b", {"gpus": 8, "gpu": "a100-80gb"}, {"seq_len": 4096})
    assert rec.assumptions.get("overlap_comm") is True
    best = next(r["layout"] for r in rec.layouts if r["layout"]["zero"] in (1, 2))
    from planner.export import deepspeed_config

    cfg = deepspeed_config(rec.model, rec.cluster, rec.training, best)
    assert cfg["zero_optimization"]["overlap_comm"] is True
    # the user's own overlap_comm is kept
    off = api.recommend("llama-2-7b", {"gpus": 8, "gpu": "a100-80gb"}, {"seq_len": 4096, "overlap_comm": False})
    assert "overlap_comm" not in off.assumptions


def test_closest_better_lists_every_changed_layout_field(monkeypatch):
    est = api.estimate("llama-2-7b", H200, {"seq_len": 4096}, {"zero": 2, "dp": 8, "mbs": 1})
    other = {**est.layout, "cp": 2, "dp": 4, "gas": 2, "sequence_parallel": True, "rank_order": "tp-cp-pp-dp"}
    rec = {"layout": other, "throughput": {"tokens_per_s": 2 * est.throughput["tokens_per_s"]}}

    class Fake:
        layouts = [rec]
        training = est.training

    monkeypatch.setattr(planning, "recommend", lambda *a, **k: Fake)
    better = diagnosis.closest_better(est, "llama-2-7b", H200, {"seq_len": 4096}, {})
    assert {c.split()[0] for c in better["changes"]} == {"cp", "dp", "gas", "sequence_parallel", "rank_order"}
    # a layout the same in every field but faster by a setting names that setting
    same = {"layout": dict(est.layout), "throughput": rec["throughput"]}
    from dataclasses import replace

    class Overlap:
        layouts = [same]
        training = replace(est.training, zero_config=replace(est.training.zero_config, overlap_comm=True))

    monkeypatch.setattr(planning, "recommend", lambda *a, **k: Overlap)
    assert diagnosis.closest_better(est, "llama-2-7b", H200, {"seq_len": 4096}, {})["changes"] == ["overlap_comm false -> true"]


def test_activation_checkpointing_section_alone_recomputes_nothing():
    """DeepSpeed 0.19.8's engine never reads activation_checkpointing (only deepspeed.checkpointing.
    configure does: its _configure_using_config_file); a Hugging Face model recomputes only through
    transformers' own switch, which exists on every PreTrainedModel."""
    import inspect

    import deepspeed.runtime.engine as engine
    from transformers import PreTrainedModel, TrainingArguments

    assert "activation_checkpointing" not in inspect.getsource(engine.DeepSpeedEngine)
    assert hasattr(PreTrainedModel, "gradient_checkpointing_enable")
    assert "gradient_checkpointing" in inspect.signature(TrainingArguments).parameters
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
          "zero_optimization": {"stage": 2}, "activation_checkpointing": {"partition_activations": True}}
    said = [f.message for f in doctor.check(ds, "llama-3-8b", {"gpus": 8}, deepspeed=False).findings]
    assert any("does not turn recomputation on" in m for m in said)
    told = doctor.check(ds, "llama-3-8b", {"gpus": 8}, layout={"recompute": "full"}, deepspeed=False).findings
    assert not any("does not turn recomputation on" in f.message for f in told)
