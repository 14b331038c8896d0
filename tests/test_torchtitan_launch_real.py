"""The launch.sh `--emit` writes for the torchtitan engine starts torchtitan 0.3.0's own trainer
(torchtitan.train) with torchrun on 2 CPU ranks (gloo), for two steps of its Llama 3 debug model,
planned here from the same shape. What torchtitan logs about itself (the device mesh it built, the
batch and accumulation it derived, the model size, the FSDP/HSDP and activation checkpointing it
applied) is compared with what the planner wrote, so an override that torchtitan refuses or reads
otherwise fails here.

launch.sh runs as emitted, the model named through TORCHTITAN_MODULE / TORCHTITAN_CONFIG as the
script asks for a shape without a registry entry (cpu_debugmodel below), with one rewrite:
`-m torchtitan.train` becomes `-m tests.test_torchtitan_launch_real`, which makes the CPU changes
listed in run_on_cpu and then runs torchtitan.train as __main__. Two further changes are for torch
2.13 (the test environment's), not the CPU: torchtitan 0.3.0 uses two things torch 2.14 has and
2.13 lacks, FSDP over spmd_types-annotated parameters and dist.set_timeout (cpu_debugmodel, and the
last item of run_on_cpu).

torchtitan is not in the test extras: torchtitan 0.3.0 requires datasets<4.8, which makes pip
downgrade transformers and huggingface_hub in the test environment. Without it this file skips.
"""

from __future__ import annotations

import io
import json
import os
import re
import runpy
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("torchtitan")
ROOT = Path(__file__).resolve().parent.parent
MODULE = "tests.test_torchtitan_launch_real"
STEPS = 2
# torchtitan's llama3 "debugmodel" (models/llama3/__init__.py _debugmodel): dim 256, 16 heads, 6
# layers, ffn compute_ffn_hidden_dim(256, multiple_of=256) = 768, vocab 2048, untied
SHAPE = ["--layers", "6", "--hidden", "256", "--heads", "16", "--kv-heads", "16", "--ffn", "768",
         "--ffn-kind", "swiglu", "--vocab", "2048", "--no-tied-embeddings", "--seq-len", "64"]


def cpu_debugmodel():
    """TORCHTITAN_CONFIG of these launches: llama3_debugmodel (models/llama3/config_registry.py)
    with the tokenizer and text the test makes (its ./tests/assets are in torchtitan's repository,
    not its wheel) and two steps; launch.sh's overrides apply on top."""
    import torch
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    config = llama3_debugmodel()
    assets = Path(os.environ["TORCHTITAN_TEST_ASSETS"])
    config.hf_assets_path = str(assets / "tokenizer")
    config.dataloader.dataset_path = str(assets / "text")  # the c4_test loader: load_dataset(path, split="train")
    config.training.steps = STEPS
    if tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 14):
        # not CPU: the default spmd_backend "spmd_types" hands fully_shard plain parameters with
        # dp_mesh_dims (distributed/full_dtensor.py resolve_fsdp_mesh), which torch 2.13's FSDP
        # refuses (fsdp/_fully_shard/_fsdp_param.py FSDPParam._init_sharding_spec); partial_dtensor
        # is the DTensor-for-TP, FSDP2-over-DP path that torch 2.13 takes
        config.parallelism.spmd_backend = "partial_dtensor"
    return config


class _CpuDeviceModule(types.ModuleType):
    """torch.cpu with the CUDA-module calls torchtitan makes: components/metrics.py
    DeviceMemoryMonitor (name, capacity, memory stats), distributed/utils.py set_pg_timeouts
    (current_device for the barrier)."""

    def __getattr__(self, name):
        import torch

        return getattr(torch.cpu, name)

    @staticmethod
    def get_device_name(device=None):
        return "cpu"

    @staticmethod
    def current_device():
        return 0

    @staticmethod
    def get_device_properties(device=None):
        return types.SimpleNamespace(total_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))

    @staticmethod
    def memory_stats(device=None):
        return {}  # no allocator statistics on the CPU: torchtitan logs -1 peaks

    @staticmethod
    def reset_peak_memory_stats(device=None):
        pass

    @staticmethod
    def empty_cache():
        pass


def run_on_cpu() -> None:
    """What must change for torchtitan 0.3.0 to train on CPU ranks: a module torchtitan imports, the
    device it picks, how attention and FSDP's gradient reduction run on it. None changes the
    configuration torchtitan parses, the mesh it builds or the parallelisms it applies."""
    import torch
    import torch.distributed as dist

    # 1. distributed/minimal_async_ep/kernels.py imports triton at import time (reached from
    # models/common/token_dispatcher.py); torch's CPU wheel has no triton. Its kernels serve the
    # MinimalAsyncEP MoE dispatcher only, which a dense Llama never calls.
    kernels = types.ModuleType("torchtitan.distributed.minimal_async_ep.kernels")
    for name in ("copy_full_counts_to_peers_kernel", "copy_rows_to_peers_kernel", "expand_topk_grad_kernel",
                 "fill_combine_metadata_kernel", "fill_dispatch_metadata_kernel", "invert_flat_indices_kernel",
                 "reduce_topk_slots_kernel", "topk_scores_grad_kernel"):
        setattr(kernels, name, _unavailable(name))
    kernels.__file__ = __file__
    sys.modules[kernels.__name__] = kernels

    # 2. tools/utils.py get_device_info takes "cuda" where torch finds no accelerator, and
    # trainer.py Trainer.__init__ calls torch.cuda.set_device. Other modules import device_type and
    # device_module by name, so they are set before any of those is imported; "cpu" makes
    # distributed/utils.py init_distributed pick gloo and the meshes CPU meshes.
    import torchtitan.tools.utils as tt_utils

    tt_utils.device_type, tt_utils.device_module = "cpu", _CpuDeviceModule("cpu_device_module")

    # 3. A language model's attention is FlexAttention or varlen (models/common/config_utils.py
    # get_attention_config); torch refuses FlexAttention backward on CPU
    # (nn/attention/flex_attention.py _validate_device). It runs eagerly here, torch's dense
    # reference for forward and backward, instead of compiled (models/common/attention.py
    # FlexAttention._compiled_flex_attn), with that refusal lifted.
    import torch.nn.attention.flex_attention as flex
    from torchtitan.models.common.attention import FlexAttention

    validate = flex._validate_device
    flex._validate_device = lambda q, k, v: validate(q.detach(), k.detach(), v.detach())
    FlexAttention._compiled_flex_attn = staticmethod(
        lambda *args, kernel_options=None, **kwargs: flex.flex_attention(*args, **kwargs))

    # 4. distributed/fsdp.py disable_fsdp_gradient_division sets FSDP's divide factor to 1, so
    # torch reduce-scatters gradients with ReduceOp.PREMUL_SUM(1.0)
    # (fsdp/_fully_shard/_fsdp_collectives.py _get_gradient_divide_factors), an op gloo lacks;
    # force_sum_reduction_for_comms makes it SUM, then a multiply by the same factor 1.
    import torchtitan.distributed.fsdp as tt_fsdp

    disable = tt_fsdp.disable_fsdp_gradient_division

    def disable_with_sum(model):
        disable(model)
        for module in model.modules():
            if isinstance(module, torch.distributed.fsdp.FSDPModule):
                module.set_force_sum_reduction_for_comms(True)

    tt_fsdp.disable_fsdp_gradient_division = disable_with_sum

    # 5. Not CPU: distributed/utils.py set_pg_timeouts, which trainer.py Trainer.train calls after
    # the first step, uses torch 2.14's dist.set_timeout, named _set_pg_timeout in torch 2.13.
    if not hasattr(dist, "set_timeout"):
        dist.set_timeout = dist.distributed_c10d._set_pg_timeout

    runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)


def _unavailable(name: str):
    def call(*args, **kwargs):
        raise RuntimeError(f"{name} is a triton kernel, not available on CPU ranks")

    return call


def make_assets(where: Path) -> None:
    """A word-level tokenizer (tokenizer.json, read by components/tokenizer.py HuggingFaceTokenizer)
    and a few hundred words of text as JSON lines with a "text" field (c4_test's sample)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = "the quick brown fox jumps over a lazy dog while one cat sleeps near an open door".split()
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(dict.fromkeys(words))}}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    (where / "tokenizer").mkdir(parents=True)
    tokenizer.save(str(where / "tokenizer" / "tokenizer.json"))
    (where / "tokenizer" / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    (where / "text").mkdir()
    lines = [json.dumps({"text": " ".join(words[(i + j) % len(words)] for j in range(100))}) for i in range(32)]
    (where / "text" / "train.jsonl").write_text("\n".join(lines) + "\n")


def emit(tmp_path: Path, *argv) -> dict:
    from planner import cli

    out = io.StringIO()
    assert cli.main(["estimate", *SHAPE, "--gpus", "2", "--engine", "torchtitan", *argv,
                     "--emit", str(tmp_path / "out"), "--json"], out=out) == 0
    return json.loads(out.getvalue())


def launch(tmp_path: Path) -> str:
    """bash launch.sh, `-m torchtitan.train` rewritten to this module; torchtitan's log (both ranks)."""
    script = (tmp_path / "out" / "launch.sh").read_text()
    assert script.count(" -m torchtitan.train ") == 1
    (tmp_path / "out" / "launch_cpu.sh").write_text(script.replace(" -m torchtitan.train ", f" -m {MODULE} "))
    make_assets(tmp_path / "assets")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bindir = str(Path(sys.executable).parent)  # the torchrun of this Python
    env = {**os.environ, "MASTER_PORT": str(port), "TORCHTITAN_MODULE": MODULE, "TORCHTITAN_CONFIG": "cpu_debugmodel",
           "TORCHTITAN_TEST_ASSETS": str(tmp_path / "assets"), "PYTHONPATH": str(ROOT),
           "PATH": bindir + os.pathsep + os.environ["PATH"], "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf")}  # load_dataset's cache, off the user's
    # the timeout only stops a hung run; torchtitan's own comm.init_timeout_seconds is 300
    proc = subprocess.run(["bash", str(tmp_path / "out" / "launch_cpu.sh")], cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    log = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout)  # torchtitan colours its metrics lines
    assert proc.returncode == 0, log[-6000:]
    return log


def check_started_as_planned(log: str, d: dict, *, dp_replicate: int, dp_shard: int, applied: list[str]) -> None:
    """Each of the 2 ranks logs the mesh, batch and model planned, what it applied, and every step."""
    lay, ranks = d["layout"], 2
    # distributed/parallel_dims.py ParallelDims.build_mesh
    mesh = (f"Building device mesh with parallelism: pp={lay['pp']}, dp_replicate={dp_replicate}, "
            f"dp_shard={dp_shard}, cp={lay['cp']}, tp={lay['tp']}, ep={lay['ep']}")
    # trainer.py Trainer.__init__: the accumulation torchtitan derives from local and global batch size
    batch = (f"Trainer is initialized with local batch size {lay['mbs']}, global batch size {lay['gbs']}, "
             f"gradient accumulation steps {lay['gas']}, sequence length {d['training']['seq_len']}, "
             f"total steps {STEPS}")
    model = f"Model llama3 debugmodel size: {d['model']['params']:,} total parameters"  # the shape planned
    # distributed/fsdp.py apply_fsdp_to_decoder, distributed/activation_checkpoint.py
    for line in [mesh, batch, model, *applied, "Training completed"]:
        assert log.count(line) == ranks, (line, log[-6000:])
    for step in range(1, STEPS + 1):  # trainer.py Trainer.train: the metrics line of each step
        assert len(re.findall(rf"step:\s+{step}\s+loss:\s+[0-9.]+\s", log)) == ranks, log[-6000:]


def test_torchtitan_trains_the_fsdp_layout_as_planned(tmp_path):
    d = emit(tmp_path, "--zero", "3", "--mbs", "2", "--gbs", "8", "--recompute", "selective")
    lay = d["layout"]
    assert (lay["dp"], lay["tp"], lay["zero"], lay["mbs"], lay["gas"], lay["recompute"]) == (2, 1, 3, 2, 2, "selective")
    # ZeRO-3: FSDP2 sharding over both ranks; 2 micro-batches of 2 a step; op-level selective AC
    check_started_as_planned(launch(tmp_path), d, dp_replicate=1, dp_shard=2, applied=[
        "Applied FSDP to the model", "Applied SelectiveAC activation checkpointing to the model"])


def test_torchtitan_trains_the_replicated_layout_as_planned(tmp_path):
    d = emit(tmp_path, "--zero", "0", "--mbs", "1", "--gbs", "4")
    lay = d["layout"]
    assert (lay["dp"], lay["tp"], lay["zero"], lay["mbs"], lay["gas"]) == (2, 1, 0, 1, 2)
    # ZeRO-0: replicated over both ranks (torchtitan's HSDP with a shard degree of 1), no sharding
    check_started_as_planned(launch(tmp_path), d, dp_replicate=2, dp_shard=1, applied=["Applied HSDP to the model"])


def test_torchtitan_trains_the_tensor_parallel_layout_as_planned(tmp_path):
    d = emit(tmp_path, "--tp", "2", "--dp", "1", "--mbs", "2", "--gbs", "4", "--sequence-parallel",
             "--recompute", "full")
    lay = d["layout"]
    assert (lay["dp"], lay["tp"], lay["sequence_parallel"], lay["gas"], lay["recompute"]) == (1, 2, True, 2, "full")
    # TP 2 with sequence parallelism (torchtitan's default), full AC
    check_started_as_planned(launch(tmp_path), d, dp_replicate=1, dp_shard=1, applied=[
        "Applied FullAC activation checkpointing to the model"])


if __name__ == "__main__":  # the module launch_cpu.sh starts in every rank
    run_on_cpu()
