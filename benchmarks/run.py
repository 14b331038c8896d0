"""Speed benchmarks: `python benchmarks/run.py` prints each figure beside its target and beside the
figure before the planning-API refactor (commit 40e25e8, measured on this 2-core machine).

1. cold start of `planner estimate` (new process each time)
2. cold `planner recommend --params 70e9 --gpus 16` (target < 0.3 s)
3. the full space of a 1T model on 4096 GPUs (target < 2 s)
4. memory + step time of 1 M valid layouts (target >= 1 M/s, aiming at 5 M/s)
5. `recommend` at the edges of the input bounds (each must answer or refuse within 2 s)
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEFORE = {  # commit 40e25e8 (README "Speed"): seconds
    "estimate": 0.28, "recommend": 0.40, "space": 0.10, "million": 1.2,
}


def wall(cmd: list[str], repeats: int = 5) -> float:
    """Median wall seconds of a fresh interpreter running `cmd`."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def line(name: str, seconds: float, target: str, before_key: str | None = None, extra: str = "") -> None:
    before = f"   before {BEFORE[before_key]:.2f} s (x{seconds / BEFORE[before_key]:.2f})" if before_key else ""
    print(f"{name:34s} {seconds:7.3f} s   target {target}{before}{extra}", flush=True)


def main() -> None:
    py = sys.executable
    # an installed package has its bytecode compiled; this machine sets PYTHONDONTWRITEBYTECODE,
    # which would make every cold start recompile planner/ from source (~30 ms)
    import compileall
    compileall.compile_dir(str(ROOT / "planner"), quiet=1)
    base = wall([py, "-c", "pass"])
    numpy = wall([py, "-c", "import numpy"])
    print(f"python itself {base:.3f} s, python + numpy {numpy:.3f} s")
    est = wall([py, "-m", "planner", "estimate", "--model", "llama-2-7b", "--gpus", "8", "--zero", "3"])
    line("estimate cold start", est, "< 0.3 s", "estimate")
    rec = wall([py, "-m", "planner", "recommend", "--params", "70e9", "--gpus", "16"])
    line("recommend 70e9 on 16 GPUs, cold", rec, "< 0.3 s", "recommend")

    sys.path.insert(0, str(ROOT))
    import numpy as np

    from planner import api, hardware, layout, search
    from planner.errors import InputError
    from planner.shapes import derive_shape

    spec = derive_shape(1e12)
    cluster = hardware.Cluster(hardware.lookup_gpu("h100-sxm"), 4096, 8)
    # gbs 2^16 sequences: every power-of-two dp and mbs divides it, so most of the space is valid
    training = layout.Training(seq_len=4096, gbs=2**16, engine="megatron-deepspeed")
    search.search(spec, cluster, training)  # warm numpy
    start = time.perf_counter()
    res = search.search(spec, cluster, training, max_mbs=16)
    elapsed = time.perf_counter() - start
    line("1T on 4096 GPUs, whole space", elapsed, "< 2 s", "space",
         f"   ({res.candidates:,} candidates, {res.valid.size:,} valid, {len(res.order):,} fit)")
    # the rules leave few valid layouts here; time memory + step time on 1e6 of them (tiled)
    runs = []
    for _ in range(5):
        big = res.valid.take(np.arange(10**6) % res.valid.size)
        start = time.perf_counter()
        search.evaluate(spec, cluster, training, big)
        runs.append(time.perf_counter() - start)
    full = statistics.median(runs)
    line("memory + step time of 1 M layouts", full, ">= 1 M/s (5 M/s)", "million", f"   {1e6 / full:,.0f} per s")

    worst = 0.0
    edges = [dict(model=1e14, cluster={"gpus": 2**20}), dict(model=1e6, cluster={"gpus": 720720}),
             dict(model="llama-3.1-405b", cluster={"gpus": 2**20, "gpus_per_node": 1024}),
             dict(model="mixtral-8x7b", cluster={"gpus": 65536}, training={"seq_len": 2**26}),
             dict(model="llama-2-7b", cluster={"gpus": 1}, training={"gbs": 2**30}),
             dict(model=70e9, cluster={"gpus": 8}, max_mbs=4096),
             # found by benchmarks/fuzz.py: highly divisible GPU counts and batches
             dict(model="mixtral-8x7b", cluster={"gpus": 720720, "gpus_per_node": 1008}, training={"gbs": 720720}),
             dict(model="llama-3.1-405b", cluster={"gpus": 5040, "gpus_per_node": 720},
                  training={"seq_len": 2**26, "gbs": 720720}),
             dict(model={"layers": 15120, "hidden": 55440, "heads": 55440, "kv_heads": 55440, "vocab": 1000},
                  cluster={"gpus": 720720, "gpus_per_node": 1008},
                  training={"engine": "megatron-deepspeed", "gbs": 735134400, "seq_len": 65520}, max_mbs=4096),
             dict(model={"layers": 5040, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336, "vocab": 16777216,
                         "experts": 8, "experts_per_token": 1},
                  cluster={"gpus": 5040}, training={"gbs": 735134400})]
    for case in edges:
        start = time.perf_counter()
        try:
            r = api.recommend(case["model"], case["cluster"], case.get("training"), max_mbs=case.get("max_mbs"))
            outcome = f"{len(r.layouts)} layouts, {r.candidates_evaluated:,} candidates"
        except InputError as exc:
            outcome = f"refused: {exc}"
        took = time.perf_counter() - start
        worst = max(worst, took)
        print(f"  recommend {str(case['model'])[:14]:>14} {case['cluster']}: {took:.2f} s, {outcome[:90]}")
    line("recommend at the input bounds, worst", worst, "< 2 s")


if __name__ == "__main__":
    main()
