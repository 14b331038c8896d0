"""The command line: JSON schema, bad input, light imports, and a frozen flag surface."""

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner import cli

ROOT = Path(__file__).resolve().parent.parent


def run(*argv):
    out = io.StringIO()
    code = cli.main(list(argv), out=out)
    return code, out.getvalue()


def test_estimate_json_schema():
    code, text = run("estimate", "--model", "llama-2-7b", "--gpus", "8", "--zero", "3", "--mbs", "2", "--gbs", "64",
                     "--json")
    assert code == 0
    d = json.loads(text)
    assert d["model"]["params"] == 6738415616  # Llama-2-7B published count
    for k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab"):
        assert k in d["model"]
    lay = d["layout"]
    assert {"dp", "tp", "pp", "cp", "ep", "vpp", "zero", "mbs", "gbs", "gas", "recompute", "sequence_parallel",
            "offload_optimizer", "offload_params"} <= set(lay)
    assert (lay["dp"], lay["gas"], lay["gbs"]) == (8, 4, 64)  # 64 / (2*8)
    mem = d["memory"]
    assert isinstance(mem["gpu_bytes"], int) and isinstance(mem["fits"], bool)
    assert set(mem["breakdown"]) == {"params", "grads", "optimizer", "activations", "logits", "buffers", "overhead"}
    assert sum(mem["breakdown"].values()) == mem["gpu_bytes"]
    assert len(mem["per_stage"]) == 1 and "cpu_bytes_per_node" in mem and "capacity_bytes" in mem
    t = d["time"]
    assert sum(t["breakdown"].values()) == pytest.approx(t["step_s"], rel=1e-9)
    assert {"tokens_per_s", "samples_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu"} <= set(
        d["throughput"])


def key_paths(tree, prefix=""):
    """Every key path of a JSON answer ('memory.breakdown.params'; lists by their first element)."""
    out = set()
    for k, v in tree.items():
        out.add(prefix + k)
        if isinstance(v, dict):
            out |= key_paths(v, f"{prefix}{k}.")
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            out |= key_paths(v[0], f"{prefix}{k}[].")
    return out


# the keys of issues 2 and 3 (README "--json schema"): frozen; new keys may be added, none renamed
ESTIMATE_KEYS = {
    "model", "model.params", "model.layers", "model.hidden", "model.heads", "model.kv_heads", "model.ffn",
    "model.ffn_kind", "model.vocab", "model.norm", "model.tied_embeddings",
    "layout", *(f"layout.{k}" for k in ("dp", "tp", "pp", "cp", "ep", "vpp", "zero", "mbs", "gbs", "gas", "recompute",
                                        "sequence_parallel", "offload_optimizer", "offload_params", "schedule")),
    "memory", *(f"memory.{k}" for k in ("gpu_bytes", "cpu_bytes_per_node", "capacity_bytes", "headroom_bytes", "fits",
                                        "peak_phase", "breakdown", "per_stage", "per_stage[].stage",
                                        "per_stage[].gpu_bytes", "per_stage[].cpu_bytes_per_node",
                                        "per_stage[].breakdown",
                                        # issue 7: both allocator peaks, the fit as a margin with its error band
                                        "allocated_bytes", "reserved_bytes", "fit_margin_bytes", "error_band",
                                        "error_band_bytes", "verdict")),
    *(f"memory.breakdown.{k}" for k in ("params", "grads", "optimizer", "activations", "logits", "buffers", "overhead")),
    "time", "time.step_s", "time.breakdown", "time.error_band",
    *(f"time.breakdown.{k}" for k in ("compute", "recompute", "tp_comm", "dp_comm", "pp_comm", "pp_bubble",
                                      "stragglers",  # issue 8: the slowest rank's delay
                                      "offload", "optimizer", "other")),
    "throughput", *(f"throughput.{k}" for k in ("tokens_per_s", "samples_per_s", "model_tflops_per_gpu",
                                                "hardware_tflops_per_gpu", "mfu", "hfu")),
    "cluster", "training", "time_to_train", "time_to_train.days", "time_to_train.gpu_hours", "time_to_train.cost",
    "deepspeed_estimator",
}
RECOMMEND_KEYS = {"model", "assumptions", "candidates_evaluated", "rejected", "layouts", "suggestions",
                  "layouts[].layout", "layouts[].memory", "layouts[].time", "layouts[].throughput",
                  "layouts[].binding_constraint", "layouts[].memory.gpu_bytes", "layouts[].time.step_s",
                  "engines", "engines[].engine", "engines[].layout", "engines[].relative_speed",
                  "engines[].settings", "clear_fit"}


def test_json_schema_is_frozen():
    _, text = run("estimate", "--model", "llama-2-7b", "--gpus", "8", "--pp", "2", "--tokens", "1e12",
                  "--price-per-gpu-hour", "2", "--ds-estimator", "--json")
    assert ESTIMATE_KEYS <= key_paths(json.loads(text))
    _, text = run("recommend", "--model", "llama-2-7b", "--gpus", "8", "--json")
    assert RECOMMEND_KEYS <= key_paths(json.loads(text))


def test_estimate_per_stage_table_text():
    code, text = run("estimate", "--model", "llama-3-70b", "--gpus", "16", "--tp", "8", "--pp", "2",
                     "--gbs", "32", "--recompute", "selective", "--sequence-parallel")
    assert code == 0
    assert "headroom" in text and "fits" in text
    assert text.count("\n") > 6


@pytest.mark.parametrize("argv, flag", [
    (["estimate", "--model", "lama-2-7b"], "--model"),
    (["estimate", "--model", "llama-2-7b", "--gpus", "8", "--tp", "3"], "--gpus"),
    (["estimate", "--model", "llama-2-7b", "--gpus", "6", "--tp", "3", "--dp", "2"], "--tp"),
    (["estimate", "--model", "llama-2-7b", "--pp", "64", "--engine", "megatron"], "--pp"),
    (["estimate", "--model", "llama-2-7b", "--dp", "4", "--mbs", "3", "--gbs", "16"], "--gbs"),
    (["estimate", "--model", "llama-2-7b", "--mbs", "-1"], "--mbs"),
    (["estimate", "--model", "llama-2-7b", "--mbs", "two"], "--mbs"),
    (["estimate", "--params", "abc"], "--params"),
    (["estimate", "--model", "llama-2-7b", "--gpu", "h1000"], "--gpu"),
    (["estimate", "--model", "llama-2-7b", "--recompute", "sometimes"], "--recompute"),
    (["estimate", "--model", "llama-2-7b", "--offload-params", "cpu", "--zero", "2"], "--offload-params"),
    (["estimate", "--model", "llama-2-7b", "--pp", "2", "--zero", "2"], "--zero"),
    (["estimate", "--model", "llama-2-7b", "--engine", "megatron", "--recompute", "full", "--recompute-method",
      "uniform"], "--recompute-method"),
    (["estimate", "--model", "llama-2-7b", "--engine", "megatron", "--recompute", "full", "--recompute-method",
      "uniform", "--recompute-layers", "33"], "--recompute-layers"),  # 32 layers in one chunk
    (["estimate", "--model", "llama-2-7b", "--recompute-method", "sideways"], "--recompute-method"),
    (["recommend", "--params", "70e9", "--gpus", "8", "--recompute-method", "uniform"], "--recompute-method"),
    (["estimate", "--model", "llama-2-7b", "--pp-edge-layers", "1"], "--pp-edge-layers"),  # DeepSpeed: even split
    (["estimate", "--model", "llama-2-7b", "--engine", "megatron", "--pp-edge-layers", "2"], "--pp-edge-layers"),
    (["recommend", "--params", "70e9"], "--gpus"),
    (["recommend", "--params", "70e9", "--gpus", "0"], "--gpus"),
])
def test_bad_input_one_line_exit_2(argv, flag, capsys):
    code, _ = run(*argv)
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and flag in err and "Traceback" not in err


def test_malformed_config_json(tmp_path, capsys):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    assert run("estimate", "--model", str(bad))[0] == 2
    assert "--model" in capsys.readouterr().err


def test_cli_subprocess_exit_status_and_light_imports():
    code = (
        "import sys; from planner.cli import main; import io; main(['estimate','--params','7e9','--json'], out=io.StringIO());"
        "main(['recommend','--params','7e9','--gpus','8','--json'], out=io.StringIO());"
        "heavy=[m for m in ('torch','deepspeed','streamlit','scipy.optimize','transformers') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
    bad = subprocess.run([sys.executable, "-m", "planner", "estimate", "--tp", "x"], cwd=ROOT, capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "--tp" in bad.stderr


FROZEN = {
    "estimate": ["--allgather-bucket-size", "--calibration", "--cp", "--dp", "--ds-estimator", "--emit", "--engine", "--ep", "--ffn",
                 "--ffn-kind", "--fp32-grad-accum", "--gbs", "--gpu", "--gpu-memory-gib", "--gpus", "--gpus-per-node",
                 "--hbm-gb-per-s", "--heads", "--hidden", "--host-ram-gib", "--inter-node-gb-per-s", "--intra-node-gb-per-s", "--json",
                 "--kv-heads", "--layers", "--mbs", "--model", "--no-contiguous-gradients", "--no-flash-attention",
                 "--no-overlap-comm", "--no-tp-comm-overlap", "--nvme-gb-per-s", "--offload-optimizer", "--offload-params", "--optimizer",
                 "--overlap-comm", "--params", "--pcie-gb-per-s", "--peak-tflops", "--pp", "--precision",
                 "--price-per-gpu-hour", "--recompute", "--reduce-bucket-size", "--schedule", "--seq-len",
                 "--sequence-parallel", "--stage3-max-live-parameters", "--stage3-max-reuse-distance",
                 "--stage3-param-persistence-threshold", "--stage3-prefetch-bucket-size", "--sub-group-size",
                 "--tied-embeddings", "--tokens", "--tp", "--tp-comm-overlap", "--vocab", "--vpp", "--zero"],
    "recommend": ["--allgather-bucket-size", "--calibration", "--emit", "--engine", "--ffn", "--ffn-kind",
                  "--fp32-grad-accum", "--gbs", "--gpu",
                  "--gpu-memory-gib", "--gpus", "--gpus-per-node", "--hbm-gb-per-s", "--heads", "--hidden",
                  "--host-ram-gib", "--inter-node-gb-per-s", "--intra-node-gb-per-s", "--json", "--kv-heads",
                  "--layers", "--max-mbs", "--memory-headroom", "--model", "--no-contiguous-gradients",
                  "--no-flash-attention", "--no-overlap-comm", "--no-tp-comm-overlap", "--nvme-gb-per-s", "--optimizer", "--overlap-comm",
                  "--params", "--pcie-gb-per-s", "--peak-tflops", "--precision", "--price-per-gpu-hour",
                  "--reduce-bucket-size", "--seq-len", "--stage3-max-live-parameters", "--stage3-max-reuse-distance",
                  "--stage3-param-persistence-threshold", "--stage3-prefetch-bucket-size", "--sub-group-size",
                  "--tied-embeddings", "--tokens", "--tokens-per-step", "--top", "--tp-comm-overlap", "--vocab",
                  # pinned layout axes (issue 8)
                  "--cp", "--dp", "--ep", "--mbs", "--offload-optimizer", "--offload-params", "--pp", "--recompute",
                  "--sequence-parallel", "--tp", "--vpp", "--zero"],
    "validate": ["--json"],
    "calibrate": [],  # its own parser (calibrate/harness/cli.py): run|fit|report PROFILE
    "check": ["--accelerate-launch", "--calibration", "--config", "--emit", "--ffn", "--ffn-kind", "--gpu", "--gpu-memory-gib", "--gpus",
              "--gpus-per-node", "--hbm-gb-per-s", "--heads", "--hidden", "--host-ram-gib", "--inter-node-gb-per-s",
              "--intra-node-gb-per-s", "--json", "--kv-heads", "--layers", "--mbs", "--model", "--no-deepspeed",
              "--nvme-gb-per-s",
              "--params", "--pcie-gb-per-s", "--peak-tflops", "--pp", "--recompute", "--seq-len", "--tied-embeddings",
              "--tp", "--vocab"],
}
# MoE shape flags (issue 10), on every command that takes a model
for command in ("estimate", "recommend", "check"):
    FROZEN[command] = FROZEN[command] + ["--experts", "--experts-per-token", "--shared-expert-ffn"]
# expert tensor parallelism as its own axis (issue 10), on the commands that take a layout
for command in ("estimate", "recommend"):
    FROZEN[command] = FROZEN[command] + ["--etp"]
# dense-first blocks (DeepSeek-V3, GLM-4.5; issue 10)
for command in ("estimate", "recommend", "check"):
    FROZEN[command] = FROZEN[command] + ["--dense-layers", "--dense-ffn", "--moe-layer-step"]
# Megatron --recompute-method block (issue 7), on the commands that take a layout
for command in ("estimate", "recommend"):
    FROZEN[command] = FROZEN[command] + ["--recompute-layers"]
# DeepSpeed activation checkpointing placement (issue 7), with the other training flags
for command in ("estimate", "recommend"):
    FROZEN[command] = FROZEN[command] + ["--no-partition-activations", "--cpu-checkpointing"]
# Megatron --recompute-method uniform|block (issue 7)
for command in ("estimate", "recommend"):
    FROZEN[command] = FROZEN[command] + ["--recompute-method"]
# MoE expert capacity factor (issue 10), with the other training flags
for command in ("estimate", "recommend"):
    FROZEN[command] = FROZEN[command] + ["--moe-capacity-factor", "--moe-pad-to-capacity"]
# Megatron's pipeline-split and p2p-overlap switches (issue 8), with the other training flags
for command in ("estimate", "recommend"):
    FROZEN[command] = FROZEN[command] + ["--no-overlap-p2p", "--pp-edge-layers"]
# torch.compile of Hugging Face blocks (issue 8), with the other training flags
for command in ("estimate", "recommend"):
    FROZEN[command] = FROZEN[command] + ["--compile"]
# a pod boundary and the oversubscription above it (issue 8), with the other cluster flags
for command in ("estimate", "recommend", "check"):
    FROZEN[command] = FROZEN[command] + ["--pod-gpus", "--oversubscription"]
# where the ranks sit (Megatron's --use-tp-pp-dp-mapping; issue 8), a layout axis recommend can pin
for command in ("estimate", "recommend"):
    FROZEN[command] = FROZEN[command] + ["--rank-order"]
# megatron-core's partial optimizer offload (HybridDeviceOptimizer), with the other training flags
for command in ("estimate", "recommend"):
    FROZEN[command] = FROZEN[command] + ["--optimizer-offload-fraction"]
# the published-run corpus restricted to one source's rows
FROZEN["validate"] = FROZEN["validate"] + ["--source"]
# whose block is trained, apart from the engine; sequence parallelism turned off where the engine's default is on
for command in ("estimate", "recommend"):
    FROZEN[command] = FROZEN[command] + ["--modules", "--no-sequence-parallel", "--grad-reduce-in-bf16",
                                         "--partition-activations", "--fsdp-mixed-precision"]
# an untied output layer for a GELU shape, whose family ties it by default
for command in ("estimate", "recommend", "check"):
    FROZEN[command] = FROZEN[command] + ["--no-tied-embeddings"]
# torchtitan's loss chunks, 1 for its releases before the chunked loss
for command in ("estimate", "recommend"):
    FROZEN[command] = FROZEN[command] + ["--loss-chunks"]
# FP8 GEMMs: the recipe, and Megatron's FP8 parameters
for command in ("estimate", "recommend"):
    FROZEN[command] = FROZEN[command] + ["--fp8-recipe", "--fp8-param-gather", "--no-fp8-param-gather"]
# the allocator's expandable segments, torchtitan's launcher's setting
for command in ("estimate", "recommend"):
    FROZEN[command] = FROZEN[command] + ["--expandable-segments", "--no-expandable-segments"]
# multi-token-prediction depths (DeepSeek-V3, GLM-4.5), on every command that takes a model
for command in ("estimate", "recommend", "check"):
    FROZEN[command] = FROZEN[command] + ["--mtp-layers"]
# what Megatron's selective recompute reruns (--recompute-modules), its experts' grouped GEMMs
for command in ("estimate", "recommend"):
    FROZEN[command] = FROZEN[command] + ["--recompute-modules", "--moe-grouped-gemm", "--no-moe-grouped-gemm"]
# dropout in training (Megatron-LM's default, GPT-2/3's), on every command that takes a model
for command in ("estimate", "recommend", "check"):
    FROZEN[command] = FROZEN[command] + ["--dropout", "--no-dropout"]
FROZEN = {command: sorted(flags) for command, flags in FROZEN.items()}


def test_cli_surface_is_frozen():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    surface = {name: sorted(s for a in p._actions for s in a.option_strings if s.startswith("--") and s != "--help")
               for name, p in sub.choices.items()}
    assert surface == FROZEN


def test_activation_checkpointing_placement_flags():
    """--partition-activations and --cpu-checkpointing reach the estimate: Llama 3 8B (L 32,
    h 4096), seq 4096, mbs 1, tp 2, full recompute under Megatron-DeepSpeed keeps one 2-byte layer
    input per layer, 2 x 4096 x 4096 = 32 MiB whole, 16 MiB per rank when partitioned over TP
    (DeepSpeed checkpointing.py partition_activations; measured in test_deepspeed_checkpointing_real)."""
    base = ["estimate", "--model", "llama-3-8b", "--gpus", "8", "--seq-len", "4096", "--engine", "megatron-deepspeed",
            "--tp", "2", "--recompute", "full", "--zero", "1", "--gbs", "8", "--json"]
    # ZeRO-1: the peak is in backward; gas 8 / (1 x 4) = 2, so the accumulated gradients are held beside
    # the activations (a step of one micro-batch peaks at backward's end, with no activation left)

    def mem(*flags):
        code, out = run(*base, *flags)
        assert code == 0
        m = json.loads(out)["memory"]
        return m["breakdown"]["activations"], m["cpu_bytes_per_node"]

    (split, host0), (whole, _) = mem("--partition-activations"), mem()
    (left, host) = mem("--partition-activations", "--cpu-checkpointing")
    assert mem("--no-partition-activations")[0] == whole  # DeepSpeed's default: off
    assert whole - split == 32 * 16 * 2**20  # 32 layers x the other rank's half, 16 MiB
    assert split - left == 32 * 16 * 2**20  # the partitioned inputs leave the GPU ...
    assert (host0, host) == (0, 8 * 32 * 16 * 2**20)  # ... for host memory: 8 ranks x 32 x 16 MiB = 4 GiB a node


def test_dropout_keeps_its_masks_and_the_export_leaves_megatrons_own():
    """--dropout: Megatron's two hidden dropouts (after the attention's output projection and after the
    MLP) keep a 1-byte mask each, sbh per layer (Korthikanti et al. 2022 section 4.1, Table 2's 34sbh
    counts them), split over TP under sequence parallelism; FlashAttention's own dropout keeps none; the
    first stage's embedding dropout keeps one more. A GPT-style 32 x 4096 model at seq 8192, mbs 2, tp 2
    with SP, no recompute, on 8 GPUs, 4 layers a stage (pp 8): 4 layers x 16,384 tokens x 2 x 4096 B / 2 =
    256 MiB, and the embedding's 16,384 x 4096 / 2 B = 32 MiB x the micro-batches the first stage holds.
    Without --dropout the Megatron arguments switch Megatron-LM's 0.1 off; with it they leave it on."""
    base = ["estimate", "--layers", "32", "--hidden", "4096", "--heads", "32", "--ffn-kind", "gelu", "--vocab", "50304",
            "--gpus", "16", "--seq-len", "8192", "--engine", "megatron", "--tp", "2", "--pp", "8", "--mbs", "2",
            "--gbs", "32", "--sequence-parallel", "--recompute", "none", "--json"]

    def stage_acts(*flags):
        code, out = run(*base, *flags)
        assert code == 0, out
        return [s["breakdown"]["activations"] for s in json.loads(out)["memory"]["per_stage"]]

    on, off = stage_acts("--dropout"), stage_acts()
    assert stage_acts("--no-dropout") == off
    layer_masks = 4 * 16_384 * 2 * 4096 // 2  # per in-flight micro-batch on a stage
    # stage i holds pp - i micro-batches (1F1B: min(p - i, m)), the first one the embedding's mask too
    assert [a - b for a, b in zip(on, off)] == [(8 - i) * layer_masks + (16_384 * 4096 // 2) * 8 * (i == 0)
                                              for i in range(8)]
    from planner.export import megatron_args
    from planner.layout import Training, single
    from planner.model import ModelSpec

    row = single(tp=2, pp=8, dp=1, mbs=2, gas=16, sequence_parallel=True).row(0)
    for dropout, flags in ((True, []), (False, ["--attention-dropout 0.0", "--hidden-dropout 0.0"])):
        gpt = ModelSpec(layers=32, hidden=4096, heads=32, kv_heads=32, ffn=16384, vocab=50304, ffn_kind="gelu",
                        norm="layernorm", dropout=dropout)
        assert [a for a in megatron_args(gpt, Training(engine="megatron", seq_len=8192), row) if "dropout" in a] == flags


def test_torchtitan_refuses_dropout(capsys):
    """torchtitan 0.3.0's language models (models/common decoder, llama3, qwen3, deepseek_v3) have no
    dropout module: --dropout under it is one line naming the flag, exit 2."""
    code = cli.main(["estimate", "--params", "8e9", "--gpus", "8", "--engine", "torchtitan", "--dropout"],
                    out=io.StringIO())
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--dropout" in err[0] and "torchtitan" in err[0]
