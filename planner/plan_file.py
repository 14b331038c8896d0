"""plan.json: everything the planner assumed for the files `--emit` wrote, read back by `planner check`.

`--emit DIR` writes the launch configs (planner/export.py) and, beside them, DIR/plan.json: the
model's full shape, the cluster, the training settings and the layout, recompute included. A
ds_config.json cannot say the model, the sequence length or the recompute (that lives in the
training script or launch.sh), so `planner check DIR` reads them from the plan; what the DeepSpeed
config states (batch, ZeRO stage and buckets, offload) still comes from the config, and flags given
on the check command line win over both. The result is the same verdict, memory and tokens/s as
the estimate or recommend that wrote the directory.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from planner.errors import InputError
from planner.hardware import Cluster, lookup_gpu
from planner.inputs import NVME_FIELDS, ZERO_FIELDS, ClusterInput, LayoutInput, TrainingInput, coerce
from planner.layout import Training, ZeroConfig
from planner.model import ModelSpec

SCHEMA = "planner-plan/1"
PLAN = "plan.json"
FLAG = "--config"
_GPU_FIGURES = ("gpu_memory_gib", "peak_tflops", "hbm_gb_per_s", "intra_node_gb_per_s", "inter_node_gb_per_s",
                "pcie_gb_per_s", "host_ram_gib", "nvme_gb_per_s")
_ROW_ONLY = ("gas", "gbs")  # in the layout for people to read; LayoutInput derives them from training.gbs


@dataclass(frozen=True)
class Plan:
    """One plan.json, as the planning API's inputs."""

    path: Path
    """Where it was read from."""
    model: ModelSpec
    """The model exactly as planned (every ModelSpec field is in the file)."""
    cluster: dict
    """ClusterInput fields."""
    training: dict
    """TrainingInput fields."""
    layout: dict
    """LayoutInput fields, recompute included."""


# ---------------------------------------------------------------------------------------------
# writing


def render(model: ModelSpec, cluster: Cluster, training: Training, row: dict, recompute_where: str | None) -> str:
    """plan.json's text for the files export.emit writes for `row`."""
    from planner import __version__

    layout = {k: row[k] for k in (*(f.name for f in fields(LayoutInput)), *_ROW_ONLY) if k in row}
    doc = {"schema": SCHEMA, "planner_version": __version__, "model": asdict(model),
           "cluster": cluster_fields(cluster), "training": training_fields(training), "layout": layout,
           "recompute_where": recompute_where}
    return json.dumps(doc, indent=1) + "\n"


def cluster_fields(c: Cluster) -> dict:
    """ClusterInput fields that rebuild `c`: the catalog GPU's name and the figures that differ from it."""
    base = lookup_gpu(c.gpu.name)
    g = c.gpu
    out = {"gpu": g.name, "gpus": c.num_gpus, "gpus_per_node": c.gpus_per_node,
           "gpu_memory_gib": g.memory_bytes / 2**30, "pod_gpus": c.pod_gpus, "oversubscription": c.oversubscription,
           "calibration": None if c.calibration is None else c.calibration.path}
    for key, attr, unit in (("hbm_gb_per_s", "hbm_bytes_per_s", 1e9),
                            ("intra_node_gb_per_s", "intra_node_bytes_per_s", 1e9),
                            ("inter_node_gb_per_s", "inter_node_bytes_per_s", 1e9),
                            ("pcie_gb_per_s", "pcie_bytes_per_s", 1e9),
                            ("host_ram_gib", "host_ram_bytes_per_node", 2**30),
                            ("nvme_gb_per_s", "nvme_bytes_per_s_per_node", 1e9)):
        if getattr(g, attr) != getattr(base, attr):
            out[key] = getattr(g, attr) / unit
    changed = [v for k, v in g.peak_flops_per_s.items() if v != base.peak_flops_per_s.get(k)]
    if changed:  # --peak-tflops replaces the training precision's GEMM dtype only (ClusterInput.resolve)
        out["peak_tflops"] = changed[0] / 1e12
    return out


def training_fields(t: Training) -> dict:
    """TrainingInput fields that rebuild `t`. The ones estimate would otherwise choose itself
    (tp_comm_overlap, the pipeline split) are written always; the rest where they differ from the
    defaults. modules null: the engine's own for this model (modules.block_modules), as planned."""
    from planner.modules import word_of

    out = {"seq_len": t.seq_len, "gbs": t.gbs, "precision": str(t.precision), "optimizer": str(t.optimizer),
           "engine": t.engine.name, "modules": None if t.modules is None else word_of(t.modules),
           "flash_attention": t.flash_attention,
           "tp_comm_overlap": t.tp_comm_overlap, "pipeline_edge_layers": t.pipeline_edge_layers}
    base = Training(engine=t.engine.name)
    given = {f.name for f in fields(TrainingInput)}
    for f in fields(Training):  # every other Training setting the API takes, where it is not the default
        if f.name in given and f.name not in out and getattr(t, f.name) != getattr(base, f.name):
            out[f.name] = getattr(t, f.name)
    zero = ZeroConfig()
    for f in fields(ZeroConfig):
        if getattr(t.zero_config, f.name) != getattr(zero, f.name):
            out[f.name] = getattr(t.zero_config, f.name)
    return out


# ---------------------------------------------------------------------------------------------
# reading


def locate(config: str) -> tuple[Plan | None, str | None]:
    """(plan, DeepSpeed or Accelerate config) for `--config PATH`: a directory `--emit` wrote (its
    plan.json, and its ds_config.json where there is one), any other file it wrote there (launch.sh,
    megatron_args.txt) standing for that directory, or a config file with the plan beside it."""
    p = Path(config).expanduser()
    other = p.is_file() and p.suffix.lower() not in (".json", ".yaml", ".yml") and (p.parent / PLAN).is_file()
    if other:  # another file --emit wrote (launch.sh, megatron_args.txt): the directory it is in
        p = p.parent
    if p.is_dir() or p.name == PLAN:  # the directory, or its plan.json named itself
        plan = read(p) if p.name == PLAN else read(p / PLAN) if (p / PLAN).is_file() else None
        p = p.parent if p.name == PLAN else p
        ds = p / "ds_config.json"
        if plan is None and not ds.is_file():
            raise InputError(f"{FLAG}: directory {str(p)!r} holds no {PLAN} or ds_config.json; give a DeepSpeed "
                             "config (.json), an Accelerate config (.yaml) or a directory written by --emit")
        return plan, str(ds) if ds.is_file() else None
    beside = p.parent / PLAN
    return (read(beside) if p.is_file() and beside.is_file() else None), str(p)


def read(path) -> Plan:
    """A plan.json, checked: another schema, malformed JSON or an unknown field is one InputError."""
    from planner.data import read_json

    path = Path(path)
    doc = read_json(path, FLAG)
    where = f"{FLAG}: {str(path)!r}"
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise InputError(f"{where} is not a planner plan (schema {got!r}; expected {SCHEMA!r}, as --emit writes)")
    sections = {}
    for key in ("model", "cluster", "training", "layout"):
        if not isinstance(doc.get(key), dict):
            raise InputError(f"{where}: {key} must be an object")
        sections[key] = dict(doc[key])
    shape = {k: v for k, v in sections["model"].items() if k != "params"}
    known = {f.name for f in fields(ModelSpec)}
    unknown = sorted(set(shape) - known)
    if unknown:
        raise InputError(f"{where}: model has unknown field {unknown[0]!r}; known: {', '.join(sorted(known))}")
    try:
        model = ModelSpec(**shape)
    except TypeError as exc:  # a required field missing
        raise InputError(f"{where}: model: {exc}") from None
    layout = {k: v for k, v in sections["layout"].items() if k not in _ROW_ONLY}
    # the records check each field as the API does; errors name the section
    coerce(sections["cluster"], ClusterInput, f"{where}: cluster")
    coerce(sections["training"], TrainingInput, f"{where}: training")
    coerce(layout, LayoutInput, f"{where}: layout")
    return Plan(path, model, sections["cluster"], sections["training"], layout)


# ---------------------------------------------------------------------------------------------
# checking


CONFIG_OWNED = ("gbs", "fp32_grad_accum", "overlap_comm", "contiguous_gradients", *ZERO_FIELDS, *NVME_FIELDS)
"""Training fields a DeepSpeed config states (planner/doctor.py inputs reads them from it): the
config's values win over the plan's, so an edited config is checked as edited."""


def inputs(plan: Plan, model: dict, cluster: dict, training: dict, layout: dict) -> tuple:
    """(model, cluster, training, layout) of the plan with the check command line's flags over it:
    --model/--params/--config replace the planned model, shape flags change it, --gpu drops the
    planned GPU's figures."""
    from planner.model import with_overrides

    spec = plan.model
    if any(model.get(k) is not None for k in ("name", "params", "config")):
        from planner.inputs import ModelInput

        spec = ModelInput(**model).resolve()
    elif model:
        spec = with_overrides(plan.model, **model)
    planned = dict(plan.cluster)
    if cluster.get("gpu") is not None:
        planned = {k: v for k, v in planned.items() if k not in _GPU_FIGURES}
    return spec, {**planned, **cluster}, {**plan.training, **training}, {**plan.layout, **layout}
