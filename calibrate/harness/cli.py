"""`python -m calibrate run|fit|report` (also `planner calibrate ...`).

run: measure the suite's cases on this machine (real engines under torchrun / DeepSpeed's launcher,
micro-benchmarks), appending each record to the profile as soon as it is measured.
fit: fit the named coefficients to the profile's runs (calibrate/harness/fit.py) and store them in it.
report: per coefficient its prior and fitted value; per quantity the error before and after.

A user's runs go to a profile of their own, never into one shipped with the planner
(data/calibration/): `run NAME` writes <user dir>/NAME.json ($PLANNER_HOME/calibration, else
~/.config/planner/calibration; planner/calibration.py user_dir), `--out PATH` anywhere else, and only
`--update-shipped` (a maintainer refreshing a shipped profile) writes the shipped file. A name reads
the user's profile when there is one, else the shipped one.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

from planner.calibration import (CALIBRATION_DIR, append_runs, is_path, is_shipped, read_profile, resolve_path,
                                 save_profile, user_dir)
from planner.errors import InputError

SUITES = ("bench", "step", "deepspeed", "torch")
"""Case modules: calibrate.benches.bench, calibrate.engines.step_cases, calibrate.engines.deepspeed_cases,
calibrate.engines.torch_cases, in the order a run takes them: the micro-benchmarks and the end-to-end
steps, which most coefficients are fitted to, before the engines' memory cases, so that a --budget-s
cuts the latter."""


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse would print the whole usage)
        print(f"calibrate: error: {message}", file=sys.stderr)
        raise SystemExit(2)


WHERE = ("a NAME is the user's profile $PLANNER_HOME/calibration/NAME.json (without PLANNER_HOME: "
         "${XDG_CONFIG_HOME:-~/.config}/planner/calibration/NAME.json) when there is one, else the shipped "
         "data/calibration/NAME.json; run and fit write the user's profile, never a shipped one unless "
         "--update-shipped")


def _destination_flags(parser) -> None:
    parser.add_argument("--out", metavar="PATH", help="write the profile here instead")
    parser.add_argument("--update-shipped", action="store_true",
                        help="write the shipped data/calibration/NAME.json itself (maintainers refreshing it)")


def build_parser() -> Parser:
    p = Parser(prog="calibrate", description="Measure real training runs and fit the planner's coefficients.",
               epilog="Profiles: " + WHERE + ".")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    r = sub.add_parser("run", help="measure this machine's cases and append them to a profile", epilog=WHERE + ".")
    r.add_argument("profile", help="profile name or path")
    _destination_flags(r)
    r.add_argument("--suite", action="append", choices=SUITES, help="case groups to run (default: all)")
    r.add_argument("--only", metavar="GLOB", help="run only cases whose name matches, e.g. 'deepspeed/zero2*'")
    r.add_argument("--gpu", help="GPU catalog name of this machine (default: detected; 'cpu' without CUDA)")
    r.add_argument("--list", action="store_true", help="list the cases and exit")
    r.add_argument("--budget-s", type=float, metavar="SECONDS",
                   help="stop launching cases once this much wall time is spent: a case whose last run in the "
                        "profile took longer than what is left is skipped, the others are cut at what is left "
                        "(default: no limit)")
    f = sub.add_parser("fit", help="fit the profile's coefficients (bounded least squares, k-fold held-out error)",
                       epilog=WHERE + "; fitting a shipped profile writes the fit to the user's copy of it.")
    f.add_argument("profile", help="profile name or path")
    _destination_flags(f)
    f.add_argument("--folds", type=int, default=5, help="k of the k-fold held-out error (default 5)")
    g = sub.add_parser("report", help="priors, fitted values and errors of a profile", epilog=WHERE + ".")
    g.add_argument("profile", help="profile name or path")
    return p


def destination(args) -> Path:
    """Where `run` or `fit` writes: --out; else the PROFILE path; else, for a name, the user's profile
    (the shipped file with --update-shipped). A shipped file only with --update-shipped, so that a
    user's runs and fits never change what ships with the planner."""
    name = args.profile
    if args.out:
        path = Path(args.out).expanduser()
    elif is_path(name):
        path = Path(name).expanduser()
    elif args.update_shipped:
        path = CALIBRATION_DIR / f"{name}.json"
    else:
        path = user_dir() / f"{name}.json"
    if is_shipped(path) and not args.update_shipped:
        flag = "--out" if args.out else "PROFILE"
        mine = user_dir() / f"{path.stem}.json"
        raise InputError(f"{flag}: {str(path)!r} is a profile shipped with the planner; write your own "
                         f"(`calibrate {args.command} {path.stem}` writes {mine}, or --out PATH), or pass "
                         "--update-shipped to change the shipped one")
    return path


def detect_gpu() -> str:
    """The GPU catalog name of device 0, or 'cpu' (a gloo profile)."""
    import torch

    from planner.hardware import lookup_gpu

    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name(0).lower().replace("nvidia", "")
    for token in [name.strip().replace(" ", "-")] + name.split():
        try:
            return lookup_gpu(token).name
        except InputError:
            continue
    raise InputError(f"--gpu: device {name.strip()!r} is not in the GPU catalog; name it with --gpu")


def collect(suites, profile_kind: str, gpu: str, only: str | None) -> list:
    """Every case of the suites, filtered by --only."""
    import importlib

    cases = []
    for suite in suites:
        module = importlib.import_module({"deepspeed": "calibrate.engines.deepspeed_cases",
                                          "torch": "calibrate.engines.torch_cases", "bench": "calibrate.benches.bench",
                                          "step": "calibrate.engines.step_cases"}[suite])
        found = module.cases(profile_kind, gpu) if suite in ("bench", "step") else module.cases(profile_kind)
        cases += found
    return [c for c in cases if only is None or fnmatch.fnmatch(c.name, only)]


def cmd_run(args) -> int:
    from tqdm import tqdm

    from calibrate.harness.record import environment, expand_rows, run_case

    gpu = args.gpu or detect_gpu()
    if gpu == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed's CPU accelerator and gloo, in every rank
    cases = collect(args.suite or SUITES, "cpu" if gpu == "cpu" else "gpu", gpu, args.only)
    if args.list:
        print("\n".join(f"{c.kind:12s} {c.name}" for c in cases))
        return 0
    path = destination(args)
    if not cases:
        raise InputError(f"--only: no case matches {args.only!r} (see --list)")
    name = path.stem if is_path(args.profile) else args.profile
    # a foreign or corrupt file is refused before any run
    last = last_wall_s(read_profile(str(path), "PROFILE")["runs"]) if path.exists() else {}
    shipped = resolve_path(args.profile) if not is_path(args.profile) else None
    if not last and shipped is not None and shipped.exists() and shipped != path:
        last = last_wall_s(read_profile(args.profile, "PROFILE")["runs"])  # --budget-s: the shipped runs' times
    if args.budget_s is not None and not args.budget_s > 0:
        raise InputError(f"--budget-s: must be a positive number of seconds, got {args.budget_s:g}")
    env = environment()
    rows, skipped = [], []
    start = time.perf_counter()
    with tqdm(cases, unit="run", desc="calibrate", file=sys.stderr) as bar:  # run i of n, elapsed, ETA
        for case in bar:
            left = None if args.budget_s is None else args.budget_s - (time.perf_counter() - start)
            if left is not None and (left < 1.0 or last.get(case.name, 0.0) > left):
                skipped.append(case.name)  # measured before, too long for what is left
                continue
            bar.set_postfix_str(case.name)
            if left is not None and case.module is not None:
                case = replace(case, timeout_s=min(case.timeout_s, left))
            records = expand_rows(run_case(case))
            for record in records:
                record["environment"] = env
            append_runs(path, records, name, gpu, env)  # each run lands as soon as it is measured
            rows += records
    print(summary(rows, time.perf_counter() - start, path))
    if skipped:
        print(f"skipped {len(skipped)} case(s) for --budget-s {args.budget_s:g}: {', '.join(skipped)}")
    return 0 if all(r["outcome"]["status"] == "ok" for r in rows) else 1


def last_wall_s(runs: list) -> dict:
    """{case name: seconds its latest run took} from a profile's records (a sweep's records, named
    case/op/size, share their case's one launch)."""
    out = {}
    for r in runs:
        seconds = (r.get("outcome") or {}).get("wall_s")
        if isinstance(seconds, (int, float)):
            name = r["name"].split("/")
            case = "/".join(name[:2]) if r.get("kind") == "collective" else r["name"]
            out[case] = float(seconds)
    return out


UNITS = ("_bytes", "_s", "_per_s", "_per_param", "_per_tensor")
"""Measured quantities the summary prints (the others are the config of a point)."""


def summary(rows: list, elapsed_s: float, path) -> str:
    """One line per run: status, seconds, and each quantity predicted vs measured."""
    lines = [f"{'status':8s} {'wall s':>7s}  case: quantity predicted / measured (error)"]
    for r in rows:
        pairs = []
        for q, measured in sorted(r["measurement"].items()):
            predicted = r["prediction"].get(q)
            if isinstance(measured, bool) or not isinstance(measured, (int, float)) or not q.endswith(UNITS):
                continue
            if isinstance(predicted, (int, float)) and measured:
                pairs.append(f"{q} {predicted:.4g} / {measured:.4g} ({predicted / measured - 1:+.1%})")
            else:
                pairs.append(f"{q} - / {measured:.4g}")
        lines.append(f"{r['outcome']['status']:8s} {r['outcome']['wall_s']:7.1f}  {r['name']}: "
                     + ("; ".join(pairs) or "-"))
    ok = sum(r["outcome"]["status"] == "ok" for r in rows)
    lines.append(f"{ok} of {len(rows)} runs ok in {elapsed_s:.0f} s; appended to {path}")
    return "\n".join(lines)


def references(doc: dict) -> dict:
    """The datasheet figures efficiencies are fractions of: the GPU catalog's, or on a CPU profile
    (no datasheet) the best measured GEMM rate and bus bandwidth."""
    gpu = doc["hardware"]["gpu"]
    if gpu != "cpu":
        from planner.hardware import lookup_gpu

        g = lookup_gpu(gpu)
        return {"peak_flops_per_s": g.peak_flops_per_s["bf16"], "fp8_peak_flops_per_s": g.peak_flops_per_s["fp8"],
                "link_bytes_per_s": g.intra_node_bytes_per_s}
    ok = [r for r in doc["runs"] if r.get("outcome", {}).get("status") == "ok"]
    flops = [r["measurement"]["flops"] / r["measurement"]["gemm_s"] for r in ok if r["kind"] == "gemm"]
    bus = [r["measurement"]["bus_bytes_per_s"] for r in ok
           if r["kind"] == "collective" and r["measurement"].get("op") != "send_recv"]
    return {"peak_flops_per_s": max(flops, default=1.0), "link_bytes_per_s": max(bus, default=1.0)}


def cmd_fit(args) -> int:
    from calibrate.harness.fit import fit

    if not 2 <= args.folds <= 100:
        raise InputError(f"--folds: must be an integer from 2 to 100, got {args.folds}")
    spec = args.profile
    if args.update_shipped and not is_path(spec):  # the shipped runs, not the user's profile of that name
        spec = str(CALIBRATION_DIR / f"{spec}.json")
    source = resolve_path(spec)
    doc = read_profile(spec, "PROFILE", check_fit=False)  # a fit by an older planner is replaced
    if args.out or args.update_shipped or not is_shipped(source):
        path = destination(args)
    else:  # a shipped profile's runs with the user's fit: the user's copy, which a name then finds
        path = user_dir() / source.name
    if not doc["runs"]:
        raise InputError(f"{args.profile}: the profile has no runs; `calibrate run {args.profile}` first")
    result = fit(doc["runs"], references(doc), args.folds)
    if doc.get("fit"):
        doc.setdefault("fit_history", []).append(doc["fit"])  # an earlier fit is kept, not overwritten
    result["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result["runs_used"] = len(doc["runs"])
    doc["fit"] = result
    save_profile(path, doc)
    print(report_text(doc))
    print(f"fit written to {path}")
    return 0


def report_text(doc: dict) -> str:
    fit = doc.get("fit")
    head = f"profile {doc.get('profile')} ({doc['hardware']['gpu']}, {len(doc['runs'])} runs)"
    if not fit:
        return head + ": not fitted yet (calibrate fit PROFILE)"
    lines = [head, "", f"{'coefficient':42s} {'prior':>12s} {'fitted':>12s}  runs"]
    for section, names in fit["coefficients"].items():
        for name, c in names.items():
            lines.append(f"{section + '.' + name:42s} {c['prior']:12.4g} {c['value']:12.4g}  {c['runs']}")
    lines += ["", f"{'quantity':34s} {'runs':>5s} {'before mean/max':>18s} {'held-out mean/max':>20s}"]
    for q, e in fit["error"].items():
        after = "-" if e["after_mean"] is None else f"{e['after_mean']:.1%} / {e['after_max']:.1%}"
        lines.append(f"{q:34s} {e['runs']:5d} {e['before_mean']:8.1%} / {e['before_max']:6.1%} {after:>20s}"
                     + (f"  ({e['note']})" if e.get("note") else
                        "  (coefficients fitted above; not held out)" if e.get("kept") else
                        "" if e["fitted"] else "  (no coefficient: exact terms)"))
    if fit["bands"]:
        lines.append("bands quoted by answers: " + ", ".join(f"{q} +-{b:.1%}" for q, b in fit["bands"].items()))
    return "\n".join(lines)


def cmd_report(args) -> int:
    print(report_text(read_profile(args.profile, "PROFILE")))
    return 0


def main(argv=None) -> int:
    from calibrate.harness.launch import Terminated, raise_on_sigterm

    args = build_parser().parse_args(argv)
    previous = raise_on_sigterm()
    try:
        return {"run": cmd_run, "fit": cmd_fit, "report": cmd_report}[args.command](args)
    except InputError as exc:
        print(f"calibrate: error: {exc}", file=sys.stderr)
        return 2
    except Terminated:  # SIGTERM (a scheduler's cancel, `timeout`): the launcher has killed the ranks
        print("calibrate: terminated; runs measured so far are in the profile", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:  # the launcher has killed the ranks; the profile keeps what landed
        print("calibrate: interrupted; runs measured so far are in the profile", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)

