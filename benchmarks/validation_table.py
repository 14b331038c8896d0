"""Write docs/validation.md: `python benchmarks/validation_table.py` (no torch; about 5 s).

Runs `planner validate` in-process (planner.api.validate: the paper figures of
data/references/published_runs.json and the published-run corpus of data/references/corpus_runs.json)
and writes every table from that answer, so the page is regenerated, never edited, after the
model changes. Prints the corpus summary line and how long the validation took.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner import api, corpus_score, report  # noqa: E402

HOW_ROWS_ARE_READ = """\
Every row of `data/references/corpus_runs.json` names its source (a paper table, a README at a
commit, a docs page, a blog, CI golden values). `planner/corpus_rows.py` reads each row into the
planner's inputs and asks `planner.api` in-process, the same reading for every row:

- **GPU** from the row's words: H100 -> `h100-sxm`; torchtitan's 96 GB HBM2e H100 (500 W) ->
  `h100-sxm` with 95 GiB; H200, B200, MI300X by name; A100 40 GB / 80 GB (A100 without a size:
  80 GB). A GPU the planner's catalog lacks makes the row not expressible.
- **Precision** bf16, unless the notes say pure bf16 (`bf16-pure`) or fp16 without bf16 (`fp16`).
  DGX Cloud's Nemotron-4 340B bf16 recipe keeps bf16 optimizer moments and no fp32 copy
  (its YAML's `optim.dtype: bf16`): read as `bf16-pure`, with its interleaved pipeline sends
  waited (`overlap_p2p_comm: False`, `--no-overlap-p2p`).
  A row whose id or notes name fp8 / float8 is an FP8 run (`--precision fp8`) with the recipe it
  names (tensorwise, rowwise, mxfp8), else the engine's default; torchtitan rows that name none
  ran tensorwise, the default of torchtitan 0.2.2 and earlier.
- **Composer's FSDP mixed precision** (llm-foundry rows) as the table's MP Mode column states it:
  `pure` (16-bit parameters gathered and computed on; the A100 40GB table) or `default` (fp32
  parameters under autocast; the other tables, and the engine's default).
- **torchtitan's loss**: `--loss-chunks 1` (the whole fp32 logits held) for rows without
  torch.compile or at a commit from before torchtitan compiled its loss (9dec370, 031f73f8),
  else the engine's default.
- **Engine** as stated, else from the source: MosaicML llm-foundry, FSDP and IBM rows `fsdp`,
  torchtitan rows `torchtitan`, BLOOM and DeepSpeed rows `megatron-deepspeed`, the others
  `megatron`. Where the planner refuses that engine for a row, its default engine. FSDP and
  torchtitan rows without a stated ZeRO stage are FULL_SHARD (3), others ZeRO-1.
- **Shape**: layers, hidden, heads, kv heads (default: heads), ffn (default 4 h), vocabulary
  (default 51,200); a SwiGLU MLP for Llama, Mistral, Mixtral, Qwen and torchtitan rows, GELU
  otherwise (Nemotron's squared ReLU has GELU's two matrices). An untied output layer where the
  row's command line says `--untie-embeddings-and-output-weights` (Megatron-LM's CI); dropout where
  the recipe keeps it: DGX Cloud's GPT-3 175B (`hidden_dropout` and `attention_dropout` 0.1) and
  Megatron-LM's CI runs, which set none and so train with Megatron-LM's own 0.1.
- **MoE rows** (DeepSeek-V3, Qwen3 MoE, gpt-oss, Mixtral, or EP > 1 in the notes) are the catalog
  model of that name with the expert layout of the notes (`EP=`, `ETP=`), ZeRO-1, sequence
  parallel with TP.
- **BLOOM prequel rows** ran with activation checkpointing (`recompute full`) and BLOOM's 250,880
  vocabulary where the row leaves them out.
- **Rows without a layout** (no TP, PP or DP given, an MFU published) are answered by `recommend`:
  its top layout's MFU against the published MFU.
- **Layout** TP, PP, CP, VPP, micro-batch (default 1), global batch, recompute, sequence
  parallelism with TP > 1 as stated (the engine's default where unstated), FlashAttention unless
  stated off; DP = GPUs / (TP PP CP) unless
  stated. A stated layout that does not multiply out to the GPU count, or missing shape fields,
  make the row not expressible.
- **Throughput**: tokens/s per GPU where published (from the iteration time where given), else
  TFLOP/s per GPU (hardware FLOPs where the source counts the recompute pass: BLOOM, Narayanan
  with full recompute; model FLOPs otherwise), else MFU. BLOOM (timed early in its run) and
  torchtitan (H100s power-capped at 500 W) are low trust: outside the throughput headline.
- **Memory** where measured: `max_allocated` against the planner's allocated peak,
  `max_reserved` against its reserved peak, otherwise its total; GiB for torchtitan and rows
  that print GiB, GB otherwise.
- **Fit calls**: a run that ran (a stated layout and a throughput figure; not the memory-only
  `mem-` rows nor BLOOM's) is called fits / borderline / oom by the estimate's memory verdict
  (its error band against capacity); a published OOM must be called oom.
- **Leave-one-source-out**: every coefficient of `data/coefficients.json` declared
  `"fitted_to": "corpus"` is refitted, over its `fit_range`, on the rows that read it from all
  trusted sources but one (the throughput MAPE; a memory coefficient on the measured peaks) and
  the held-out source's error reported; where a single source reads it, each of its GPUs is held
  out in turn.
"""


def pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def loso_md(fits: list) -> list[str]:
    """Each corpus-fitted coefficient's held-out error per source, or that none is fitted."""
    if not fits:
        return ["No coefficient is fitted to the corpus (none in `data/coefficients.json` declares "
                '`"fitted_to": "corpus"`).', ""]
    out = []
    for f in fits:
        name = f"`{f['section']}.{f['name']}`"
        if "folds" not in f:
            out += [f"{name}: {f['note']}.", ""]
            continue
        out += [f"{name}: prior {f['value']:.4g}, range {f['low']:.4g}-{f['high']:.4g}; fitted on "
                f"{report.fit_rows_text(f)} {f['value_all']:.4g} (MAPE {pct(f['mape_all'])}).", "",
                md_table(["held out", "cases", "fitted", "MAPE of the rest", "held-out MAPE", "held-out mean error"],
                         [[x["held_out"], str(x["cases"]), f"{x['value']:.4g}", pct(x["fit_mape"]), pct(x["mape"]),
                           f"{x['mean_error']:+.1%}"] for x in f["folds"]]), ""]
    return out


def page(v: dict) -> str:
    c, s = v["corpus"], v["corpus"]["summary"]
    out = ["# Validation: predicted against published runs", "",
           "Generated by `python benchmarks/validation_table.py` from `planner validate --json`; "
           "do not edit by hand. Error = predicted / published - 1 (positive: the planner promises "
           "more throughput or memory than published).", "",
           "## Summary", "", report.corpus_summary_text(s), "",
           f"Paper figures (Narayanan et al. 2021, Korthikanti et al. 2022; `data/references/published_runs.json`): "
           f"MAPE over {len(v['cases'])} figures {pct(v['mape'])}.", "",
           "## How rows are read", "", HOW_ROWS_ARE_READ,
           "## Per source, engine and metric", "",
           md_table(["source", "engine", "metric", "cases", "mean error", "MAPE"],
                    [[g["source"], g["engine"], g["metric"] + (" (low trust)" if g["low_trust"] else ""), str(g["cases"]),
                      f"{g['mean_error']:+.1%}", f"{g['mape']:.1%}"] for g in c["groups"]]), "",
           "## Fit calls", "",
           "Runs that ran, by the planner's memory verdict; published OOMs; rows not expressed; rows "
           "with no fit call (memory-only rows, BLOOM, rows without a layout). Each row is in one column.", "",
           md_table(["source", "rows", "ran: fits", "ran: borderline", "ran: oom", "OOM called oom", "OOM missed",
                     "not expressed", "no fit call"],
                    [[f["source"], *(str(f[k]) for k in ("rows", *corpus_score.CALLS))] for f in c["fit_calls"]]), "",
           "## Leave-one-source-out", ""]
    out += loso_md(c["loso"])
    out += ["## Not expressed", "", md_table(["run", "reason"], [[n["id"], n["reason"]] for n in c["not_expressed"]]), "",
            "## Every corpus row", "",
            md_table(["run", "engine", "metric", "published", "predicted", "error", "fit call"],
                     [[r["id"], r["engine"], f["metric"] + (f" ({f['kind']})" if "kind" in f else ""),
                       f"{f['published']:.4g}", f"{f['predicted']:.4g}", f"{f['error']:+.1%}", r["call"]]
                      for r in c["rows"] for f in r["figures"]]
                     + [[r["id"], r["engine"], "-", "-", "-", "-", r["call"]] for r in c["rows"] if not r["figures"]]), "",
            "## Paper figures", "",
            md_table(["case", "metric", "published", "predicted", "error"],
                     [[r["id"], r["metric"], f"{r['published']:.4g}", f"{r['predicted']:.4g}", f"{r['error']:+.1%}"]
                      for r in v["cases"]]), ""]
    return "\n".join(out)


def main() -> None:
    start = time.perf_counter()
    v = api.validate()
    elapsed_s = time.perf_counter() - start
    path = ROOT / "docs" / "validation.md"
    path.write_text(page(v))
    print(report.corpus_summary_text(v["corpus"]["summary"]))
    print(f"wrote {path.relative_to(ROOT)}; planner validate took {elapsed_s:.1f} s")


if __name__ == "__main__":
    main()
