"""FP8 GEMMs (planner/fp8.py): what Transformer Engine and torchao keep and cost, against their code,
torchao's own benchmark table and NVIDIA's and MosaicML's published FP8 runs."""

import io
import json

import numpy as np
import pytest

from planner import activations, api, cli, corpus_rows, corpus_score, export, layout, timing
from planner.errors import InputError
from planner.engines.torchtitan.export import fp8_module
from planner.model import ModelSpec, lookup
from planner.stage import Step

GPT = dict(layers=4, hidden=2048, heads=16, ffn=8192, vocab=32000, ffn_kind="gelu")


def _layer_bytes(engine: str, precision: str, **lay) -> float:
    model = api.resolve_model(GPT)
    training = layout.Training(seq_len=2048, precision=precision, engine=engine)
    return float(activations.layer_bytes(model, training, layout.single(mbs=1, gas=1, **lay))[0][0])


def test_transformer_engine_saves_its_gemm_inputs_in_fp8():
    """TE 2.18 module/linear.py _linear_forward_impl and layernorm_linear.py _LayerNormLinear.forward
    keep the FP8 (column-wise) copy of each GEMM input for wgrad, not the bf16 tensor: per token,
    qkv's and fc1's norm outputs and fc2's input go from 2 to 1 B an element; the output projection's
    input is attention's output, which FlashAttention keeps in bf16 all the same, so its FP8 copy
    comes on top (+1 B). GPT shape h 2048, f 8192, one rank: -h - h - f + h = -10240 B a token."""
    h, f, tokens = 2048, 8192, 2048
    delta = _layer_bytes("megatron", "fp8") - _layer_bytes("megatron", "bf16")
    assert delta == pytest.approx(tokens * (-h - h - f + h))


def test_torchao_keeps_the_bf16_activations():
    """torchao v0.18.0 float8/float8_linear.py matmul_with_hp_or_float8_args.forward saves the bf16
    input and weight: activations as in bf16. torchao's table (docs/source/workflows/training.md,
    Llama 3 8B on 8 H100): 47.65 GiB bf16, 47.77 tensorwise, 47.79 rowwise, within 0.3 %."""
    assert _layer_bytes("torchtitan", "fp8") == _layer_bytes("torchtitan", "bf16")
    bf16, fp8 = (api.estimate("llama-3-8b", {"gpus": 8}, {"engine": "torchtitan", "precision": p, "seq_len": 8192,
                                                          "gbs": 8}, {"mbs": 1, "zero": 3, "recompute": "selective"})
                 .memory["gpu_bytes"] for p in ("bf16", "fp8"))
    assert fp8 == pytest.approx(bf16, rel=0.003)


def _params_bytes(zero: int, precision: str) -> float:
    e = api.estimate("llama-3-8b", {"gpus": 8}, {"engine": "megatron", "precision": precision, "gbs": 8},
                     {"zero": zero, "recompute": "full"})
    return e.memory["breakdown"]["params"]


def test_megatron_caches_fp8_weights_unless_the_parameters_are_fp8():
    """Megatron passes TE's is_first_microbatch, so each block linear keeps its FP8 weight and
    transpose across micro-batches beside the bf16 weight (TE 2.18 Linear.forward, cache_name
    'weight'): 2 B a parameter. Llama 3 8B's 32 blocks: qkv 4096 x 6144, o 4096 x 4096, gate/up/down
    3 x 4096 x 14336 = 218,103,808 a block (+ 8,192 norm weights, counted with them here), x 32
    x 2 B. With the distributed optimizer NeMo's recipes keep FP8 parameters instead
    (--fp8-param-gather): no cache, the parameter itself FP8 and transposed, 2 B as bf16's."""
    cache = _params_bytes(0, "fp8") - _params_bytes(0, "bf16")
    assert cache == pytest.approx(2 * 32 * (218_103_808 + 8_192), rel=1e-9)
    assert _params_bytes(1, "fp8") == _params_bytes(1, "bf16")


def test_fp8_parameters_gather_half_the_bytes():
    """--fp8-param-gather: the distributed optimizer's parameter buffer is uint8 (Megatron-LM d98e8a6
    core/distributed/param_and_grad_buffer.py group_params_for_buffers): 1 B a parameter, not 2."""
    model, cluster = lookup("llama-3-70b"), api.Cluster(api.lookup_gpu("h100-sxm"), 64, 8)
    lay = layout.single(tp=8, dp=8, zero=1, mbs=1, gas=8, sequence_parallel=True)
    c = timing.coefficients("time")
    on, off = (timing.param_gather_s(Step(model, cluster, layout.Training(engine="megatron", precision="fp8", fp8_param_gather=g), lay, c))[0][0] for g in (True, False))
    assert 0.5 <= on / off < 0.55  # bandwidth-bound: the latency terms stay


def test_fp8_published_runs():
    """NVIDIA's NeMo 24.07 FP8 performance table (Transformer Engine, H100) and MosaicML's llm-foundry
    amp_fp8 rows (te.Linear, H100), as planner validate reads them: each source within 8 % on
    average (fp8_gemm_efficiency_max is fitted to them, leave-one-source-out 3.2 % and 5.3 %)."""
    rows = [r for r in corpus_rows.load_rows()
            if corpus_rows.precision(r) == "fp8" and r["id"].split("-")[0] in ("nemo", "mpt")]
    errors = {}
    for row in rows:
        reading = corpus_rows.read(row)
        if reading.reason:  # no layer count or GPU count published
            continue
        scored = corpus_score.score(row, corpus_rows.ask(reading))
        fig = next((f for f in scored["figures"] if f["metric"] != corpus_score.MEMORY_METRIC), None)
        if fig and fig.get("predicted"):
            errors.setdefault(scored["source"], []).append(fig["predicted"] / fig["published"] - 1)
    assert set(errors) == {"nemo", "mpt"} and sum(map(len, errors.values())) >= 8
    for source, errs in errors.items():
        assert np.mean(np.abs(errs)) <= 0.08, (source, errs)


def test_rowwise_against_tensorwise_as_torchao_measured():
    """torchao's table: rowwise 6,768 tokens/s a GPU against tensorwise 7,689.5, 0.880 (Llama 3 8B,
    torchtitan, 8 H100, seq 8192, batch 1, per-op SAC)."""
    def tokens(recipe):
        e = api.estimate("llama-3-8b", {"gpus": 8}, {"engine": "torchtitan", "fp8_recipe": recipe, "seq_len": 8192,
                                                     "gbs": 8}, {"mbs": 1, "zero": 3, "recompute": "selective"})
        return e.throughput["tokens_per_s"]
    assert tokens("rowwise") / tokens("tensorwise") == pytest.approx(6768 / 7689.5, abs=0.02)


def _cli(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    import contextlib
    with contextlib.redirect_stderr(err):
        code = cli.main(list(argv), out)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("argv, message", [
    (["--engine", "deepspeed"], "--precision: --engine deepspeed has no FP8 training path; --engine megatron, fsdp or "
                                "torchtitan has one"),
    (["--gpu", "a100-80gb"], "--precision fp8: a100-80gb has no FP8 tensor cores"),
    (["--fp8-recipe", "mxfp8"], "--fp8-recipe mxfp8: needs Blackwell"),
    (["--engine", "torchtitan", "--fp8-recipe", "delayed"], "--fp8-recipe: --engine torchtitan runs rowwise, "
                                                            "tensorwise, mxfp8, got delayed"),
    (["--engine", "torchtitan", "--fp8-param-gather"], "--fp8-param-gather: Megatron's (--engine megatron), or torchtitan's with"),
])
def test_no_fp8_path_is_one_line(argv, message):
    code, out, err = _cli("estimate", "--params", "1e9", "--gpus", "8", "--precision", "fp8", *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err


def test_fp8_without_an_engine_is_megatrons():
    """Neither DeepSpeed engine has an FP8 path; NVIDIA's FP8 recipes are Megatron's, delayed scaling
    its default (Megatron-LM d98e8a6 transformer_config.py fp8_recipe 'delayed')."""
    code, out, _ = _cli("estimate", "--params", "1e9", "--gpus", "8", "--precision", "fp8", "--json")
    d = json.loads(out)
    assert code == 0 and d["defaults"]["engine"] == "megatron" and d["defaults"]["fp8_recipe"] == "delayed"
    assert d["training"]["precision"] == "fp8"


def test_exports_write_the_engines_fp8_switches(tmp_path):
    """Megatron-LM: --fp8-format (no default: FP8 off without it) and --fp8-recipe, --fp8-param-gather
    with the distributed optimizer; Accelerate: mixed_precision fp8 with the TE backend, read by
    Accelerate 1.16's own launch parser; torchtitan 0.3.0: a config module (its parse by torchtitan
    itself is recorded in data/references/torchtitan_cli.json, tests/test_export.py)."""
    e = api.estimate("llama-3-8b", {"gpus": 8}, {"engine": "megatron", "precision": "fp8", "gbs": 64}, {"zero": 1})
    args = export.megatron_args(e.model, e.training, e.record["layout"])
    assert {"--fp8-format hybrid", "--fp8-recipe delayed", "--fp8-param-gather", "--bf16"} <= set(args)

    from accelerate.commands.launch import launch_command_parser
    from accelerate.commands.config.config_args import load_config_from_file

    e = api.estimate("llama-3-8b", {"gpus": 8}, {"engine": "fsdp", "precision": "fp8", "gbs": 64}, {"zero": 3})
    files = dict((name, text) for name, text, _ in export.render(e.model, e.cluster, e.training, e.record["layout"]))
    path = tmp_path / "accelerate_config.yaml"
    path.write_text(files["accelerate_config.yaml"])
    cfg = load_config_from_file(str(path))
    assert cfg.mixed_precision == "fp8" and cfg.fp8_config["backend"] == "TE"
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    from accelerate.commands.launch import _validate_launch_command

    _validate_launch_command(args)
    assert args.mixed_precision == "fp8" and args.fp8_backend == "TE"

    with pytest.raises(InputError, match="tensorwise.*torchtitan 0.3.0"):
        fp8_module(lookup("llama-3-8b"), layout.Training(engine="torchtitan", fp8_recipe="tensorwise"))


def test_current_scaling_reads_each_input_once_more():
    """Transformer Engine 2.18: under delayed scaling the norm kernel writes qkv's and fc1's FP8 inputs
    itself (csrc/extensions/normalization.cpp FULLY_FUSED) and every cast takes its amax in the same
    pass; current scaling (Megatron --fp8-recipe tensorwise) runs norm + amax into a bf16 tensor, then
    the cast (FUSED_NORM_AMAX_FP8), and an amax pass (2 B read) before each other cast. GPT shape
    h 2048, f 8192 (GELU), MHA, one rank, T tokens, at B bytes/s: forward (2 + 4) (h + h) + 2 (h + f),
    backward 2 ((h + 2h) + h + f + h) bytes a token more."""
    from planner import fp8

    model, T, hbm = api.resolve_model(GPT), 2048, 1e12
    lay = layout.single(mbs=1, gas=1)

    def cast(recipe):
        training = layout.Training(seq_len=T, engine="megatron", fp8_recipe=recipe)
        return np.array(fp8.cast_s(model, training, lay, 1.0, hbm)).ravel()

    h, f = 2048, 8192
    more = cast("tensorwise") - cast("delayed")
    assert more == pytest.approx([T * ((2 + 4) * 2 * h + 2 * (h + f)) / hbm, T * 2 * (3 * h + h + f + h) / hbm])


def test_recommend_auto_answers_with_the_faster_precision():
    """--precision auto: bf16 and FP8 under one engine (Megatron without --engine), the faster one
    answered and its speed against the other's fastest in a note; the other engines without an FP8
    path answer in bf16 and say so. On an A100 (no FP8 tensor cores) bf16 alone."""
    code, out, _ = _cli("recommend", "--params", "70e9", "--gpus", "64", "--precision", "auto", "--top", "1", "--json")
    d = json.loads(out)
    fp8_speed = d["layouts"][0]["throughput"]["tokens_per_s"]
    code_bf16, out_bf16, _ = _cli("recommend", "--params", "70e9", "--gpus", "64", "--engine", "megatron", "--top", "1",
                                  "--json")
    bf16_speed = json.loads(out_bf16)["layouts"][0]["throughput"]["tokens_per_s"]
    assert code == code_bf16 == 0 and d["defaults"]["precision"] == "fp8" and d["defaults"]["engine"] == "megatron"
    assert f"--precision auto: fp8, {fp8_speed / bf16_speed:.2f}x the fastest bf16 layout" in d["notes"]
    assert {e["engine"]: e["precision"] for e in d["engines"]} == {
        "deepspeed": "bf16", "megatron-deepspeed": "bf16", "fsdp": "fp8", "torchtitan": "fp8"}
    code, out, _ = _cli("recommend", "--params", "70e9", "--gpus", "64", "--gpu", "a100-80gb", "--precision", "auto",
                        "--top", "1", "--json")
    assert code == 0 and json.loads(out)["defaults"]["precision"] == "bf16"


def test_torchao_float8_all_gather_moves_the_converted_linears_at_one_byte():
    """torchtitan 0.2.2 enable_fsdp_float8_all_gather (tensorwise only; torchao v0.18 fsdp_utils.py
    WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather casts the shard to e4m3): Llama 3 8B's
    block linears, 32 x (2 x 4096^2 + 2 x 4096 x 1024 + 3 x 4096 x 14336) = 6,979,321,856 of its
    8,030,261,248 parameters, gather at 1 B; the embedding, norms and lm_head at 2 B."""
    from planner.held import gathered_param_bytes

    m = lookup("llama-3-8b")
    linears = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
    share = linears / m.params
    on = layout.Training(engine="torchtitan", precision="fp8", fp8_recipe="tensorwise", fp8_param_gather=True)
    off = layout.Training(engine="torchtitan", precision="fp8", fp8_recipe="tensorwise")
    assert gathered_param_bytes(m, on) == pytest.approx(2 * (1 - share) + share)  # 1.13 B an element
    assert gathered_param_bytes(m, off) == 2.0
    with pytest.raises(InputError, match="--fp8-param-gather: .*tensorwise"):
        layout.Training(engine="torchtitan", precision="fp8", fp8_recipe="rowwise", fp8_param_gather=True)
    # the published runs that say so read it: torchtitan's H200 benchmark and torchao's tensorwise row
    rows = {r["id"]: r for r in corpus_rows.load_rows()}
    assert corpus_rows.read(rows["torchtitan-h200-8B-32gpu"]).training.fp8_param_gather is True
    assert corpus_rows.read(rows["mem-torchao-h100-llama3-8b-fp8-tensorwise"]).training.fp8_param_gather is True
    assert corpus_rows.read(rows["mem-torchao-h100-llama3-8b-fp8-rowwise"]).training.fp8_param_gather is None


def test_torchao_float8_all_gather_measured_on_fsdp2():
    """torchtitan's Llama (3 blocks, dim 64, 4 heads, 2 KV heads, ffn 160, vocab 256) under its
    apply_fsdp_to_decoder on 2 gloo ranks, converted as torchtitan 0.2.2 did (torchao 0.18
    convert_to_float8_training with enable_fsdp_float8_all_gather, emulated; python -m
    calibrate.engines.torchtitan_float8): a block unit's all-gather output is 43,264 B = 1 B x 43,008
    linear elements (wqkv 64 x 128, wo 64 x 64, w1 and w3 64 x 160, w2 160 x 64) + 2 B x 128 norm
    elements, against 2 B x 43,136 in bf16; the embedding and [norm, lm_head] units gather bf16. The
    planner's bytes per element over the model's 162,240 move the same 195,456 B a forward."""
    from pathlib import Path

    from planner.held import gathered_param_bytes

    doc = json.loads((Path(__file__).resolve().parent.parent / "data/references/torchtitan_float8_cpu.json").read_text())
    runs = {r["recipe"]: r for r in doc["rows"] if r["kind"] == "all_gather"}
    bf16, fp8_gather = runs["bf16"], runs["tensorwise-fp8-all-gather"]
    assert fp8_gather["gathered_bytes"]["layers.1"] == 1 * 43_008 + 2 * 128
    assert bf16["gathered_bytes"]["layers.1"] == 2 * 43_136
    assert fp8_gather["gathered_bytes"]["embed"] == bf16["gathered_bytes"]["embed"] == 2 * 64 * 256
    r = bf16
    m = ModelSpec(layers=r["layers"], hidden=r["dim"], heads=r["heads"], kv_heads=r["kv_heads"], ffn=r["ffn"],
                  vocab=r["vocab"])
    assert m.params == sum(r["unit_params"].values()) == 162_240
    for run, training in ((bf16, layout.Training(engine="torchtitan", precision="fp8", fp8_recipe="tensorwise")),
                          (fp8_gather, layout.Training(engine="torchtitan", precision="fp8", fp8_recipe="tensorwise",
                                                       fp8_param_gather=True))):
        assert gathered_param_bytes(m, training) * m.params == pytest.approx(sum(run["gathered_bytes"].values()))


def test_transformer_engine_gathers_sequence_parallel_inputs_in_fp8():
    """TE d0067d0 pytorch/distributed.py gather_along_first_dim quantizes before it all-gathers
    (_all_gather_fp8: 1 B an element) the sequence-parallel input of qkv and fc1 and the output
    gradient of proj and fc2; the reduce-scatters stay bf16. Without userbuffers, one pass of a
    dense block's two linear pairs loses an all-gather of T h FP8 bytes and a reduce-scatter of
    T h bf16 bytes each: (AR(T h) + AR(T h / 2)) / 2 per pair in all-reduce equivalents, against
    AR(T h) in bf16. torchao under torchtitan 0.3.0 gathers bf16."""
    from planner import mp_comm
    from planner.collectives import group_collective_s
    from planner.hardware import Cluster, lookup_gpu
    from planner.memory import coefficients

    model = api.resolve_model(GPT)
    cluster = Cluster(lookup_gpu("h100-sxm"), 8, 8)
    lay = layout.single(tp=8, mbs=2, sequence_parallel=True)
    c = coefficients("time")
    tokens_h_bf16 = 2 * 2048 * 2048 * 2.0  # mbs x seq x hidden x 2 B

    def exposed(engine, precision):
        training = layout.Training(seq_len=2048, precision=precision, engine=engine, tp_comm_overlap=False)
        tp_ar = mp_comm.tp_all_reduce_s(Step(model, cluster, training, lay, c))
        units = mp_comm.tp_pass_units(model, training, lay)
        return float(mp_comm.tp_pass_exposed_s(Step(model, cluster, training, lay, c), tp_ar, units)[0])

    whole = float(group_collective_s(cluster, c, "all_reduce", tokens_h_bf16, lay.tp)[0])
    half = float(group_collective_s(cluster, c, "all_reduce", tokens_h_bf16 / 2, lay.tp)[0])
    assert exposed("megatron", "bf16") == pytest.approx(2 * whole, rel=1e-9)
    assert exposed("megatron", "fp8") == pytest.approx(2 * (whole + half) / 2, rel=1e-9)
    assert exposed("torchtitan", "fp8") == pytest.approx(exposed("torchtitan", "bf16"), rel=1e-12)
