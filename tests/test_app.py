"""The Streamlit dashboard (app.py) under streamlit.testing's AppTest: what it shows equals the CLI's
`--json` answer for the same inputs, and bad input is a message on the page, not a traceback."""

import io
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from dashboard.inputs import config_from_upload  # noqa: E402
from planner import calibration, cli, memory, report, timing  # noqa: E402
from planner.errors import InputError  # noqa: E402
from planner.results import short  # noqa: E402

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


def settled(at: AppTest) -> AppTest:
    """The page once the other engines' comparison, which the app searches on a worker thread after
    drawing the first answer, is on it (the rerun the page's poll makes when it is done). A comparison
    an earlier page of this process already made is drawn at once, with no search asked for."""
    try:  # streamlit's AppTest state may list the key and still miss it on reading: as if none was asked
        future = at.session_state["engines_future"]
    except KeyError:
        future = None
    if future is not None:
        future.result(timeout=300)
        at.run()
    assert not any("searching the other engines" in m.value for m in [*at.markdown, *at.caption])
    return at


HEAD = re.compile(r"(?P<title>.*)  \n#### `(?P<label>[^`]*)` &nbsp; :(?P<colour>\w+)-badge\[(?P<verdict>\w+)\]")
COLOURS = {"fits": "green", "borderline": "orange", "oom": "red"}


def headline(at: AppTest) -> dict:
    """The headline at the top of the page: its title, layout label, verdict and the verdict's colour,
    its figures and the lines under them (the best other engine, or the suggested config)."""
    box = at.get_by_key("headline")
    first, *rest = [m.value for m in box.markdown]
    m = HEAD.fullmatch(first)
    assert m, first
    assert m["colour"] == COLOURS[m["verdict"]]  # fits green, borderline amber, OOM red
    return {**m.groupdict(), "metrics": {x.label: x.value for x in box.metric}, "aside": rest}


def legend_of(answer: dict) -> str:
    """report's legend (the CLI's) for the layout labels of a `recommend --json` answer, on one line."""
    rows = [r["layout"] for r in answer["layouts"]] + [e["layout"] for e in answer["engines"] if e["layout"]]
    rows += [answer["clear_fit"]["layout"]] if answer["clear_fit"] else []
    return " ".join(report.legend_text("\n".join(map(short, rows))).split())


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
    """The headline is `est`: its layout, verdict, tokens/s, MFU, step time and peak memory."""
    head = headline(at)
    assert head["label"] == short(est["layout"]) and head["verdict"] == est["memory"]["verdict"]
    shown = head["metrics"]
    assert shown["Peak GiB per GPU"] == f"{est['memory']['gpu_bytes'] / GiB:.2f}"
    assert shown["Step time (s)"] == f"{est['time']['step_s']:.2f}"
    assert shown["Tokens/s"] == f"{est['throughput']['tokens_per_s']:,.0f}"
    assert shown["MFU"] == f"{est['throughput']['mfu']:.1%}"


def colour_scales(at: AppTest) -> dict:
    """{'memory' | 'time': (colour scale domain, its range, the legend's entries)} of the memory and
    step-time charts' component colours."""
    out = {}
    for chart in at.get("vega_lite_chart"):
        spec = json.loads(chart.proto.spec)
        for part in spec.get("layer", [spec]):  # the memory chart: bars, error band, capacity line
            colour = part.get("encoding", {}).get("color", {})
            if colour.get("field") == "component":
                which = "memory" if part["encoding"]["y"].get("title") == "GiB per GPU" else "time"
                out[which] = (colour["scale"]["domain"], colour["scale"]["range"], colour["legend"]["values"])
    return out


def assert_colours_follow(at: AppTest, est: dict) -> dict:
    """Every component of the planner in the charts' colour scales, whatever `est` (the CLI's answer
    for the page's layout) holds, and its components with a value in the legends; the scales."""
    scales = colour_scales(at)
    stages = est["memory"]["per_stage"]
    assert scales["memory"][0] == list(memory.BREAKDOWN_KEYS)
    assert scales["memory"][2] == [k for k in memory.BREAKDOWN_KEYS if any(s["breakdown"][k] for s in stages)]
    assert scales["time"][0] == list(timing.BREAKDOWN_KEYS)
    assert scales["time"][2] == [k for k in timing.BREAKDOWN_KEYS if est["time"]["breakdown"][k] > 0]
    return scales


@pytest.mark.slow
def test_default_page_is_the_cli_answer_for_70b_on_16_gpus():
    at = settled(started())
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
    # and DeepSpeed's overlap_comm where it searched it on
    knobs = [f for k in ("stage3_max_live_parameters", "stage3_max_reuse_distance") if k in answer["assumptions"]
             for f in ("--" + k.replace("_", "-"), str(answer["assumptions"][k]))]
    knobs += ["--overlap-comm"] * bool(answer["assumptions"].get("overlap_comm"))
    est = cli_json("estimate", "--model", "llama-3-70b", "--gpus", "16", "--gbs", str(row["gbs"]),
                   "--engine", answer["assumptions"]["engine"], *estimate_flags(row), *knobs)
    # the headline: the CLI's first line (the layout to launch, #1 here) and its best other engine
    assert answer["clear_fit"] is None and est["layout"] == row
    assert est["throughput"] == answer["layouts"][0]["throughput"]  # the table's row, estimated alone
    assert_metrics_are(at, est)
    best = max((e for e in answer["engines"] if e["layout"]), key=lambda e: e["relative_speed"])
    assert headline(at)["aside"] == [
        f"**Best other engine**: {best['engine']}, {report.ratio_text(best['relative_speed'])} than #1 "
        f"({best['tokens_per_s']:,.0f} tokens/s): `{short(best['layout'])}`"]
    assert legend_of(answer) in [c.value for c in at.caption]  # the legend of the labels on the page
    # memory per stage, step time, and the speed-versus-memory scatter; the three launch files
    assert len(at.get("vega_lite_chart")) == 3
    assert_colours_follow(at, est)
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
    assert headline(at)["title"] == "Chosen layout: #3 of 10, megatron" and est["layout"] == row
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
    # and the headline is the layout the CLI says to launch: that one where it is in the table, else #1
    launch = answer["clear_fit"] if answer["clear_fit"]["rank"] else answer["layouts"][0]
    head = headline(at)
    assert head["label"] == short(launch["layout"]) and head["verdict"] == launch["memory"]["verdict"]
    assert head["metrics"]["Tokens/s"] == f"{launch['throughput']['tokens_per_s']:,.0f}"


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
def test_manual_layout_time_to_train_oom_and_bad_layouts():
    at = started()
    auto_scales = colour_scales(at)  # the default page's: llama-3-70b, ZeRO-3 and offloads, one stage
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
    assert headline(at)["title"] == "Your layout, megatron-deepspeed"
    assert metrics(at)["Time to train"] == f"{est['time_to_train']['days']:.1f} days"
    assert metrics(at)["Cost"] == f"{est['time_to_train']['cost']:,.0f}"
    assert len(at.get("vega_lite_chart")) == 2
    # each component keeps its colour: the scales are the whole lists on both pages, whatever they draw
    scales = assert_colours_follow(at, est)
    assert scales["memory"][:2] == auto_scales["memory"][:2] and scales["time"][:2] == auto_scales["time"][:2]
    assert scales["memory"][2] != auto_scales["memory"][2] and scales["time"][2] != auto_scales["time"][2]
    # the layout runs out of memory: red in the headline (assert_metrics_are), its launch files behind a
    # warning and a tick
    assert est["memory"]["verdict"] == "oom"
    assert not at.get("download_button") and len(at.warning) == 1 and "will not fit" in at.warning[0].value
    at.checkbox(key="download_anyway").check().run()
    assert "megatron_args.txt" in [b.label for b in at.get("download_button")]
    # an impossible layout is one line on the page; fixing it brings the answer back
    at.number_input(key="man_tp").set_value(3).run()
    assert not at.exception and len(at.error) == 1 and at.error[0].value.startswith("--gpus: 16 is not divisible")
    at.number_input(key="man_tp").set_value(8).run()
    assert not problems(at)
    assert_metrics_are(at, est)


@pytest.mark.slow
def test_profiles_of_the_chosen_gpu_and_nothing_fits():
    def measured_on(name: str, gpu: str) -> bool:  # the planner takes a profile for this GPU
        try:
            return calibration.load(name, gpu) is not None
        except InputError:
            return False

    at = started()
    offered = at.selectbox(key="calibration").options
    assert offered == ["none", *(p for p in calibration.known_profiles() if measured_on(p, "h100-sxm"))]
    assert "cpu-gloo" not in offered  # measured on CPU
    at.selectbox(key="gpu").set_value("h200").run()
    offered = at.selectbox(key="calibration").options
    assert offered == ["none", *(p for p in calibration.known_profiles() if measured_on(p, "h200"))]
    assert "h200" in offered
    at.selectbox(key="calibration").set_value("h200")
    at.selectbox(key="gpu").set_value("h100-sxm").run()  # a profile of the GPU left behind goes with it
    assert at.selectbox(key="calibration").value == "none" and not problems(at)
    at.selectbox(key="model_name").set_value("llama-3.1-405b")
    at.selectbox(key="engine").set_value("megatron")  # no offload: 405B needs thousands of GiB on one GPU
    at.number_input(key="gpus").set_value(1)
    at.run()
    assert not at.exception and at.error and at.error[0].value.startswith("Nothing fits.")
    code, _ = cli.main(["recommend", "--model", "llama-3.1-405b", "--engine", "megatron", "--gpus", "1"],
                       out=io.StringIO()), None
    assert code == 2  # the CLI agrees


@pytest.mark.parametrize("name, raw, words", [
    ("notes.json", b"this is not json", "not valid JSON"),
    ("list.json", b"[1, 2, 3]", "not a Hugging Face model config"),
    ("big.json", b"{" + b" " * (2**20 + 1) + b"}", "a config.json is under 1 MiB"),
])
def test_uploads_that_are_not_a_config_are_one_line(name, raw, words):
    with pytest.raises(InputError, match=words):
        config_from_upload(name, raw)


def test_an_uploaded_config_with_nonsense_values_is_refused_by_the_api():
    config = config_from_upload("config.json", json.dumps(
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
    assert code == 1
    # your config in the headline and under its own heading; the suggested one under "Suggested", with
    # the launch files (they are its files, not yours)
    assert_metrics_are(at, answer["estimate"])
    head = headline(at)
    better = answer["better"]
    assert head["title"] == "Your config" and better is not None
    assert not answer["estimate"]["memory"]["fits"] and better["gain"] is None  # the suggested one fits instead
    assert head["aside"] == [f"**Suggested**: `{better['label']}`, fits, {better['tokens_per_s']:,.0f} tokens/s"]
    headings = [h.value for h in at.subheader]
    assert headings.index("Your config") < headings.index("Suggested") < headings.index("Launch files")
    assert [b.label for b in at.get("download_button")] == ["ds_config.json", "accelerate_config.yaml", "launch.sh"]
    assert better["label"] == short(better["layout"])
    # a paste that is not JSON is one line, and the page recovers
    at.text_area(key="check_config").set_value("{oops").run()
    assert not at.exception and len(at.error) == 1 and "not valid JSON" in at.error[0].value
