"""Megatron's --recompute-modules: what each leaves unsaved, against megatron-core's own layer.

The reference, data/references/megatron_recompute_cpu.json, is python -m calibrate.engines.megatron_recompute:
megatron-core 0.16.1's TransformerLayer (local spec; hidden 64, ffn 128, bf16; MoE: 8 experts top-2 and a
shared expert of 128) on one gloo rank, the bytes per token its saved tensors still hold after the forward
under selective recompute of each list. The drops are compared with the planner's Megatron list
(planner/saved/megatron.py Saved.dropped_by), e = 2 bytes, h = 64, f = 128, k = 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner import activations, api, layout
from planner.model import ModelSpec

REFERENCE = Path(__file__).resolve().parent.parent / "data" / "references" / "megatron_recompute_cpu.json"
ROWS = {row["name"]: row for row in json.loads(REFERENCE.read_text())["rows"]}


def kept(name: str) -> float:
    return ROWS[name]["kept_bytes_per_token"]


def planned_drop(moe: bool, module: str) -> float:
    """Bytes per token the planner's Megatron list drops under `module` for the reference's shape."""
    model = ModelSpec(layers=1, hidden=64, heads=4, kv_heads=4, ffn=128, vocab=256,
                      **({"experts": 8, "experts_per_token": 2, "shared_expert_ffn": 128} if moe else {}))
    saved = activations.saved_tensors(model, layout.Training(seq_len=16, engine="megatron"), 16, 2.0 if moe else 1.0, 2)
    return sum(x.bytes_per_token for x in saved if module in x.dropped_by)


def test_recomputing_the_moe_layer_drops_its_router_dispatcher_and_experts():
    # k rows of the permuted fc1 input (e h k = 256), their fc1 output (2 e f k = 1024) and fc2 input
    # (e f k = 512), the routing prob (e k = 4), router (k x (8 + 4) = 24) and dispatcher (3 E + 8 k = 40)
    # and the shared expert's fc1 output and fc2 input (3 e f = 768): 2628
    drop = kept("moe-core_attn") - kept("moe-core_attn-moe")
    assert drop == planned_drop(True, "moe") == 2628


def test_recomputing_the_shared_expert_drops_its_fc1_output_and_fc2_input():
    drop = kept("moe-core_attn") - kept("moe-core_attn-shared_experts")
    assert drop == planned_drop(True, "shared_experts") == 3 * 2 * 128  # [gate|up] 2 e f + e f


def test_recomputing_the_dense_mlp_drops_what_it_saves_inside():
    # the local spec's MLP takes the norm's output as its (kept) input; under Transformer Engine's spec
    # the norm is fused into linear_fc1, so its output (e h) is inside the checkpoint too
    drop = kept("dense-core_attn") - kept("dense-core_attn-mlp")
    assert drop == 3 * 2 * 128  # fc1 output [gate|up] 2 e f and fc2 input e f
    assert planned_drop(False, "mlp") == drop + 2 * 64


def test_recomputing_the_norms_drops_their_internals_and_outputs():
    # the local spec's two RMSNorms are modules of their own in both layers: under 'layernorm' neither
    # keeps what it saves beside its input (eager here: 516 bytes a token) and its output goes once used.
    # Transformer Engine's fused norms save only an fp32 rstd beside their input, so the planner drops
    # their outputs (e h), where they are modules of their own (MLA's attention norm, an MoE layer's MLP
    # norm; read from megatron-core's gpt_layer_specs.py, not measured: TE does not run on the CPU)
    for kind in ("moe", "dense"):
        drop = kept(f"{kind}-core_attn") - kept(f"{kind}-core_attn-layernorm")
        row = ROWS[f"{kind}-core_attn-layernorm"]
        assert 2 * row["norm_saved_bytes_per_token"] <= drop <= 2 * (row["norm_saved_bytes_per_token"]
                                                                    + row["norm_output_bytes_per_token"])
    assert planned_drop(True, "layernorm") == 2 * 64 and planned_drop(False, "layernorm") == 0


@pytest.mark.slow
def test_megatron_core_keeps_what_the_reference_says():
    from calibrate.engines.megatron_recompute import measure

    rows = measure(one_process=True)
    assert [row["name"] for row in rows] == list(ROWS)
    for row in rows:
        assert row["megatron_core"] == "0.16.1" and row == ROWS[row["name"]] | {"torch": row["torch"]}, row["name"]


def test_the_modules_change_memory_and_time_as_nvidia_runs_deepseek_v3():
    # NeMo's DeepSeek-V3 H100 recipe (data/references/nemo_recommended_layouts.json): recompute_modules
    # mla_up_proj, mlp, moe on tp 2, pp 16, ep 64. Against core_attn alone each MoE block keeps no expert
    # rows (k = 8 of them, each 7 e f = 28 KiB wide) and reruns its expert GEMMs and both all-to-alls
    cluster = {"gpu": "h100-sxm", "gpus": 1024}
    training = {"engine": "megatron", "seq_len": 4096, "gbs": 8192}
    lay = {"tp": 2, "pp": 16, "ep": 64, "etp": 1, "mbs": 1, "zero": 1, "recompute": "selective"}
    core = api.estimate("deepseek-v3", cluster, training, lay)
    nvidia = api.estimate("deepseek-v3", cluster, {**training, "recompute_modules": "mla_up_proj,mlp,moe"}, lay)
    acts = lambda e: e.memory["breakdown"]["activations"]  # noqa: E731
    assert acts(nvidia) < 0.5 * acts(core)
    step = lambda e: e.record["time"]["breakdown"]  # noqa: E731
    assert step(nvidia)["recompute"] > 2 * step(core)["recompute"] and step(nvidia)["tp_comm"] > step(core)["tp_comm"]
    hw = lambda e: e.record["throughput"]["hardware_tflops_per_gpu"] / e.record["throughput"]["model_tflops_per_gpu"]  # noqa: E731
    assert hw(nvidia) > hw(core)  # the rerun GEMMs count as hardware FLOPs
    with pytest.raises(Exception, match="^--recompute-modules: mla_up_proj needs multi-head latent attention"):
        api.estimate("llama-3-8b", {"gpus": 8}, {"engine": "megatron", "recompute_modules": "mla_up_proj"},
                     {"recompute": "selective"})


def test_moe_act_drops_the_routed_experts_activation_output():
    # moe/experts.py TEGroupedMLP: the activation runs under a CheckpointWithoutOutput whose output, the
    # k rows' fc2 input (e f k = 2 x 128 x 2), goes once fc2 used it; the shared expert keeps its own
    # (TEGroupedMLP needs Transformer Engine: read from the code, not counted here)
    assert planned_drop(True, "moe_act") == 2 * 128 * 2
    assert planned_drop(False, "moe_act") == 0


def test_moe_act_needs_grouped_experts_and_not_delayed_fp8():
    cluster, lay = {"gpus": 16}, {"ep": 8, "recompute": "selective"}
    training = {"engine": "megatron", "recompute_modules": "moe_act,layernorm"}
    with pytest.raises(Exception, match="^--recompute-modules: moe_act needs --moe-grouped-gemm"):
        api.estimate("qwen3-30b-a3b", cluster, {**training, "moe_grouped_gemm": False}, lay)
    grouped = training  # megatron's default
    est = api.estimate("qwen3-30b-a3b", cluster, grouped, lay)
    assert list(est.training.recompute_modules) == ["moe_act", "layernorm"]
    # transformer_config.py: "Delayed scaling does not support moe_act and layernorm recompute for fp8"
    with pytest.raises(Exception, match="^--recompute-modules: moe_act and layernorm recompute need"):
        api.estimate("qwen3-30b-a3b", cluster, {**grouped, "precision": "fp8", "fp8_recipe": "delayed"}, lay)
    api.estimate("qwen3-30b-a3b", cluster, {**grouped, "precision": "fp8", "fp8_recipe": "tensorwise"}, lay)


def test_grouped_experts_run_their_gemms_as_one_kernel():
    # Qwen3-30B-A3B on 8 expert ranks: 16 local experts, each taking 8 ranks x 4,096 tokens x 8 routes / 128
    # = 2,048 rows of a 4,096-token micro-batch. SequentialMLP runs a GEMM per expert and matrix, each
    # paying the small-GEMM fall-off (compute.gemm_s: F + F_half); one grouped GEMM (TEGroupedMLP) pays
    # it once over all 16
    from planner import compute, hardware, model as M, timing
    from planner.stage import Step

    qwen, gpu = M.lookup("qwen3-30b-a3b"), hardware.lookup_gpu("h100-sxm")
    cluster = hardware.Cluster(gpu, 8, 8)
    lay = layout.single(ep=8, dp=8, mbs=1, gas=1)
    c = timing.time_coefficients(cluster)
    seconds = {g: compute.gemm_fwd_s(Step(qwen, cluster, layout.Training(engine="megatron", seq_len=4096,
                                                                            moe_grouped_gemm=g), lay, c),
                                     frozenset({"fc1", "fc2"}))
               for g in (False, True)}
    f1, f2, half = 2 * 2048 * 2048 * 1536, 2 * 2048 * 768 * 2048, c["gemm_half_efficiency_flops"]  # [gate|up], down
    assert seconds[True] / seconds[False] == pytest.approx((16 * (f1 + f2) + 2 * half) / (16 * (f1 + f2 + 2 * half)),
                                                           rel=1e-9)  # 0.84
    with pytest.raises(Exception, match="^--moe-grouped-gemm: --engine megatron-deepspeed runs its experts"):
        api.estimate("qwen3-30b-a3b", {"gpus": 8}, {"engine": "megatron-deepspeed", "moe_grouped_gemm": True},
                     {"ep": 8})


def test_recommend_searches_wider_recompute_where_it_pays():
    # DeepSeek-V3 on 256 H100s: Megatron's attention-core recompute alone leaves the fitting layouts to
    # full recompute; recomputing the experts' activation, the norms and MLA's up projections too
    # (NVIDIA's DeepSeek-V3 H100 launch recomputes mla_up_proj) fits faster selective layouts, which
    # recommend finds and reports
    rec = api.recommend("deepseek-v3", {"gpu": "h100-sxm", "gpus": 256}, {"engine": "megatron"}, top=1)
    core = api.recommend("deepseek-v3", {"gpu": "h100-sxm", "gpus": 256},
                         {"engine": "megatron", "recompute_modules": "core_attn"}, top=1)
    assert rec.defaults["recompute_modules"] == ["core_attn", "moe_act", "layernorm", "mla_up_proj"]
    assert "recompute_modules" not in core.defaults
    speed = lambda r: r.layouts[0]["throughput"]["tokens_per_s"]  # noqa: E731
    assert speed(rec) > speed(core) and rec.layouts[0]["layout"]["recompute"] == "selective"
    # a dense model without MLA has nothing beyond the attention core to list: no extra search
    dense = api.recommend("llama-3-8b", {"gpus": 8}, {"engine": "megatron"}, top=1)
    assert "recompute_modules" not in dense.defaults


def test_recommend_refuses_what_the_named_engine_refuses_in_one_line(capsys):
    # every layout breaks the rule, so the answer is the rule's own line (exit 2), not "no layout fits"
    from planner import cli

    assert cli.main(["recommend", "--model", "llama-3-8b", "--gpus", "8", "--engine", "megatron",
                     "--recompute-modules", "mla_up_proj"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("planner: error: --recompute-modules: mla_up_proj needs")
