"""The planning API (planner/api.py): inputs by value, defaults reported back, the same answers as
the CLI, and no way back into argparse."""

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner import api, cli
from planner.errors import InputError
from planner.inputs import DEFAULTS, ClusterInput, LayoutInput, ModelInput, TrainingInput

ROOT = Path(__file__).resolve().parent.parent


def cli_json(*argv):
    out = io.StringIO()
    assert cli.main(list(argv), out=out) == 0
    return json.loads(out.getvalue())


def test_estimate_by_value_equals_the_cli():
    e = api.estimate("llama-3-70b", {"gpus": 16}, {"gbs": 32}, {"tp": 8, "pp": 2, "recompute": "selective",
                                                                "sequence_parallel": True})
    d = cli_json("estimate", "--model", "llama-3-70b", "--gpus", "16", "--gbs", "32", "--tp", "8", "--pp", "2",
                 "--recompute", "selective", "--sequence-parallel", "--json")
    assert e.to_json() == d
    assert e.memory["gpu_bytes"] == d["memory"]["gpu_bytes"] and e.layout["dp"] == 1  # 16 / (8 * 2)


def test_model_given_as_a_config_dict_a_count_or_a_record():
    # the same Llama-2-7B as a config dict (its Hugging Face config.json fields), as the catalog name,
    # and as a ModelInput; 6,738,415,616 parameters each time (the published count)
    config = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000}
    for model in (config, "llama-2-7b", ModelInput(name="llama-2-7b")):
        assert api.estimate(model, {"gpus": 8}, layout={"zero": 3}).model.params == 6_738_415_616
    assert abs(api.estimate(70e9, ClusterInput(gpus=8), layout=LayoutInput(zero=3)).model.params / 70e9 - 1) < 0.01


def test_defaults_are_reported_back():
    e = api.estimate("llama-2-7b", {"gpus": 8}, layout={"tp": 2})
    # dp = 8 / 2, gbs = 4Mi tokens / 4096 = 1024 sequences (recommend's batch, a multiple of mbs * dp),
    # engine megatron-deepspeed because tp > 1, and the DEFAULTS table
    assert e.defaults == {"dp": 4, "gbs": 1024, "tokens_per_step": 4 * 2**20, "engine": "megatron-deepspeed",
                          "gpu": "h100-sxm", "seq_len": 4096, "precision": "bf16", "optimizer": "adamw",
                          "modules": "megatron"}
    given = api.estimate("llama-2-7b", {"gpus": 8, "gpu": "a100-80gb"},
                         TrainingInput(seq_len=2048, engine="deepspeed", precision="bf16", optimizer="adamw", gbs=8,
                                       modules="hf"),
                         {"dp": 8})
    assert given.defaults == {}
    r = api.recommend("llama-2-7b", {"gpus": 8})
    assert r.defaults["tokens_per_step"] == DEFAULTS["tokens_per_step"] == 4 * 2**20
    assert r.defaults["gbs"] == 1024 and r.assumptions["gbs"] == 1024  # 4Mi tokens / 4096
    assert r.defaults["memory_headroom"] == 0.05 and r.defaults["engine"] == "deepspeed"


def test_recommend_by_value_equals_the_cli():
    r = api.recommend(70e9, {"gpus": 16}, top=3)
    d = cli_json("recommend", "--params", "70e9", "--gpus", "16", "--top", "3", "--json")
    assert r.to_json() == d and len(r.layouts) == 3


@pytest.mark.parametrize("call, flag", [
    (lambda: api.estimate("llama-2-7b", {"gpus": float("inf")}), "--gpus"),
    (lambda: api.estimate("llama-2-7b", {"gpus": 8, "speed": 1}), "speed"),
    (lambda: api.estimate("llama-2-7b", {"gpus": 8}, layout={"tp": float("nan")}), "--tp"),
    (lambda: api.estimate(float("nan")), "--params"),
    (lambda: api.recommend("llama-2-7b", {"gpus": 2**40}), "--gpus"),
    (lambda: api.recommend("llama-2-7b", {"gpus": 8}, memory_headroom=1.0), "--memory-headroom"),
    (lambda: api.estimate({"model_type": "llama", "hidden_size": 1e400}), "--model"),
])
def test_bad_values_are_one_clear_error(call, flag):
    with pytest.raises(InputError, match=flag):
        call()


def test_no_way_back_into_argparse():
    # the API and everything under it import without the CLI: no cycle, callable from an app
    code = ("import sys; import planner.api, planner.search, planner.memory, planner.timing;"
            "print(','.join(m for m in ('planner.cli', 'argparse') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_recommend_without_the_engine_comparison_keeps_its_layouts():
    # the comparison searches the other engines only: the layouts of the engine asked for are the same
    full = api.recommend(70e9, {"gpus": 16}, {"engine": "deepspeed"}, top=3)
    alone = api.recommend(70e9, {"gpus": 16}, {"engine": "deepspeed"}, top=3, compare_engines=False)
    assert alone.engines == [] and len(full.engines) == 4  # five engines, one of them asked for
    assert [r["layout"] for r in alone.layouts] == [r["layout"] for r in full.layouts]
