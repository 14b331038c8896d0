"""`planner estimate | recommend | validate`: the command line. I/O lives here, formulas elsewhere.

Bad input prints one line naming the flag and exits with status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from planner.errors import InputError

_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def count(text: str) -> float:
    """'70e9', '70B', '7.5e9', '1.5T', '4M' -> float (positive)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*", str(text).lower())
    if not m:
        raise argparse.ArgumentTypeError(f"expected a positive number such as 70e9 or 70B, got {text!r}")
    value = float(m.group(1)) * _SUFFIX.get(m.group(2), 1.0)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = count(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value != int(value):
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(value)


def non_negative_int(text: str) -> int:
    if str(text).strip() == "0":
        return 0
    return positive_int(text)


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit status 2."""

    def error(self, message):
        raise InputError(message)


# ---------------------------------------------------------------------------------------------
# flag groups shared by the subcommands


def add_model_flags(p):
    g = p.add_argument_group("model")
    g.add_argument("--model", help="catalog name (e.g. llama-3-70b) or a Hugging Face config.json path")
    g.add_argument("--params", type=count, help="parameter count (70e9, 70B): derive a Llama-3-style shape")
    g.add_argument("--layers", type=positive_int)
    g.add_argument("--hidden", type=positive_int)
    g.add_argument("--heads", type=positive_int)
    g.add_argument("--kv-heads", type=positive_int)
    g.add_argument("--ffn", type=positive_int)
    g.add_argument("--ffn-kind", choices=("gelu", "swiglu"))
    g.add_argument("--vocab", type=positive_int)
    g.add_argument("--tied-embeddings", action="store_true", default=None)
    g.add_argument("--seq-len", type=positive_int, help="tokens per sequence (default 4096)")


def add_cluster_flags(p):
    g = p.add_argument_group("cluster")
    g.add_argument("--gpu", default="h100-sxm",
                   help="a100-80gb, a100-40gb, h100-sxm, h100-pcie, h200, b200, l40s, mi300x (default h100-sxm)")
    g.add_argument("--gpus", type=positive_int, help="total GPUs")
    g.add_argument("--gpus-per-node", type=positive_int, help="default: the GPU type's usual node size")
    g.add_argument("--gpu-memory-gib", type=positive_float, help="override device memory")
    g.add_argument("--peak-tflops", type=positive_float, help="override dense peak TFLOP/s of --precision")
    g.add_argument("--hbm-gb-per-s", type=positive_float)
    g.add_argument("--intra-node-gb-per-s", type=positive_float, help="GPU-GPU link per direction")
    g.add_argument("--inter-node-gb-per-s", type=positive_float, help="network per GPU per direction")
    g.add_argument("--pcie-gb-per-s", type=positive_float)
    g.add_argument("--host-ram-gib", type=positive_float, help="CPU memory per node")
    g.add_argument("--nvme-gb-per-s", type=positive_float, help="NVMe bandwidth per node")


def add_training_flags(p):
    g = p.add_argument_group("training")
    g.add_argument("--gbs", type=positive_int, help="global batch in sequences")
    g.add_argument("--precision", default="bf16", help="bf16, fp16, fp32, bf16-pure")
    g.add_argument("--optimizer", default="adamw", help="adamw, sgd, adafactor, adam8bit")
    g.add_argument("--no-flash-attention", action="store_true")
    g.add_argument("--engine", default=None, help="deepspeed, megatron-deepspeed, megatron, fsdp")
    g = p.add_argument_group("DeepSpeed buffers (zero_optimization fields)")
    g.add_argument("--reduce-bucket-size", type=positive_int)
    g.add_argument("--allgather-bucket-size", type=positive_int)
    g.add_argument("--stage3-prefetch-bucket-size", type=non_negative_int)
    g.add_argument("--stage3-max-live-parameters", type=non_negative_int)
    g.add_argument("--stage3-max-reuse-distance", type=non_negative_int)
    g.add_argument("--stage3-param-persistence-threshold", type=non_negative_int)
    g.add_argument("--sub-group-size", type=positive_int)
    g.add_argument("--overlap-comm", dest="overlap_comm", action="store_true", default=None)
    g.add_argument("--no-overlap-comm", dest="overlap_comm", action="store_false")
    g.add_argument("--no-contiguous-gradients", action="store_true")
    g.add_argument("--tokens", type=count, help="training tokens: report days, GPU-hours and cost")
    g.add_argument("--price-per-gpu-hour", type=positive_float)


def build_parser() -> Parser:
    p = Parser(prog="planner", description="Memory and throughput planner for distributed LLM training.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    e = sub.add_parser("estimate", help="memory and step time of one layout")
    add_model_flags(e)
    add_cluster_flags(e)
    add_training_flags(e)
    g = e.add_argument_group("layout")
    g.add_argument("--tp", type=positive_int, default=1)
    g.add_argument("--pp", type=positive_int, default=1)
    g.add_argument("--dp", type=positive_int, help="default gpus/(tp*pp*cp)")
    g.add_argument("--cp", type=positive_int, default=1)
    g.add_argument("--ep", type=positive_int, default=1)
    g.add_argument("--vpp", type=positive_int, default=1)
    g.add_argument("--schedule", default=None, help="1f1b, interleaved, gpipe (default: interleaved when --vpp > 1)")
    g.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3))
    g.add_argument("--offload-optimizer", default="none", help="none, cpu, nvme")
    g.add_argument("--offload-params", default="none", help="none, cpu, nvme")
    g.add_argument("--mbs", type=positive_int, default=1)
    g.add_argument("--recompute", default="none", help="none, selective, full")
    g.add_argument("--sequence-parallel", action="store_true")
    e.add_argument("--ds-estimator", action="store_true", help="also print DeepSpeed's own estimator figures")
    e.add_argument("--emit", metavar="DIR", help="write ds_config.json, accelerate config and launch command")
    e.add_argument("--json", action="store_true")

    r = sub.add_parser("recommend", help="fastest layout that fits")
    add_model_flags(r)
    add_cluster_flags(r)
    add_training_flags(r)
    r.add_argument("--tokens-per-step", type=count, help="global batch in tokens (default 4Mi = 4,194,304)")
    r.add_argument("--top", type=positive_int, default=5)
    r.add_argument("--memory-headroom", type=fraction, default=0.05,
                   help="fraction of GPU memory kept free (default 0.05)")
    r.add_argument("--max-mbs", type=positive_int, default=16)
    r.add_argument("--emit", metavar="DIR")
    r.add_argument("--json", action="store_true")

    v = sub.add_parser("validate", help="predicted vs published runs")
    v.add_argument("--json", action="store_true")
    return p


# ---------------------------------------------------------------------------------------------
# turning flags into model / cluster / training


def resolve_model(args):
    from planner import model as M

    overrides = {k: getattr(args, k) for k in ("layers", "hidden", "heads", "kv_heads", "ffn", "ffn_kind", "vocab",
                                               "tied_embeddings")}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if args.model and args.params:
        raise InputError("--model and --params: give one of them, not both")
    if args.model:
        spec = M.from_hf_config(args.model) if args.model.endswith(".json") else M.lookup(args.model)
        return M.with_overrides(spec, **overrides)
    if args.params:
        return M.derive_shape(args.params, **overrides)
    needed = ("layers", "hidden", "heads", "vocab")
    missing = [k for k in needed if k not in overrides]
    if missing:
        raise InputError("--model: give --model NAME|config.json, --params N, or a full shape "
                         f"(missing {', '.join('--' + m.replace('_', '-') for m in missing)})")
    heads = overrides["heads"]
    overrides.setdefault("kv_heads", heads)
    kind = overrides.setdefault("ffn_kind", "swiglu")
    overrides.setdefault("ffn", 4 * overrides["hidden"] if kind == "gelu" else M.llama3_ffn(overrides["hidden"]))
    overrides.setdefault("tied_embeddings", False)
    return M.ModelSpec(name="custom", source="shape given by flags", **overrides)


def resolve_cluster(args, default_gpus: int):
    from planner import hardware as H

    gpu = H.lookup_gpu(args.gpu)
    precision = "bf16" if args.precision in ("bf16", "bf16-pure") else args.precision
    peak = dict(gpu.peak_flops_per_s)
    if args.peak_tflops:
        peak[precision] = args.peak_tflops * 1e12
    gpu = H.with_overrides(
        gpu,
        memory_bytes=int(args.gpu_memory_gib * 2**30) if args.gpu_memory_gib else None,
        peak_flops_per_s=peak,
        hbm_bytes_per_s=args.hbm_gb_per_s and args.hbm_gb_per_s * 1e9,
        intra_node_bytes_per_s=args.intra_node_gb_per_s and args.intra_node_gb_per_s * 1e9,
        inter_node_bytes_per_s=args.inter_node_gb_per_s and args.inter_node_gb_per_s * 1e9,
        pcie_bytes_per_s=args.pcie_gb_per_s and args.pcie_gb_per_s * 1e9,
        host_ram_bytes_per_node=int(args.host_ram_gib * 2**30) if args.host_ram_gib else None,
        nvme_bytes_per_s_per_node=args.nvme_gb_per_s and args.nvme_gb_per_s * 1e9,
    )
    num = args.gpus or default_gpus
    per_node = args.gpus_per_node or min(gpu.gpus_per_node, num)
    return H.Cluster(gpu=gpu, num_gpus=num, gpus_per_node=per_node)


def resolve_training(args, gbs: int, default_engine: str):
    from planner.layout import ZeroConfig, Training

    zc = {k: getattr(args, k) for k in ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size",
                                        "stage3_max_live_parameters", "stage3_max_reuse_distance",
                                        "stage3_param_persistence_threshold", "sub_group_size", "overlap_comm")}
    zc = {k: v for k, v in zc.items() if v is not None}
    if args.no_contiguous_gradients:
        zc["contiguous_gradients"] = False
    return Training(seq_len=args.seq_len or 4096, gbs=gbs, precision=args.precision.lower(),
                    optimizer=args.optimizer.lower(), flash_attention=not args.no_flash_attention,
                    engine=(args.engine or default_engine).lower(), zero_config=ZeroConfig(**zc))


# ---------------------------------------------------------------------------------------------
# commands


def cmd_estimate(args, out) -> int:
    from planner import layout as Lmod
    from planner import report

    cp, tp, pp = args.cp, args.tp, args.pp
    if args.dp is None:
        if args.gpus and args.gpus % (tp * pp * cp):
            raise InputError(f"--gpus: {args.gpus} is not divisible by --tp*--pp*--cp = {tp * pp * cp}")
        dp = (args.gpus or tp * pp * cp) // (tp * pp * cp)
    else:
        dp = args.dp
    default_gpus = tp * pp * cp * dp
    if args.gpus and args.gpus != default_gpus:
        raise InputError(f"--gpus: {args.gpus} != --tp*--pp*--dp*--cp = {default_gpus}")
    gbs = args.gbs or args.mbs * dp
    if gbs % (args.mbs * dp):
        raise InputError(f"--gbs: {gbs} is not divisible by --mbs*--dp = {args.mbs * dp}")
    model = resolve_model(args)
    default_engine = "megatron" if args.vpp > 1 else "megatron-deepspeed" if max(tp, cp) > 1 else "deepspeed"
    training = resolve_training(args, gbs, default_engine)
    cluster = resolve_cluster(args, default_gpus)
    lay = Lmod.single(tp=tp, pp=pp, dp=dp, cp=cp, ep=args.ep, vpp=args.vpp, zero=args.zero,
                      offload_optimizer=args.offload_optimizer, offload_params=args.offload_params,
                      mbs=args.mbs, gas=gbs // (args.mbs * dp), recompute=args.recompute,
                      sequence_parallel=args.sequence_parallel, schedule=args.schedule)
    Lmod.check_single(model, cluster, training, lay)
    ev = report.evaluate(model, cluster, training, lay)
    record = report.layout_record(model, cluster, training, lay, ev, 0, with_stages=True)
    result = {"model": model.shape_dict(), "cluster": cluster_dict(cluster), "training": training_dict(training), **record}
    result["memory"]["per_stage"] = record["memory"]["per_stage"]
    if args.tokens:
        result["time_to_train"] = train_time(args, result, cluster)
    if args.ds_estimator:
        result["deepspeed_estimator"] = ds_estimator(model, cluster)
    if args.emit:
        from planner import export
        result["emitted"] = [str(p) for p in export.emit(args.emit, model, cluster, training, record["layout"])]
    if args.json:
        out.write(json.dumps(result, indent=1) + "\n")
        return 0
    out.write(describe(model, cluster, training) + "\n\n")
    out.write(report.memory_table(result, cluster.gpu.memory_bytes) + "\n")
    out.write(f"peak rank total {report.gib(result['memory']['gpu_bytes'])} GiB at the {result['memory']['peak_phase']} peak"
              f"; CPU per node {report.gib(result['memory']['cpu_bytes_per_node'])} GiB"
              f" -> {'fits' if result['memory']['fits'] else 'DOES NOT FIT'}\n\n")
    out.write(time_text(result) + "\n")
    if args.tokens:
        out.write(train_time_text(result["time_to_train"]) + "\n")
    if args.ds_estimator:
        out.write(ds_estimator_text(result["deepspeed_estimator"]) + "\n")
    if args.emit:
        out.write("wrote " + ", ".join(result["emitted"]) + "\n")
    return 0


def cluster_dict(cluster) -> dict:
    return {"gpu": cluster.gpu.name, "num_gpus": cluster.num_gpus, "gpus_per_node": cluster.gpus_per_node,
            "num_nodes": cluster.num_nodes, "memory_bytes": cluster.gpu.memory_bytes}


def training_dict(training) -> dict:
    from dataclasses import asdict
    return asdict(training)


def describe(model, cluster, training) -> str:
    return (f"model {model.name}: {model.params:,} params, L={model.layers} h={model.hidden} a={model.heads} "
            f"kv={model.kv_heads} ffn={model.ffn} ({model.ffn_kind}) V={model.vocab}\n"
            f"cluster {cluster.num_gpus} x {cluster.gpu.name} ({cluster.gpus_per_node} per node, "
            f"{cluster.gpu.memory_bytes / 2**30:.1f} GiB each); seq {training.seq_len}, {training.precision}, "
            f"{training.optimizer}, engine {training.engine}, flash attention {'on' if training.flash_attention else 'off'}")


def time_text(record) -> str:
    t, th = record["time"], record["throughput"]
    parts = ", ".join(f"{k} {v:.3f}" for k, v in t["breakdown"].items() if v > 0)
    return (f"step {t['step_s']:.3f} s ({parts})\n"
            f"{th['tokens_per_s']:,.0f} tokens/s, {th['model_tflops_per_gpu']:.0f} model TFLOP/s per GPU, "
            f"MFU {th['mfu']:.1%}, HFU {th['hfu']:.1%}")


def train_time(args, record, cluster) -> dict:
    from planner import timing
    tokens_per_step = record["layout"]["gbs"] * record["training"]["seq_len"]
    return timing.time_to_train(record["time"]["step_s"], tokens_per_step, args.tokens, cluster.num_gpus,
                                args.price_per_gpu_hour)


def train_time_text(tt) -> str:
    text = f"time to train: {tt['days']:.1f} days, {tt['gpu_hours']:,.0f} GPU-hours"
    if tt.get("cost") is not None:
        text += f", cost {tt['cost']:,.0f}"
    return text


def ds_estimator(model, cluster) -> dict:
    from planner import deepspeed_estimator as D
    rows = {}
    kw = dict(num_gpus_per_node=cluster.gpus_per_node, num_nodes=cluster.num_nodes)
    for off in (False, True):
        g, c = D.zero2_model_states_bytes(model.params, cpu_offload=off, **kw)
        rows[f"zero2_offload_{str(off).lower()}"] = {"gpu_bytes": int(g), "cpu_bytes_per_node": int(c)}
    for off, offp in ((False, False), (True, False), (True, True)):
        g, c = D.zero3_model_states_bytes(model.params, model.largest_layer_params, cpu_offload=off,
                                          cpu_offload_params=offp, **kw)
        rows[f"zero3_offload_{str(off).lower()}_params_{str(offp).lower()}"] = {"gpu_bytes": int(g),
                                                                                 "cpu_bytes_per_node": int(c)}
    return rows


def ds_estimator_text(rows) -> str:
    lines = ["DeepSpeed's own estimator (model states only; GiB per GPU / per node CPU):"]
    lines += [f"  {k}: {v['gpu_bytes'] / 2**30:.2f} / {v['cpu_bytes_per_node'] / 2**30:.2f}" for k, v in rows.items()]
    return "\n".join(lines)


def cmd_recommend(args, out) -> int:
    from planner import search

    return search.run_cli(args, out)


def cmd_validate(args, out) -> int:
    from planner import validate

    return validate.run_cli(args, out)


def main(argv=None, out=None) -> int:
    out = out or sys.stdout
    try:
        args = build_parser().parse_args(argv)
        command = {"estimate": cmd_estimate, "recommend": cmd_recommend, "validate": cmd_validate}[args.command]
        return command(args, out)
    except InputError as exc:
        msg = str(exc).splitlines()[0] if str(exc) else "invalid input"
        sys.stderr.write(f"planner: error: {msg}\n")
        return 2


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
