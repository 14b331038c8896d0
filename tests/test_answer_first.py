"""recommend and estimate lead with the answer (issue 34, item 2): the first line names the layout
to launch (the one --emit writes) with its tokens/s, MFU, step time and memory verdict; then what
was assumed (wrapped at 100 columns); a table at most 120 columns wide; and one legend explaining
every abbreviation of the layout labels printed."""

import io
import json
import re

import pytest

from planner import cli
from planner.results import short

WIDTH = 120


def run(*argv):
    out = io.StringIO()
    code = cli.main(list(argv), out=out)
    return code, out.getvalue()


CASES = {"70e9-16": ("recommend", "--params", "70e9", "--gpus", "16"),
         "llama-3-70b-64": ("recommend", "--model", "llama-3-70b", "--gpus", "64")}


@pytest.fixture(scope="module", params=sorted(CASES))
def answer(request):
    argv = CASES[request.param]
    code, text = run(*argv)
    jcode, jtext = run(*argv, "--json")
    assert code == 0 and jcode == 0
    return text, json.loads(jtext)


def launched(d: dict) -> dict:
    """The layout --emit writes (cli.cmd_recommend): the clear fit under a borderline #1, else #1."""
    return d["clear_fit"] or d["layouts"][0]


def test_first_line_is_the_layout_to_launch(answer):
    text, d = answer
    assert not d["notes"]  # no engine fallback here: nothing comes before the answer
    first = text.splitlines()[0]
    rec = launched(d)
    assert first.startswith(f"launch {short(rec['layout'])}: ")
    assert f"{rec['throughput']['tokens_per_s']:,.0f} tokens/s" in first
    assert f"MFU {rec['throughput']['mfu']:.1%}" in first and f"step {rec['time']['step_s']:.2f} s" in first


def test_the_answer_says_its_margin_and_the_best_other_engine(answer):
    text, d = answer
    lines = text.splitlines()
    head = "\n".join(lines[:lines.index(next(x for x in lines if x.startswith("assumed: ")))])
    rec = launched(d)
    mem = rec["memory"]
    assert f"{mem['verdict']}, {mem['fit_margin_bytes'] / 2**30:.2f} GiB free of {mem['capacity_bytes'] / 2**30:.2f} GiB" \
        in head
    fitting = [e for e in d["engines"] if e["layout"] is not None]
    best = max(fitting, key=lambda e: e["relative_speed"])
    line = next(x for x in head.splitlines() if x.startswith("best other engine: "))
    assert line.startswith(f"best other engine: {best['engine']}, ")
    rel = best["relative_speed"]
    ratio = f"{rel:.2f}x faster" if rel > 1.005 else f"{1 / rel:.2f}x slower" if rel < 0.995 else "as fast"
    assert ratio in line and f"{best['tokens_per_s']:,.0f} tokens/s" in line and short(best["layout"]) in line


def test_assumed_comes_after_the_answer_wrapped_at_100(answer):
    text, d = answer
    lines = text.splitlines()
    k = next(i for i, x in enumerate(lines) if x.startswith("assumed: "))
    assert 0 < k <= 3
    block = [lines[k]] + [x for x in lines[k + 1:k + 12] if x.startswith("  ") and not x.startswith("   ")]
    block = block[:next((i for i, x in enumerate(block[1:], 1) if x.startswith("model ")), len(block))]
    assert all(len(x) <= 100 for x in block)
    flat = " ".join(" ".join(block).split())
    assert all(f"{key} " in flat for key in d["assumptions"])


def test_no_line_passes_120_columns(answer):
    text, _ = answer
    lines = text.splitlines()
    assert all(len(x) <= WIDTH for x in lines), max(lines, key=len)
    table = [x for x in lines if re.match(r"#\s+tokens/s", x)]
    assert len(table) == 1


def test_table_keeps_every_row_and_the_binding_constraint_of_1(answer):
    text, d = answer
    for k, rec in enumerate(d["layouts"], 1):
        row = next(x for x in text.splitlines() if re.match(rf"{k}\s", x))
        assert short(rec["layout"]) in row and f"{rec['throughput']['tokens_per_s']:,.0f}" in row
        assert rec["memory"]["verdict"] in row
    flat = " ".join(text.split())
    assert f"#1 is bound by {d['layouts'][0]['binding_constraint']}" in flat


def label_abbreviations(label: str) -> set:
    """'tp1 pp1 dp16 z3 mbs4x16 ful-rc off-opt:cpu' -> {'tp', 'pp', 'dp', 'z', 'mbs', 'ful-rc', 'off-opt'}."""
    return {re.sub(r"(\d+x\d+|\d+)$", "", tok.split(":")[0]) for tok in label.split()}


def legend_of(text: str) -> str:
    lines = text.splitlines()
    k = next(i for i, x in enumerate(lines) if x.startswith("legend: "))
    block = [lines[k]]
    for x in lines[k + 1:]:
        if not x.startswith("    "):
            break
        block.append(x)
    return " ".join(" ".join(block).split())


def test_legend_explains_every_abbreviation_printed(answer):
    text, d = answer
    legend = legend_of(text)
    labels = [rec["layout"] for rec in d["layouts"]] + [e["layout"] for e in d["engines"] if e["layout"]]
    labels += [launched(d)["layout"]]
    printed = [short(x) for x in labels]
    assert all(label in " ".join(text.split()) for label in printed)
    abbreviations = set().union(*(label_abbreviations(x) for x in printed))
    assert {"tp", "pp", "dp", "z", "mbs"} <= abbreviations
    for abbr in abbreviations:
        assert re.search(rf"(?<![\w-]){re.escape(abbr)}(?![a-z])", legend), (abbr, legend)


def test_estimate_leads_with_its_verdict():
    """estimate's verdict and step-time lines below stay whole (the dashboard and check quote them)."""
    argv = ("estimate", "--model", "llama-3-70b", "--gpus", "64", "--tp", "8", "--pp", "2", "--gbs", "1024")
    code, text = run(*argv)
    _, jtext = run(*argv, "--json")
    assert code == 0
    d = json.loads(jtext)
    lines = text.splitlines()
    first = lines[0]
    assert first.startswith(f"layout {short(d['layout'])}: ")
    assert f"{d['throughput']['tokens_per_s']:,.0f} tokens/s" in first and f"MFU {d['throughput']['mfu']:.1%}" in first
    assert f"step {d['time']['step_s']:.2f} s" in first and d["memory"]["verdict"] in first
    assert lines[1].startswith("assumed: ")
    k = next(i for i, x in enumerate(lines) if x.startswith("model "))
    assert all(len(x) <= 100 for x in lines[1:k])  # the assumed line, wrapped
    assert len(first) <= WIDTH
    legend = legend_of(text)
    for abbr in label_abbreviations(short(d["layout"])):
        assert re.search(rf"(?<![\w-]){re.escape(abbr)}(?![a-z])", legend), (abbr, legend)
