"""Micro-benchmarks: GEMM, attention, collectives and send/recv (bench, bench_worker), CPU Adam and
the host's optimizer-step cost, eager operators' host time (eager_ops), the engines' host overhead
(engine_host), torch.compile'd Hugging Face blocks (hf_compiled), and the saved-tensor counters the
real-engine workers and the activation tests measure with (saved)."""
