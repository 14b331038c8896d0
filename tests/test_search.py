"""`planner recommend`: the enumerated space, the rules, the ranking and its agreement with estimate."""

import io
import json

import numpy as np
import pytest

from planner import cli, hardware, layout, results, search, variants
from planner.engines import NAMES as ENGINE_NAMES
from planner.errors import InputError
from planner.model import lookup


def recommend(*argv):
    out = io.StringIO()
    code = cli.main(["recommend", *argv], out=out)
    return code, out.getvalue()


def test_space_size_is_the_product_of_the_searched_choices():
    model = lookup("llama-2-7b")
    cluster = hardware.Cluster(hardware.lookup_gpu("h100-sxm"), 8, 8)
    res = search.search(model, cluster, layout.Training(gbs=64, engine="megatron-deepspeed"))
    # (tp, pp, cp, dp) with tp*pp*cp*dp = 8 = 2^3 and every factor a power of two: C(3+3, 3) = 20
    # ways; x 16 micro-batch sizes x 6 vpp choices x 4 ZeRO x 3 x 3 offloads x 3 recompute x 2 SP
    assert res.candidates == 20 * 16 * 6 * 4 * 3 * 3 * 3 * 2
    assert sum(res.rejected.values()) + len(res.order) == res.candidates


def test_recommended_layouts_obey_the_rules_and_fit():
    code, text = recommend("--model", "llama-2-13b", "--gpus", "16", "--gbs", "128", "--engine",
                           "megatron-deepspeed", "--top", "20", "--json")
    assert code == 0
    d = json.loads(text)
    assert d["candidates_evaluated"] >= sum(d["rejected"].values()) + len(d["layouts"])
    speeds = [r["throughput"]["tokens_per_s"] for r in d["layouts"]]
    assert speeds == sorted(speeds, reverse=True)
    for r in d["layouts"]:
        lay, mem = r["layout"], r["memory"]
        assert lay["tp"] * lay["pp"] * lay["dp"] * lay["cp"] == 16
        assert lay["mbs"] * lay["gas"] * lay["dp"] == 128
        assert 40 % lay["tp"] == 0 and lay["tp"] <= 8  # Llama-2-13B has 40 heads; TP inside a node
        assert not (lay["pp"] > 1 and lay["zero"] >= 2)  # DeepSpeed's pipeline engine: ZeRO 0/1 only
        assert mem["fits"] and mem["required_bytes"] <= 0.95 * mem["capacity_bytes"]


def test_recommend_agrees_with_estimate_of_the_same_layout():
    code, text = recommend("--model", "llama-2-7b", "--gpus", "8", "--gbs", "64", "--json", "--top", "1")
    best = json.loads(text)["layouts"][0]
    lay = best["layout"]
    argv = ["estimate", "--model", "llama-2-7b", "--gpus", "8", "--gbs", "64", "--json", "--engine", "deepspeed"]
    for flag in ("tp", "pp", "dp", "cp", "ep", "vpp", "zero", "mbs"):
        argv += [f"--{flag}", str(lay[flag])]
    argv += ["--recompute", lay["recompute"], "--offload-optimizer", lay["offload_optimizer"],
             "--offload-params", lay["offload_params"]] + (["--sequence-parallel"] if lay["sequence_parallel"] else [])
    out = io.StringIO()
    assert cli.main(argv, out=out) == 0
    est = json.loads(out.getvalue())
    assert est["memory"]["gpu_bytes"] == best["memory"]["gpu_bytes"]
    assert est["time"]["step_s"] == pytest.approx(best["time"]["step_s"], rel=1e-12)


def test_engine_rules_shape_the_answer():
    model = lookup("llama-2-70b")
    cluster = hardware.Cluster(hardware.lookup_gpu("a100-80gb"), 32, 8)
    for engine in ENGINE_NAMES:
        res = search.search(model, cluster, layout.Training(gbs=256, engine=engine))
        v = res.valid
        if engine == "deepspeed":
            assert (v.tp == 1).all() and not ((v.pp > 1) & (v.zero >= 2)).any()
        if engine == "megatron":
            # the optimizer offloads to the CPU under the distributed optimizer only (HybridDeviceOptimizer)
            assert (v.zero <= 1).all() and (v.offload_params == 0).all() and (v.offload_optimizer <= 1).all()
            assert ((v.offload_optimizer == 0) | (v.zero == 1)).all() and (v.offload_optimizer == 1).any()
        if engine == "fsdp":
            assert (v.pp == 1).all() and (v.zero != 1).all()


def test_nothing_fits_says_what_would(capsys):
    code, text = recommend("--params", "1e12", "--gpus", "8", "--engine", "megatron")
    assert code == 2
    # only ZeRO-Infinity fits a 1T model on 8 GPUs; DeepSpeed's own dp 8 spills its host memory (2,156
    # GiB a node: 250 GB of bf16 gradient partitions a rank and, the parameters spilling past
    # max_in_cpu, the reuse buffer of a sub-group's full parameters, ~16 GB a rank), Megatron-DeepSpeed's
    # tp 8 does not
    assert "nothing fits" in text and "GiB per GPU" in text and "--engine megatron-deepspeed fits" in text


def test_emit_from_recommend(tmp_path):
    code, text = recommend("--model", "llama-2-7b", "--gpus", "8", "--gbs", "64", "--json", "--emit", str(tmp_path))
    assert code == 0
    emitted = json.loads(text)["layouts"][0]["emitted"]
    cfg = json.loads((tmp_path / "ds_config.json").read_text())
    best = json.loads(text)["layouts"][0]["layout"]
    assert str(tmp_path / "ds_config.json") in emitted
    assert cfg["train_batch_size"] == 64 == best["mbs"] * best["gas"] * best["dp"]
    assert cfg["zero_optimization"]["stage"] == best["zero"]


def test_emit_under_a_borderline_first_writes_the_layout_that_clears_the_band(tmp_path):
    # 70B on 16 H100s under Megatron: #1's peak is inside the +-10 % band of capacity; the files are for
    # the fastest layout whose need plus its band fits, the one recommend names
    code, text = recommend("--params", "70e9", "--gpus", "16", "--engine", "megatron", "--json", "--emit", str(tmp_path))
    answer = json.loads(text)
    assert code == 0 and answer["layouts"][0]["memory"]["verdict"] == "borderline"
    clear = answer["clear_fit"]
    assert "emitted" in clear and "emitted" not in answer["layouts"][0]
    assert clear["layout"]["cp"] != answer["layouts"][0]["layout"]["cp"]  # #1 runs cp 1, the clear fit cp 2
    args = (tmp_path / "megatron_args.txt").read_text()
    assert f"--context-parallel-size {clear['layout']['cp']}" in args


@pytest.mark.parametrize("argv, flag", [
    (["--params", "70e9", "--gpus", "16", "--gbs", "64", "--tokens-per-step", "1e6"], "--gbs"),
    (["--model", "llama-2-7b", "--params", "7e9", "--gpus", "8"], "--model"),
    (["--params", "70e9", "--gpus", "12"], "--gpus"),
    (["--params", "70e9", "--gpus", "16", "--memory-headroom", "1.5"], "--memory-headroom"),
])
def test_recommend_bad_input(argv, flag, capsys):
    code, _ = recommend(*argv)
    err = capsys.readouterr().err
    assert code == 2 and flag in err and err.count("\n") == 1


def test_search_is_one_vectorized_pass_over_arrays():
    model = lookup("llama-3-8b")
    cluster = hardware.Cluster(hardware.lookup_gpu("h100-sxm"), 64, 8)
    lay, dropped, coarsened = search.enumerate_layouts(model, cluster, layout.Training(gbs=512))
    assert isinstance(lay.tp, np.ndarray) and lay.tp.ndim == 1 and lay.size > 50_000
    # built: 16 of the 36 (zero, offload optimizer, offload params) combinations; the rest counted
    assert dropped["engine rule"] == lay.size * (36 - 16) // 16


def test_binding_constraint_names_a_variant_that_does_not_fit():
    code, text = recommend("--params", "70e9", "--gpus", "16", "--json", "--top", "3")
    d = json.loads(text)
    usable_gib = 0.95 * d["layouts"][0]["memory"]["capacity_bytes"] / 2**30
    for rec in d["layouts"]:
        msg = rec["binding_constraint"]
        if msg.startswith("memory:"):
            need = float(msg.rsplit("needs ", 1)[1].split(" GiB")[0])
            assert need > usable_gib  # the faster variant it names really does not fit


def test_recommend_time_to_train():
    code, text = recommend("--model", "llama-2-7b", "--gpus", "8", "--gbs", "64", "--seq-len", "4096",
                           "--tokens", "1e12", "--price-per-gpu-hour", "2", "--json", "--top", "1")
    rec = json.loads(text)["layouts"][0]
    steps = 1e12 / (64 * 4096)  # tokens / tokens per step
    assert rec["time_to_train"]["days"] == pytest.approx(steps * rec["time"]["step_s"] / 86400)
    assert rec["time_to_train"]["cost"] == pytest.approx(2 * steps * rec["time"]["step_s"] * 8 / 3600)


def test_pinned_axes_keep_their_values_and_find_the_full_searchs_best_of_them():
    code, text = recommend("--model", "llama-3-70b", "--gpus", "64", "--engine", "megatron", "--tp", "8", "--zero", "1",
                           "--top", "20", "--no-tp-comm-overlap", "--json")
    assert code == 0
    d = json.loads(text)
    assert d["assumptions"]["pinned"] == {"tp": 8, "zero": 1}
    assert d["layouts"] and all(r["layout"]["tp"] == 8 and r["layout"]["zero"] == 1 for r in d["layouts"])
    # the unpinned search over the same inputs, filtered to tp 8 / ZeRO-1 afterwards, ranks the same layout first
    model, cluster = lookup("llama-3-70b"), hardware.Cluster(hardware.lookup_gpu("h100-sxm"), 64, 8)
    res = search.search(model, cluster, layout.Training(gbs=1024, engine="megatron"))
    first = next(int(i) for i in res.order if res.valid.tp[i] == 8 and res.valid.zero[i] == 1)
    assert d["layouts"][0]["throughput"]["tokens_per_s"] == pytest.approx(
        float(res.eval.tokens_per_s[first]), rel=1e-9)
    # pinning removes the other values from the space instead of rejecting them
    assert d["candidates_evaluated"] < res.candidates / 10


@pytest.mark.parametrize("argv, gains", [
    # tp 8 on H100: each TP collective of a 70B block is long beside its GEMMs; hidden, it pays
    (("--model", "llama-3-70b", "--gpus", "64", "--gpu", "h100-sxm", "--tp", "8"), True),
    # tp 4 on A100: the 16 SMs TransformerEngine's collectives take (108 of them) cost the GEMMs more
    # than the overlap hides
    (("--model", "gpt3-175b", "--gpus", "96", "--gpu", "a100-80gb", "--tp", "4"), False),
])
def test_recommend_turns_on_tp_comm_overlap_only_where_the_fastest_layout_gains(argv, gains, tmp_path):
    def best(*more):
        code, text = recommend(*argv, "--engine", "megatron", "--top", "1", *more, "--json")
        assert code == 0
        d = json.loads(text)
        return d, d["layouts"][0]["throughput"]["tokens_per_s"]

    (chosen, speed), (_, on), (off_d, off) = best("--emit", str(tmp_path)), best("--tp-comm-overlap"), \
        best("--no-tp-comm-overlap")
    assert (on > off) == gains
    assert speed == pytest.approx(max(on, off), rel=1e-9)
    assert chosen["assumptions"].get("tp_comm_overlap", False) == gains
    assert chosen["defaults"].get("tp_comm_overlap", False) == gains
    assert "tp_comm_overlap" not in off_d["assumptions"]  # the user's own choice is no default
    # what recommend chose is what it exports
    assert ("--tp-comm-overlap" in (tmp_path / "launch.sh").read_text()) == gains


def test_pinned_optimizer_offload_leaves_the_parameters_offload_searched():
    # --offload-optimizer cpu alone: ZeRO-1/2 layouts (parameters on the GPU) stay in the search, and
    # the pinned search's best is at least the full search's best with the optimizer on the CPU (the
    # pinned one also tries --recompute-layers variants of offloading layouts: search.REFINED_PARENTS)
    code, text = recommend("--model", "llama-3-8b", "--gpus", "8", "--engine", "deepspeed", "--offload-optimizer", "cpu",
                           "--top", "20", "--json")
    assert code == 0
    rows = [r["layout"] for r in json.loads(text)["layouts"]]
    assert all(r["offload_optimizer"] == "cpu" for r in rows)
    assert any(r["offload_params"] == "none" and r["zero"] < 3 for r in rows)
    model, cluster = lookup("llama-3-8b"), hardware.Cluster(hardware.lookup_gpu("h100-sxm"), 8, 8)
    res = search.search(model, cluster, layout.Training(gbs=1024, engine="deepspeed"))
    first = next(int(i) for i in res.order if res.valid.offload_optimizer[i] == 1)
    assert json.loads(text)["layouts"][0]["throughput"]["tokens_per_s"] >= \
        float(res.eval.tokens_per_s[first]) * (1 - 1e-9)


def test_pins_without_an_engine_choose_one_that_has_the_axes():
    # the issue's own command: DeepSpeed alone has no TP, so without --engine the pins pick the engine
    # estimate would (api.default_engine): megatron-deepspeed with TP, megatron with interleaving
    code, text = recommend("--model", "llama-3-70b", "--gpus", "64", "--tp", "8", "--zero", "1", "--json")
    assert code == 0
    d = json.loads(text)
    assert d["defaults"]["engine"] == d["assumptions"]["engine"] == "megatron-deepspeed"
    assert d["layouts"] and all(r["layout"]["tp"] == 8 and r["layout"]["zero"] == 1 for r in d["layouts"])
    code, text = recommend("--model", "llama-3-70b", "--gpus", "64", "--vpp", "2", "--json", "--top", "1")
    d = json.loads(text)
    assert code == 0 and d["assumptions"]["engine"] == "megatron" and d["layouts"][0]["layout"]["vpp"] == 2
    # no layout pin: DeepSpeed stays the default, the others are compared under the table
    code, text = recommend("--model", "llama-3-70b", "--gpus", "64", "--zero", "3", "--json", "--top", "1")
    assert json.loads(text)["assumptions"]["engine"] == "deepspeed"
    # expert parallelism: DeepSpeed alone launches none, Megatron-Core does (estimate takes the same engine)
    code, text = recommend("--model", "qwen3-30b-a3b", "--gpus", "16", "--ep", "8", "--json", "--top", "1")
    d = json.loads(text)
    assert code == 0 and d["assumptions"]["engine"] == "megatron" and d["layouts"][0]["layout"]["ep"] == 8
    out = io.StringIO()
    assert cli.main(["estimate", "--model", "qwen3-30b-a3b", "--gpus", "16", "--ep", "8", "--zero", "1", "--json"],
                    out=out) == 0
    assert json.loads(out.getvalue())["defaults"]["engine"] == "megatron"


@pytest.mark.parametrize("argv, flags", [
    (["--gpus", "48", "--tp", "3"], "--tp"),                    # 3 divides 48 but not the 64 heads
    (["--gpus", "32", "--tp", "8", "--pp", "8"], "--tp*--pp"),  # 64 > 32 GPUs
    (["--gpus", "32", "--tp", "8", "--pp", "2", "--dp", "4", "--cp", "2"], "--tp*--pp*--cp*--dp"),  # 64 != 32
    (["--gpus", "32", "--recompute", "some"], "--recompute"),
])
def test_contradicting_pins_name_their_flags(argv, flags, capsys):
    code, _ = recommend("--model", "llama-3-70b", "--engine", "megatron", *argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith(f"planner: error: {flags}")


def test_pareto_front():
    memory_bytes = np.array([1, 2, 3, 4, 4])
    tokens_per_s = np.array([1.0, 3.0, 2.0, 4.0, 3.5])
    # (3 B, 2 tok/s) is beaten by (2 B, 3 tok/s); (4 B, 3.5) by (4 B, 4)
    assert results.pareto_front(memory_bytes, tokens_per_s).tolist() == [True, True, False, True, False]


def test_engine_comparison_is_each_engines_own_recommendation():
    code, text = recommend("--model", "llama-3-70b", "--gpus", "64", "--engine", "deepspeed", "--json")
    d = json.loads(text)
    best = d["layouts"][0]["throughput"]["tokens_per_s"]
    assert [e["engine"] for e in d["engines"]] == [n for n in ENGINE_NAMES if n != "deepspeed"]
    for entry in d["engines"]:
        code, own = recommend("--model", "llama-3-70b", "--gpus", "64", "--engine", entry["engine"], "--json")
        searched = json.loads(own)["defaults"]
        own = json.loads(own)["layouts"][0]
        assert entry["layout"] == own["layout"]
        # the settings its own recommend chose, as the defaults it reports
        assert entry["settings"] == {k: searched[k] for k in ("tp_comm_overlap", "optimizer_offload_fraction",
                                                               "stage3_max_live_parameters", "stage3_max_reuse_distance",
                                                               "overlap_comm")
                                     if k in searched}
        assert entry["relative_speed"] == pytest.approx(own["throughput"]["tokens_per_s"] / best, rel=1e-9)
    # 3D parallelism beats ZeRO-3 data parallelism at this scale (Narayanan et al. 2021, section 5.2: PTD-P vs ZeRO-3)
    assert max(e["relative_speed"] for e in d["engines"] if e["engine"] == "megatron-deepspeed") > 1


def test_engine_comparison_keeps_the_pins_and_says_when_they_break_an_engine():
    code, text = recommend("--model", "llama-3-70b", "--gpus", "64", "--engine", "megatron", "--tp", "8", "--json")
    d = json.loads(text)
    by = {e["engine"]: e for e in d["engines"]}
    assert by["deepspeed"]["layout"] is None and by["deepspeed"]["note"] == "the pinned axes break its rules"
    assert by["megatron-deepspeed"]["layout"]["tp"] == 8


def test_partial_recompute_fills_the_memory_that_full_recompute_leaves():
    """Llama 3.1 405B on 128 H100 under Megatron: recomputing every layer leaves memory free and
    no recompute does not fit; the search tries the block method's first N layers per chunk and
    keeps the least recompute that fits (Megatron --recompute-method block). With the optimizer on
    the GPU: offloaded to the CPU, no recompute fits."""
    code, text = recommend("--model", "llama-3.1-405b", "--gpus", "128", "--engine", "megatron", "--top", "1",
                           "--offload-optimizer", "none", "--json")
    assert code == 0
    d = json.loads(text)
    lay = d["layouts"][0]["layout"]
    assert lay["recompute"] == "full" and lay["recompute_layers"]
    assert d["rejected"]["more recompute than a variant that fits"] > 0
    assert sum(d["rejected"].values()) + len(d["layouts"]) <= d["candidates_evaluated"]

    def estimate(n):
        argv = ["estimate", "--model", "llama-3.1-405b", "--gpus", "128", "--engine", "megatron", "--json",
                "--recompute", "full", "--tp", str(lay["tp"]), "--pp", str(lay["pp"]), "--vpp", str(lay["vpp"]),
                "--cp", str(lay["cp"]), "--zero", str(lay["zero"]), "--mbs", str(lay["mbs"]), "--gbs", str(lay["gbs"])]
        argv += ["--sequence-parallel"] if lay["sequence_parallel"] else []
        argv += ["--recompute-layers", str(n)] if n else []
        argv += ["--pp-edge-layers", str(d["assumptions"]["pp_edge_layers"])]  # the split recommend searched
        argv += ["--tp-comm-overlap"] if d["assumptions"].get("tp_comm_overlap") else []  # and the TP overlap
        out = io.StringIO()
        assert cli.main(argv, out=out) == 0
        return json.loads(out.getvalue())

    chosen, one_fewer, every = estimate(lay["recompute_layers"]), estimate(lay["recompute_layers"] - 1), estimate(None)
    usable = 0.95 * chosen["memory"]["capacity_bytes"]  # recommend keeps 5 % free
    assert chosen["memory"]["required_bytes"] <= usable < one_fewer["memory"]["required_bytes"]
    assert chosen["time"]["step_s"] < every["time"]["step_s"]
    assert chosen["time"]["step_s"] == pytest.approx(d["layouts"][0]["time"]["step_s"], rel=1e-12)


def test_recompute_layers_pin_and_its_contradictions(capsys):
    code, text = recommend("--model", "llama-3.1-405b", "--gpus", "256", "--engine", "megatron", "--recompute-layers", "4",
                           "--top", "3", "--json")
    assert code == 0
    assert {r["layout"]["recompute_layers"] for r in json.loads(text)["layouts"]} == {4}
    for argv, flag in ((["--recompute", "selective", "--recompute-layers", "4"], "--recompute-layers"),
                       (["--engine", "deepspeed", "--recompute-layers", "30"], "--recompute-layers"),  # not ceil(80/k)
                       (["--engine", "fsdp", "--recompute", "selective"], "--recompute")):
        code, _ = recommend("--model", "llama-3-70b", "--gpus", "64", *argv)
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and err.startswith(f"planner: error: {flag}")


def test_recommend_searches_megatrons_edge_accounting():
    # Llama 3 405B's 126 blocks interleave over 16 stages only with the embedding and the loss counted
    # as a block each ((126 + 2)/(16 x 2) = 4 a chunk; Dubey et al. 2024 section 3.3.2 ran 7, 8 x 14, 7):
    # pinned to pp 16 vpp 2, recommend finds it: Megatron's --account-for-* split lets more pipelines
    # interleave evenly (variants.edge_layers_choice), for 80 blocks it does not (80 divides, 82 = 2 x 41)
    from planner import api

    rec = api.recommend("llama-3.1-405b", {"gpus": 8192}, {"engine": "megatron", "seq_len": 8192, "gbs": 2048},
                        pinned={"tp": 8, "pp": 16, "vpp": 2}, top=1)
    assert rec.layouts and rec.assumptions["pp_edge_layers"] == 1 and rec.defaults["pp_edge_layers"] == 1
    assert rec.layouts[0]["layout"]["vpp"] == 2
    training = layout.Training(engine="megatron")
    h100 = hardware.lookup_gpu("h100-sxm")
    assert variants.edge_layers_choice(lookup("llama-3-70b"), hardware.Cluster(h100, 64, 8), training).pipeline_edge_layers == 0
    # told not to, 126 % 32 != 0: the pinned interleaving runs as unequal chunks, which Megatron-LM takes as
    # --pipeline-model-parallel-layout (Engine.pipeline_layout; 30 chunks of 4 blocks and 2 of 3)
    plain = api.recommend("llama-3.1-405b", {"gpus": 8192},
                          {"engine": "megatron", "seq_len": 8192, "gbs": 2048, "pipeline_edge_layers": 0},
                          pinned={"tp": 8, "pp": 16, "vpp": 2}, top=1)
    assert plain.layouts[0]["layout"]["vpp"] == 2 and plain.assumptions["pp_edge_layers"] == 0


def test_estimate_takes_the_edge_accounting_a_stated_interleaving_needs():
    # NVIDIA's B200 recipe for Qwen3-235B-A22B (NeMo scripts/performance/recommended_model_configs/
    # model_configs_b200.csv: pp 8, vpp 12, ep 8) interleaves 94 blocks over 96 chunks, which
    # Megatron-LM only starts with the embedding and the loss counted as layers ((94 + 2) / 96 = 1;
    # training/arguments.py validate_args; NeMo's qwen3_235b_a22b recipe sets both --account-for-*)
    from planner import api

    cluster, training = {"gpu": "b200", "gpus": 64}, {"engine": "megatron", "seq_len": 4096, "gbs": 1024}
    lay = {"pp": 8, "vpp": 12, "ep": 8, "mbs": 1, "zero": 1}
    est = api.estimate("qwen3-235b-a22b", cluster, training, lay)
    assert est.training.pipeline_edge_layers == 1 and est.defaults["pp_edge_layers"] == 1
    # told not to count them, 96 chunks exceed 94 blocks: refused, naming the flag
    with pytest.raises(InputError, match=r"^--pp\*--vpp: must not exceed the layer count 94"):
        api.estimate("qwen3-235b-a22b", cluster, {**training, "pipeline_edge_layers": 0}, lay)
    # a layout that divides the blocks as they are keeps Megatron-LM's default (no edge accounting)
    plain = api.estimate("qwen3-235b-a22b", cluster, training, {**lay, "pp": 2, "vpp": 1, "ep": 8})
    assert plain.training.pipeline_edge_layers == 0 and "pp_edge_layers" not in plain.defaults


def test_recommend_lowers_zero3_live_parameters_where_that_decides_the_fit():
    # Llama-2-7B, ZeRO-3 on 8 GPUs of 42 GiB, nothing offloaded: DeepSpeed's default 1e9 live
    # parameters keep 2 GB of gathered weights beside the module computing; 2 x its largest block
    # submodule (gate_proj, 4096 x 11008 = 45,088,768), rounded up to 1e8, keeps 1e8:
    # (1e9 - 1e8) x 2 B = 1.68 GiB less (measured bounds: tests/test_deepspeed_zero3_live.py)
    from planner import api

    pins = {"zero": 3, "offload_optimizer": "none", "offload_params": "none", "mbs": 1, "recompute": "none"}
    cluster = {"gpu": "a100-40gb", "gpus": 8, "gpu_memory_gib": 42}
    rec = api.recommend("llama-2-7b", cluster, {"seq_len": 4096}, pinned=pins, top=1)
    assert rec.layouts and rec.defaults["stage3_max_live_parameters"] == 100_000_000
    assert rec.training.zero_config.stage3_max_reuse_distance == 100_000_000
    default = api.estimate("llama-2-7b", cluster, {"seq_len": 4096}, {"dp": 8, **pins})
    lean = api.estimate("llama-2-7b", cluster, {"seq_len": 4096, "stage3_max_live_parameters": 100_000_000,
                                                "stage3_max_reuse_distance": 100_000_000}, {"dp": 8, **pins})
    saved = default.memory["allocated_bytes"] - lean.memory["allocated_bytes"]
    assert saved == pytest.approx((1e9 - 1e8) * 2, rel=1e-6)
    assert rec.layouts[0]["memory"]["gpu_bytes"] == pytest.approx(lean.memory["gpu_bytes"], rel=1e-9)
    # told the knobs, recommend keeps them (and with the defaults nothing of these pins fits)
    # (--engine deepspeed named: without it, recommend answers with an engine whose layout fits)
    told = api.recommend("llama-2-7b", cluster, {"seq_len": 4096, "stage3_max_live_parameters": 10**9,
                                                 "engine": "deepspeed"}, pinned=pins, top=1)
    assert not told.layouts


def test_recommend_raises_zero3_live_parameters_where_recompute_gathers_twice():
    # Llama-3.1-405B (a block of 2 x 16384^2 + 2 x 16384 x 1024 + 3 x 16384 x 53248 = 3,187,671,040
    # elements, 3,187,703,808 with its norms) on 512 H100s under ZeRO-3 with every block recomputed:
    # DeepSpeed's 1e9 defaults release gate_proj and what runs before it after the recompute, so the backward gathers
    # 45 % of each block again (counted on the real engine: tests/test_deepspeed_zero3_live.py);
    # knobs of 3.2e9 keep the block, and the search takes them because the step is faster
    from planner import api, sharding
    from planner.model import lookup

    model = lookup("llama-3.1-405b")
    cluster, training = {"gpus": 512, "gpu": "h100-sxm"}, {"engine": "deepspeed", "seq_len": 4096, "gbs": 512}
    pins = {"zero": 3, "recompute": "full", "offload_optimizer": "none", "offload_params": "none"}
    rec = api.recommend(model, cluster, training, pinned=pins, top=1)
    assert rec.defaults["stage3_max_live_parameters"] == rec.defaults["stage3_max_reuse_distance"] == 3_200_000_000
    lay = layout.single(dp=512, zero=3, recompute="full")
    fetches = sharding.recompute_fetches(model, rec.training, lay)
    assert fetches["regather"][0] == 0
    default = api.estimate(model, cluster, training, {"dp": 512, "mbs": 1, **pins})
    roomy = api.estimate(model, cluster, {**training, "stage3_max_live_parameters": 3_200_000_000,
                                          "stage3_max_reuse_distance": 3_200_000_000}, {"dp": 512, "mbs": 1, **pins})
    assert roomy.time["step_s"] < default.time["step_s"]
    assert rec.layouts[0]["time"]["step_s"] == pytest.approx(roomy.time["step_s"], rel=1e-9)
    # the block held: (3.2e9 - 1e9) more elements gathered ahead at 2 B each
    held = roomy.memory["allocated_bytes"] - default.memory["allocated_bytes"]
    assert held == pytest.approx((3.2e9 - 1e9) * 2, rel=0.01)
    # a 70B block (856M elements) fits under the defaults: nothing to raise
    assert variants.roomy_zero3_training(lookup("llama-3-70b"), layout.Training(engine="deepspeed")) is None


def test_hugging_face_engines_offer_only_the_recompute_gradient_checkpointing_launches():
    """transformers 5.25 modeling_utils.py _activation_checkpointing_enable wraps whole decoder layers
    in torch.utils.checkpoint and accelerate's fsdp_activation_checkpointing is a bool, so DeepSpeed
    and FSDP on Hugging Face modules checkpoint every layer or none; a 'selective' plan there would be
    launched without recompute and hold every activation. Llama-3-8B at 8K tokens on 8 GPUs: the
    search ranks selective layouts among the first 40 when the engine is allowed it."""
    import inspect

    from planner import api

    modeling_utils = pytest.importorskip("transformers.modeling_utils")
    knobs = inspect.signature(modeling_utils.PreTrainedModel.activation_checkpointing_enable).parameters
    assert "every_n_layers" in knobs and not any("selective" in k for k in knobs)
    for name in ("deepspeed", "fsdp"):
        rec = api.recommend("llama-3-8b", {"gpus": 8}, {"engine": name, "seq_len": 8192}, top=40)
        assert {r["layout"]["recompute"] for r in rec.layouts} <= {"none", "full"}
        # partial recompute there is every k-th of the 32 layers: ceil(32 / k) of them
        partial = {r["layout"]["recompute_layers"] for r in rec.layouts} - {None}
        assert partial <= {16, 11, 8, 7, 6, 5, 4, 3, 2, 1}
    rec = api.recommend("llama-3-8b", {"gpus": 8}, {"engine": "torchtitan", "seq_len": 8192}, top=40)
    assert "selective" in {r["layout"]["recompute"] for r in rec.layouts}  # op-level SAC is launchable there


def test_deepspeed_recomputes_every_other_layer_where_memory_is_left():
    """Llama-3-8B at 8K tokens on 8 GPUs under DeepSpeed on Hugging Face modules: checkpointing
    every layer leaves memory free, so the search tries every k-th layer (transformers
    every_n_layers) and the winner recomputes fewer layers, faster, still within the memory that
    recommend keeps (95 % of capacity)."""
    from planner import api

    rec = api.recommend("llama-3-8b", {"gpus": 8}, {"engine": "deepspeed", "seq_len": 8192}, top=1)
    lay = rec.layouts[0]["layout"]
    assert lay["recompute"] == "full" and 1 <= lay["recompute_layers"] < 32
    pinned = {k: lay[k] for k in ("tp", "pp", "dp", "zero", "mbs", "recompute")}
    every = api.estimate("llama-3-8b", {"gpus": 8}, {"engine": "deepspeed", "seq_len": 8192}, pinned)
    chosen = api.estimate("llama-3-8b", {"gpus": 8}, {"engine": "deepspeed", "seq_len": 8192},
                          {**pinned, "recompute_layers": lay["recompute_layers"]})
    assert chosen.time["step_s"] < every.time["step_s"]
    assert every.memory["required_bytes"] < chosen.memory["required_bytes"] <= 0.95 * chosen.memory["capacity_bytes"]


def test_combined_evaluations_equal_a_fresh_one():
    # search() keeps its first evaluation and adds those of the lighter-recompute variants and of the
    # other rank order row by row (grouping.picked) instead of evaluating everything again: a fresh
    # evaluation of the final candidates reads the same, whole arrays and single rows alike
    from planner.api import resolve_model

    model, cluster = resolve_model(100e9), hardware.Cluster(hardware.lookup_gpu("h100-sxm"), 16, 8)
    training = layout.Training(gbs=1024, engine="megatron", pipeline_edge_layers=1)
    res = search.search(model, cluster, training, headroom=0.05)
    valid, ev = res.valid, res.eval
    assert (valid.recompute_layers > 0).any() and (valid.rank_order == 1).any()  # both paths taken
    fresh = search.evaluate(model, cluster, training, valid, 0.05)
    assert (ev.fits == fresh.fits).all()
    np.testing.assert_array_equal(ev.time["step_s"], fresh.time["step_s"])
    for part, keys in ((lambda e: e.memory, ("total", "activations", "cpu_per_node")),
                       (lambda e: e.time["breakdown"], ("compute", "recompute", "pp_comm", "optimizer")),
                       (lambda e: e.time["throughput"], ("tokens_per_s",))):
        for key in keys:
            np.testing.assert_array_equal(part(ev)[key], part(fresh)[key])
            for i in (0, valid.size - 1, int(np.flatnonzero(valid.rank_order == 1)[0])):
                assert part(ev).at(key, i) == part(fresh).at(key, i)
