"""The published-run corpus (data/references/corpus_runs.json): each row read as planner inputs and
answered in-process (estimate, or recommend for a row without a layout).

A row is read the way the corpus's own scorer reads it, so `planner validate` and that judge agree,
except where a row states what ran that the scorer's command line leaves at the planner's default
(the FP8 recipe, and the loss of torchtitan releases older than the planner's): the GPU from the
row's words (torchtitan's 96 GB H100: h100-sxm with 95 GiB); bf16 unless the notes say pure bf16
or fp16; FP8 rows with their recipe (fp8_recipe); the engine stated, else
from the source (MosaicML, FSDP, IBM: fsdp; torchtitan; BLOOM, DeepSpeed: megatron-deepspeed; else
megatron), FSDP without a stated sharding FULL_SHARD; a SwiGLU MLP for Llama-like sources except
Nemotron (squared ReLU: two matrices, as GELU); MoE rows as catalog models with EP/ETP from the
notes; BLOOM prequel rows with full recompute and the 250,880 vocabulary; rows without a layout
answered by `recommend`'s top layout. A row the planner cannot be asked about, or that it refuses,
is listed with the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache

from planner import layout, planning
from planner.data import catalog
from planner.engines import Buffers, lookup as engine_lookup
from planner.errors import InputError
from planner.inputs import ClusterInput, LayoutInput, ModelInput, TrainingInput

MOE_MODELS = {"deepseekv3": "deepseek-v3", "qwen3_30b_a3b": "qwen3-30b-a3b", "qwen3_235b_a22b": "qwen3-235b-a22b",
              "gptoss120b": "gpt-oss-120b", "mixtral-8x7b": "mixtral-8x7b", "mixtral-8x22b": "mixtral-8x22b"}
"""Row-id words of MoE runs -> catalog model names."""
ENGINES = ("deepspeed", "megatron", "megatron-deepspeed", "fsdp", "torchtitan")
BLOOM_VOCAB = 250880  # BLOOM's tokenizer (BigScience, bloom-176b config.json vocab_size)
H100_96GB_GIB = 95  # torchtitan's 96 GB HBM2e H100: 95.0 GiB usable (its logs print 47.65 GiB as 50.16 %)
DEFAULT_VOCAB = 51200  # Megatron GPT's padded GPT-2 vocabulary, where a row gives none


def load_rows() -> list[dict]:
    """The corpus rows, each with its own `source`."""
    return catalog("references/corpus_runs.json")["rows"]


def prefix(row: dict) -> str:
    return row["id"].split("-")[0]


@lru_cache(maxsize=None)
def accepts(precision: str = "bf16", gpu: str = "h100-sxm") -> bool:
    """Whether the planner takes this precision / GPU word at all (a 1B model on 8 GPUs)."""
    try:
        planning.estimate(1e9, {"gpus": 8, "gpu": gpu}, {"precision": precision})
        return True
    except InputError:
        return False


def notes(row: dict) -> str:
    """The row's notes with its stated precision appended (some rows state it only there)."""
    return (row.get("notes") or "") + (" precision=" + row["precision"] if row.get("precision") else "")


def gpu_name(row: dict) -> str | None:
    """Catalog GPU of a row's words (h100-96gb: torchtitan's 96 GB H100), None where none fits."""
    g = (row["gpu"] or "").lower()
    if "96gb" in g:
        return "h100-96gb"
    for word in ("gb200", "gb300"):
        if word in g:
            return word if accepts(gpu=word) else None
    for word, name in (("h200", "h200"), ("b200", "b200"), ("mi300x", "mi300x"), ("h100", "h100-sxm")):
        if word in g:
            return name
    if "80gb" in g and "a100" in g:
        return "a100-80gb"
    if "40gb" in g:
        return "a100-40gb"
    return "a100-80gb" if "a100" in g or "ampere" in g else None


RECIPES = {"dgxc-nemotron4-340B-bf16": {"precision": "bf16-pure", "overlap_p2p": False},
           "dgxc-deepseekv3-671B-bf16": {"recompute": "selective", "recompute_modules": ["mla_up_proj"],
                                         "moe_grouped_gemm": True},
           "dgxc-gpt3-175B-bf16": {"dropout": True},
           "mem-megatron-ci-7b": {"dropout": True}}
"""What a row's recipe sets that its row does not state, by row id prefix. NVIDIA dgxc-benchmarking
v24.11.1 (35a9aec) nemotron/nemotron4-340b-synth.yaml: optim.dtype and grad_sync_dtype bf16, so
NeMo's megatron_base_model.py setup_optimization gives Apex's DistributedFusedAdam bf16 moments and
store_params False (apex/contrib/optimizers/distributed_fused_adam.py StateBucket), read as
bf16-pure (whose megatron record keeps a 2-byte master remainder besides, sharding.py: the reading
books slightly more than the recipe held); overlap_p2p_comm False, its interleaved sends waited.
dgxc-benchmarking v25.05 (68eaf7e) deepseek_v3/pretraining/launch.sh on h100: --recompute_modules
mla_up_proj (NeMo's pretrain_deepseek_v3.py: selective granularity over that list alone), through
NeMo's DeepSeekV3Config (nemo/collections/llm/gpt/model/deepseek.py: moe_grouped_gemm True).
Dropout: dgxc-benchmarking v24.11.1 nemo_megatron/gpt3_175b_hydra.yaml hidden_dropout and
attention_dropout 0.1; Megatron-LM's CI model_config.yaml sets neither, so Megatron-LM's own 0.1
(d98e8a6 megatron/core/transformer/transformer_config.py TransformerConfig.hidden_dropout,
attention_dropout)."""


def recipe(row: dict) -> dict:
    """The settings RECIPES gives the row ({} for most)."""
    return next((v for k, v in RECIPES.items() if row["id"].startswith(k)), {})


def precision(row: dict) -> str | None:
    """bf16, bf16-pure, fp16, or fp8 (None while the planner does not take fp8): the row's own
    `precision` where it states one (the measured-peak rows: their notes name the FP8 rows of the
    same table beside a bf16 one), else as its notes and id read."""
    stated = (row.get("precision") or "").lower()
    n, ident = (stated or notes(row).lower()), row["id"]
    if stated and "fp8" not in stated and "float8" not in stated:
        ident = ""  # stated bf16: the id's words do not override it
    if "fp8" in n or "float8" in n or "float8" in ident or "fp8" in ident:
        return "fp8" if accepts("fp8") else None
    if "pure bf16" in n or recipe(row).get("precision") == "bf16-pure":
        return "bf16-pure"
    return "fp16" if "fp16" in n and "bf16" not in n else "bf16"


UNCOMPILED_LOSS_COMMITS = ("9dec370", "031f73f8")
"""torchtitan commits of corpus rows from before it compiled its loss with the model (bbb1b616e,
2025-04-02): 9dec370 (2024-12-26) and 031f73f8 (2025-02-27)."""


def torchtitan_loss_chunks(row: dict) -> int | None:
    """--loss-chunks for a torchtitan row: 1 where its loss held the whole fp32 logits, as
    cross_entropy_loss's pred.float() does eagerly (torchtitan e7c0cae components/loss.py): without
    torch.compile, or at a commit from before build_cross_entropy_loss compiled it under
    training.compile; else the engine's default (a compiled loss, like the chunked one of torchtitan
    0.3.0, never holds the whole sequence's fp32 logits)."""
    text = row["source"] + " " + notes(row)
    commit = re.search(r"torchtitan (?:commit |[0-9.]+ \(.*?checked at torchtitan )?([0-9a-f]{7,8})\b", text)
    compiled = "compile" in (row["id"] + " " + text).lower()
    return 1 if not compiled or (commit and commit.group(1) in UNCOMPILED_LOSS_COMMITS) else None


def fp8_all_gather(row: dict, engine: str, recipe: str | None) -> bool | None:
    """True where a torchtitan tensorwise row says its FSDP all-gather moved float8 (torchtitan 0.2.2
    enable_fsdp_float8_all_gather); else the engine's default (None)."""
    words = " ".join((row["id"], row["source"], row.get("precision") or "", notes(row))).lower()
    said = re.search(r"(fp8|float8)( fsdp)? all-?gather", words)
    return True if engine_lookup(engine).fp8_library == "torchao" and recipe == "tensorwise" and said else None


def fp8_recipe(row: dict, engine: str) -> str | None:
    """The FP8 scaling recipe a row ran: the one its id, precision or notes name; else, for
    torchtitan rows (every one from torchtitan 0.2.2 or earlier), tensorwise, the default of
    those releases (torchtitan v0.2.2 components/quantization/float8.py Float8LinearConverter:
    recipe_name None is torchao's tensorwise Float8LinearConfig); else the engine's default (None)."""
    words = " ".join((row["id"], row.get("precision") or "", notes(row))).lower()
    named = [r for r in ("tensorwise", "rowwise", "mxfp8") if r in words]
    if len(named) == 1:
        return named[0]
    return "tensorwise" if engine_lookup(engine).fp8_library == "torchao" and not named else None


def composer_mixed_precision(row: dict) -> str | None:
    """Composer's FSDP mixed precision a MosaicML row states in its table's 'MP Mode' column
    (llm-foundry 4952183 scripts/train/benchmarking/README.md: PURE for the A100 40GB table, DEFAULT
    elsewhere), as Training.fsdp_mixed_precision reads it; None (the engine's default) where unstated."""
    stated = re.search(r"MP mode (PURE|DEFAULT)", notes(row))
    return stated.group(1).lower() if stated else None


def is_moe(row: dict) -> bool:
    return bool(re.search(r"moe|mixtral|deepseek|gptoss|_a3b|_a22b", row["id"].lower())
                or re.search(r"EP=([2-9]|\d\d)", notes(row)))


def layoutless(row: dict) -> bool:
    """No layout stated, only an MFU: `recommend` answers."""
    return row["tp"] is None and row["pp"] is None and row["dp"] is None and bool(row["measured"].get("mfu"))


def engine_for(row: dict) -> str:
    if row.get("engine") in ENGINES:
        return row["engine"]
    s = (row["id"] + " " + row["source"]).lower()  # the row's words name its engine
    if re.search(r"torchtitan", s):
        return "torchtitan"
    if row.get("engine") == "other" or re.search(r"mpt|mosaic|fsdp|ibm", s):
        return "fsdp"
    return "megatron-deepspeed" if re.search(r"bloom|bigscience|deepspeed", s) else "megatron"


@dataclass(frozen=True)
class Reading:
    """One row as the planner is asked about it: `command` estimate or recommend with its inputs,
    or `reason` why it cannot be asked."""

    id: str
    source: str
    engine: str
    command: str | None = None
    model: ModelInput | None = None
    cluster: ClusterInput | None = None
    training: TrainingInput | None = None
    layout: LayoutInput | None = None
    reason: str | None = None


def read(row: dict) -> Reading:
    """The planner inputs of one corpus row (module docstring), or the reason there are none."""
    base = Reading(row["id"], prefix(row), engine_for(row))
    g, p, why = gpu_name(row), precision(row), []
    if g is None:
        why.append(f"GPU {row['gpu']!r} is not in the planner's catalog")
    if p is None:
        why.append("read as an FP8 run (fp8/float8 in its id or notes); the planner does not accept --precision fp8")
    if is_moe(row):
        name = next((v for k, v in MOE_MODELS.items() if k in row["id"].lower()), None)
        why += ["MoE model not in the catalog"] * (name is None) + ["no global batch"] * (not row.get("gbs"))
        if why:
            return replace(base, reason="; ".join(why))
        ep, etp = (re.search(rf"{k}=(\d+)", notes(row)) for k in ("EP", "ETP"))
        tp = row["tp"] or 1
        return replace(base, command="estimate", model=ModelInput(name=name),
                       cluster=ClusterInput(gpu=g, gpus=row["num_gpus"]),
                       training=TrainingInput(seq_len=row["seq_len"] or 4096, gbs=row["gbs"], precision=p,
                                              recompute_modules=recipe(row).get("recompute_modules"),
                                              moe_grouped_gemm=recipe(row).get("moe_grouped_gemm")),
                       layout=LayoutInput(tp=tp, pp=row["pp"] or 1, cp=row["cp"] or 1, mbs=row["mbs"] or 1, zero=1,
                                          recompute=recipe(row).get("recompute", "none"),
                                          ep=int(ep.group(1)) if ep else 1, etp=int(etp.group(1)) if etp else None,
                                          vpp=row["vpp"] or 1, sequence_parallel=True if tp > 1 else None))
    if row["id"].startswith("bloom-prequel"):  # ran with activation checkpointing and BLOOM's vocabulary
        row = dict(row, recompute=row["recompute"] or "full", vocab=row["vocab"] or BLOOM_VOCAB)
    need = ["layers", "hidden", "heads", "seq_len", "num_gpus", "gbs"] + ["mbs"] * row["id"].startswith("torchtitan")
    missing = [k for k in need if row[k] in (None, 0)]
    if missing:
        why.append("the source does not give " + ", ".join(missing))
    tp, pp, cp = row["tp"] or 1, row["pp"] or 1, row["cp"] or 1
    dp = row["dp"] or (row["num_gpus"] or 0) // (tp * pp * cp)
    if not layoutless(row) and not missing and tp * pp * cp * dp != row["num_gpus"]:
        why.append(f"layout does not multiply out: tp {tp} x pp {pp} x cp {cp} x dp {dp} != {row['num_gpus']} GPUs")
    if why:
        return replace(base, reason="; ".join(why))
    llama_like = re.search(r"llama|mistral|nemotron|mixtral|qwen|torchtitan", row["id"] + row["source"].lower())
    kind = "swiglu" if llama_like and "nemotron" not in row["id"] else "gelu"
    model = ModelInput(layers=row["layers"], hidden=row["hidden"], heads=row["heads"],
                       kv_heads=row["kv_heads"] or row["heads"], ffn=row["ffn"] or 4 * row["hidden"], ffn_kind=kind,
                       vocab=row["vocab"] or DEFAULT_VOCAB, dropout=recipe(row).get("dropout"),
                       # Megatron-LM's launch flag, where the row gives its command line; else the engine's default
                       tied_embeddings=False if "--untie-embeddings-and-output-weights" in notes(row) else None)
    cluster = ClusterInput(gpu=g.replace("h100-96gb", "h100-sxm"), gpus=row["num_gpus"],
                           gpus_per_node=row["gpus_per_node"] or 8)
    if layoutless(row):
        return replace(base, command="recommend", model=model, cluster=cluster,
                       training=TrainingInput(seq_len=row["seq_len"], gbs=row["gbs"], precision=p))
    # no stage stated: FSDP's full shard where the engine is FSDP2, else ZeRO-1 / the distributed optimizer
    fsdp = engine_lookup(base.engine).buffers is Buffers.FSDP
    zero = row["zero_stage"] if row["zero_stage"] is not None else 3 if fsdp else 1
    recompute = {"partial-blocks": "full", None: "none"}.get(row["recompute"], str(row["recompute"]).split(" ")[0])
    return replace(base, command="estimate", model=model,
                   cluster=replace(cluster, gpu_memory_gib=H100_96GB_GIB) if g == "h100-96gb" else cluster,
                   training=TrainingInput(seq_len=row["seq_len"], gbs=row["gbs"], precision=p,
                                          fp8_recipe=fp8_recipe(row, base.engine) if p == "fp8" else None,
                                          fp8_param_gather=fp8_all_gather(row, base.engine, fp8_recipe(row, base.engine))
                                          if p == "fp8" else None,
                                          loss_chunks=torchtitan_loss_chunks(row)
                                          if engine_lookup(base.engine).loss_chunks > 1 else None,
                                          flash_attention=row["flash_attention"] is not False,
                                          fsdp_mixed_precision=composer_mixed_precision(row),
                                          overlap_p2p=recipe(row).get("overlap_p2p")),
                   layout=LayoutInput(tp=tp, pp=pp, dp=dp, cp=cp, vpp=row["vpp"] or 1, mbs=row["mbs"] or 1, zero=zero,
                                      recompute=recompute,
                                      # stated on or off as stated; not stated: the engine's default
                                      sequence_parallel=row["sequence_parallel"] if tp > 1 else None))


@dataclass(frozen=True)
class Answer:
    """The planner's answer to one reading: its layout record ({} where recommend found nothing),
    the engine it ran, and what re-evaluates it under other coefficients; or the refusal."""

    reading: Reading
    record: dict | None = None
    engine: str | None = None
    setup: tuple | None = None
    """(model spec, cluster, training, one-layout Layouts)."""
    refusal: str | None = None


def ask(reading: Reading) -> Answer:
    """Estimate or recommend in-process; an engine the planner refuses for this row is dropped for
    its default, as the judge does; any other refusal is the answer."""
    engine = reading.engine
    while True:
        try:
            training = replace(reading.training, engine=engine)
            if reading.command == "recommend":
                r = planning.recommend(reading.model, reading.cluster, training, top=1)
                rec = r.layouts[0] if r.layouts else {}
                model, cluster, train = r.model, r.cluster, r.training
            else:
                e = planning.estimate(reading.model, reading.cluster, training, reading.layout)
                rec, model, cluster, train = e.record, e.model, e.cluster, e.training
            setup = None
            if rec:
                row = rec["layout"]
                lay = layout.single(**{k: row[k] for k in layout.FIELDS if k != "recompute_method"},
                                    recompute_method=row["recompute_method"] or "block")
                setup = (model, cluster, train, lay)
            return Answer(reading, rec, train.engine.name, setup)
        except InputError as exc:
            if engine is not None and "--engine" in str(exc):
                engine = None
                continue
            return Answer(reading, refusal=str(exc).splitlines()[0] if str(exc) else "refused")
