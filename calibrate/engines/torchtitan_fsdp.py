"""What torchtitan 0.3.0's FSDP2 wrapping holds beyond the model states, on 2 gloo ranks.

    pip install torchtitan==0.3.0 && python -m calibrate.engines.torchtitan_fsdp [--out PATH]

torchtitan wraps a decoder its own way (distributed/fsdp.py apply_fsdp_to_decoder, untied weights):
the token embedding is a unit, [norm, lm_head] another that is not resharded after forward, one unit
per block, and the root holds nothing. Its loss (components/loss.py ChunkedLossWrapper, every llama3
config) runs lm_head and the loss chunk by chunk, each chunk's backward at once, with lm_head kept
unsharded and its gradient synchronised at the last chunk only; the decoder's backward follows from
the accumulated hidden-state gradient. This runs torchtitan's own Llama3Model (FlexAttention run eagerly, so
that backward runs on a CPU; attention does not touch FSDP's buffers), apply_fsdp_to_decoder and
ChunkedLossWrapper on 2 gloo ranks, and tracks FSDP's buffers and the unsharded gradients buffer by
buffer with calibrate/engines/fsdp_transient_worker.py's BufferTracker, at the moments forward (the decoder),
loss (the chunked head, forward and backward), backward (the decoder) and final_callback (after
autograd). Results go to data/references/torchtitan_fsdp_cpu.json (atomically), read by
tests/test_fsdp_transients_real.py.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "data" / "references" / "torchtitan_fsdp_cpu.json"
D, MBS, SEQ, CHUNKS = 2, 2, 32, 8
DIM, HEADS, KV_HEADS, FFN, LAYERS = 64, 4, 2, 160, 3
RUNS = [  # (name, param dtype, reshard_after_forward_policy, vocab, tied embeddings)
    *[(f"{dtype}/{policy}/vocab-{vocab}", dtype, policy, vocab, False)
      for dtype in ("bf16", "fp32") for policy in ("default", "never") for vocab in (256, 4096)],
    # Llama 3.2 1B/3B and the small Qwen3s tie the output to the embedding (enable_weight_tying)
    *[(f"bf16/{policy}/vocab-{vocab}/tied", "bf16", policy, vocab, True)
      for policy in ("default", "never") for vocab in (256, 4096)]]


def unit_of(fqn: str) -> str:
    """torchtitan's unit of a parameter fqn: 'layers.N', 'embed' or 'head' ([norm, lm_head])."""
    parts = fqn.split(".")
    if parts[0] == "layers":
        return ".".join(parts[:2])
    return "embed" if parts[0] == "tok_embeddings" else "head"


def tied_unit_of(fqn: str) -> str:
    """Tied: [tok_embeddings, norm, lm_head] is one unit, 'edges'."""
    unit = unit_of(fqn)
    return unit if unit.startswith("layers.") else "edges"


def build(vocab: int, tied: bool = False):
    from calibrate.harness.recording import eager_flex_attention, stub_triton_kernels

    stub_triton_kernels()  # torchtitan imports triton for its MoE all-to-all (unused by a dense Llama)
    eager_flex_attention()  # FlexAttention eager (its math path runs backward on a CPU too)
    from torchtitan.models.common import ComplexRoPE
    from torchtitan.models.llama3 import _build_llama3_layers, llama3_configs

    base = llama3_configs["debugmodel"](attn_backend="flex")
    blocks = _build_llama3_layers(n_layers=LAYERS, dim=DIM, n_heads=HEADS, n_kv_heads=KV_HEADS, hidden_dim=FFN,
                                  rope=ComplexRoPE.Config(dim=DIM // HEADS, max_seq_len=4096, theta=500000),
                                  fuse_qkv=True, attn_backend="flex")
    config = dataclasses.replace(
        base, dim=DIM, vocab_size=vocab, layers=blocks, enable_weight_tying=tied,
        tok_embeddings=dataclasses.replace(base.tok_embeddings, embedding_dim=DIM, num_embeddings=vocab),
        norm=dataclasses.replace(base.norm, normalized_shape=DIM),
        lm_head=dataclasses.replace(base.lm_head, in_features=DIM, out_features=vocab))
    import torch

    torch.manual_seed(0)
    model = config.build()
    model.init_weights(buffer_device=None)
    return model.train()


def run(name: str, dtype: str, policy: str, vocab: int, tied: bool) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torchtitan.components.loss import ChunkedLossWrapper
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    from calibrate.engines.deepspeed_transient_worker import _micro
    from calibrate.engines.fsdp_transient_worker import BufferTracker, private_copy_comms, states_and_fsdp_params

    model = build(vocab, tied)
    unit_of_param = tied_unit_of if tied else unit_of
    units = {}
    for fqn, p in model.named_parameters():
        units[unit_of_param(fqn)] = units.get(unit_of_param(fqn), 0) + p.numel()
    mesh = init_device_mesh("cpu", (D,), mesh_dim_names=("fsdp",))
    param_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    apply_fsdp_to_decoder(model, mesh, param_dtype=param_dtype, reduce_dtype=torch.float32, pp_enabled=False,
                          reshard_after_forward_policy=policy)
    loss_fn = ChunkedLossWrapper(ChunkedLossWrapper.Config(num_chunks=CHUNKS))
    loss_fn.set_lm_head(model.lm_head)
    model._skip_lm_head = True
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    fsdp_modules = [m for m in model.modules() if hasattr(m, "set_custom_all_gather")]
    gather, copy_scatter = private_copy_comms()

    class SumScatter(type(copy_scatter)):
        # torchtitan's disable_fsdp_gradient_division (factor 1.0) makes FSDP reduce with
        # ReduceOp.PREMUL_SUM(1.0) (_fsdp_collectives.py _get_gradient_divide_factors), which gloo
        # lacks: a sum is the same numbers and the same buffers
        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            return super().__call__(output_tensor, input_tensor, group, dist.ReduceOp.SUM, async_op)

    scatter = SumScatter()
    for m in fsdp_modules:
        m.set_custom_all_gather(gather)
        m.set_custom_reduce_scatter(scatter)
    torch.manual_seed(1)
    ids = torch.randint(0, vocab, (MBS, SEQ))
    labels = torch.randint(0, vocab, (MBS, SEQ))
    tokens = torch.tensor(float(MBS * SEQ))
    masks = model.get_attention_masks(positions=torch.arange(SEQ).repeat(MBS, 1))  # as trainer.py's post_dataloading_process

    def step(tracker=None):
        def phase(name):
            if tracker is not None:
                tracker.phase = name
                tracker.sample()

        def forward():
            phase("forward")
            pred = model(ids, attention_masks=masks)
            phase("loss")
            loss, _ = loss_fn(pred, labels, tokens)
            return loss

        def backward(loss):
            phase("backward")
            loss.backward()  # the final callback sets "final_callback", then "after"
            if tracker is not None:
                tracker.sample()

        _micro(forward, backward)

    step()  # lazy init, optimizer states
    opt.step()
    opt.zero_grad(set_to_none=False)
    states, fsdp_params = states_and_fsdp_params(model, opt, fsdp_modules)
    tracker = BufferTracker(model, fsdp_params, unit_of_param)
    tracker.install()
    try:
        step(tracker)
    finally:
        tracker.remove()
    dist.barrier()
    return {"name": name, "dtype": dtype, "policy": policy, "vocab": vocab, "tied": tied, "units": units,
            "model_states": states, "peaks": tracker.peaks}


def worker(cfg: dict) -> None:
    import torch.distributed as dist

    from calibrate.harness.worker_io import rank, write_result

    dist.init_process_group("gloo")
    runs = []
    for r in cfg["runs"]:
        start = time.perf_counter()
        runs.append({**run(*r), "seconds": round(time.perf_counter() - start, 2)})
    write_result({"rank": rank(), "world": dist.get_world_size(), "runs": runs})


def measure() -> list[dict]:
    from calibrate.harness.launch import launch

    out = launch("calibrate.engines.torchtitan_fsdp", ["--worker", json.dumps({"runs": RUNS})], nproc=D, timeout_s=600)
    if out.status != "ok" or len(out.ranks) != D:
        raise SystemExit(f"torchtitan_fsdp: {out.status}: {out.error}\n{out.log_tail}")
    first, second = (r["runs"] for r in out.ranks)
    assert [r["peaks"] for r in first] == [r["peaks"] for r in second], "the ranks differ"
    return [{"dim": DIM, "heads": HEADS, "kv_heads": KV_HEADS, "ffn": FFN, "layers": LAYERS, "seq": SEQ,
             "batch": MBS, "chunks": CHUNKS, "ranks": D, **r} for r in first]


def main(argv=None) -> int:
    from calibrate.harness.recording import worker_or_record

    return worker_or_record(argv, worker, __doc__, OUT, "python -m calibrate.engines.torchtitan_fsdp: torchtitan "
                            "0.3.0's Llama3Model, apply_fsdp_to_decoder and ChunkedLossWrapper on 2 gloo ranks; FSDP's "
                            "buffers and unsharded gradients beyond the model states, the exact peak per moment "
                            "(calibrate/engines/fsdp_transient_worker.py BufferTracker)", measure)


if __name__ == "__main__":
    sys.exit(main())
