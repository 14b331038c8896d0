"""Parse what planner.engines.torchtitan.export writes with torchtitan 0.3.0's own trainer config parser.

    pip install torchtitan==0.3.0 && python -m calibrate.engines.torchtitan_cli [--out PATH]

For a set of layouts (ZeRO 0/2/3, TP with and without SP, every pipeline schedule, 2 and 4 stages
per rank, CP, EP, CPU offload, fp32 and pure bf16, each recompute policy, FP8 linears through the config
module --emit writes), the overrides are handed
to torchtitan.config.manager.ConfigManager.parse_args with the registry entry planner chose, and the
resulting Trainer.Config fields are recorded beside the arguments in
data/references/torchtitan_cli.json (atomically), read by tests/test_export.py. A layout torchtitan
rejects is recorded with its error.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
from pathlib import Path

from calibrate.harness.recording import run_cli, stub_triton_kernels
from planner import layout
from planner.export import normalise_row
from planner.engines.torchtitan.export import CONFIGS, FP8_CONFIG, FP8_MODULE, fp8_module, torchtitan_args
from planner.model import lookup

OUT = Path(__file__).resolve().parents[2] / "data" / "references" / "torchtitan_cli.json"
BASE = dict(tp=1, pp=1, dp=8, cp=1, ep=1, vpp=1, zero=3, offload_optimizer="none", offload_params="none", mbs=2,
            gas=4, recompute="none", recompute_layers=None, recompute_method=None, sequence_parallel=False,
            schedule="1f1b")
CASES = [  # (catalog model, precision, row changes)
    ("llama-3-8b", "bf16", {}),
    ("llama-3-8b", "bf16", {"zero": 2, "recompute": "selective"}),
    ("llama-3-8b", "bf16", {"zero": 0, "recompute": "full"}),
    ("llama-3-8b", "fp32", {"tp": 2, "dp": 4, "sequence_parallel": True}),
    ("llama-3-8b", "bf16-pure", {"tp": 2, "dp": 4}),
    ("llama-3-70b", "bf16", {"tp": 4, "pp": 2, "dp": 1, "sequence_parallel": True, "gas": 16}),
    ("llama-3-70b", "bf16", {"pp": 4, "dp": 2, "schedule": "gpipe", "gas": 8}),
    ("llama-3-70b", "bf16", {"pp": 4, "dp": 2, "vpp": 2, "schedule": "interleaved", "gas": 8}),
    ("llama-3-70b", "bf16", {"pp": 2, "dp": 4, "vpp": 4, "schedule": "interleaved", "gas": 8}),  # 82 weights, 11 a stage
    ("llama-3-70b", "bf16", {"pp": 4, "dp": 2, "schedule": "zb-h1", "gas": 8}),
    ("llama-3-8b", "bf16", {"cp": 4, "dp": 2, "mbs": 1}),
    ("llama-3-8b", "bf16", {"offload_optimizer": "cpu", "offload_params": "cpu"}),
    ("qwen3-30b-a3b", "bf16", {"ep": 8, "dp": 8}),
    ("llama-3-8b", "fp8", {}),  # the emitted torchtitan_fp8.py module's config (export_torchtitan.fp8_module)
    ("llama-3-70b", "fp8", {"tp": 8, "dp": 1, "sequence_parallel": True}),
]


def parse(model_name: str, args: list[str], fp8_module: str | None = None) -> dict:
    """The Trainer.Config fields torchtitan's ConfigManager makes of the overrides, or its error;
    with `fp8_module` (the text of export_torchtitan.fp8_module), that module's config, importable
    from a temporary directory as launch.sh's PYTHONPATH makes it, and its block linears' types."""
    from torchtitan.config.manager import ConfigManager

    module, config = CONFIGS[model_name]
    err = io.StringIO()
    with tempfile.TemporaryDirectory() as where:
        if fp8_module is not None:
            Path(where, FP8_MODULE + ".py").write_text(fp8_module)
            sys.path.insert(0, where)
            module, config = FP8_MODULE, FP8_CONFIG
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                cfg = ConfigManager().parse_args(["--module", module, "--config", config, *" ".join(args).split()])
        except SystemExit:
            return {"error": " ".join(err.getvalue().split())[:400]}
        finally:
            if fp8_module is not None:
                sys.path.remove(where)
                sys.modules.pop(FP8_MODULE, None)
    par, train = cfg.parallelism, cfg.training
    model, layer = cfg.model_spec.model, cfg.model_spec.model.layers[0]
    linears = {"lm_head": model.lm_head, "attention.wqkv": layer.attention.qkv_linear.wqkv, "attention.wo": layer.attention.wo}
    if layer.feed_forward is not None:  # a dense block (an MoE block's experts are not linears)
        linears.update({"feed_forward.w1": layer.feed_forward.w1, "feed_forward.w2": layer.feed_forward.w2})
    return {"linears": {name: type(c).__qualname__ + _scaling(c) for name, c in linears.items()},
            "parallelism": {k: getattr(par, k) for k in (
                "data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                "tensor_parallel_degree", "enable_sequence_parallel", "pipeline_parallel_degree",
                "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size", "pipeline_parallel_layers_per_stage",
                "context_parallel_degree", "expert_parallel_degree")},
            "training": {k: getattr(train, k) for k in ("local_batch_size", "global_batch_size", "seq_len",
                                                        "disable_cuda_graphs", "enable_cpu_offload", "dtype",
                                                        "mixed_precision_param")},
            "activation_checkpoint": type(cfg.activation_checkpoint).__qualname__}


def _scaling(config) -> str:
    """' (rowwise)' / ' (tensorwise)' for a Float8Linear config: its input cast's scaling granularity."""
    ao = getattr(config, "_torchao_config", None)
    if ao is None:
        return ""
    granularity = str(ao.cast_config_input.scaling_granularity).lower()
    return " (rowwise)" if "axiswise" in granularity else " (tensorwise)"


def measure() -> list[dict]:
    stub_triton_kernels()
    # torchtitan 0.3.0 components/quantization/float8.py: the converter refuses to build on a GPU
    # without FP8 (SM89); the config is what is parsed here, not a model
    import torchtitan.components.quantization.float8 as float8

    float8.has_cuda_capability = lambda *args: True
    rows = []
    for name, precision, change in CASES:
        row = normalise_row({**BASE, **change})
        training = layout.Training(seq_len=4096, precision=precision, engine="torchtitan")
        args = torchtitan_args(lookup(name), training, row)
        module = fp8_module(lookup(name), training)
        rows.append({"model": name, "precision": precision, "row": row, "args": args, "fp8_module": module,
                     "parsed": parse(name, args, module)})
        print(rows[-1], flush=True)
    return rows


def main(argv=None) -> int:
    return run_cli(argv, __doc__, OUT, "python -m calibrate.engines.torchtitan_cli: "
                   "planner.engines.torchtitan.export's overrides parsed by torchtitan 0.3.0's "
                   "config.manager.ConfigManager (tyro over Trainer.Config)", measure)


if __name__ == "__main__":
    raise SystemExit(main())
