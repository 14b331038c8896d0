"""End-to-end cases (calibrate/engines/step_worker.py): whole training steps of transformers Llamas of
published shapes under FSDP2 and DeepSpeed, each paired with the planner's answer for the same
model, GPU and layout (planner.api.estimate): step time and the allocator's two peaks.

Only a GPU profile has them: a CPU has no catalog datasheet to predict its step time from, and
its allocator keeps no peaks. The shapes are published models' (config.json of each), sized so the
whole suite runs in a couple of minutes on one GPU: a large-token step where GEMMs dominate and a
small one where the host's dispatch of eager operators does.
"""

from __future__ import annotations

import json

from calibrate.harness.record import Case, ranks_for

TINYLLAMA = {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32,
             "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 4096,
             "tie_word_embeddings": False}
"""TinyLlama-1.1B (huggingface.co/TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T config.json)."""
SMOLLM = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
          "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": 2048,
          "tie_word_embeddings": True}
"""SmolLM-135M (huggingface.co/HuggingFaceTB/SmolLM-135M config.json)."""

CONFIGS = (  # (name, engine, model, zero, mbs, seq, Hugging Face gradient checkpointing)
    ("step/fsdp/tinyllama-1.1b/mbs4-seq2048", "fsdp", TINYLLAMA, 3, 4, 2048, False),
    ("step/fsdp/tinyllama-1.1b/mbs4-seq2048-checkpointed", "fsdp", TINYLLAMA, 3, 4, 2048, True),
    ("step/fsdp/smollm-135m/mbs1-seq1024", "fsdp", SMOLLM, 3, 1, 1024, False),
    ("step/deepspeed/tinyllama-1.1b/zero1-mbs4-seq2048", "deepspeed", TINYLLAMA, 1, 4, 2048, False),
    # ZeRO-3's per-submodule fetches (timing.zero3_fetch_s): hidden under TinyLlama's large passes,
    # shown by SmolLM's host-bound ones (not yet measured on a GPU)
    ("step/deepspeed/tinyllama-1.1b/zero3-mbs4-seq2048", "deepspeed", TINYLLAMA, 3, 4, 2048, False),
    ("step/deepspeed/smollm-135m/zero3-mbs1-seq1024", "deepspeed", SMOLLM, 3, 1, 1024, False),
)

PREDICTED = {"allocated_peak_bytes": ("memory", "allocated_bytes"), "reserved_peak_bytes": ("memory", "reserved_bytes"),
             "device_used_bytes": ("memory", "gpu_bytes"), "step_s": ("time", "step_s")}
"""Measured quantity -> where planner.api.estimate's answer has it."""


def prediction(engine: str, llama: dict, zero: int, mbs: int, seq: int, checkpointing: bool, ranks: int,
               gpu: str) -> dict:
    from planner import api

    e = api.estimate({**llama, "model_type": "llama"}, {"gpus": ranks, "gpu": gpu},
                     # one micro-batch per step, as step_worker.py runs it (gradient_accumulation_steps 1)
                     {"seq_len": seq, "engine": engine, "precision": "bf16", "gbs": mbs * ranks},
                     {"dp": ranks, "zero": zero, "mbs": mbs, "recompute": "full" if checkpointing else "none"})
    return {q: float(getattr(e, section)[key]) for q, (section, key) in PREDICTED.items()}


def _reduce(ranks: list) -> dict:
    worst = max(ranks, key=lambda r: r.get("reserved_peak_bytes", 0))
    out = {k: worst[k] for k in ("params", "allocated_peak_bytes", "reserved_peak_bytes", "device_used_bytes",
                                 "forward_s", "backward_s", "optimizer_s", "inactive_split_peak_bytes",
                                 "alloc_retries", "segments_peak", "kernel_s", "optimizer_kernel_s") if k in worst}
    # a synchronous step waits for the slowest; communicators as calibrate/harness/record.py gpu_memory counts them;
    # every timed step of every rank kept: their spread is the step-to-step jitter a straggler term needs
    return {**out, "step_s": max(r["step_s"] for r in ranks), "process_groups": 1 + (len(ranks) > 1),
            "step_s_all": [r.get("step_s_all") for r in ranks]}


def cases(profile_kind: str, gpu: str | None = None) -> list:
    if profile_kind != "gpu":
        return []
    ranks = ranks_for(profile_kind)
    out = []
    for name, engine, llama, zero, mbs, seq, ckpt in CONFIGS:
        cfg = {"engine": engine, "llama": llama, "zero": zero, "mbs": mbs, "seq": seq, "checkpointing": ckpt}
        out.append(Case(name=name, kind="step_time", config={**cfg, "layout": {"dp": ranks}, "gpu": gpu},
                        predict=lambda c=cfg: prediction(c["engine"], c["llama"], c["zero"], c["mbs"], c["seq"],
                                                         c["checkpointing"], ranks, gpu),
                        reduce=_reduce, module="calibrate.engines.step_worker", args=[json.dumps(cfg)], nproc=ranks,
                        launcher="deepspeed" if engine == "deepspeed" else "torchrun", timeout_s=300))
    return out
