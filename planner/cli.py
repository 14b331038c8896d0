"""`planner estimate | recommend | check | validate`: the command handlers, argparse's answers
(planner/flags.py) to the planning API (planner/api.py) and back.

Flags become the API's input records; the answer is printed as text or JSON. Bad input prints
one line naming the flag and exits with status 2, without a traceback and without writing.
"""

from __future__ import annotations

import json
import os
import sys

from planner.errors import InputError
from planner.flags import CLUSTER_FLAGS, LAYOUT_DEFAULTS, MODEL_FLAGS, ZERO_FLAGS, build_parser


# ---------------------------------------------------------------------------------------------
# flags -> API inputs


def model_input(args):
    from planner.inputs import ModelInput

    return ModelInput(**{k: getattr(args, k) for k in MODEL_FLAGS if k != "model"},
                      **({"name": args.model} if args.model is not None else {}))


def cluster_input(args):
    from planner.inputs import ClusterInput

    return ClusterInput(**{k: getattr(args, k) for k in CLUSTER_FLAGS})


def training_input(args):
    from planner.inputs import TrainingInput

    return TrainingInput(seq_len=args.seq_len, gbs=args.gbs, tokens_per_step=getattr(args, "tokens_per_step", None),
                         precision=args.precision, optimizer=args.optimizer,
                         fp8_recipe=args.fp8_recipe, fp8_param_gather=args.fp8_param_gather,
                         flash_attention=not args.no_flash_attention, engine=args.engine,
                         overlap_comm=args.overlap_comm, contiguous_gradients=False if args.no_contiguous_gradients else None,
                         fp32_grad_accum=args.fp32_grad_accum, tp_comm_overlap=args.tp_comm_overlap,
                         compile=args.compile, modules=args.modules,
                         grad_reduce_in_bf16=args.grad_reduce_in_bf16, fsdp_mixed_precision=args.fsdp_mixed_precision,
                         recompute_modules=args.recompute_modules,
                         overlap_p2p=args.overlap_p2p, pipeline_edge_layers=args.pp_edge_layers,
                         loss_chunks=args.loss_chunks, expandable_segments=args.expandable_segments, partition_activations=args.partition_activations, cpu_checkpointing=args.cpu_checkpointing,
                         moe_capacity_factor=args.moe_capacity_factor, moe_pad_to_capacity=args.moe_pad_to_capacity,
                         moe_grouped_gemm=args.moe_grouped_gemm,
                         optimizer_offload_fraction=args.optimizer_offload_fraction,
                         tokens=args.tokens, price_per_gpu_hour=args.price_per_gpu_hour,
                         **{k: getattr(args, k) for k in ZERO_FLAGS})


def cmd_estimate(args, out) -> int:
    from planner import api, report
    from planner.inputs import LayoutInput

    layout = LayoutInput(tp=args.tp, pp=args.pp, dp=args.dp, cp=args.cp, ep=args.ep, etp=args.etp, vpp=args.vpp,
                         schedule=args.schedule,
                         zero=args.zero, offload_optimizer=args.offload_optimizer, offload_params=args.offload_params,
                         mbs=args.mbs, recompute=args.recompute, recompute_layers=args.recompute_layers,
                         recompute_method=args.recompute_method,
                         sequence_parallel=args.sequence_parallel, rank_order=args.rank_order)
    e = api.estimate(model_input(args), cluster_input(args), training_input(args), layout, ds_estimator=args.ds_estimator)
    result = e.to_json()
    if args.emit:
        result["emitted"] = _emit(args.emit, e.model, e.cluster, e.training, e.layout)
    if args.json:
        out.write(json.dumps(result, indent=1) + "\n")
        return 0
    out.write(report.estimate_text(e) + "\n")
    if args.emit:
        out.write("wrote " + _shown(result["emitted"]) + "\n")
    return 0


def cmd_recommend(args, out) -> int:
    from planner import api, report

    pinned = {k: getattr(args, k) for k in LAYOUT_DEFAULTS if getattr(args, k) is not None}
    # the other engines' searches beside this one's where the machine has a core for them (a
    # single-threaded process: planner/forked.py)
    r = api.recommend(model_input(args), cluster_input(args), training_input(args), top=args.top,
                      memory_headroom=args.memory_headroom, max_mbs=args.max_mbs, pinned=pinned,
                      workers=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    # the files are for the fastest layout that clears its memory band: #1, or under a borderline #1 the
    # clear fit recommend names (#1 itself where none clears it)
    chosen = (r.clear_fit or r.layouts[0]) if r.layouts else None
    if chosen and args.emit:
        chosen["emitted"] = _emit(args.emit, r.model, r.cluster, r.training, chosen["layout"])
    if args.json:
        out.write(json.dumps(r.to_json(), indent=1) + "\n")
    else:
        out.write(report.recommend_text(r) + "\n")
        if chosen and args.emit:
            which = "" if chosen is r.layouts[0] else f" (for {report.short(chosen['layout'])}, which clears the band)"
            out.write("wrote " + _shown(chosen["emitted"]) + which + "\n")
    if not r.layouts:
        # the answer (with what would fit) is printed; exit 2 still comes with its one stderr line,
        # naming --gbs where the batch is the cause (refine.batch_proposals)
        if r.batch_proposals:
            raise InputError(f"--gbs: {r.batch_note}: no {r.training.engine.name} layout of {r.cluster.num_gpus} x "
                             f"{r.cluster.gpu.name} fits; {r.suggestions[0]}")
        raise InputError(f"--gpus: no layout fits {r.cluster.num_gpus} x {r.cluster.gpu.name}"
                         + (f"; {r.suggestions[0]}" if r.suggestions else ""))
    return 0


def cmd_check(args, out) -> int:
    """Exit 0 when the config runs and fits, 1 when a finding says it will not, 2 for bad input."""
    from planner import api, report

    from planner import ds_config

    cluster = {k: v for k, v in vars(cluster_input(args)).items() if v is not None}
    if args.dir is not None and args.config is not None:
        raise InputError(f"--config: give the directory {args.dir!r} or --config PATH, not both")
    args.config = args.config if args.dir is None else args.dir
    if (args.config is None) == (args.accelerate_launch is None):
        raise InputError("--config: give --config PATH or --accelerate-launch COMMAND (one of them)")
    config, plan = args.config, None
    if args.config is not None:  # a directory --emit wrote, or a config with its plan.json beside it
        from planner import plan_file

        plan, config = plan_file.locate(args.config)
    if args.accelerate_launch is not None:
        config, processes = ds_config.from_accelerate_launch(args.accelerate_launch)
        if processes and cluster.get("gpus") not in (None, processes):
            raise InputError(f"--gpus: {cluster['gpus']}, but the launch says --num_processes {processes}")
        if processes:  # none on the line or in its --config_file: --gpus gives the count (doctor.inputs asks)
            cluster.setdefault("gpus", processes)
    seq = {"seq_len": args.seq_len} if args.seq_len else {}
    if plan is not None:
        given = {k: getattr(args, k) for k in ("tp", "pp", "recompute", "mbs") if getattr(args, k) is not None}
        model = {k: v for k, v in vars(model_input(args)).items() if v is not None}
        r = api.check_plan(plan, config, model, cluster, seq, given, deepspeed=not args.no_deepspeed)
    else:
        r = api.check(config, model_input(args), cluster, seq,
                      {"tp": args.tp or 1, "pp": args.pp or 1, "recompute": args.recompute or "none"},
                      mbs=args.mbs, deepspeed=not args.no_deepspeed)
    result = r.to_json()
    if plan is not None:
        result["plan"] = str(plan.path)
    if args.emit and r.better:
        e = r.estimate
        result["emitted"] = _emit(args.emit, e.model, e.cluster, e.training, r.better["layout"])
    out.write(json.dumps(result, indent=1) + "\n" if args.json else report.check_text(r) + "\n")
    if args.emit and r.better and not args.json:
        out.write("wrote " + _shown(result["emitted"]) + "\n")
    return 0 if r.ok else 1


def cmd_validate(args, out) -> int:
    from planner import api, report

    v = api.validate(source=args.source)
    out.write(json.dumps(v, indent=1) + "\n" if args.json else report.validate_text(v) + "\n")
    return 0


def _emit(directory, model, cluster, training, row) -> list[str]:
    from planner import export

    if "\x00" in directory:
        raise InputError(f"--emit: {directory!r} is not a usable path (it holds a NUL character)")
    return [str(p) for p in export.emit(directory, model, cluster, training, row)]


def _shown(paths) -> str:
    """Paths for a text line; bytes the OS gave that are not UTF-8 stay escaped instead of failing the print."""
    return ", ".join(paths).encode("utf-8", "backslashreplace").decode("utf-8")


def main(argv=None, out=None) -> int:
    out = out or sys.stdout
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        if argv[:1] == ["calibrate"]:  # its own parser; torch, deepspeed and scipy load only there
            return _plugin("calibrate")(argv[1:])
        args = build_parser().parse_args(argv)
        command = {"estimate": cmd_estimate, "recommend": cmd_recommend, "check": cmd_check,
                   "validate": cmd_validate}[args.command]
        return command(args, out)
    except InputError as exc:
        msg = str(exc).splitlines()[0] if str(exc) else "invalid input"
        sys.stderr.write(f"planner: error: {msg}\n")
        return 2


def _plugin(name: str):
    """The `planner NAME` command a package registers under the entry-point group planner.commands
    (pyproject.toml: calibrate = "calibrate.harness.cli:main"): planner itself never imports it."""
    from importlib.metadata import entry_points

    found = entry_points(group="planner.commands", name=name)
    if not found:
        raise InputError(f"{name}: no package registers this command (pip install -e '.[calibrate]' from the "
                         "planner checkout installs it)")
    return next(iter(found)).load()


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
