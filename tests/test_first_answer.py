"""The first answer a user gets (issue 34, items 4 and 7): recommend answers with the engine that
fits where none was asked for; where the batch is why nothing fits, it says so and names batches
that fit; estimate takes recommend's batch; small edges of the flags and names."""

import io
import json
import math
import re

import pytest

from planner import api, cli
from planner.engines import ENGINES
from planner.inputs import DEFAULTS

FIELDS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "schedule", "zero", "offload_optimizer", "offload_params", "mbs",
          "recompute", "recompute_layers", "recompute_method", "sequence_parallel", "rank_order")


def run(*argv):
    out = io.StringIO()
    try:
        code = cli.main(list(argv), out=out)
    except SystemExit as exc:  # --help
        code = exc.code
    return code, out.getvalue()


def is_prime(n: int) -> bool:
    return n > 1 and all(n % k for k in range(2, math.isqrt(n) + 1))


def layout_input(row: dict) -> dict:
    """A layout record (recommend's) as estimate's layout input: gas and gbs follow from the batch."""
    return {k: row[k] for k in FIELDS if k in row and row[k] is not None}


# --- 1. no engine asked for, and the default one cannot fit: the fastest engine that can --------


@pytest.fixture(scope="module")
def trillion():
    code, text = run("recommend", "--params", "1e12", "--gpus", "4096")
    jcode, jtext = run("recommend", "--params", "1e12", "--gpus", "4096", "--json")
    return code, text, jcode, json.loads(jtext)


def test_no_engine_given_answers_with_an_engine_that_fits(trillion):
    code, text, jcode, d = trillion
    assert code == 0 and jcode == 0
    first = text.splitlines()[0]
    m = re.match(r"no (\S+) layout fits .*; (\S+)'s fastest fits", first)
    assert m, first
    default, chosen = m.groups()
    assert default == DEFAULTS["engine"] and chosen in ENGINES and chosen != default
    # the engine named first is the one whose layout is returned, in the JSON too
    assert d["defaults"]["engine"] == chosen == d["assumptions"]["engine"]
    assert d["notes"] and chosen in d["notes"][0]
    lead = d["layouts"][0]
    assert lead["memory"]["fits"] and lead["memory"]["verdict"] in ("fits", "borderline")
    # the fastest of the engines that fit: none of the others is faster
    others = [e for e in d["engines"] if e["layout"] is not None]
    assert all(e["tokens_per_s"] <= lead["throughput"]["tokens_per_s"] * (1 + 1e-9) for e in others)
    assert {e["engine"] for e in d["engines"]} == set(ENGINES) - {chosen}
    default_entry = next(e for e in d["engines"] if e["engine"] == default)
    assert default_entry["layout"] is None and default_entry["note"]


def test_the_chosen_engine_answers_as_it_would_when_named(trillion):
    _, _, _, d = trillion
    chosen = d["defaults"]["engine"]
    named = api.recommend(1e12, {"gpus": 4096}, {"engine": chosen}, top=1)
    assert named.layouts[0]["layout"] == d["layouts"][0]["layout"]
    # its layout fits by estimate's own verdict, the assumptions recommend chose given back
    knobs = {k: d["assumptions"][k] for k in ("tp_comm_overlap", "overlap_comm", "optimizer_offload_fraction",
                                               "stage3_max_live_parameters", "stage3_max_reuse_distance")
             if k in d["assumptions"]}
    e = api.estimate(1e12, {"gpus": 4096}, {"engine": chosen, "gbs": d["assumptions"]["gbs"], **knobs},
                     layout_input(d["layouts"][0]["layout"]))
    assert e.memory["fits"]


def test_a_named_engine_keeps_its_answer():
    # --engine deepspeed given: nothing fits a 1T model without TP in 4096 x 80 GB, exit 2
    code, text = run("recommend", "--params", "1e12", "--gpus", "4096", "--engine", "deepspeed", "--json")
    assert code == 2
    d = json.loads(text)
    assert d["layouts"] == [] and d["notes"] == [] and "engine" not in d["defaults"]
    # a power-of-two batch on a power-of-two cluster: the batch is not why (memory is)
    assert d["batch_proposals"] == []


# --- 2. nothing fits because of the batch -------------------------------------------------------


@pytest.fixture(scope="module")
def prime_batch():
    argv = ("recommend", "--model", "llama-3-70b", "--gpus", "128", "--seq-len", "6144", "--engine", "deepspeed")
    code, text = run(*argv)
    jcode, jtext = run(*argv, "--json")
    return code, text, jcode, json.loads(jtext)


def test_the_default_batch_at_6144_is_prime():
    gbs = round(DEFAULTS["tokens_per_step"] / 6144)
    assert DEFAULTS["tokens_per_step"] == 4_194_304 and gbs == 683 and is_prime(gbs)
    assert math.gcd(gbs, 128) == 1  # no data-parallel degree above 1 divides it


def test_a_prime_batch_is_named_as_the_cause(prime_batch, capsys):
    code, text, jcode, d = prime_batch
    assert code == 2 and jcode == 2
    first = text.splitlines()[0]
    assert first.startswith("nothing fits deepspeed") and "683 sequences" in first and "prime" in first
    assert d["layouts"] == [] and d["suggestions"][0].startswith("--gbs ")
    capsys.readouterr()
    run("recommend", "--model", "llama-3-70b", "--gpus", "128", "--seq-len", "6144", "--engine", "deepspeed")
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("planner: error: --gbs: ") and "683" in err


def test_proposed_batches_split_and_fit(prime_batch):
    _, text, _, d = prime_batch
    props = d["batch_proposals"]
    assert props and {p["engine"] for p in props} == {"deepspeed"}
    assert any(p["gbs"] < 683 for p in props) and any(p["gbs"] > 683 for p in props)
    assert [abs(p["gbs"] - 683) for p in props] == sorted(abs(p["gbs"] - 683) for p in props)
    assert len(props) <= 6  # a few, not a scan
    for p in props:
        lay = p["layout"]
        assert p["gbs"] % (lay["mbs"] * lay["dp"]) == 0 and lay["dp"] > 1
        assert p["tokens_per_step"] == p["gbs"] * 6144
        assert abs(p["gbs"] - 683) <= 683 // 8 + 1  # nearby
        assert f"--gbs {p['gbs']}" in text
        # it fits by the planner's own verdict, the batch and the settings its search chose given
        e = api.estimate("llama-3-70b", {"gpus": 128},
                         {"seq_len": 6144, "gbs": p["gbs"], "engine": "deepspeed", **p["settings"]}, layout_input(lay))
        assert e.memory["fits"]
        assert e.throughput["tokens_per_s"] == pytest.approx(p["tokens_per_s"], rel=1e-6)
    for p in (min(props, key=lambda p: p["gbs"]), max(props, key=lambda p: p["gbs"])):
        # and recommend at that batch finds a layout at least as fast
        r = api.recommend("llama-3-70b", {"gpus": 128}, {"seq_len": 6144, "gbs": p["gbs"], "engine": "deepspeed"},
                          top=1)
        assert r.layouts and r.layouts[0]["throughput"]["tokens_per_s"] >= p["tokens_per_s"] * (1 - 1e-9)


def test_prime_batch_without_engine_answers_and_still_proposes():
    code, text = run("recommend", "--model", "llama-3-70b", "--gpus", "128", "--seq-len", "6144")
    assert code == 0
    lines = text.splitlines()
    assert lines[0].startswith("no deepspeed layout fits") and "683 sequences" in lines[0]
    assert lines[1].startswith("batches that fit deepspeed")


# --- 3. estimate's batch: recommend's ---------------------------------------------------------


def test_estimate_takes_recommends_batch():
    code, text = run("estimate", "--model", "llama-3-70b", "--gpus", "64", "--json")
    assert code == 0
    d = json.loads(text)
    gbs = DEFAULTS["tokens_per_step"] // DEFAULTS["seq_len"]
    assert gbs == 1024 and d["defaults"]["gbs"] == gbs and d["layout"]["gbs"] == gbs and d["layout"]["gas"] == 16
    given = json.loads(run("estimate", "--model", "llama-3-70b", "--gpus", "64", "--gbs", "1024", "--json")[1])
    assert given["throughput"] == d["throughput"] and "gbs" not in given["defaults"]


def test_estimate_batch_rounds_to_a_multiple_of_mbs_dp():
    # 4Mi tokens / 6144 = 683 sequences; over 64 data-parallel ranks the nearest multiple is 704
    e = api.estimate("llama-3-8b", {"gpus": 64}, {"seq_len": 6144})
    assert e.defaults["gbs"] == 704 and 704 % 64 == 0 and abs(704 - 683) <= 32
    e = api.estimate("llama-3-8b", {"gpus": 64}, {"seq_len": 6144}, {"mbs": 2, "zero": 1})
    assert e.defaults["gbs"] % 128 == 0 and abs(e.defaults["gbs"] - 683) <= 64
    # a batch smaller than one micro-batch per rank: one
    e = api.estimate("llama-3-8b", {"gpus": 64}, {"seq_len": 131072, "tokens_per_step": 2**20}, {"zero": 3})
    assert e.defaults["gbs"] == 64


def test_estimate_text_says_what_it_assumed():
    code, text = run("estimate", "--model", "llama-3-70b", "--gpus", "64", "--tp", "8", "--zero", "1")
    assert code == 0
    answer, head = text.split("\nmodel ")[0].split("\nassumed: ", 1)  # the answer first (test_answer_first.py)
    head = "assumed: " + head
    assert answer.startswith("layout ") and "tokens/s" in answer.splitlines()[0]
    assert head.startswith("assumed: ") and all(len(line) <= 100 for line in head.splitlines())
    flat = " ".join(head.split())
    assert "gbs 1024" in flat and "engine megatron-deepspeed" in flat and "--tp 8" in flat
    code, text = run("estimate", "--model", "llama-3-70b", "--gpus", "64", "--gbs", "1024", "--engine", "deepspeed",
                     "--seq-len", "4096")
    flat = " ".join(text.split("\nmodel ")[0].split("\nassumed: ", 1)[1].split())
    assert "gbs" not in flat and "engine" not in flat and "seq_len" not in flat


# --- 4. small edges -------------------------------------------------------------------------


def test_misspelled_gpu_suggests_each_gpu_once(capsys):
    code, _ = run("estimate", "--gpu", "h100-sxn", "--gpus", "8", "--model", "llama-2-7b")
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--gpu" in err
    names = [n.strip() for n in re.search(r"did you mean ([^?]+)\?", err).group(1).split(",")]
    assert "h100-sxm" in names and len(names) == len(set(names))


def test_params_model_has_a_readable_name():
    e = api.estimate(70e9, {"gpus": 8}, layout={"zero": 3})
    assert e.model.name == "params-70B"
    assert api.estimate(1.5e12, {"gpus": 4096}, layout={"zero": 3}).model.name == "params-1.5T"


@pytest.mark.parametrize("command", ["recommend", "estimate"])
def test_help_describes_every_flag_asked_about(command):
    parser = cli.build_parser()
    sub = parser._subparsers._group_actions[0].choices[command]
    helps = {a.dest: a.help for a in sub._actions}
    assert helps["emit"] and helps["json"]
    assert all(name in helps["engine"] for name in ENGINES)
