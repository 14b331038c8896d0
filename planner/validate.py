"""`planner validate`: predicted vs published throughput and memory, with the mean abs. % error.

Cases come from data/references/published_runs.json (each record names its source). Nothing
is tuned per case: every prediction uses the same catalog coefficients.
"""

from __future__ import annotations

import numpy as np

from planner import activations, engines, hardware, layout, search
from planner.model import ModelSpec
from planner.stage import Stage

# Where a paper leaves a layout field out we assume the Megatron-LM default and say so.
ASSUMED_MBS = 1  # Narayanan 2021 Table 1 omits the micro-batch size; Megatron-LM's default is 1


def load_runs() -> list[dict]:
    from planner.data import catalog

    return catalog("references/published_runs.json")


def run_model(run: dict) -> ModelSpec:
    """Megatron GPT shape of a published run (ffn 4h, LayerNorm, biases, learned positions, tied)."""
    return ModelSpec(layers=run["layers"], hidden=run["hidden"], heads=run["heads"], kv_heads=run["kv_heads"],
                     ffn=run["ffn"], vocab=run["vocab"], ffn_kind="gelu", norm="layernorm", bias=True,
                     positions="learned", max_positions=run["seq_len"], tied_embeddings=True, dropout=True,
                     architecture="gpt2", name=run["id"], source=run["source"])


def run_setup(run: dict):
    """(model, cluster, training, layouts) of a published run with a complete layout, else None."""
    if not run.get("layers") or run.get("tp") is None or run.get("gbs") is None:
        return None
    model = run_model(run)
    cluster = hardware.Cluster(hardware.lookup_gpu("a100-80gb"), run["num_gpus"], run["gpus_per_node"])
    zero = run["zero_stage"] or 0
    # a run measured on an engine of its time names it (engines.ARCHIVED)
    name = run.get("engine") or ("megatron-deepspeed" if zero >= 2 else "megatron")
    engine = engines.ARCHIVED.get(name) or engines.lookup(name)
    # Megatron-LM of 2021 all-reduced gradients after the backward pass (megatron/model/distributed.py
    # DistributedDataParallel.allreduce_gradients); --overlap-grad-reduce came with Megatron-core
    overlap = False if engine.grad_buckets is engines.GradBuckets.MEGATRON_DDP else None
    # nor did its pipeline sends overlap compute (p2p_communication.py of 2021-22 waited on
    # batch_isend_irecv at once; overlap_p2p_comm came with Megatron-core in 2023)
    training = layout.Training(seq_len=run["seq_len"], gbs=run["gbs"], precision="fp16",
                               engine=engine,
                               flash_attention=bool(run["flash_attention"]), overlap_p2p=False,
                               zero_config=layout.ZeroConfig(overlap_comm=overlap))
    mbs = run["mbs"] or ASSUMED_MBS
    vpp = run["vpp"] or 1
    lay = layout.single(tp=run["tp"], pp=run["pp"], dp=run["dp"], cp=run["cp"] or 1, vpp=vpp, zero=zero, mbs=mbs,
                        gas=run["gbs"] // (mbs * run["dp"]), recompute=run["recompute"] or "none",
                        sequence_parallel=bool(run["sequence_parallel"]))
    return model, cluster, training, lay


def compare() -> list[dict]:
    """One row per published figure we can predict: id, metric, published, predicted, error."""
    rows = []
    for run in load_runs():
        setup = run_setup(run)
        if setup is None:
            continue
        model, cluster, training, lay = setup
        measured = run["measured"]
        ev = search.evaluate(model, cluster, training, lay)
        th, step_s = ev.time["throughput"], float(ev.time["step_s"][0])
        # Narayanan 2021 TFLOP/s count the recompute pass (eq. 3): compare hardware FLOPs
        if "tflops_per_gpu" in measured:
            rows.append(_row(run, training, "TFLOP/s per GPU (hardware)", measured["tflops_per_gpu"],
                             float(th["hardware_tflops_per_gpu"][0])))
        if "iter_time_s" in measured:
            rows.append(_row(run, training, "iteration time s", measured["iter_time_s"], step_s))
        if "memory_gib_activations" in measured:
            acts = activations.stage_activation_bytes(Stage(model, training, lay, np.zeros(1, dtype=np.int64)))
            rows.append(_row(run, training, "activation GiB (first stage)", measured["memory_gib_activations"],
                             float(acts[0]) / 2**30))
    return rows


def _row(run, training, metric, published, predicted) -> dict:
    return {"id": run["id"], "metric": metric, "published": published, "predicted": predicted,
            "error": predicted / published - 1.0, "source": run["source"].split(",")[0],
            "engine": training.engine.name}


# the sign of an error that flatters the plan: more throughput, less time or memory than measured
OPTIMISTIC_SIGN = {"TFLOP/s per GPU (hardware)": 1.0, "iteration time s": -1.0, "activation GiB (first stage)": -1.0}


def by_group(rows: list[dict]) -> list[dict]:
    """Per (source, engine, metric): cases, mean absolute error, mean signed error and which way it leans
    (optimistic: the plan promises more speed or less memory than was measured)."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["source"], r["engine"], r["metric"]), []).append(r["error"])
    out = []
    for (source, engine, metric), errors in groups.items():
        signed = float(np.mean(errors))
        lean = signed * OPTIMISTIC_SIGN[metric]
        out.append({"source": source, "engine": engine, "metric": metric, "cases": len(errors), "mape": float(np.mean(np.abs(errors))),
                    "mean_error": signed, "leaning": "optimistic" if lean > 0 else "pessimistic" if lean < 0 else "none"})
    return out


def mape(rows: list[dict], metric_prefix: str = "") -> float:
    errs = [abs(r["error"]) for r in rows if r["metric"].startswith(metric_prefix)]
    return float(np.mean(errs)) if errs else float("nan")
