"""Speed benchmarks: `python benchmarks/run.py` prints each figure beside its target.

1. cold start of `planner estimate` (new process each time; target < 0.3 s on 2 cores)
2. cold `planner recommend --params 70e9 --gpus 16` (target < 0.5 s)
3. the full space of a 1T model on 4096 GPUs (target < 2 s, >= 1e6 candidates/s)
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def wall(cmd: list[str], repeats: int = 5) -> float:
    """Median wall seconds of a fresh interpreter running `cmd`."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    py = sys.executable
    # an installed package has its bytecode compiled; this machine sets PYTHONDONTWRITEBYTECODE,
    # which would make every cold start recompile planner/ from source (~30 ms)
    import compileall
    compileall.compile_dir(str(ROOT / "planner"), quiet=1)
    base = wall([py, "-c", "pass"])
    est = wall([py, "-m", "planner", "estimate", "--model", "llama-2-7b", "--gpus", "8", "--zero", "3"])
    print(f"estimate cold start     {est:.3f} s (python itself {base:.3f} s)   target < 0.3 s   ratio {est / 0.3:.2f}")
    rec = wall([py, "-m", "planner", "recommend", "--params", "70e9", "--gpus", "16"])
    print(f"recommend 70e9 on 16    {rec:.3f} s                          target < 0.5 s   ratio {rec / 0.5:.2f}")

    sys.path.insert(0, str(ROOT))
    from planner import hardware, layout, model, report, search

    spec = model.derive_shape(1e12)
    cluster = hardware.Cluster(hardware.lookup_gpu("h100-sxm"), 4096, 8)
    # gbs 2^16 sequences: every power-of-two dp and mbs divides it, so most of the space is valid
    training = layout.Training(seq_len=4096, gbs=2**16, engine="megatron-deepspeed")
    search.search(spec, cluster, training)  # warm numpy
    start = time.perf_counter()
    res = search.search(spec, cluster, training, max_mbs=16)
    elapsed = time.perf_counter() - start
    rate = res["candidates"] / elapsed
    print(f"1T on 4096 GPUs         {elapsed:.3f} s for {res['candidates']:,} candidates "
          f"({rate:,.0f}/s; {res['valid'].size:,} valid, {len(res['order']):,} fit)   target < 2 s, >= 1e6/s   "
          f"ratio {elapsed / 2:.2f}")
    print("  rejected: " + ", ".join(f"{k} {v:,}" for k, v in res["rejected"].items()))
    # the rules leave few valid layouts here; time memory + step time on 1e6 of them (tiled)
    import numpy as np
    big = res["valid"].take(np.arange(10**6) % res["valid"].size)
    start = time.perf_counter()
    report.evaluate(spec, cluster, training, big)
    full = time.perf_counter() - start
    print(f"  memory + step time of 1,000,000 valid layouts: {full:.3f} s ({1e6 / full:,.0f} per s)   "
          f"target >= 1e6/s   ratio {1e6 / full / 1e6:.2f}")


if __name__ == "__main__":
    main()
