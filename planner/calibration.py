"""Calibration profiles: measured runs, the coefficients fitted to them, and the error they leave.

A profile is a path, or a name: the user's profile <user_dir()>/<name>.json when there is one, else
the shipped data/calibration/<name>.json (no merging: a user's profile replaces the shipped one of
its name whole). `python -m calibrate` writes them (calibrate/ runs the real engines and fits; it
needs torch, deepspeed and scipy), into the user's directory, never into a shipped file unless told
(--update-shipped). This module costs no heavy import (`planner estimate --calibration NAME`). A
profile holds:

- schema: SCHEMA; profile: its name; hardware: {"gpu": GPU catalog name, or "cpu" for a gloo
  profile}; environment: where it was measured;
- runs: every measured case (config, the planner's prediction, the measurement, the outcome),
  appended and never rewritten;
- fit: the fitted coefficients ({section: {name: {"prior", "value", "lower", "upper"}}}), the
  error per measured quantity before and after fitting on held-out runs, and the relative error
  bands (`bands`: {"peak_memory": x, "step_time": y}) the answers quote.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from planner.data import DATA_DIR, atomic_write, catalog, read_json
from planner.errors import InputError

SCHEMA = "planner-calibration/1"
CALIBRATION_DIR = DATA_DIR / "calibration"
FLAG = "--calibration"
BAND_QUANTITIES = ("peak_memory", "step_time")
"""Answers quote a relative error band for these."""
FITTABLE = {
    "memory": ("allocator_fragmentation", "allocator_fragmentation_expandable", "cuda_context_bytes",
               "nccl_bytes_per_group"),
    "time": ("gemm_efficiency_max", "gemm_half_efficiency_flops", "bus_efficiency_intra_node",
             "collective_latency_scale", "hbm_efficiency", "cpu_adam_params_per_s",
             "cpu_adam_unfused_params_per_s", "dp_overlap_fraction_with_overlap", "eager_op_host_s",
             "dtensor_step_host_s_per_tensor", "rank_speed_cv", "eager_bytes_per_s_per_sm", "p2p_latency_s",
             "attention_efficiency", "fp8_gemm_efficiency_max"),
}
"""The named coefficients of data/coefficients.json a profile may replace."""


@dataclass(frozen=True)
class Calibration:
    """A loaded profile, reduced to what answers use (hashable, so clusters stay hashable)."""

    name: str
    """Profile name (file stem)."""
    path: str
    """Where it was read from."""
    hardware: str
    """GPU catalog name the runs were measured on ('cpu' for a gloo profile)."""
    overrides: tuple = ()
    """((section, coefficient, value), ...) fitted values replacing the priors."""
    bands: tuple = ()
    """((quantity, relative error), ...) from held-out runs."""

    def band(self, quantity: str) -> float:
        return dict(self.bands).get(quantity, prior_band(quantity))


def prior_band(quantity: str) -> float:
    """Relative error band without a profile (data/coefficients.json 'bands', each sourced)."""
    return float(catalog("coefficients.json")["bands"][quantity]["value"])


def coefficient_values(section: str, calibration: Calibration | None = None) -> dict:
    """Named coefficients of one section: the priors of data/coefficients.json, with a profile's
    fitted values in their place."""
    values = {k: v["value"] for k, v in catalog("coefficients.json")[section].items()}
    if calibration is not None:
        values.update({name: value for sec, name, value in calibration.overrides if sec == section})
    return values


def clears_band(margin_bytes, band_bytes):
    """Whether a peak may err high by its whole band and still fit (numbers or arrays)."""
    return margin_bytes >= band_bytes


def verdict(margin_bytes: float, band_bytes: float) -> str:
    """fits when the answer may err high by its whole band and still fit, oom when it may err low by
    its whole band and still not fit, borderline in between (the band straddles capacity)."""
    return "fits" if clears_band(margin_bytes, band_bytes) else "oom" if margin_bytes < -band_bytes else "borderline"


def user_dir() -> Path:
    """Where a user's profiles live: $PLANNER_HOME/calibration, else $XDG_CONFIG_HOME/planner/calibration
    (~/.config/planner/calibration). Not data/calibration/: that ships with the planner, and a
    reinstall or `git pull` would overwrite or conflict with a user's runs there."""
    home = os.environ.get("PLANNER_HOME")
    if home:
        return Path(home).expanduser() / "calibration"
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config).expanduser() / "planner" / "calibration"


def is_path(spec: str) -> bool:
    """Whether a profile spec is a path (has a '/' or ends in .json) rather than a name."""
    return "/" in spec or spec.endswith(".json")


def resolve_path(spec: str) -> Path:
    """A path as given; a name: the user's profile when there is one, else the shipped one."""
    if is_path(spec):
        return Path(spec).expanduser()
    user = user_dir() / f"{spec}.json"
    return user if user.exists() else CALIBRATION_DIR / f"{spec}.json"


def is_shipped(path) -> bool:
    """Whether `path` is in data/calibration/, the profiles shipped with the planner."""
    return Path(path).expanduser().resolve().is_relative_to(CALIBRATION_DIR.resolve())


def known_profiles() -> dict:
    """{name: path} of every profile a name finds: shipped ones, with the user's in their place."""
    found = {}
    for folder in (CALIBRATION_DIR, user_dir()):  # the user's last: it wins
        if folder.is_dir():
            found.update({p.stem: p for p in folder.glob("*.json")})
    return dict(sorted(found.items()))


def read_profile(spec: str, flag: str = FLAG, check_fit: bool = True) -> dict:
    """The profile's JSON, checked for schema and shape (and its fit unless a refit will replace
    it); any problem is one InputError naming `flag`."""
    path = resolve_path(spec)
    if not path.exists() and not is_path(spec):
        known = ", ".join(known_profiles()) or "none"
        raise InputError(f"{flag}: no profile {spec!r} (known: {known}, in {user_dir()} or shipped; or give a path)")
    doc = read_json(path, flag)
    where = str(path)
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise InputError(f"{flag}: {where!r} is not a calibration profile (schema {found!r}, expected {SCHEMA!r})")
    hardware = doc.get("hardware")
    if not isinstance(hardware, dict) or not isinstance(hardware.get("gpu"), str):
        raise InputError(f"{flag}: {where!r} has no hardware.gpu (the device it was measured on)")
    if not isinstance(doc.get("runs"), list):
        raise InputError(f"{flag}: {where!r} has no runs list")
    fit = doc.get("fit")
    if fit is not None and check_fit:
        _check_fit(fit, where, flag)
    return doc


def _check_fit(fit, where: str, flag: str) -> None:
    if not isinstance(fit, dict) or not isinstance(fit.get("coefficients", {}), dict):
        raise InputError(f"{flag}: {where!r} has a malformed fit section")
    for section, names in fit.get("coefficients", {}).items():
        if section not in FITTABLE or not isinstance(names, dict):
            raise InputError(f"{flag}: {where!r} fits unknown section {section!r} (allowed: {', '.join(FITTABLE)})")
        for name, entry in names.items():
            if name not in FITTABLE[section]:
                raise InputError(f"{flag}: {where!r} fits unknown coefficient {section}.{name} (allowed: "
                                 f"{', '.join(FITTABLE[section])}; refit it: planner calibrate fit PROFILE)")
            value = entry.get("value") if isinstance(entry, dict) else None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise InputError(f"{flag}: {where!r}: {section}.{name} value must be a number >= 0, got {value!r}")
    for quantity, band in fit.get("bands", {}).items():
        if quantity not in BAND_QUANTITIES or isinstance(band, bool) or not isinstance(band, (int, float)) \
                or not 0 <= band < 10:
            raise InputError(f"{flag}: {where!r}: band {quantity!r} must be one of {', '.join(BAND_QUANTITIES)} "
                             f"with a relative error in [0, 10), got {band!r}")


def load(spec: str | None, gpu_name: str) -> Calibration | None:
    """The profile `spec` names, for a cluster of `gpu_name` GPUs; None for no profile (the priors).
    A profile measured on other hardware is refused: its coefficients describe that hardware."""
    if spec is None or spec == "none":
        return None
    doc = read_profile(spec)
    measured_on = doc["hardware"]["gpu"]
    if measured_on != gpu_name:
        raise InputError(f"{FLAG}: profile {doc.get('profile', spec)!r} was measured on {measured_on}, not {gpu_name}; "
                         f"calibrate on {gpu_name} or drop {FLAG} to use the priors")
    fit = doc.get("fit") or {}
    overrides = tuple((section, name, float(entry["value"]))
                      for section, names in sorted(fit.get("coefficients", {}).items())
                      for name, entry in sorted(names.items()))
    bands = tuple(sorted((q, float(b)) for q, b in fit.get("bands", {}).items()))
    return Calibration(str(doc.get("profile", Path(spec).stem)), str(resolve_path(spec)), measured_on, overrides, bands)


def new_profile(name: str, gpu: str, environment: dict) -> dict:
    return {"schema": SCHEMA, "profile": name,
            "about": f"Measured by `python -m calibrate run {name}` on this hardware; every run records its "
                     "environment, exact config, the planner's prediction then, the measurement and the outcome.",
            "hardware": {"gpu": gpu}, "environment": environment, "runs": [], "fit": None, "fit_history": []}


def save_profile(path: Path, doc: dict) -> None:
    """Write a profile atomically (a killed writer leaves the old file whole)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(doc, indent=1, sort_keys=False) + "\n", flag=FLAG)


def append_runs(path: Path, records: list, name: str, gpu: str, environment: dict) -> dict:
    """Append measured runs to the profile at `path` (created when missing); earlier runs and fits
    are kept. A profile of other hardware is refused, not overwritten."""
    path = Path(path)
    doc = read_profile(str(path), "PROFILE") if path.exists() else new_profile(name, gpu, environment)
    if doc["hardware"]["gpu"] != gpu:
        raise InputError(f"{FLAG}: {str(path)!r} holds runs measured on {doc['hardware']['gpu']}, not {gpu}; "
                         "name another profile")
    doc["runs"].extend(records)
    doc["environment"] = environment
    save_profile(path, doc)
    return doc
