"""Fit the planner's named coefficients to a profile's measured runs, and say what it bought.

Each FitGroup pairs the records of one kind with the planner formula that predicts them (the
planner's own function, called with trial coefficients: no second copy of a formula) and the
coefficients it may move, each inside bounds. scipy.optimize.least_squares (trust-region
reflective, bounded) minimizes the relative errors log(predicted / measured). The error each
quantity keeps is measured on held-out runs: k-fold, fit on k-1 folds, predict the k-th (the runs of
one case, measured again in another session, share a fold).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from planner.calibration import coefficient_values
from planner.collectives import nccl_time_s, p2p_message_s
from calibrate.benches.bench import FP8
from planner.compute import attention_matmuls_s, fp8_gemm_coefficients, gemm_s
from planner.memory import reserved_bytes

BOUNDS = {
    ("time", "gemm_efficiency_max"): (0.01, 1.0),
    ("time", "gemm_half_efficiency_flops"): (1e3, 1e13),
    ("time", "fp8_gemm_efficiency_max"): (0.01, 1.0),
    ("time", "bus_efficiency_intra_node"): (1e-4, 1.0),
    ("time", "collective_latency_scale"): (1e-3, 1e5),
    ("time", "cpu_adam_params_per_s"): (1e5, 1e11),
    ("time", "cpu_adam_unfused_params_per_s"): (1e5, 1e11),
    ("time", "eager_op_host_s"): (1e-7, 1e-3),
    ("time", "dtensor_step_host_s_per_tensor"): (1e-7, 1e-3),
    ("time", "rank_speed_cv"): (1e-4, 0.3),
    ("time", "eager_bytes_per_s_per_sm"): (1e8, 1e12),
    ("time", "p2p_latency_s"): (1e-7, 1e-2),
    ("time", "attention_efficiency"): (0.01, 1.0),
    ("memory", "allocator_fragmentation"): (1e-4, 1.0),
    ("memory", "cuda_context_bytes"): (2**20, 4 * 2**30),
    ("memory", "nccl_bytes_per_group"): (2**16, 2**30),
}
"""Where each fitted coefficient may go (efficiencies are fractions of a datasheet figure)."""


@dataclass(frozen=True)
class FitGroup:
    """One kind of measurement, the planner formula predicting it, and the coefficients it fits."""

    kind: str
    """Record kind (calibrate/harness/record.py KINDS)."""
    quantity: str
    """The measured quantity compared (a key of the records' measurement)."""
    coefficients: tuple
    """((section, name), ...) this group's records determine."""
    predict: Callable[[list, dict, dict], np.ndarray]
    """(records, {section: coefficient values}, hardware references) -> predicted quantity."""
    band: str | None = None
    """The answer band (planner.calibration.BAND_QUANTITIES) this quantity's held-out error sets."""
    note: str | None = None
    """What `calibrate report` says of the group's error (default: fitted, or exact terms)."""
    where: Callable[[dict], bool] | None = None
    """Which records of the kind the group takes (default: all)."""
    label: str | None = None
    """The name its errors go under (default: kind.quantity)."""
    uses_fitted: bool = False
    """Fitted with the coefficients earlier groups fitted, not the priors (the FP8 sweep: the 16-bit
    sweep's fixed seconds a GEMM, which it cannot tell apart from its own efficiency)."""

    @property
    def name(self) -> str:
        return self.label or f"{self.kind}.{self.quantity}"


def _gemm(records, c, ref):
    flops = np.array([r["measurement"]["flops"] for r in records], dtype=float)
    return gemm_s(flops, ref["peak_flops_per_s"], c["time"])


def _fp8(record) -> bool:
    return record.get("config", {}).get("dtype") == FP8


def _fp8_gemm(records, c, ref):
    """FP8 GEMMs as the planner times them (planner/compute.py block_gemm_rate): the FP8 peak at
    fp8_gemm_efficiency_max, the 16-bit curve's fixed seconds a GEMM."""
    flops = np.array([r["measurement"]["flops"] for r in records], dtype=float)
    ratio = ref["fp8_peak_flops_per_s"] / ref["peak_flops_per_s"]
    return gemm_s(flops, ref["fp8_peak_flops_per_s"], fp8_gemm_coefficients(c["time"], ratio))


def _collective(records, c, ref):
    m = [r["measurement"] for r in records]
    bus = ref["link_bytes_per_s"] * c["time"]["bus_efficiency_intra_node"]
    # one node: every rank on it (the harness's sweeps run on one machine)
    return np.array([nccl_time_s(x["bytes"], x["ranks"], x["ranks"], bus, "all_reduce" if x["op"] == "all_reduce"
                                 else "all_gather", c["time"]) for x in m], dtype=float)


def _p2p(records, c, ref):
    # one message between two ranks of the machine, at its link's bus efficiency (collectives.p2p_bytes_per_s)
    m = [r["measurement"] for r in records]
    bus = ref["link_bytes_per_s"] * c["time"]["bus_efficiency_intra_node"]
    return np.array([p2p_message_s(x["bytes"], bus, c["time"]) for x in m], dtype=float)


def _attention(records, c, ref):
    # the kernels of one causal FlashAttention forward and backward at the fitted share of the peak
    return np.array([sum(attention_matmuls_s(r["measurement"]["flops_fwd"], ref["peak_flops_per_s"],
                                             c["time"]["attention_efficiency"])) for r in records], dtype=float)


def _point_to_point(record) -> bool:
    return record["measurement"].get("op") == "send_recv"


def _adam_implementation(record) -> str | None:
    """calibrate/benches/bench.py ADAM_RATES' implementation a cpu_adam record measured; the first profiles'
    records (config 'foreach') ran torch's AdamW, single-tensor ('torch') or with foreach=True, which no
    engine steps on the host (None)."""
    config = record.get("config") or {}
    if "implementation" in config:
        return config["implementation"]
    return None if config.get("foreach") else "torch"


def _cpu_adam(rate: str):
    def predict(records, c, ref):
        params = np.array([r["measurement"]["params"] for r in records], dtype=float)
        return params / c["time"][rate]
    return predict


def _measured_itself(name: str):
    """A bench that measures the time coefficient `name` itself: each record predicts its value."""
    return lambda records, c, ref: np.full(len(records), c["time"][name])


def _eager_ops(records, c, ref):
    m = [r["measurement"] for r in records]
    return np.array([(x["forward_ops"] + x["backward_ops"]) * c["time"]["eager_op_host_s"] for x in m], dtype=float)


def _eager_layer(records, c, ref):
    # the bytes the planner counts for the layer (recorded with the run) at what eager kernels reach
    # on the run's GPU with these coefficients (planner/compute.py eager_bytes_per_s)
    from planner.compute import eager_bytes_per_s
    from planner.hardware import Cluster, lookup_gpu

    return np.array([r["prediction"]["layer_bytes"] / eager_bytes_per_s(Cluster(lookup_gpu(r["config"]["gpu"]), 1, 1), c["time"])
                     for r in records], dtype=float)


def _reserved(records, c, ref):
    allocated = np.array([r["measurement"]["allocated_peak_bytes"] for r in records], dtype=float)
    return reserved_bytes(allocated, c["memory"])


def _device_used(records, c, ref):
    # what the device holds beyond the allocator's reserve: the CUDA context and NCCL's buffers per
    # communicator (planner.memory _states_part "fixed_overhead"), measured as mem_get_info's used bytes
    m = [r["measurement"] for r in records]
    return np.array([x["reserved_peak_bytes"] + c["memory"]["cuda_context_bytes"]
                     + c["memory"]["nccl_bytes_per_group"] * x["process_groups"] for x in m], dtype=float)


def _step_allocated(records, c, ref):
    # the end-to-end runs' allocated peak, predicted by the planner as it is now (exact terms, no
    # coefficient): a run recorded before a memory term changed is judged by the current model
    from calibrate.engines.step_cases import prediction

    return np.array([prediction(x["engine"], x["llama"], x["zero"], x["mbs"], x["seq"], x["checkpointing"],
                                x["layout"]["dp"], x["gpu"])["allocated_peak_bytes"]
                     for x in (r["config"] for r in records)], dtype=float)


def _step_time(records, c, ref):
    # an end-to-end step with the coefficients in hand (the profile's fit where an earlier group fitted
    # them): none of them is fitted to these runs, so their error is a held-out one
    from planner import layout, timing
    from planner.calibration import FITTABLE, Calibration
    from planner.hardware import Cluster, lookup_gpu
    from planner.hf_config import from_hf_config

    overrides = tuple((s, n, float(c[s][n])) for s in FITTABLE for n in FITTABLE[s] if n in c.get(s, {}))
    out = []
    for x in (r["config"] for r in records):
        cluster = Cluster(lookup_gpu(x["gpu"]), x["layout"]["dp"], x["layout"]["dp"],
                          Calibration("fit", "", x["gpu"], overrides))
        training = layout.Training(seq_len=x["seq"], engine=x["engine"], precision="bf16")
        lay = layout.single(dp=x["layout"]["dp"], zero=x["zero"], mbs=x["mbs"],
                            recompute="full" if x["checkpointing"] else "none")
        out.append(timing.step_time(from_hf_config({**x["llama"], "model_type": "llama"}), cluster, training,
                                    lay)["step_s"][0])
    return np.array(out, dtype=float)


def _layer_saved(records, c, ref):
    # a layer counted on CUDA is predicted by the planner as it is now (it models what CUDA keeps); a
    # CPU count by the prediction recorded with it, which the tests translate kernel by kernel
    from calibrate.engines.torch_cases import activation_prediction

    def one(r):
        x = r["config"]
        if x.get("device") != "cuda":
            return r["prediction"]["layer_saved_bytes"]
        return activation_prediction(x["llama"]["attn_implementation"], x["dtype"], x["checkpointing"])["layer_saved_bytes"]

    return np.array([one(r) for r in records], dtype=float)


def _recorded(quantity: str):
    """Exact terms with no coefficient (model states, saved activations): the prediction recorded
    with the run."""
    return lambda records, c, ref: np.array([r["prediction"][quantity] for r in records], dtype=float)


GROUPS = (
    # a GEMM's kernel time where the bench profiled it (a training step issues its GEMMs asynchronously);
    # else a single synchronized call's, which carries the host's 30-40 us a call (bench.gemm_run)
    FitGroup("gemm", "kernel_s", (("time", "gemm_efficiency_max"), ("time", "gemm_half_efficiency_flops")), _gemm,
             where=lambda r: not _fp8(r)),
    FitGroup("gemm", "gemm_s", (("time", "gemm_efficiency_max"), ("time", "gemm_half_efficiency_flops")), _gemm,
             where=lambda r: "kernel_s" not in r["measurement"] and not _fp8(r)),
    # the FP8 sweep (bench/gemm/float8_e4m3fn): FP8's own large-GEMM efficiency
    FitGroup("gemm", "kernel_s", (("time", "fp8_gemm_efficiency_max"),), _fp8_gemm, where=_fp8,
             label="gemm_fp8.kernel_s", uses_fitted=True),
    FitGroup("gemm", "gemm_s", (("time", "fp8_gemm_efficiency_max"),), _fp8_gemm,
             where=lambda r: "kernel_s" not in r["measurement"] and _fp8(r), label="gemm_fp8.gemm_s",
             uses_fitted=True),
    FitGroup("collective", "collective_s", (("time", "bus_efficiency_intra_node"),
                                            ("time", "collective_latency_scale")), _collective,
             where=lambda r: not _point_to_point(r)),
    # the attention core's kernels (GPU profiles: FlashAttention through SDPA)
    FitGroup("attention", "kernel_s", (("time", "attention_efficiency"),), _attention),
    # the send/recv ping-pong's one-way time (pipeline sends, EP all-to-all peers, CP ring passes)
    FitGroup("collective", "collective_s", (("time", "p2p_latency_s"),), _p2p, where=_point_to_point,
             label="p2p.one_way_s"),
    # the fused host optimizers (one pass over the states), then torch's single-tensor loop
    FitGroup("cpu_adam", "adam_step_s", (("time", "cpu_adam_params_per_s"),), _cpu_adam("cpu_adam_params_per_s"),
             where=lambda r: _adam_implementation(r) in ("deepspeed", "torch-fused"), label="cpu_adam.fused_step_s"),
    FitGroup("cpu_adam", "adam_step_s", (("time", "cpu_adam_unfused_params_per_s"),),
             _cpu_adam("cpu_adam_unfused_params_per_s"), where=lambda r: _adam_implementation(r) == "torch",
             label="cpu_adam.unfused_step_s"),
    FitGroup("eager_ops", "layer_host_s", (("time", "eager_op_host_s"),), _eager_ops),
    FitGroup("eager_layer", "layer_elementwise_s", (("time", "eager_bytes_per_s_per_sm"),), _eager_layer),
    FitGroup("dtensor_step", "extra_s_per_tensor", (("time", "dtensor_step_host_s_per_tensor"),),
             _measured_itself("dtensor_step_host_s_per_tensor")),
    # the spread of speeds between a machine's GPUs (planner/stragglers.py; two or more GPUs)
    FitGroup("rank_speed", "speed_cv", (("time", "rank_speed_cv"),), _measured_itself("rank_speed_cv")),
    # the allocator's reserve and the memory outside it, from the end-to-end training steps
    # (calibrate/engines/step_cases.py) where a GPU profile has them: a small model's few MB measure the
    # allocator's block rounding, not what a step's changing activation sizes fragment
    FitGroup("step_time", "reserved_peak_bytes", (("memory", "allocator_fragmentation"),), _reserved, "peak_memory"),
    FitGroup("step_time", "device_used_bytes", (("memory", "cuda_context_bytes"), ("memory", "nccl_bytes_per_group")),
             _device_used, "peak_memory"),
    FitGroup("memory", "reserved_peak_bytes", (("memory", "allocator_fragmentation"),), _reserved, "peak_memory"),
    FitGroup("memory", "device_used_bytes", (("memory", "cuda_context_bytes"), ("memory", "nccl_bytes_per_group")),
             _device_used, "peak_memory"),
    FitGroup("memory", "peak_bytes", (), _recorded("peak_bytes"), "peak_memory"),
    FitGroup("memory", "model_state_bytes", (), _recorded("model_state_bytes"), "peak_memory"),
    FitGroup("memory", "host_bytes", (), _recorded("host_bytes")),  # ZeRO-Offload: no answer band of its own
    FitGroup("memory", "model_state_bytes_per_param", (), _recorded("model_state_bytes_per_param"), "peak_memory"),
    FitGroup("activations", "layer_saved_bytes", (), _layer_saved, "peak_memory"),
    FitGroup("step_time", "allocated_peak_bytes", (), _step_allocated, "peak_memory"),
    FitGroup("step_time", "step_s", (), _step_time, "step_time", "the coefficients fitted above, none from these runs"),
)


def usable(records: list, group: FitGroup) -> list:
    """The group's successful runs that measured its quantity."""
    def ok(r):
        m = r.get("measurement") or {}
        predicted = group.coefficients or isinstance((r.get("prediction") or {}).get(group.quantity), (int, float))
        return (r.get("kind") == group.kind and r.get("outcome", {}).get("status") == "ok" and predicted
                and (group.where is None or group.where(r))
                and isinstance(m.get(group.quantity), (int, float)) and m[group.quantity] > 0)
    return [r for r in records if ok(r)]


def priors() -> dict:
    return {s: coefficient_values(s) for s in ("memory", "time")}


def _with(coef: dict, names, values) -> dict:
    out = {s: dict(v) for s, v in coef.items()}
    for (section, name), value in zip(names, values):
        out[section][name] = float(value)
    return out


def relative_errors(group: FitGroup, records: list, coef: dict, ref: dict) -> np.ndarray:
    measured = np.array([r["measurement"][group.quantity] for r in records], dtype=float)
    return group.predict(records, coef, ref) / measured - 1.0


def fit_group(group: FitGroup, records: list, coef: dict, ref: dict) -> dict:
    """Bounded least squares of log(predicted/measured) over the group's coefficients; returns them."""
    from scipy.optimize import least_squares

    if not group.coefficients or not records:
        return {}
    names = group.coefficients
    lo = np.log([BOUNDS[n][0] for n in names])
    hi = np.log([BOUNDS[n][1] for n in names])
    start = np.clip(np.log([coef[s][n] for s, n in names]), lo + 1e-9, hi - 1e-9)

    def residuals(log_values):
        trial = _with(coef, names, np.exp(log_values))
        return np.log1p(relative_errors(group, records, trial, ref))

    res = least_squares(residuals, start, bounds=(lo, hi), method="trf", x_scale="jac")
    return dict(zip(names, np.exp(res.x).tolist()))


def case_keys(records: list) -> list:
    """Each record's case: its name (the same config measured again, in another session, shares it),
    or its position for an unnamed record."""
    return [r.get("name") or i for i, r in enumerate(records)]


def folds(keys: list, k: int) -> list:
    """k folds of the record indices, interleaved over the distinct cases in measurement order
    (deterministic): every run of a case falls in one fold, so no run is predicted by a fit that saw
    its own case measured again."""
    cases = {key: i for i, key in enumerate(dict.fromkeys(keys))}
    k = max(2, min(k, len(cases)))
    return [[i for i, key in enumerate(keys) if cases[key] % k == f] for f in range(k)]


def held_out_errors(group: FitGroup, records: list, coef: dict, ref: dict, k: int) -> np.ndarray:
    """Absolute relative error of every run, each predicted by a fit that never saw it (k-fold);
    a group with nothing to fit predicts every run with the priors."""
    if not group.coefficients:
        return np.abs(relative_errors(group, records, coef, ref))
    errors = np.full(len(records), np.nan)
    keys = case_keys(records)
    if len(set(keys)) < 2:
        return errors
    for held in folds(keys, k):
        values = fit_group(group, [r for i, r in enumerate(records) if i not in held], coef, ref)
        fitted = _with(coef, list(values), values.values())
        errors[held] = np.abs(relative_errors(group, [records[i] for i in held], fitted, ref))
    return errors


def fit(records: list, ref: dict, k: int = 5) -> dict:
    """Fit every group with data; the coefficients, and per quantity the error before (priors) and
    after (k-fold held-out) fitting, and the answer bands."""
    prior = priors()
    coef = prior
    fitted, errors, bands = {}, {}, {}
    for group in GROUPS:
        rows = usable(records, group)
        if not rows:
            continue
        before = np.abs(relative_errors(group, rows, prior, ref))
        # a coefficient an earlier group fitted (the end-to-end runs come first) is kept: this group's
        # runs are then only predicted with it, and do not set the answers' band
        taken = bool(group.coefficients) and all(n in fitted.get(s, {}) for s, n in group.coefficients)
        # a group with no coefficient of its own is judged with those fitted so far (its runs fitted none)
        base = coef if group.uses_fitted else prior
        after = np.abs(relative_errors(group, rows, coef, ref)) if taken else \
            held_out_errors(group, rows, base if group.coefficients else coef, ref, k)
        values = {} if taken else fit_group(group, rows, base, ref)
        coef = _with(coef, list(values), values.values())
        for (section, name), value in values.items():
            lo, hi = BOUNDS[(section, name)]
            fitted.setdefault(section, {})[name] = {"prior": prior[section][name], "value": value,
                                                    "lower": lo, "upper": hi, "runs": len(rows)}
        held = bool(np.isfinite(after).all())
        errors[group.name] = {
            "runs": len(rows), "fitted": bool(group.coefficients), "kept": taken, "note": group.note, "before_mean": float(before.mean()),
            "before_max": float(before.max()), "after_mean": float(after.mean()) if held else None,
            "after_max": float(after.max()) if held else None,
            "folds": min(k, len(set(case_keys(rows))))}
        if group.band and held and not taken:
            # the band covers the worst held-out run, rounded up to 0.1 %: a fit call is then "fits"
            # only when every held-out run would have fitted
            worst = max(bands.get(group.band, 0.0), float(after.max()))
            bands[group.band] = math.ceil(worst * 1000 - 1e-9) / 1000
    return {"coefficients": fitted, "error": errors, "bands": bands, "references": ref, "folds": k}
