"""Megatron-core's vocab-parallel cross entropy: its peak bytes per logit, counted on the CPU.

For each shape, one rank of gloo (tp = 1) runs the output layer's GEMM on 16-bit hidden states and
megatron-core 0.16.1's loss on its 16-bit logits, then the backward: tensor_parallel/cross_entropy.py
vocab_parallel_cross_entropy (what GPTModel's compute_language_model_loss calls without
--cross-entropy-loss-fusion), and fused_cross_entropy.py fused_vocab_parallel_cross_entropy (with it,
the 'native' implementation). The peak of live bytes above what was live before
(calibrate/benches/saved.py transient_peak_bytes: torch.profiler allocation events in time order)
over the logits' count is the loss's bytes per logit; the GEMM's own input gradients, counted in
it where they are live at the peak, are under 0.15 byte a logit at these shapes (h 64).

    python -m calibrate.engines.megatron_loss [--out FILE]
"""

from __future__ import annotations

import sys
from pathlib import Path

from calibrate.harness.worker_io import counted_in_child, one_gloo_rank

OUT = Path(__file__).resolve().parents[2] / "data" / "references" / "megatron_loss_cpu.json"

CONFIGS = {  # name: (sequence, batch, hidden, vocab)
    "s512-b2-h64-V8192": (512, 2, 64, 8192),
    "s256-b4-h64-V32768": (256, 4, 64, 32768),
}


def count(name: str) -> dict:
    """One shape and both losses in this process: peak bytes per logit."""
    import megatron.core
    import torch
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.fusions.fused_cross_entropy import fused_vocab_parallel_cross_entropy

    from calibrate.benches.saved import transient_peak_bytes

    one_gloo_rank()
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    s, b, h, v = CONFIGS[name]
    torch.manual_seed(0)
    hidden = torch.randn(s, b, h, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(v, h, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, v, (s, b))
    row = {"name": name, "megatron_core": megatron.core.__version__, "torch": torch.__version__,
           "seq": s, "batch": b, "hidden": h, "vocab": v}
    for key, loss_fn in (("unfused", tensor_parallel.vocab_parallel_cross_entropy),
                         ("fused_native", lambda logits, target: fused_vocab_parallel_cross_entropy(
                             logits, target, parallel_state.get_tensor_model_parallel_group()))):
        def step():
            loss_fn(torch.matmul(hidden, weight.t()), labels).sum().backward()
            hidden.grad = weight.grad = None

        step()  # warm: lazy kernels and workspaces
        row[f"{key}_bytes_per_logit"] = transient_peak_bytes(step) / (s * b * v)
    return row


def measure() -> list[dict]:
    """A row for every shape, all in one fresh process."""
    return counted_in_child("calibrate.engines.megatron_loss", list(CONFIGS))


def main(argv=None) -> int:
    from calibrate.harness.recording import count_or_record

    return count_or_record(sys.argv[1:] if argv is None else argv, count, __doc__, OUT,
                           "python -m calibrate.engines.megatron_loss: megatron-core 0.16.1 vocab_parallel_cross_entropy "
                           "and fused_vocab_parallel_cross_entropy after a bf16 output-layer GEMM on one gloo rank, peak "
                           "live bytes per logit of forward and backward (torch.profiler allocation events)",
                           measure, "megatron-core")


if __name__ == "__main__":
    sys.exit(main())
