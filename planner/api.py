"""The planning API: `estimate` one layout, `recommend` the fastest that fits, `check` a user's
config, `validate` against published runs. Plain typed functions: the CLI, the Streamlit app and
calibrate/ all call these.

    from planner import api
    e = api.estimate("llama-3-70b", {"gpus": 16}, layout={"tp": 8, "pp": 2, "recompute": "selective"})
    e.memory["gpu_bytes"], e.time["step_s"], e.to_json()
    r = api.recommend(70e9, {"gpus": 16})
    r.layouts[0]["layout"], r.assumptions

Inputs are given by value (planner/inputs.py); every default applied is reported back in the
answer's `defaults`. This module only gathers: estimate and recommend live in planner/planning.py,
check in planner/doctor.py, validate in planner/validate.py and planner/corpus.py, and nothing
in planner/ imports this module.
"""

from __future__ import annotations

import math

from planner.activations import offloads_checkpoints
from planner.calibration import known_profiles, read_profile
from planner.data import parse_json
from planner.engines import ENGINES, NAMES as ENGINE_NAMES
from planner.errors import InputError
from planner.hardware import Cluster, load_gpus, lookup_gpu
from planner.inputs import DEFAULTS, ClusterInput, LayoutInput, ModelInput, TrainingInput, resolve_model, with_gpus
from planner.memory import PHASES
from planner.model import load_catalog
from planner.options import Optimizer, Precision, Schedule
from planner.planning import Estimate, Recommendation, default_engine, default_gbs, estimate, recommend
from planner.results import short
from planner.search import PINNABLE


def check(config, model, cluster=None, training=None, layout=None, *, mbs: int | None = None, deepspeed: bool = True):
    """`planner check`: a user's DeepSpeed config (path or dict, or an Accelerate YAML path) run as
    DeepSpeed would run it, with findings (planner/doctor.py CheckReport)."""
    from planner import doctor  # here, not above: estimate's cold start does not load the checker

    return doctor.check(config, model, cluster, training, layout, mbs, deepspeed)


def check_plan(plan, config: str | None, model: dict, cluster: dict, training: dict, layout: dict,
               deepspeed: bool = True):
    """`planner check` of a directory `--emit` wrote (plan: planner.plan_file.Plan; doctor.check_plan)."""
    from planner import doctor

    return doctor.check_plan(plan, config, model, cluster, training, layout, deepspeed)


def validate(source: str | None = None) -> dict:
    """Predicted vs published runs: the paper figures of data/references/published_runs.json
    (planner/validate.py: 'cases', 'mape', 'by_group', 'mape_by_metric') and the published-run
    corpus of data/references/corpus_runs.json ('corpus': planner/corpus.py). `source`: only the
    rows whose id starts with it (InputError naming --source where none does)."""
    from planner import corpus, corpus_rows
    from planner import validate as V

    if source is not None and not source.strip():
        raise InputError("--source: give an id prefix such as dgxc or mpt")
    compared = V.compare()
    runs = [r for r in corpus_rows.load_rows() if source is None or r["id"].startswith(source)]
    rows = [r for r in compared if source is None or r["id"].startswith(source)]
    if not runs and not rows:  # the sources named are those a --source can select
        known = sorted({corpus_rows.prefix(r) for r in corpus_rows.load_rows()}
                       | {r["id"].split("-")[0] for r in compared})
        raise InputError(f"--source: no published run's id starts with {source!r} (sources: {', '.join(known)})")

    def finite(x: float) -> float | None:  # no figure of that kind among the chosen rows: null, not NaN
        return x if math.isfinite(x) else None

    return {"cases": rows, "mape": finite(V.mape(rows)), "by_group": V.by_group(rows),
            "mape_by_metric": {m: V.mape(rows, m) for m in sorted({r["metric"] for r in rows})},
            "corpus": corpus.validate(runs)}


__all__ = ["estimate", "recommend", "check", "check_plan", "validate", "Estimate", "Recommendation", "ModelInput",
           "ClusterInput", "TrainingInput", "LayoutInput", "DEFAULTS", "with_gpus", "default_engine", "default_gbs",
           "resolve_model", "lookup_gpu", "Cluster", "InputError",
           # the choices a front end offers, the parts of an answer it shows, and its own inputs' readers
           "load_catalog", "load_gpus", "ENGINES", "ENGINE_NAMES", "offloads_checkpoints", "Optimizer", "Precision",
           "Schedule", "PINNABLE", "PHASES", "short", "known_profiles", "read_profile", "parse_json"]


