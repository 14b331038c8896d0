"""One calibration case, how it runs, and the record it leaves.

A Case names a real run (a worker module under a launcher, or an in-process benchmark), the exact
config, the planner's prediction for that config (through the planning API or planner's own
functions; never the CLI) and how the ranks' raw results reduce to measured quantities. Quantities
carry their unit in the name (`*_bytes`, `*_s`, `*_flops_per_s`, `*_bytes_per_s`), and a record's
prediction and measurement use the same names, so the fit and the report pair them by name.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field
from typing import Callable

from calibrate.harness.launch import Outcome, launch

KINDS = ("memory", "activations", "step_time", "gemm", "collective", "copy", "cpu_adam", "eager_ops", "dtensor_step",
         "rank_speed", "eager_layer", "attention")


@dataclass
class Case:
    """One measurement to make."""

    name: str
    """Unique within a suite, e.g. 'deepspeed/zero2/gas4'."""
    kind: str
    """One of KINDS."""
    config: dict
    """The exact configuration, JSON-serialisable (model shape, layout, engine config)."""
    predict: Callable[[], dict]
    """The planner's prediction: quantity name -> value."""
    reduce: Callable[[list], dict]
    """Ranks' (or the in-process run's) raw results -> measured quantity name -> value."""
    module: str | None = None
    """Worker module run under the launcher; None runs `run_inline` in this process."""
    args: list = field(default_factory=list)
    """Worker command-line arguments."""
    nproc: int = 2
    """Processes per node."""
    launcher: str = "torchrun"
    """torchrun | deepspeed."""
    timeout_s: float = 300.0
    """Wall-clock limit of the whole run."""
    env: dict = field(default_factory=dict)
    """Extra environment for the ranks."""
    run_inline: Callable[[], dict] | None = None
    """In-process measurement (micro-benchmarks that need no process group)."""

    def __post_init__(self):
        assert self.kind in KINDS, self.kind
        assert (self.module is None) != (self.run_inline is None), self.name


def environment() -> dict:
    """Where a measurement was made: device, count, library versions."""
    import torch

    env = {"host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "device": "cpu", "device_count": 0, "nccl": None}
    try:
        import deepspeed

        env["deepspeed"] = deepspeed.__version__
    except Exception:  # deepspeed is optional for FSDP/benchmark-only profiles
        env["deepspeed"] = None
    if torch.cuda.is_available():
        env.update(device=torch.cuda.get_device_name(0), device_count=torch.cuda.device_count(),
                   nccl=".".join(map(str, torch.cuda.nccl.version())))
    else:
        env["cpu"] = platform.processor() or platform.machine()
        env["device_count"] = os.cpu_count()
    return env


def run_case(case: Case) -> dict:
    """Run one case; a failed run is a record with its status, not an exception."""
    start = time.perf_counter()
    if case.module is not None:
        outcome = launch(case.module, case.args, case.nproc, case.timeout_s, case.launcher, env=case.env)
    else:
        try:
            outcome = Outcome("ok", 0, 0.0, [case.run_inline()])
        except Exception as exc:  # a benchmark that fails is a recorded result
            status = "oom" if "out of memory" in str(exc) else "crash"
            outcome = Outcome(status, None, 0.0, [], error=f"{type(exc).__name__}: {exc}"[:500])
        outcome.wall_s = time.perf_counter() - start
    measurement = {}
    if outcome.status == "ok":
        try:
            measurement = case.reduce(outcome.ranks)
        except Exception as exc:  # ranks that wrote incomplete results
            outcome.status, outcome.error = "crash", f"reduce failed: {type(exc).__name__}: {exc}"[:500]
    return {"name": case.name, "kind": case.kind, "config": case.config, "prediction": case.predict(),
            "measurement": measurement, "outcome": outcome.to_json(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def run_together(cases: list) -> list:
    """Cases of one worker module that takes '{"runs": [config, ...]}' (each case's args its one JSON
    config, itself a {"runs": [...]} or not), run in one launch instead of one each: the ranks start,
    import and join the process group once. Each rank's result is {"runs": [one result a config]};
    a case's reduce gets each rank's results of its own configs, shaped as its own launch would have
    returned them. The records are run_case's, the launch's outcome shared by all."""
    first = cases[0]
    assert all((c.module, c.launcher, c.nproc, c.env) == (first.module, first.launcher, first.nproc, first.env)
               and c.module is not None and len(c.args) == 1 for c in cases), [c.name for c in cases]
    import json

    configs = [json.loads(c.args[0]) for c in cases]
    spans, runs = [], []
    for cfg in configs:
        own = cfg["runs"] if "runs" in cfg else [cfg]
        spans.append((len(runs), len(runs) + len(own), "runs" in cfg))
        runs += own
    outcome = launch(first.module, [json.dumps({"runs": runs})], first.nproc, sum(c.timeout_s for c in cases),
                     first.launcher, env=first.env)
    records = []
    for case, (start, end, nested) in zip(cases, spans):
        out = Outcome(outcome.status, outcome.returncode, outcome.wall_s, [], outcome.log_tail, outcome.error)
        measurement = {}
        if out.status == "ok":
            try:
                ranks = [{"runs": r["runs"][start:end]} if nested else r["runs"][start] for r in outcome.ranks]
                measurement = case.reduce(ranks)
            except Exception as exc:  # ranks that wrote incomplete results
                out.status, out.error = "crash", f"reduce failed: {type(exc).__name__}: {exc}"[:500]
        records.append({"name": case.name, "kind": case.kind, "config": case.config, "prediction": case.predict(),
                        "measurement": measurement, "outcome": out.to_json(),
                        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return records


def expand_rows(record: dict) -> list:
    """A run that measured many points (a size sweep: measurement {"rows": [...]}) becomes one record
    per point, so that every record pairs one measured quantity set with its config."""
    rows = record["measurement"].get("rows")
    if not rows:
        return [record]
    return [{**record, "name": f"{record['name']}/{row.get('op', '')}/{row.get('bytes', i)}",
             "config": {**record["config"], "point": i}, "measurement": row} for i, row in enumerate(rows)]


GPU_MEMORY = ("allocated_peak_bytes", "reserved_peak_bytes", "device_used_bytes")
"""What a GPU rank adds to its result (calibrate/harness/worker_io.py cuda_memory)."""


def ranks_for(profile_kind: str) -> int:
    """Ranks per run: 2 gloo processes on a CPU; on GPUs one per device, at most 2 (the cases are
    sized for data parallelism of 2; a one-GPU machine runs them with 1)."""
    if profile_kind == "cpu":
        return 2
    import torch

    return max(1, min(2, torch.cuda.device_count()))


def gpu_memory(rank_result: dict, process_groups: int) -> dict:
    """A GPU rank's allocator peaks and device use, with the communicators it belongs to (what
    calibrate/harness/fit.py fits the allocator reserve, CUDA context and NCCL buffers to)."""
    out = {k: rank_result[k] for k in GPU_MEMORY if k in rank_result}
    return {**out, "process_groups": process_groups} if out else {}
