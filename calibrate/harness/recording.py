"""What the standalone recorders share: their command line and the reference file they write
(data/references/*.json, `python -m calibrate.<room>.<script> [--out PATH]`), and the CPU stand-ins
that let torchtitan's own modules run where triton and compiled FlexAttention cannot.

record.py is the harness's other record: a Case of `python -m calibrate run` and the profile row it
leaves; a recorder here measures once and writes a whole reference file.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path


def write_recording(out: Path, source: str, rows: list, package: str | tuple = "torchtitan") -> None:
    """The recording with the installed torch and `package` (the engine measured; a tuple: each of
    them) versions, written atomically."""
    from importlib.metadata import version

    import torch

    packages = (package,) if isinstance(package, str) else package
    doc = {"_source": source, "environment": {"torch": torch.__version__, **{p: version(p) for p in packages},
                                              "device": "cpu"}, "rows": rows}
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(out)


def run_cli(argv, doc: str, default_out: Path, source: str, measure_rows, package: str | tuple = "torchtitan",
            names=None) -> int:
    """`python -m calibrate.<room>.<script> [--out PATH]`: measure and write the recording. With `names`
    (the rows the recorder measures, in order) it also takes `--only NAME,...`: those rows alone
    (measure_rows(only), a list of names or None for all), written to an --out that must be given, so
    that a partial recording never replaces the committed reference (a test re-records a few rows to
    compare them with it)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--out", type=Path, default=None)
    if names is not None:
        p.add_argument("--only", type=lambda text: text.split(","), default=None,
                       help="comma-separated row names to record (default: every row)")
    args = p.parse_args(argv)
    only = getattr(args, "only", None)
    if only is not None:
        unknown = [n for n in only if n not in names]
        if unknown or not only:
            p.error(f"--only: no row named {', '.join(unknown) or repr('')}")
        if args.out is None:
            p.error("--only records part of the reference: give --out")
    rows = measure_rows(only) if names is not None else measure_rows()
    write_recording(args.out or default_out, source, rows, package)
    return 0


def worker_or_record(argv, worker, *record_args, **record_kwargs) -> int:
    """A recorder whose rows its own ranks measure: `--worker CONFIG` runs `worker` on this rank
    (calibrate/engines/deepspeed_worker.py run_and_leave: the JSON config, every rank waited for);
    otherwise run_cli(argv, *record_args, **record_kwargs), which launches them."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        from calibrate.engines.deepspeed_worker import run_and_leave

        sys.argv = [sys.argv[0], *argv[1:]]
        run_and_leave(worker)
        return 0
    return run_cli(argv, *record_args, **record_kwargs)


def count_or_record(argv, count, doc: str, default_out: Path, source: str, measure_rows, package: str) -> int:
    """A recorder whose rows are counted in a child of itself: `--config NAME,...` counts them in this
    process (the child: calibrate/harness/worker_io.py print_counts, which exits); otherwise run_cli."""
    if argv[:1] == ["--config"]:
        from calibrate.harness.worker_io import print_counts

        print_counts(argv[1], count)
    return run_cli(argv, doc, default_out, source, measure_rows, package)


def stub_triton_kernels() -> None:
    """torchtitan.distributed.minimal_async_ep imports triton at import time (its MoE all-to-all)."""
    stub = types.ModuleType("torchtitan.distributed.minimal_async_ep")

    def unavailable(*args, **kwargs):
        raise RuntimeError("MoE async dispatch is not available on the CPU")

    stub.combine_op = stub.dispatch_op = stub.init_buffer = unavailable
    stub.MinimalAsyncEPDispatchMetadata = type("MinimalAsyncEPDispatchMetadata", (), {})
    stub.__file__, stub.__path__ = __file__, []
    sys.modules.setdefault("torchtitan.distributed.minimal_async_ep", stub)


def eager_flex_attention() -> None:
    """torchtitan's FlexAttention run eagerly (it compiles it; both return out, lse and max_scores),
    with torch's refusal of CPU inputs that need grad lifted."""
    import torch.nn.attention.flex_attention as fa
    from torchtitan.models.common.attention import FlexAttention

    # the sac/moe/mla recorders run forward only; torchtitan_fsdp's backward takes the eager math path
    fa._validate_device = lambda *args, **kwargs: None
    FlexAttention._compiled_flex_attn = staticmethod(
        lambda *args, kernel_options=None, **kwargs: fa.flex_attention(*args, **kwargs))
