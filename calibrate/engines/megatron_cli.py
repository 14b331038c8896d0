"""Parse what planner.export.megatron_args writes with Megatron-LM's and Megatron-DeepSpeed's own parsers.

    python -m venv --system-site-packages /tmp/mlm-venv && /tmp/mlm-venv/bin/pip install triton==3.8.0
    python -m calibrate.engines.megatron_cli --megatron-lm-git DIR --megatron-deepspeed-git DIR \\
        --megatron-lm-python /tmp/mlm-venv/bin/python [--out PATH]

The two DIRs are git clones (bare is fine) of NVIDIA/Megatron-LM and microsoft/Megatron-DeepSpeed holding
the commits pinned below; the script extracts `megatron/` (and Megatron-DeepSpeed's `tools/`, which its
arguments.py imports) with `git archive` into a temporary directory. Neither is pip-installable as a
training package (megatron-core wheels leave out megatron/training), so each parses in a child process
with PYTHONPATH on its extracted tree, the tree's megatron/core included.

For each layout below (dense Llama 3 8B/70B; TP with and without SP; PP with 1F1B and interleaving; CP;
the distributed optimizer; full, block, uniform and selective recompute; fp32/bf16/fp16/bf16-pure; FP8
with each Megatron-LM recipe; EP on MoE models; multi-token prediction; optimizer offload), the arguments and launch.sh's
environment (megatron_environment) come from planner's own functions, and are then handed to
  * Megatron-LM: training/arguments.py parse_args(ignore_unknown_args=False) with sys.argv set,
    validate_args(args, {'tokenizer_type': 'GPT2BPETokenizer'}) as pretrain_gpt.py passes it, then
    training/argument_utils.py core_transformer_config_from_args (TransformerConfig.__post_init__);
  * Megatron-DeepSpeed: megatron/arguments.py parse_args, validate_args (as megatron/initialize.py
    initialize_megatron calls them).
WORLD_SIZE and RANK=0 are set as torchrun sets them (both parse_args read them). The parsed fields
that say what the layout means, or the parser's or validator's error, go to
data/references/megatron_cli.json (atomically), read by tests/test_megatron_cli.py.

Stubbed, because they need a GPU, a GPU library or a newer Python, nothing else:
  * Megatron-LM needs Python >= 3.12: typing.override is typing_extensions.override on 3.11;
  * training/utils/common_utils.py get_device_arch_version (reads cuda:0) returns the case's GPU's
    compute capability major, so validate_args' CUDA_DEVICE_MAX_CONNECTIONS check runs as on it, and
    torch.cuda.get_device_capability its capability, for the --moe-grouped-gemm check;
  * Transformer Engine is absent: core/utils.py's cached TE version reads 2.20.2 and
    rope_utils.fused_apply_rotary_pos_emb (TE's fused RoPE) is a placeholder, for TransformerConfig;
  * Megatron-DeepSpeed: DeepSpeed's accelerator (DS_ACCELERATOR=cpu here) names itself 'cuda' during
    validate_args, so its CUDA_DEVICE_MAX_CONNECTIONS check runs as on a GPU.
Triton is installed in the Megatron-LM venv, not stubbed (megatron/core imports its kernels).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "data" / "references" / "megatron_cli.json"
COMMITS = {"megatron-lm": "d98e8a64ddf34856e74b24714e3bedb2f5a39553",
           "megatron-deepspeed": "f4157bea69f3df8c6cb66f2ebcda66ba03d1288e"}
TE_VERSION = "2.20.2"  # the Transformer Engine planner/export.py cites
BASE = dict(tp=1, pp=1, dp=8, cp=1, ep=1, vpp=1, zero=1, offload_optimizer="none", offload_params="none", mbs=1,
            gas=8, recompute="none", recompute_layers=None, recompute_method=None, sequence_parallel=False,
            schedule="1f1b")
SP = {"sequence_parallel": True}
CASES = [  # (engine, catalog model, precision, Training changes, row changes); the GPU is an H100 unless "gpu"
    ("megatron", "llama-3-8b", "bf16", {}, {}),
    ("megatron", "llama-3-8b", "bf16", {}, {"zero": 0, "tp": 2, "dp": 4, "recompute": "selective"}),
    ("megatron", "llama-3-8b", "bf16", {}, {"tp": 4, "dp": 2, **SP, "recompute": "full"}),
    ("megatron", "llama-3-70b", "bf16", {}, {"tp": 4, "pp": 2, "dp": 2, **SP, "gas": 16, "recompute": "full",
                                            "recompute_layers": 3}),
    ("megatron", "llama-3-70b", "bf16", {}, {"tp": 4, "pp": 4, "vpp": 2, "dp": 1, **SP, "gas": 16,
                                            "schedule": "interleaved", "recompute": "full", "recompute_layers": 2,
                                            "recompute_method": "uniform"}),
    ("megatron", "llama-3-70b", "bf16", {"overlap_p2p": False}, {"tp": 8, "pp": 4, "vpp": 5, "dp": 1, **SP,
                                                                "gas": 16, "schedule": "interleaved"}),
    ("megatron", "llama-3-8b", "bf16", {"pipeline_edge_layers": 1, "tp_comm_overlap": True,
                                        "grad_reduce_in_bf16": True},
     {"tp": 2, "pp": 2, "dp": 2, **SP, "rank_order": "tp-cp-pp-dp"}),  # (32 + 2) / 2 blocks a stage
    # Llama 3.1 405B as Meta interleaved it: (126 + 2) / (16 x 2) = 4 layer slots a virtual stage
    ("megatron", "llama-3.1-405b", "bf16", {"pipeline_edge_layers": 1}, {"tp": 8, "pp": 16, "vpp": 2, "dp": 1, **SP,
                                                                        "gas": 16, "schedule": "interleaved"}),
    ("megatron", "llama-3-8b", "bf16", {}, {"cp": 4, "dp": 2}),
    ("megatron", "llama-3-8b", "bf16", {}, {"tp": 2, "cp": 2, "dp": 2, **SP}),
    ("megatron", "llama-3-8b", "fp32", {}, {"zero": 0}),
    ("megatron", "llama-3-8b", "fp16", {}, {"tp": 2, "dp": 4, **SP}),
    ("megatron", "llama-3-8b", "bf16-pure", {}, {}),
    ("megatron", "llama-3-8b", "fp8", {}, {"tp": 2, "dp": 4, **SP}),  # the default recipe, FP8 parameter gather
    ("megatron", "llama-3-8b", "fp8", {"fp8_recipe": "tensorwise"}, {}),
    ("megatron", "llama-3-8b", "fp8", {"fp8_recipe": "delayed", "fp8_param_gather": False}, {"zero": 0}),
    ("megatron", "llama-3-70b", "fp8", {"fp8_recipe": "mxfp8", "gpu": "b200"}, {"tp": 4, "pp": 2, "dp": 1, **SP,
                                                                                "gas": 16}),
    ("megatron", "llama-3-8b", "bf16", {}, {"offload_optimizer": "cpu"}),
    ("megatron", "llama-3-8b", "fp8", {"fp8_recipe": "delayed"}, {"offload_optimizer": "cpu"}),
    # validate_args: FP8 parameters beside optimizer offload only under delayed scaling (megatron_args refuses it)
    ("megatron", "llama-3-8b", "fp8", {"fp8_recipe": "tensorwise", "fp8_param_gather": False},
     {"offload_optimizer": "cpu"}),
    ("megatron", "qwen3-30b-a3b", "bf16", {"moe_capacity_factor": 1.0, "moe_pad_to_capacity": True},
     {"ep": 8, "dp": 8}),
    ("megatron", "mixtral-8x7b", "bf16", {}, {"tp": 2, "pp": 2, "dp": 4, "ep": 4, **SP, "recompute": "full"}),
    ("megatron", "deepseek-v3", "bf16", {}, {"ep": 8, "dp": 8}),  # MLA, 3 dense blocks then 58 MoE
    # 61 blocks on 4 x 4 virtual stages (NVIDIA's GB200 recipe) and on 16 stages: --pipeline-model-parallel-layout
    ("megatron", "deepseek-v3", "bf16", {}, {"pp": 4, "vpp": 4, "dp": 8, "ep": 8, "gas": 16, "schedule": "interleaved"}),
    ("megatron", "deepseek-v3", "bf16", {"pipeline_edge_layers": 1}, {"pp": 16, "dp": 2, "ep": 2, "gas": 16}),
    # NeMo's DeepSeek-V3 H100 recipe recomputes MLA's up projections, the dense MLPs and the MoE layers
    ("megatron", "deepseek-v3", "bf16", {"recompute_modules": ["mla_up_proj", "mlp", "moe"]},
     {"ep": 8, "dp": 8, "recompute": "selective"}),
    # grouped experts, the norms and the experts' activation recomputed (as Megatron-Bridge's GPT-OSS H100 recipe)
    ("megatron", "qwen3-30b-a3b", "bf16", {"moe_grouped_gemm": True, "recompute_modules": ["moe_act", "layernorm"]},
     {"pp": 2, "ep": 8, "dp": 8, "recompute": "selective"}),
    # one multi-token-prediction depth (--mtp-num-layers), alone and on the last of 4 x 4 virtual stages
    ("megatron", ("deepseek-v3", {"mtp_layers": 1}), "bf16", {}, {"ep": 8, "dp": 8}),
    ("megatron", ("deepseek-v3", {"mtp_layers": 1}), "bf16", {}, {"pp": 4, "vpp": 4, "dp": 8, "ep": 8, "gas": 16,
                                                               "schedule": "interleaved"}),
    ("megatron", ("mixtral-8x7b", {"mtp_layers": 2}), "bf16", {}, {"tp": 2, "pp": 2, "vpp": 2, "dp": 2, "ep": 2, **SP,
                                                                "gas": 16, "schedule": "interleaved"}),
    ("megatron-deepspeed", "llama-3-8b", "bf16", {}, {}),
    ("megatron-deepspeed", "llama-3-8b", "bf16", {}, {"tp": 2, "dp": 4, **SP, "zero": 2, "recompute": "full"}),
    ("megatron-deepspeed", "llama-3-8b", "bf16", {}, {"tp": 2, "cp": 2, "dp": 2, "recompute": "selective"}),
    ("megatron-deepspeed", "llama-3-8b", "bf16", {}, {"cp": 4, "dp": 2, "zero": 3}),
    ("megatron-deepspeed", "llama-3-70b", "bf16", {}, {"tp": 4, "pp": 4, "dp": 1, **SP, "gas": 16,
                                                      "recompute": "full"}),
    ("megatron-deepspeed", "llama-3-8b", "fp16", {}, {"zero": 3, "mbs": 2, "gas": 4}),
    ("megatron-deepspeed", "llama-3-8b", "bf16", {"partition_activations": True, "cpu_checkpointing": True},
     {"tp": 4, "dp": 2, "recompute": "full"}),
    ("megatron-deepspeed", "mixtral-8x7b", "bf16", {}, {"tp": 2, "dp": 4, "ep": 4, **SP}),
]
ZERO_CONFIG = ("partition_activations", "cpu_checkpointing")  # Training changes that are ZeroConfig's


def build(engine: str, name, precision: str, changes: dict, row_changes: dict) -> dict:
    """One case: planner's row, arguments and launch.sh environment, after planner's own checks.
    `name`: a catalog model, or (catalog model, its ModelSpec overrides)."""
    from planner.export import check_row, normalise_row, megatron_args, megatron_environment
    from planner.hardware import Cluster, lookup_gpu
    from planner.layout import Training, ZeroConfig
    from planner.model import lookup, with_overrides

    name, overrides = (name, {}) if isinstance(name, str) else name
    changes = dict(changes)
    gpu = lookup_gpu(changes.pop("gpu", "h100-sxm"))
    zero = ZeroConfig(**{k: changes.pop(k) for k in ZERO_CONFIG if k in changes})
    row = normalise_row({**BASE, **row_changes})
    gpus = row["tp"] * row["pp"] * row["cp"] * row["dp"]
    model, cluster = with_overrides(lookup(name), **overrides), Cluster(gpu, gpus, min(gpus, 8))
    training = Training(engine=engine, seq_len=4096, precision=precision, zero_config=zero, **changes)
    check_row(model, cluster, training, row)  # a layout --emit writes
    env = [line.split("#")[0].split()[1] for line in megatron_environment(cluster, training, row)]
    return {"engine": engine, "model": name, **({"model_overrides": overrides} if overrides else {}),
            "precision": precision, "gpu": gpu.name, "training": changes,
            "zero_config": {k: getattr(zero, k) for k in ZERO_CONFIG}, "row": row,
            "args": megatron_args(model, training, row, ds_config_path="ds_config.json"),
            "environment": dict(kv.split("=", 1) for kv in env),
            "world_size": gpus, "compute_capability": gpu.compute_capability}


# ---------------------------------------------------------------------------------------------
# the children: one per engine, PYTHONPATH on its extracted tree

MLM_FIELDS = (
    "world_size", "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
    "virtual_pipeline_model_parallel_size", "num_layers_per_virtual_pipeline_stage", "expert_model_parallel_size",
    "expert_tensor_parallel_size", "data_parallel_size", "sequence_parallel", "use_distributed_optimizer",
    "recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules", "bf16", "fp16",
    "params_dtype", "fp8",
    "fp8_recipe", "fp8_param_gather", "micro_batch_size", "global_batch_size", "seq_length", "num_layers",
    "hidden_size", "num_attention_heads", "group_query_attention", "num_query_groups", "kv_channels",
    "ffn_hidden_size", "swiglu", "normalization", "position_embedding_type", "add_bias_linear",
    "untie_embeddings_and_output_weights", "attention_dropout", "hidden_dropout", "qk_layernorm",
    "multi_latent_attention", "num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_layer_freq",
    "moe_token_dispatcher_type", "moe_grouped_gemm", "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity",
    "optimizer",
    "optimizer_cpu_offload", "optimizer_offload_fraction", "use_precision_aware_optimizer", "main_grads_dtype",
    "exp_avg_dtype", "exp_avg_sq_dtype", "accumulate_allreduce_grads_in_fp32", "overlap_grad_reduce",
    "overlap_param_gather", "overlap_p2p_comm", "tp_comm_overlap", "use_tp_pp_dp_mapping",
    "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split", "use_flash_attn", "mtp_num_layers",
    "cross_entropy_loss_fusion", "cross_entropy_fusion_impl",
    "attention_backend")
CONFIG_FIELDS = ("mtp_num_layers", "sequence_parallel", "recompute_granularity", "recompute_method", "recompute_num_layers",
                 "recompute_modules",
                 "virtual_pipeline_model_parallel_size", "context_parallel_size", "fp8", "fp8_recipe", "fp8_param",
                 "num_moe_experts", "moe_layer_freq", "gated_linear_unit", "normalization")
MDS_FIELDS = (
    "world_size", "tensor_model_parallel_size", "pipeline_model_parallel_size", "ds_pipeline_enabled",
    "ds_sequence_parallel_size", "virtual_pipeline_model_parallel_size", "data_parallel_size", "sequence_parallel",
    "deepspeed", "deepspeed_config", "zero_stage", "use_distributed_optimizer", "deepspeed_activation_checkpointing",
    "partition_activations", "checkpoint_in_cpu", "recompute_granularity", "recompute_method",
    "recompute_num_layers", "bf16", "fp16", "params_dtype", "micro_batch_size", "global_batch_size", "seq_length",
    "num_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "kv_channels", "ffn_hidden_size",
    "swiglu", "normalization", "use_rotary_position_embeddings", "add_bias_linear",
    "untie_embeddings_and_output_weights", "num_experts", "topk", "moe_expert_parallel_size", "optimizer",
    "use_flash_attn", "use_flash_attn_v1", "use_flash_attn_v2")


def _plain(value):
    """JSON-able: torch dtypes and enums by name."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(getattr(value, "name", value))


@contextlib.contextmanager
def _argv_env(case: dict):
    """sys.argv and the environment torchrun and launch.sh give rank 0 of the case's job."""
    saved_argv, saved_env = sys.argv, dict(os.environ)
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    os.environ.update(WORLD_SIZE=str(case["world_size"]), RANK="0", **case["environment"])
    sys.argv = ["pretrain_gpt.py", *" ".join(case["args"]).split()]
    try:
        yield
    finally:
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)


def _run(case: dict, parse, validate, fields) -> dict:
    """parse() then validate(args): the fields, or the first error (argparse's usage line dropped)."""
    out, err = io.StringIO(), io.StringIO()
    with _argv_env(case), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            args = parse()
        except SystemExit:
            return {"error": " ".join(err.getvalue().split("error:")[-1].split())[:400], "stage": "parse_args"}
        try:
            extra = validate(args)
        except Exception as e:  # what validate_args or TransformerConfig raises
            return {"error": f"{type(e).__name__}: {' '.join(str(e).split())}"[:400], "stage": "validate"}
    return {"args": {k: _plain(getattr(args, k, None)) for k in fields}, **extra}


def parse_megatron_lm(cases: list[dict]) -> list[dict]:
    import typing

    import typing_extensions

    typing.override = typing_extensions.override  # Megatron-LM needs Python >= 3.12 (pyproject requires-python)
    import megatron.core
    import megatron.core.models.common.embeddings.rope_utils as rope_utils
    import megatron.core.utils as core_utils
    import megatron.training.arguments as arguments
    from megatron.training.argument_utils import core_transformer_config_from_args
    from packaging.version import Version

    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] in megatron.core.__file__, megatron.core.__file__
    core_utils._te_version = Version(TE_VERSION)  # no Transformer Engine on this machine
    rope_utils.fused_apply_rotary_pos_emb = lambda *args, **kwargs: None  # TE's fused RoPE, never called here

    def validate(case):
        def run(args):
            arguments.validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})  # pretrain_gpt.py's defaults
            config = core_transformer_config_from_args(args)
            return {"config": {"class": type(config).__name__,
                               **{k: _plain(getattr(config, k, None)) for k in CONFIG_FIELDS}}}
        return run

    rows = []
    for case in cases:
        major = int(case["compute_capability"])
        arguments.get_device_arch_version = lambda: major  # reads cuda:0's properties
        # validate_args' --moe-grouped-gemm check reads cuda:0's capability too
        arguments.torch.cuda.get_device_capability = lambda device=None, c=case["compute_capability"]: (
            int(c), round(10 * (c - int(c))))
        rows.append(_run(case, lambda: arguments.parse_args(ignore_unknown_args=False), validate(case), MLM_FIELDS))
    return rows


def parse_megatron_deepspeed(cases: list[dict]) -> list[dict]:
    import deepspeed.accelerator

    import megatron.arguments as arguments

    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] in arguments.__file__, arguments.__file__
    real = deepspeed.accelerator.get_accelerator

    class Cuda:  # validate_args reads device_name() for its CUDA_DEVICE_MAX_CONNECTIONS check
        def __getattr__(self, name):
            return getattr(real(), name)

        def device_name(self, *args):
            return "cuda"

    def validate(args):
        deepspeed.accelerator.get_accelerator = Cuda
        try:
            arguments.validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})  # pretrain_gpt.py's defaults
        finally:
            deepspeed.accelerator.get_accelerator = real
        return {}

    return [_run(case, lambda: arguments.parse_args(ignore_unknown_args=False), validate, MDS_FIELDS)
            for case in cases]


def child(engine: str, src: Path, dst: Path) -> None:
    cases = json.loads(src.read_text())
    parse = parse_megatron_lm if engine == "megatron-lm" else parse_megatron_deepspeed
    dst.write_text(json.dumps(parse(cases)))


# ---------------------------------------------------------------------------------------------
# the parent: extract, build, run the children, record

def extract(git_dir: Path, commit: str, where: Path, paths: list[str]) -> Path:
    where.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(git_dir), "archive", commit, *paths], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


def measure(opts) -> list[dict]:
    cases = [build(*case) for case in CASES]
    trees = {"megatron-lm": (opts.megatron_lm_git, ["megatron"], opts.megatron_lm_python),
             "megatron-deepspeed": (opts.megatron_deepspeed_git, ["megatron", "tools"], sys.executable)}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (git_dir, paths, python) in trees.items():
            engine = "megatron" if name == "megatron-lm" else name
            mine = [c for c in cases if c["engine"] == engine]
            tree = extract(git_dir, COMMITS[name], Path(tmp, name), paths)
            src, dst = Path(tmp, name + ".in.json"), Path(tmp, name + ".out.json")
            src.write_text(json.dumps(mine))
            env = {**os.environ, "PYTHONPATH": str(tree), "DS_ACCELERATOR": "cpu"}
            subprocess.run([python, "-m", "calibrate.engines.megatron_cli", "--child", name, str(src), str(dst)],
                           cwd=REPO, env=env, check=True)
            for case, parsed in zip(mine, json.loads(dst.read_text())):
                case["parsed"] = parsed
                print(case["engine"], case["model"], case["precision"], parsed.get("error", "ok"), flush=True)
    return cases


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--megatron-lm-git", type=Path, default=Path("/work/.mirror/NVIDIA+Megatron-LM/repo"))
    p.add_argument("--megatron-deepspeed-git", type=Path,
                   default=Path("/work/.mirror/microsoft+Megatron-DeepSpeed/repo"))
    p.add_argument("--megatron-lm-python", default=sys.executable, help="a Python with triton (see above)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--child", nargs=3, metavar=("ENGINE", "IN", "OUT"), help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    if opts.child:
        child(opts.child[0], Path(opts.child[1]), Path(opts.child[2]))
        return 0
    rows = measure(opts)
    import deepspeed
    import torch

    doc = {"_source": "python -m calibrate.engines.megatron_cli: planner.export.megatron_args (and "
                      "megatron_environment's exports) parsed by Megatron-LM training/arguments.py parse_args + validate_args + "
                      "core_transformer_config_from_args, and Megatron-DeepSpeed megatron/arguments.py parse_args + "
                      "validate_args, each from its source tree at the commit below (stubs: the module docstring)",
           "commits": {"NVIDIA/Megatron-LM": COMMITS["megatron-lm"],
                       "microsoft/Megatron-DeepSpeed": COMMITS["megatron-deepspeed"]},
           "environment": {"python": sys.version.split()[0], "torch": torch.__version__,
                           "deepspeed": deepspeed.__version__, "transformer_engine (stubbed)": TE_VERSION},
           "rows": rows}
    tmp = opts.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, opts.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
