"""Do a change's answers match a base commit's? `python benchmarks/frozen_answers.py [--base REF]`

Runs a fixed set of CLI calls (estimate, recommend, check, validate; every engine; dense and MoE
catalog models; H100, A100, H200, B200, GB200, MI300X; bf16, fp8, offload, pipelines, experts)
with --json on the working tree and on REF (default HEAD, checked out in a temporary git worktree),
and prints each call whose JSON differs, with the first differing paths. Both sides are computed
now, so nothing here records the planner's own output as an expected value: a refactor must leave
every answer as it was, and a deliberate change lists its differences for the closing note.

    --base REF     the commit to compare against (default HEAD: what the working tree changes)
    --dump PATH    only write this tree's answers as JSON to PATH (used for the base side)
    --list         print the calls and exit
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TMP = "<tmp>"  # the temporary directory's path, the same on both sides


def calls() -> list[list[str]]:
    """The frozen CLI calls: at least 200, each a list of arguments after `planner`."""
    out: list[list[str]] = []
    engines = ["deepspeed", "fsdp", "megatron", "megatron-deepspeed", "torchtitan"]
    # recommend: every engine for dense models on the common GPUs
    for model, gpus, gpu in [("llama-3-8b", 8, "h100-sxm"), ("llama-3-70b", 16, "h100-sxm"),
                             ("llama-2-13b", 8, "a100-80gb"), ("mistral-7b", 4, "a100-40gb"),
                             ("llama-3.1-405b", 128, "h200"), ("qwen3-8b", 8, "b200")]:
        for engine in engines:
            out.append(["recommend", "--model", model, "--gpus", str(gpus), "--gpu", gpu, "--engine", engine])
    # recommend without an engine (the comparison), by parameter count and by catalog name
    for params, gpus in [("1e9", 1), ("3e9", 2), ("7e9", 8), ("13e9", 8), ("70e9", 16), ("70e9", 64), ("175e9", 128)]:
        out.append(["recommend", "--params", params, "--gpus", str(gpus)])
    for model, gpus, gpu in [("qwen3-30b-a3b", 16, "h100-sxm"), ("mixtral-8x7b", 16, "h100-sxm"),
                             ("gpt-oss-20b", 8, "h100-sxm"), ("deepseek-v3", 256, "h200"),
                             ("llama-3-70b", 72, "gb200"), ("llama-3-8b", 8, "mi300x"),
                             ("gpt3-175b", 128, "h100-sxm"), ("llama-3-8b", 8, "l40s")]:
        out.append(["recommend", "--model", model, "--gpus", str(gpus), "--gpu", gpu])
    for extra in [["--precision", "fp8"], ["--precision", "auto"], ["--seq-len", "32768"], ["--gbs", "512"],
                  ["--offload-optimizer", "cpu"], ["--compile"], ["--modules", "hf-liger"], ["--tokens", "1e12"]]:
        out.append(["recommend", "--model", "llama-3-8b", "--gpus", "16", "--gpu", "h100-sxm", *extra])
    # estimate: one layout per engine and setting, each engine at the ZeRO stages it launches
    shard = {"deepspeed": "3", "fsdp": "3", "megatron": "1", "megatron-deepspeed": "1", "torchtitan": "3"}
    light = {"deepspeed": "1", "fsdp": "0", "megatron": "0", "megatron-deepspeed": "0", "torchtitan": "0"}
    base = ["estimate", "--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100-sxm"]
    for engine in engines:
        z, z0 = shard[engine], light[engine]
        for layout in [["--zero", z0], ["--zero", z, "--mbs", "2"], ["--tp", "2", "--zero", z],
                       ["--tp", "2", "--pp", "2", "--zero", z0, "--sequence-parallel"],
                       ["--zero", z, "--recompute", "full", "--mbs", "4"],
                       ["--zero", z0, "--recompute", "selective"]]:
            out.append([*base, "--engine", engine, *layout])
    for precision in ["fp32", "fp16", "bf16", "bf16-pure", "fp8"]:
        for engine in ["megatron", "torchtitan", "fsdp", "deepspeed"]:
            out.append([*base, "--engine", engine, "--precision", precision, "--zero", shard[engine]])
    for recipe in ["delayed", "tensorwise", "rowwise"]:
        for engine in ["megatron", "torchtitan"]:
            out.append([*base, "--engine", engine, "--precision", "fp8", "--fp8-recipe", recipe,
                        "--zero", shard[engine]])
    big = ["estimate", "--model", "llama-3-70b", "--gpus", "64", "--gpu", "h100-sxm"]
    for layout in [["--tp", "8", "--pp", "4", "--vpp", "5", "--mbs", "1"],
                   ["--tp", "4", "--pp", "8", "--schedule", "gpipe"],
                   ["--tp", "8", "--cp", "2", "--sequence-parallel", "--seq-len", "32768"],
                   ["--tp", "8", "--pp", "2", "--recompute", "full", "--recompute-layers", "1",
                    "--recompute-method", "uniform"],
                   ["--offload-params", "cpu", "--offload-optimizer", "cpu"],
                   ["--pp", "8", "--schedule", "zb-h1"]]:
        for engine in ["megatron", "megatron-deepspeed", "torchtitan"]:
            out.append([*big, "--engine", engine, "--zero", light[engine] if "--pp" in layout else shard[engine],
                        *layout])
    for model, gpus, layout in [("qwen3-30b-a3b", 16, ["--ep", "8", "--zero", "1"]),
                                ("qwen3-30b-a3b", 16, ["--ep", "8", "--zero", "3", "--engine", "torchtitan"]),
                                ("mixtral-8x7b", 16, ["--ep", "8", "--tp", "2", "--zero", "1"]),
                                ("mixtral-8x7b", 16, ["--ep", "4", "--etp", "2", "--tp", "2", "--zero", "1"]),
                                ("deepseek-v3", 256, ["--ep", "32", "--pp", "8", "--zero", "1"]),
                                ("gpt-oss-120b", 32, ["--ep", "8", "--tp", "2", "--zero", "1"]),
                                ("llama-4-scout", 32, ["--ep", "16", "--zero", "1"]),
                                ("qwen3-235b-a22b", 64, ["--ep", "16", "--pp", "4", "--zero", "1"])]:
        out.append(["estimate", "--model", model, "--gpus", str(gpus), "--gpu", "h100-sxm", *layout])
    for gpu in ["a100-40gb", "a100-80gb", "h100-pcie", "h100-96gb", "h200", "b200", "gb200", "gb300", "l40s",
                "mi300x"]:
        for zero in ["2", "3"]:
            out.append(["estimate", "--model", "llama-2-7b", "--gpus", "8", "--gpu", gpu, "--zero", zero])
    for bucket in [["--reduce-bucket-size", "5e8"], ["--stage3-prefetch-bucket-size", "1e9"],
                   ["--no-overlap-comm"], ["--fp32-grad-accum"], ["--recompute", "full", "--mbs", "8"], ["--sub-group-size", "1e8"],
                   ["--offload-optimizer", "nvme", "--offload-params", "nvme"], ["--optimizer", "adafactor"]]:
        out.append(["estimate", "--model", "llama-2-13b", "--gpus", "8", "--engine", "deepspeed", "--zero", "3",
                    *bucket])
    for nodes in [1, 2, 4, 16, 32, 128]:
        out.append(["estimate", "--params", "13e9", "--gpus", str(8 * nodes), "--zero", "3", "--mbs", "2"])
        out.append(["estimate", "--params", "13e9", "--gpus", str(8 * nodes), "--tp", "8", "--zero", "1",
                    "--engine", "megatron"])
    # check: what --emit writes, read back, and hand-written configs
    for i, engine in enumerate(engines):
        out.append(["recommend", "--model", "llama-3-8b", "--gpus", "16", "--engine", engine,
                    "--emit", f"{TMP}/emit{i}"])
        out.append(["check", "--config", f"{TMP}/emit{i}", "--no-deepspeed"])
    for name in CONFIGS:
        out.append(["check", "--config", f"{TMP}/{name}", "--model", "llama-3-8b", "--gpus", "8", "--no-deepspeed"])
    out.append(["check", "--accelerate-launch", f"accelerate launch --config_file {TMP}/acc_ds.yaml "
                "--num_processes 8 train.py", "--model", "llama-3-8b", "--no-deepspeed"])
    # validate: every source of the published runs
    out.append(["validate"])
    for source in ["dgxc", "mpt", "nemo", "narayanan2021", "torchtitan", "bloom", "ibm", "mem", "megatron", "korthikanti2022"]:
        out.append(["validate", "--source", source])
    return [[*c, "--json"] for c in out]


CONFIGS = {  # hand-written configs for `check`, as users write them
    "zero2.json": json.dumps({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8,
                              "bf16": {"enabled": True}, "zero_optimization": {"stage": 2, "overlap_comm": True}}),
    "zero3_offload.json": json.dumps({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 2,
                                      "fp16": {"enabled": True}, "zero_optimization": {
                                          "stage": 3, "offload_optimizer": {"device": "cpu"},
                                          "offload_param": {"device": "cpu"}, "reduce_bucket_size": 5e8}}),
    "deprecated.json": json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                                   "zero_optimization": {"stage": 3, "cpu_offload": True,
                                                         "cpu_offload_param": True}}),
    "acc_ds.yaml": "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nmixed_precision: bf16\n"
                   "deepspeed_config:\n  zero_stage: 3\n  offload_optimizer_device: none\n"
                   "  gradient_accumulation_steps: 4\n  zero3_init_flag: true\nnum_processes: 8\n",
    "acc_nested.yaml": "distributed_type: DEEPSPEED\nmixed_precision: bf16\nnum_processes: 8\ndeepspeed_config:\n"
                       "  zero_stage: 2\n  zero_optimization:\n    stage: 3\n",
}


def answer(argv: list[str], tmp: str) -> object:
    """One call's JSON (or its exit status and first line where it prints no JSON), paths neutral."""
    from planner.cli import main

    argv = [a.replace(TMP, tmp) for a in argv]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv, out=out)
        except SystemExit as e:  # argparse refusals
            rc = e.code
    text = out.getvalue().replace(tmp, TMP)
    try:
        return json.loads(text)
    except ValueError:
        return {"rc": rc, "stdout": text.strip().splitlines()[:1], "stderr": err.getvalue().replace(tmp, TMP)
                .strip().splitlines()[-1:]}


def dump(path: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in CONFIGS.items():
            Path(tmp, name).write_text(text)
        answers = {" ".join(c): answer(c, tmp) for c in calls()}
    Path(path).write_text(json.dumps(answers, default=str))


def diff(a, b, path: str = "") -> list[str]:
    """Paths where two JSON values differ; floats equal to 12 significant digits count as equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [p for k in sorted(set(a) | set(b), key=str)
                for p in (diff(a.get(k), b.get(k), f"{path}.{k}") if k in a and k in b else [f"{path}.{k}"])]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}[len {len(a)} -> {len(b)}]"]
        return [p for i, (x, y) in enumerate(zip(a, b)) for p in diff(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-300):
        return []
    return [] if a == b else [f"{path}: {str(a)[:60]} -> {str(b)[:60]}"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", default="HEAD")
    p.add_argument("--dump")
    p.add_argument("--list", action="store_true")
    args = p.parse_args()
    if args.list:
        print("\n".join(" ".join(c) for c in calls()), f"{len(calls())} calls", sep="\n")
        return 0
    if args.dump:
        sys.path.insert(0, os.environ.get("PYTHONPATH") or str(ROOT))
        dump(args.dump)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp, "base")
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.base], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            env = {**os.environ, "PYTHONPATH": str(tree)}  # the base's planner, this file's calls
            subprocess.run([sys.executable, __file__, "--dump", f"{tmp}/base.json"], cwd=tree, env=env, check=True)
            subprocess.run([sys.executable, __file__, "--dump", f"{tmp}/head.json"], cwd=ROOT, check=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
        base, head = (json.loads(Path(tmp, f).read_text()) for f in ("base.json", "head.json"))
    changed = [(c, d) for c in base if (d := diff(base[c], head.get(c)))]
    for c, d in changed:
        print(f"{c}\n  " + "\n  ".join(d[:6]) + (f"\n  ... {len(d) - 6} more" if len(d) > 6 else ""))
    print(f"{len(base) - len(changed)} of {len(base)} answers unchanged against {args.base}")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
