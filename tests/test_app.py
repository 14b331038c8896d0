"""The Streamlit dashboard (app.py) under streamlit.testing's AppTest: what it shows equals the CLI's
`--json` answer for the same inputs, and bad input is a message on the page, not a traceback."""

import importlib.util
import io
import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from planner import cli, report  # noqa: E402
from planner.errors import InputError  # noqa: E402
from planner.search import short  # noqa: E402

APP = Path(__file__).resolve().parent.parent / "app.py"
GiB = 2**30


def cli_json(*argv) -> dict:
    out = io.StringIO()
    assert cli.main([*argv, "--json"], out=out) == 0
    return json.loads(out.getvalue())


def started() -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=120).run()
    assert not at.exception
    return at


def problems(at: AppTest) -> list:
    return [e.value for e in at.error] + [e.value for e in at.exception]


def metrics(at: AppTest) -> dict:
    return {m.label: m.value for m in at.metric}


def assert_table_is(at: AppTest, answer: dict) -> None:
    table = at.dataframe[0].value
    assert len(table) == len(answer["layouts"]) > 0
    for (_, row), rec in zip(table.iterrows(), answer["layouts"]):
        assert row["layout"] == short(rec["layout"])
        assert row["GiB/GPU"] == pytest.approx(rec["memory"]["gpu_bytes"] / GiB, rel=1e-12)
        assert row["tokens/s"] == pytest.approx(rec["throughput"]["tokens_per_s"], rel=1e-12)
        assert row["binding constraint"] == rec["binding_constraint"]


def estimate_flags(row: dict) -> list:
    flags = []
    for key in ("tp", "pp", "dp", "cp", "ep", "vpp", "zero", "offload_optimizer", "offload_params", "mbs", "recompute",
                "schedule"):
        flags += ["--" + key.replace("_", "-"), str(row[key])]
    return flags + (["--sequence-parallel"] if row["sequence_parallel"] else [])


def assert_metrics_are(at: AppTest, est: dict) -> None:
    shown = metrics(at)
    assert shown["Peak GiB per GPU"] == f"{est['memory']['gpu_bytes'] / GiB:.2f}"
    assert shown["Step time (s)"] == f"{est['time']['step_s']:.3f}"
    assert shown["Tokens/s"] == f"{est['throughput']['tokens_per_s']:,.0f}"
    assert shown["MFU"] == f"{est['throughput']['mfu']:.1%}"


@pytest.mark.slow
def test_default_page_is_the_cli_answer_for_70b_on_16_gpus():
    at = started()
    assert not problems(at)
    answer = cli_json("recommend", "--model", "llama-3-70b", "--gpus", "16", "--top", "10")
    assert_table_is(at, answer)
    assert answer["layouts"][0]["memory"]["verdict"] == "fits" and not at.warning  # #1 clears its band
    engines = at.dataframe[1].value  # the fastest layout under each other engine
    assert list(engines["engine"]) == [e["engine"] for e in answer["engines"]]
    assert list(engines["layout"]) == [short(e["layout"]) if e["layout"] else e["note"] for e in answer["engines"]]
    # the chosen layout (#1) is `planner estimate` of that layout with the recommended batch and engine
    row = answer["layouts"][0]["layout"]
    # with the ZeRO-3 knobs recommend chose for it (search.py lean_zero3_training, where they decide the fit)
    knobs = [f for k in ("stage3_max_live_parameters", "stage3_max_reuse_distance") if k in answer["assumptions"]
             for f in ("--" + k.replace("_", "-"), str(answer["assumptions"][k]))]
    est = cli_json("estimate", "--model", "llama-3-70b", "--gpus", "16", "--gbs", str(row["gbs"]),
                   "--engine", answer["assumptions"]["engine"], *estimate_flags(row), *knobs)
    assert_metrics_are(at, est)
    # memory per stage, step time, and the speed-versus-memory scatter; the three launch files
    assert len(at.get("vega_lite_chart")) == 3
    assert [b.label for b in at.get("download_button")] == ["ds_config.json", "accelerate_config.yaml", "launch.sh"]


@pytest.mark.slow
def test_changed_inputs_and_pinned_axes_follow_the_cli():
    at = started()
    at.selectbox(key="model_name").set_value("llama-3-8b")
    at.number_input(key="gpus").set_value(32)
    at.selectbox(key="engine").set_value("megatron")
    at.selectbox(key="pin_tp").set_value(2)
    at.selectbox(key="pin_zero").set_value(1)
    at.run()
    assert not problems(at)
    answer = cli_json("recommend", "--model", "llama-3-8b", "--gpus", "32", "--engine", "megatron", "--tp", "2",
                      "--zero", "1", "--top", "10")
    assert all(r["layout"]["tp"] == 2 and r["layout"]["zero"] == 1 for r in answer["layouts"])
    assert_table_is(at, answer)
    # choosing the third row shows that layout's estimate
    at.selectbox(key="chosen").set_value(3).run()
    row = answer["layouts"][2]["layout"]
    # with the --tp-comm-overlap recommend turned on for it (tp 2 on H100 gains by it)
    assert answer["assumptions"]["tp_comm_overlap"] is True
    est = cli_json("estimate", "--model", "llama-3-8b", "--gpus", "32", "--gbs", str(row["gbs"]), "--engine", "megatron",
                   "--tp-comm-overlap", *estimate_flags(row))
    assert_metrics_are(at, est)
    assert at.subheader[1].value == f"Chosen layout: {short(row)}"
    # the overlap turned off by hand follows --no-tp-comm-overlap
    at.selectbox(key="tp_comm_overlap").set_value("off").run()
    assert_table_is(at, cli_json("recommend", "--model", "llama-3-8b", "--gpus", "32", "--engine", "megatron", "--tp", "2",
                                 "--zero", "1", "--top", "10", "--no-tp-comm-overlap"))


@pytest.mark.slow
def test_megatrons_offloaded_share_follows_the_cli():
    at = started()
    at.selectbox(key="model_name").set_value("llama-3-70b")
    at.selectbox(key="engine").set_value("megatron")
    at.run()
    at.selectbox(key="offload_share").set_value(0.5)  # shown for megatron
    at.run()
    assert not problems(at)
    answer = cli_json("recommend", "--model", "llama-3-70b", "--gpus", "16", "--engine", "megatron",
                      "--optimizer-offload-fraction", "0.5", "--top", "10")
    assert any(r["layout"]["offload_optimizer"] == "cpu" for r in answer["layouts"])
    assert_table_is(at, answer)
    # #1 is borderline at the prior's +-10 %: the page names the fastest layout that clears it, as the CLI
    assert answer["layouts"][0]["memory"]["verdict"] == "borderline" and answer["clear_fit"] is not None
    assert [w.value for w in at.warning] == [report.clear_fit_text(answer["layouts"][0]["memory"], answer["clear_fit"])]


@pytest.mark.slow
def test_compile_and_an_oversubscribed_pod_follow_the_cli():
    at = started()
    at.selectbox(key="model_name").set_value("llama-3-8b")
    at.number_input(key="gpus").set_value(32)
    at.selectbox(key="engine").set_value("fsdp")
    at.number_input(key="pod_gpus").set_value(16)
    at.run()
    at.checkbox(key="compile").check()  # shown for the Hugging Face engines
    at.number_input(key="oversubscription").set_value(4.0)
    at.run()
    assert not problems(at)
    answer = cli_json("recommend", "--model", "llama-3-8b", "--gpus", "32", "--engine", "fsdp", "--compile",
                      "--pod-gpus", "16", "--oversubscription", "4", "--top", "10")
    assert answer["assumptions"]["compile"] is True and answer["assumptions"]["oversubscription"] == 4
    assert_table_is(at, answer)


@pytest.mark.slow
def test_the_model_code_follows_the_cli():
    at = started()
    at.selectbox(key="model_name").set_value("llama-3-8b")
    at.selectbox(key="engine").set_value("fsdp")
    at.run()
    at.selectbox(key="modules").set_value("hf-liger")  # shown for the Hugging Face engines
    at.run()
    assert not problems(at)
    answer = cli_json("recommend", "--model", "llama-3-8b", "--gpus", "16", "--engine", "fsdp", "--modules", "hf-liger",
                      "--top", "10")
    assert answer["assumptions"]["modules"] == "hf-liger"
    assert_table_is(at, answer)


@pytest.mark.slow
def test_hugging_face_engines_offer_their_recompute_and_host_checkpoints():
    at = started()
    at.radio(key="mode").set_value("manual").run()
    at.selectbox(key="engine").set_value("fsdp").run()
    assert at.selectbox(key="man_recompute").options == ["none", "full"]  # no selective switch in transformers
    at.selectbox(key="model_name").set_value("llama-3-8b")
    at.number_input(key="gpus").set_value(8)
    at.number_input(key="seq_len").set_value(32768)
    at.radio(key="batch_kind").set_value("sequences").run()
    at.number_input(key="gbs").set_value(16)
    at.selectbox(key="man_zero").set_value(3)
    at.selectbox(key="man_recompute").set_value("full")
    at.checkbox(key="cpu_checkpointing").check()
    at.run()
    assert not problems(at)
    assert_metrics_are(at, cli_json("estimate", "--model", "llama-3-8b", "--gpus", "8", "--engine", "fsdp", "--seq-len",
                                    "32768", "--gbs", "16", "--zero", "3", "--recompute", "full", "--cpu-checkpointing"))
    at.selectbox(key="engine").set_value("megatron").run()
    assert at.selectbox(key="man_recompute").options == ["none", "selective", "full"]
    assert "cpu_checkpointing" not in [c.key for c in at.checkbox]
    at.number_input(key="gpus").set_value(16)  # two nodes: which group crosses them depends on the order
    at.number_input(key="man_pp").set_value(2)
    at.number_input(key="seq_len").set_value(4096)
    at.selectbox(key="man_zero").set_value(1)
    at.selectbox(key="man_rank_order").set_value("tp-cp-pp-dp").run()  # Megatron's other placement
    assert not problems(at)
    flags = ["--model", "llama-3-8b", "--gpus", "16", "--engine", "megatron", "--pp", "2", "--gbs", "16", "--zero", "1",
             "--recompute", "full"]
    pp_inner = cli_json("estimate", *flags, "--rank-order", "tp-cp-pp-dp")
    assert pp_inner["time"]["step_s"] != cli_json("estimate", *flags)["time"]["step_s"]
    assert_metrics_are(at, pp_inner)


@pytest.mark.slow
def test_manual_layout_time_to_train_and_bad_layouts():
    at = started()
    at.radio(key="mode").set_value("manual").run()  # the layout widgets appear in manual mode
    at.selectbox(key="engine").set_value("megatron-deepspeed").run()  # its recompute choices include selective
    at.number_input(key="man_tp").set_value(8)
    at.number_input(key="man_pp").set_value(2)
    at.selectbox(key="man_zero").set_value(1)
    at.selectbox(key="man_recompute").set_value("selective")
    at.checkbox(key="man_sp").set_value(True)
    at.number_input(key="tokens_b").set_value(1000.0)
    at.run()
    at.number_input(key="price").set_value(2.0).run()
    assert not problems(at)
    flags = ["--model", "llama-3-70b", "--gpus", "16", "--engine", "megatron-deepspeed", "--tp", "8", "--pp", "2",
             "--zero", "1", "--recompute", "selective", "--sequence-parallel", "--gbs", "1024", "--tokens", "1e12",
             "--price-per-gpu-hour", "2"]
    est = cli_json("estimate", *flags)
    assert_metrics_are(at, est)
    assert metrics(at)["Time to train"] == f"{est['time_to_train']['days']:.1f} days"
    assert len(at.get("vega_lite_chart")) == 2
    assert "megatron_args.txt" in [b.label for b in at.get("download_button")]
    # an impossible layout is one line on the page; fixing it brings the answer back
    at.number_input(key="man_tp").set_value(3).run()
    assert not at.exception and len(at.error) == 1 and at.error[0].value.startswith("--gpus: 16 is not divisible")
    at.number_input(key="man_tp").set_value(8).run()
    assert not problems(at)
    assert_metrics_are(at, est)


@pytest.mark.slow
def test_nothing_fits_and_foreign_calibration_are_messages():
    at = started()
    at.selectbox(key="model_name").set_value("llama-3.1-405b")
    at.selectbox(key="engine").set_value("megatron")  # no offload: 405B needs thousands of GiB on one GPU
    at.number_input(key="gpus").set_value(1)
    at.run()
    assert not at.exception and at.error and at.error[0].value.startswith("Nothing fits.")
    code, _ = cli.main(["recommend", "--model", "llama-3.1-405b", "--engine", "megatron", "--gpus", "1"],
                       out=io.StringIO()), None
    assert code == 2  # the CLI agrees
    at.selectbox(key="engine").set_value("deepspeed")
    at.number_input(key="gpus").set_value(16)
    at.selectbox(key="calibration").set_value("cpu-gloo")  # measured on CPU, not on h100-sxm
    at.run()
    assert not at.exception and len(at.error) == 1 and at.error[0].value.startswith("--calibration")


def load_app_module():
    spec = importlib.util.spec_from_file_location("planner_app", APP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # main() runs only as __main__ (streamlit run)
    return module


@pytest.mark.parametrize("name, raw, words", [
    ("notes.json", b"this is not json", "not valid JSON"),
    ("list.json", b"[1, 2, 3]", "not a Hugging Face model config"),
    ("big.json", b"{" + b" " * (2**20 + 1) + b"}", "a config.json is under 1 MiB"),
])
def test_uploads_that_are_not_a_config_are_one_line(name, raw, words):
    app = load_app_module()
    with pytest.raises(InputError, match=words):
        app.config_from_upload(name, raw)


def test_an_uploaded_config_with_nonsense_values_is_refused_by_the_api():
    app = load_app_module()
    config = app.config_from_upload("config.json", json.dumps(
        {"model_type": "llama", "hidden_size": -4096, "num_hidden_layers": 32, "num_attention_heads": 32,
         "vocab_size": 32000, "intermediate_size": 11008}).encode())
    from planner import api

    with pytest.raises(InputError, match="hidden"):
        api.estimate({"config": config}, {"gpus": 8})


@pytest.mark.slow
def test_check_mode_is_planner_check(tmp_path):
    at = started()
    at.radio(key="mode").set_value("check my config").run()
    config = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
              "zero_optimization": {"stage": 3, "overlap_comm": True, "stage3_prefetch_bucket_sise": 5e7}}
    at.text_area(key="check_config").set_value(json.dumps(config))
    at.selectbox(key="chk_recompute").set_value("full")
    at.run()
    assert not at.exception
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    out = io.StringIO()
    code = cli.main(["check", "--config", str(path), "--model", "llama-3-70b", "--gpus", "16", "--recompute", "full",
                     "--no-deepspeed", "--json"], out=out)  # the page asks DeepSpeed only when ticked
    answer = json.loads(out.getvalue())
    shown = [e.value for e in at.error] + [e.value for e in at.warning] + [e.value for e in at.info]
    assert sorted(shown) == sorted(f"[{f['kind']}] {f['message']}" for f in answer["findings"])
    assert any("did you mean 'stage3_prefetch_bucket_size'" in v for v in shown)  # the typo DeepSpeed refuses
    assert code == 1 and answer["estimate"]["memory"]["gpu_bytes"] / GiB == pytest.approx(
        float(metrics(at)["Peak GiB per GPU"]), abs=0.005)
    # a paste that is not JSON is one line, and the page recovers
    at.text_area(key="check_config").set_value("{oops").run()
    assert not at.exception and len(at.error) == 1 and "not valid JSON" in at.error[0].value
