"""The command line's flags: argparse types for numbers, the flag groups, and the parser of every
subcommand (the handlers are planner/cli.py)."""

from __future__ import annotations

import argparse
import math
import re

from planner.bounds import help_text
from planner.errors import InputError

_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def count(text: str) -> float:
    """'70e9', '70B', '7.5e9', '1.5T', '4M' -> a finite positive float."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*", str(text).lower())
    if not m:
        raise argparse.ArgumentTypeError(f"expected a positive number such as 70e9 or 70B, got {text!r}")
    value = float(m.group(1)) * _SUFFIX.get(m.group(2), 1.0)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite positive number, got {text!r}")
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
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None


def number(text: str) -> float:
    """A finite number (range checks live in planner/bounds.py)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    value = number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit status 2."""

    def error(self, message):
        raise InputError(message)


def _h(text: str, key: str | None = None) -> str:
    return f"{text} {help_text(key)}" if key else text


# ---------------------------------------------------------------------------------------------
# flag groups shared by the subcommands (names frozen by tests/test_cli.py)

MODEL_FLAGS = ("model", "params", "layers", "hidden", "heads", "kv_heads", "ffn", "ffn_kind", "vocab", "tied_embeddings",
               "dropout", "experts", "experts_per_token", "shared_expert_ffn", "dense_layers", "dense_ffn", "moe_layer_step",
               "mtp_layers")
CLUSTER_FLAGS = ("gpu", "gpus", "gpus_per_node", "gpu_memory_gib", "peak_tflops", "hbm_gb_per_s", "intra_node_gb_per_s",
                 "inter_node_gb_per_s", "pcie_gb_per_s", "host_ram_gib", "nvme_gb_per_s", "calibration", "pod_gpus",
                 "oversubscription")
ZERO_FLAGS = ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size", "stage3_max_live_parameters",
              "stage3_max_reuse_distance", "stage3_param_persistence_threshold", "sub_group_size")


def add_model_flags(p):
    g = p.add_argument_group("model")
    g.add_argument("--model", help="catalog name (e.g. llama-3-70b) or a Hugging Face config.json path")
    g.add_argument("--params", type=count, help=_h("parameter count (70e9, 70B): derive a Llama-3-style shape", "params"))
    for key in ("layers", "hidden", "heads", "kv_heads", "ffn"):
        g.add_argument("--" + key.replace("_", "-"), type=positive_int, help=help_text(key))
    g.add_argument("--ffn-kind", choices=("gelu", "swiglu"))
    g.add_argument("--vocab", type=positive_int, help=help_text("vocab"))
    g.add_argument("--tied-embeddings", action=argparse.BooleanOptionalAction, default=None,
                   help="output layer shares the input embedding (default for a shape given by flags: tied for "
                        "--ffn-kind gelu, the GPT family; untied for swiglu, the Llama family)")
    g.add_argument("--dropout", action=argparse.BooleanOptionalAction, default=None,
                   help="hidden and attention dropout in training (Megatron-LM's own default, 0.1, and GPT-2/3's; "
                        "its 1-byte masks kept and the kernels' extra traffic; default: the catalog's or config's, "
                        "off for a shape given by flags)")
    g.add_argument("--experts", type=positive_int, help=_h("routed MLP experts per block (MoE; --ffn is each expert's width)", "experts"))
    g.add_argument("--experts-per-token", type=positive_int, help=_h("top-k experts per token", "experts_per_token"))
    g.add_argument("--shared-expert-ffn", type=non_negative_int,
                   help=_h("width of a shared expert every token passes (Qwen2-MoE style)", "shared_expert_ffn"))
    g.add_argument("--dense-layers", type=non_negative_int,
                   help=_h("first blocks with a dense MLP instead of experts (DeepSeek-V3 first_k_dense_replace)",
                           "dense_layers"))
    g.add_argument("--dense-ffn", type=non_negative_int, help=_h("MLP width of the dense blocks", "dense_ffn"))
    g.add_argument("--moe-layer-step", type=positive_int,
                   help=_h("every this-th block (after the dense-first ones) has the experts, the others a dense "
                           "MLP (Qwen decoder_sparse_step, Llama 4 interleave_moe_layer_step)", "moe_layer_step"))
    g.add_argument("--mtp-layers", type=non_negative_int,
                   help=_h("multi-token-prediction depths trained after the last block, on the last pipeline "
                           "stage (megatron --mtp-num-layers; DeepSeek-V3 and GLM-4.5 train 1: their configs' "
                           "num_nextn_predict_layers; default 0)", "mtp_layers"))
    g.add_argument("--seq-len", type=positive_int, help=_h("tokens per sequence (default 4096)", "seq_len"))


def add_cluster_flags(p):
    g = p.add_argument_group("cluster")
    g.add_argument("--gpu", help="a100-80gb, a100-40gb, h100-sxm, h100-pcie, h200, b200, l40s, mi300x (default h100-sxm)")
    g.add_argument("--gpus", type=positive_int, help=_h("total GPUs", "gpus"))
    g.add_argument("--gpus-per-node", type=positive_int, help=_h("default: the GPU type's usual node size", "gpus_per_node"))
    for key, text in (("gpu_memory_gib", "override device memory"),
                      ("peak_tflops", "override dense peak TFLOP/s of --precision"), ("hbm_gb_per_s", ""),
                      ("intra_node_gb_per_s", "GPU-GPU link per direction"),
                      ("inter_node_gb_per_s", "network per GPU per direction"), ("pcie_gb_per_s", ""),
                      ("host_ram_gib", "CPU memory per node"), ("nvme_gb_per_s", "NVMe bandwidth per node")):
        g.add_argument("--" + key.replace("_", "-"), type=positive_float, help=_h(text, key))
    g.add_argument("--pod-gpus", type=non_negative_int,
                   help=_h("GPUs under one non-blocking switch domain (default 0: the whole network is)", "pod_gpus"))
    g.add_argument("--oversubscription", type=positive_float,
                   help=_h("a pod's NIC bandwidth over its uplinks above the pod, e.g. 7 for 1:7 (default 1)",
                           "oversubscription"))
    g.add_argument("--calibration", metavar="NAME|PATH",
                   help="a measured profile whose fitted coefficients and error bands replace the priors: a path, or "
                        "a NAME, your own $PLANNER_HOME/calibration/NAME.json (else ${XDG_CONFIG_HOME:-~/.config}/planner/calibration/) "
                        "when there is one, else the shipped data/calibration/NAME.json; 'none' for the priors "
                        "(default)")


def add_training_flags(p):
    g = p.add_argument_group("training")
    g.add_argument("--gbs", type=positive_int, help=_h("global batch in sequences", "gbs"))
    g.add_argument("--precision", help="bf16, fp16, fp32, bf16-pure, fp8 (bf16 weights, FP8 block GEMMs; default bf16)")
    g.add_argument("--fp8-recipe", default=None,
                   help="FP8 scaling: delayed, tensorwise (megatron: TE; torchtitan 0.2: torchao), rowwise "
                        "(torchtitan), mxfp8 (Blackwell) (default: the engine's; implies --precision fp8)")
    g.add_argument("--fp8-param-gather", dest="fp8_param_gather", action="store_true", default=None,
                   help="megatron: FP8 parameters, all-gathered at 1 B each by the distributed optimizer "
                        "(the default with --precision fp8 and --zero 1, as NeMo's FP8 recipes run); torchtitan "
                        "with --fp8-recipe tensorwise: FSDP2's float8 all-gather (torchtitan 0.2.2)")
    g.add_argument("--no-fp8-param-gather", dest="fp8_param_gather", action="store_false",
                   help="megatron: bf16 parameters, TE's FP8 copy and transpose of each weight cached beside them")
    g.add_argument("--optimizer", help="adamw, sgd, adafactor, adam8bit (default adamw)")
    g.add_argument("--no-flash-attention", action="store_true")
    from planner.engines import NAMES
    from planner.inputs import DEFAULTS

    g.add_argument("--engine", default=None,
                   help=f"{', '.join(NAMES)} (default {DEFAULTS['engine']}; megatron-deepspeed with --tp, --cp or "
                        "--sequence-parallel, megatron with --vpp, --ep or --precision fp8)")
    g = p.add_argument_group("DeepSpeed buffers (zero_optimization fields)")
    # the rest of training's flags sit in this group too, in this order, as --help has listed them
    _add_deepspeed_buffer_flags(g)
    _add_engine_setting_flags(g)
    _add_memory_setting_flags(g)
    g.add_argument("--tokens", type=count, help=_h("training tokens: report days, GPU-hours and cost", "tokens"))
    g.add_argument("--price-per-gpu-hour", type=positive_float, help=help_text("price_per_gpu_hour"))


def _add_deepspeed_buffer_flags(g):
    """zero_optimization's buffer sizes and knobs, overlap_comm, contiguous gradients, the fp32 gradient
    accumulation of data_types."""
    for key in ZERO_FLAGS:
        kind = positive_int if key in ("reduce_bucket_size", "allgather_bucket_size", "sub_group_size") else non_negative_int
        g.add_argument("--" + key.replace("_", "-"), type=kind, help=help_text(key))
    g.add_argument("--overlap-comm", dest="overlap_comm", action="store_true", default=None)
    g.add_argument("--no-overlap-comm", dest="overlap_comm", action="store_false")
    g.add_argument("--no-contiguous-gradients", action="store_true")
    g.add_argument("--fp32-grad-accum", action="store_true", default=None,
                   help="DeepSpeed data_types.grad_accum_dtype fp32 (bf16 + ZeRO-1: BF16_Optimizer)")


def _add_engine_setting_flags(g):
    """How an engine runs its step: TP communication overlap, compile, the block's code, gradient
    precision, pipeline sends and split."""
    g.add_argument("--tp-comm-overlap", action="store_true", default=None,
                   help="Megatron --tp-comm-overlap (TransformerEngine): SP collectives pipelined with their GEMMs "
                        "(default: estimate on under --engine megatron with sequence parallelism, as NeMo's recipes "
                        "run it; recommend turns it on where it makes the fastest layout faster)")
    g.add_argument("--no-tp-comm-overlap", dest="tp_comm_overlap", action="store_false",
                   help="never turn on --tp-comm-overlap (e.g. without TransformerEngine)")
    g.add_argument("--compile", action="store_true", default=None,
                   help="torch.compile each Hugging Face block (Inductor): fused elementwise kernels, fewer launches, "
                        "what its partitioner saves (--engine deepspeed or fsdp, Llama-style dense blocks)")
    g.add_argument("--grad-reduce-in-bf16", action="store_true", default=None,
                   help="Megatron: keep and reduce gradients in bf16, not fp32 main grads (NeMo's performance recipes)")
    g.add_argument("--recompute-modules", default=None, metavar="M1,M2",
                   help="Megatron: what --recompute selective recomputes, of core_attn, moe_act, layernorm, "
                        "mla_up_proj, mlp, moe, shared_experts (default core_attn; NVIDIA's MoE recipes list several)")
    g.add_argument("--fsdp-mixed-precision", choices=("default", "pure"), default=None,
                   help="with --modules llm-foundry, Composer's FSDP mixed_precision: default (fp32 parameters under "
                        "autocast, llm-foundry's benchmark harness; the default) or pure (16-bit parameters, its yamls)")
    g.add_argument("--modules", choices=("hf", "hf-liger", "llm-foundry", "megatron", "torchtitan"), default=None,
                   help="whose transformer block is trained, apart from the engine: what it saves for backward and "
                        "how its loss holds the logits (default: the engine's own; Hugging Face engines train a GELU "
                        "shape given by flags as llm-foundry's MPT)")
    g.add_argument("--no-overlap-p2p", dest="overlap_p2p", action="store_false", default=None,
                   help="Megatron --no-overlap-p2p-communication: interleaved pipeline sends wait (default: they run "
                        "beside the next chunk's compute)")
    g.add_argument("--pp-edge-layers", type=int, choices=(0, 1), default=None,
                   help="blocks' worth the first and last pipeline stages give up for the embedding and the loss "
                        "(Megatron --account-for-embedding/loss-in-pipeline-split: 1; default: the engine's, or 1 "
                        "where only the blocks + 2 split evenly over the stated --pp x --vpp)")


def _add_memory_setting_flags(g):
    """What the allocator, the loss, the activation checkpoints, MoE capacity and the optimizer offload
    hold, and where."""
    g.add_argument("--expandable-segments", dest="expandable_segments", action="store_true", default=None,
                   help="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the launch: less of the allocator's "
                        "reserve lost to fragmentation (default: torchtitan's run_train.sh sets it, the others not)")
    g.add_argument("--no-expandable-segments", dest="expandable_segments", action="store_false")
    g.add_argument("--loss-chunks", type=positive_int, default=None,
                   help="torchtitan: sequence chunks its loss runs over (default 8, ChunkedLossWrapper num_chunks; "
                        "1 for torchtitan 0.2.2 and earlier, whose cross_entropy_loss held all the fp32 logits)")
    g.add_argument("--partition-activations", dest="partition_activations", action="store_true", default=None,
                   help="DeepSpeed activation_checkpointing.partition_activations (Megatron-DeepSpeed "
                        "--partition-activations): checkpointed layer inputs split over TP (default off, DeepSpeed's)")
    g.add_argument("--no-partition-activations", dest="partition_activations", action="store_false",
                   help="every TP rank keeps each checkpointed layer input whole (the default)")
    g.add_argument("--cpu-checkpointing", action="store_true", default=None,
                   help="checkpointed layer inputs wait in host memory: DeepSpeed activation_checkpointing.cpu_checkpointing "
                        "(megatron-deepspeed), transformers activation_checkpointing_enable(offload=True) (deepspeed, fsdp)")
    g.add_argument("--moe-capacity-factor", type=number, metavar="C",
                   help=_h("MoE expert capacity factor: each expert takes ceil(T k C / E) tokens, the rest dropped "
                           "(default: megatron-deepspeed's DeepSpeed-MoE 1.0, padded; dropless elsewhere; "
                           "--engine megatron or megatron-deepspeed)", "moe_capacity_factor"))
    g.add_argument("--moe-pad-to-capacity", action="store_true", default=None,
                   help="with --moe-capacity-factor under --engine megatron: pad every expert's input to its "
                        "capacity (Megatron --moe-pad-expert-input-to-capacity)")
    g.add_argument("--moe-grouped-gemm", action="store_true", default=None,
                   help="under --engine megatron: each expert matrix of the local experts as one grouped GEMM "
                        "(Megatron --moe-grouped-gemm, as NVIDIA's MoE recipes run; the default)")
    g.add_argument("--no-moe-grouped-gemm", dest="moe_grouped_gemm", action="store_false",
                   help="under --engine megatron: a GEMM per local expert (SequentialMLP, Megatron-LM's bare default)")
    g.add_argument("--optimizer-offload-fraction", type=number, metavar="F",
                   help=_h("with --offload-optimizer cpu under --engine megatron: the share of the optimizer partition "
                           "on the host, the rest stepping on the GPU (megatron-core --optimizer-offload-fraction; "
                           "default 1.0)", "optimizer_offload_fraction"))


LAYOUT_DEFAULTS = {"tp": 1, "pp": 1, "dp": None, "cp": 1, "ep": 1, "etp": None, "vpp": 1, "zero": 0, "offload_optimizer": "none",
                   "offload_params": "none", "mbs": 1, "recompute": "none", "recompute_layers": None,
                   "recompute_method": "block",
                   "sequence_parallel": None, "rank_order": "tp-cp-dp-pp"}
"""estimate's layout defaults; recommend takes the same flags with no default: each one given pins its axis."""


def add_layout_flags(g, pinning: bool):
    def default(key):
        return None if pinning else LAYOUT_DEFAULTS[key]

    pin = " (pins the axis; the search covers the rest)" if pinning else ""
    for key in ("tp", "pp", "dp", "cp", "ep", "vpp"):
        text = "default gpus/(tp*pp*cp)" if key == "dp" and not pinning else ""
        g.add_argument("--" + key, type=positive_int, default=default(key), help=_h(text + pin, key))
    g.add_argument("--etp", type=positive_int, default=default("etp"),
                   help=_h("TP ranks each routed expert splits over (megatron: 1 or --tp, --expert-tensor-parallel-size; "
                           "default the engine's)" + pin, "etp"))
    g.add_argument("--zero", type=int, default=default("zero"), choices=(0, 1, 2, 3), help=pin or None)
    g.add_argument("--offload-optimizer", default=default("offload_optimizer"), help="none, cpu, nvme" + pin)
    g.add_argument("--offload-params", default=default("offload_params"), help="none, cpu, nvme" + pin)
    g.add_argument("--mbs", type=positive_int, default=default("mbs"), help=_h(pin, "mbs"))
    g.add_argument("--recompute", default=default("recompute"), help="none, selective, full" + pin)
    g.add_argument("--recompute-layers", type=positive_int, default=None,
                   help=_h("with --recompute full: layers per model chunk recomputed, the rest keep their "
                           "activations (Megatron --recompute-method block; Hugging Face engines: every k-th layer, N = ceil(L/k)); "
                           "default every layer" + pin, "recompute_layers"))
    g.add_argument("--recompute-method", default=default("recompute_method"),
                   help="block, uniform: with --recompute-layers N, the first N layers of each chunk (block) or "
                        "every layer in checkpoints of N (uniform; Megatron --recompute-method)" + pin)
    g.add_argument("--sequence-parallel", action="store_true", default=default("sequence_parallel"),
                   help="Megatron sequence parallelism with TP (default: on under --engine megatron where --tp > 1, "
                        "as NeMo's recipes run it; off elsewhere)" + pin)
    g.add_argument("--no-sequence-parallel", dest="sequence_parallel", action="store_false",
                   help="no sequence parallelism" + pin)
    g.add_argument("--rank-order", default=default("rank_order"),
                   help="tp-cp-dp-pp (Megatron's default: pipeline stages farthest apart), tp-cp-pp-dp (Megatron-LM "
                        "--use-tp-pp-dp-mapping, Llama 3's: pipelines inside nodes and pods); --engine megatron" + pin)


def build_parser() -> Parser:
    p = Parser(prog="planner", description="Memory and throughput planner for distributed LLM training.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    e = sub.add_parser("estimate", help="memory and step time of one layout")
    add_model_flags(e)
    add_cluster_flags(e)
    add_training_flags(e)
    add_layout_flags(e.add_argument_group("layout"), pinning=False)
    e.add_argument("--schedule", default=None, help="1f1b, interleaved, gpipe, zb-h1 (default: interleaved when --vpp > 1)")
    e.add_argument("--ds-estimator", action="store_true", help="also print DeepSpeed's own estimator figures")
    e.add_argument("--emit", metavar="DIR", help="write ds_config.json, accelerate config and launch command")
    e.add_argument("--json", action="store_true", help="print the answer as one JSON object")

    r = sub.add_parser("recommend", help="fastest layout that fits")
    add_model_flags(r)
    add_cluster_flags(r)
    add_training_flags(r)
    r.add_argument("--tokens-per-step", type=count,
                   help=_h("global batch in tokens (default 4Mi = 4,194,304)", "tokens_per_step"))
    r.add_argument("--top", type=positive_int, help=_h("layouts to show (default 5)", "top"))
    r.add_argument("--memory-headroom", type=number,
                   help="fraction of GPU memory kept free (default 0.05) [a number >= 0 and < 1]")
    r.add_argument("--max-mbs", type=positive_int, help=_h("largest micro-batch tried (default 16)", "max_mbs"))
    add_layout_flags(r.add_argument_group("pinned layout axes"), pinning=True)
    r.add_argument("--emit", metavar="DIR",
                   help="write the recommended layout's ds_config.json, accelerate config and launch command")
    r.add_argument("--json", action="store_true", help="print the answer as one JSON object")

    k = sub.add_parser("check", help="predict and diagnose your own ds_config.json or Accelerate YAML")
    k.add_argument("dir", nargs="?", metavar="DIR", help="a directory --emit wrote: the same as --config DIR")
    k.add_argument("--config", metavar="PATH",
                   help="a DeepSpeed config (.json), an Accelerate config (.yaml), or a directory --emit wrote; a "
                        "plan.json there (or beside the config) gives the model, cluster, training and layout "
                        "the config cannot say, and the flags given here win over it")
    k.add_argument("--accelerate-launch", metavar="COMMAND",
                   help="instead of --config: an 'accelerate launch [--config_file F] [--use_deepspeed] ...' command line "
                        "(quoted), read as Accelerate does: the file's fields, the line's flags over them")
    add_model_flags(k)
    add_cluster_flags(k)
    g = k.add_argument_group("what the config does not say")
    g.add_argument("--tp", type=positive_int, help="Megatron-DeepSpeed tensor parallel size (default 1, or the plan's)")
    g.add_argument("--pp", type=positive_int, help="pipeline stages (DeepSpeed PipelineModule; default 1, or the plan's)")
    g.add_argument("--recompute", help="the script's activation checkpointing: none, selective, full (default none, "
                                       "or the plan's)")
    g.add_argument("--mbs", type=positive_int, help="the script's per-device batch, for an 'auto' micro-batch")
    k.add_argument("--no-deepspeed", action="store_true",
                   help="skip asking DeepSpeed's own config class (a child process; seconds) where it is installed")
    k.add_argument("--emit", metavar="DIR", help="write the closest better config's files")
    k.add_argument("--json", action="store_true")

    v = sub.add_parser("validate", help="predicted vs published runs")
    v.add_argument("--source", metavar="PREFIX",
                   help="only the published runs whose id starts with PREFIX (e.g. dgxc, mpt, narayanan2021)")
    v.add_argument("--json", action="store_true")

    c = sub.add_parser("calibrate", help="run, fit and report calibration profiles (python -m calibrate; needs torch)",
                       add_help=False)
    c.add_argument("rest", nargs=argparse.REMAINDER, help="calibrate's own arguments: run|fit|report PROFILE ...")
    return p
