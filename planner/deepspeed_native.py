"""DeepSpeed's own verdict on a config, where DeepSpeed is installed (`planner check`).

DeepSpeed takes seconds to import, and the planner never imports it: a child process builds
deepspeed.runtime.config.DeepSpeedConfig (the class deepspeed.initialize builds, with its pydantic
models and _do_error_check / _batch_assertion) from the config with the values the planner
resolved, at the run's data-parallel size, and reports what it raises.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys

# the child: DeepSpeedConfig reads the world size from torch.distributed, which is not initialized
# here; it is told the run's data-parallel size instead (runtime/config.py DeepSpeedConfig.__init__)
_CHILD = """
import json, sys
import deepspeed
import deepspeed.runtime.config as C
dp = int(sys.argv[2])
C.dist.get_rank = lambda *a, **k: 0
C.dist.get_world_size = lambda *a, **k: dp
try:
    C.DeepSpeedConfig(json.loads(sys.argv[1]))
    print("ACCEPTED", deepspeed.__version__)
except Exception as exc:
    text = [line.strip() for line in str(exc).splitlines() if line.strip() and "errors.pydantic.dev" not in line]
    print("REFUSED", deepspeed.__version__, type(exc).__name__ + ": " + " ".join(text or [""])[:400])
"""


def installed() -> bool:
    return importlib.util.find_spec("deepspeed") is not None


def resolved(ds: dict, training: dict, layout: dict, bucket_keys: dict) -> dict:
    """`ds` with the "auto" values the planner resolved written in: batch keys, buckets and precision,
    as Hugging Face's Trainer fills them before DeepSpeed sees the config (transformers
    integrations/deepspeed.py HfTrainerDeepSpeedConfig.fill_match: only "auto" values); the user's own
    values stay, so DeepSpeed judges the batch the user wrote."""
    out = copy.deepcopy(ds)
    dp = layout["dp"]
    batch = {"train_batch_size": training["gbs"], "train_micro_batch_size_per_gpu": layout["mbs"],
             "gradient_accumulation_steps": training["gbs"] // (layout["mbs"] * dp)}
    for key, value in batch.items():
        if out.get(key) == "auto":
            out[key] = value
    zero = out.get("zero_optimization")
    if isinstance(zero, dict):
        for field, keys in bucket_keys.items():
            for key in keys:
                if zero.get(key) == "auto" and field in training:
                    zero[key] = training[field]
    for key in ("bf16", "fp16"):
        if isinstance(out.get(key), dict) and out[key].get("enabled") == "auto":
            out[key]["enabled"] = training["precision"] == key
    if out.get("gradient_clipping") == "auto":
        out["gradient_clipping"] = 1.0  # Trainer's max_grad_norm default
    return out


def verdict(config: dict, data_parallel: int, timeout_s: float = 180.0) -> tuple[str, str]:
    """('accepted' | 'refused' | 'unavailable', detail) from DeepSpeed's own DeepSpeedConfig."""
    if not installed():
        return "unavailable", "DeepSpeed is not installed here"
    try:
        run = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(config), str(data_parallel)],
                             capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "unavailable", f"DeepSpeed did not answer within {timeout_s:.0f} s"
    lines = [line for line in run.stdout.splitlines() if line.startswith(("ACCEPTED", "REFUSED"))]
    if not lines:
        tail = (run.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return "unavailable", f"DeepSpeed could not be run ({tail})"
    word, version, *rest = lines[-1].split(" ", 2)
    return word.lower(), f"DeepSpeed {version}" + (f": {rest[0]}" if rest else "")
