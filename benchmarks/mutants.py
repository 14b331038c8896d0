"""Does a wrong term fail a test? `python benchmarks/mutants.py [-k SUBSTRING] [pytest args]`

Every step-time and memory term of the planner is made 10x too large and 10x too small, one at a
time, and the fast test suite runs against it (in a fresh process, through
benchmarks/mutant_plugin.py); so are the five deliberate errors issue 6 names. A mutant is
"killed" when some test fails, and the script prints the first failing test. A survivor is a term
no test guards. Runs ~1-2 minutes per surviving mutant on 2 cores (killed ones stop at the first
failure).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TERMS = [
    # memory
    ("planner.sharding", "rank_params"), ("planner.sharding", "persistent_params"),
    ("planner.sharding", "deepspeed_grad_partition_excess"), ("planner.sharding", "expert_dp"),
    ("planner.sharding", "expert_tp"), ("planner.sharding", "largest_module_params"), ("planner.sharding", "recompute_fetches"),
    ("planner.sharding", "zero3_swap_elements"), ("planner.sharding", "aio_aligned"),
    ("planner.sharding", "largest_tensor_params"), ("planner.engines.deepspeed.memory", "deepspeed_offload_staging_bytes"),
    ("planner.sharding", "oversized_tensor_params"), ("planner.engines.deepspeed.memory", "deepspeed_reduction_transient_bytes"),
    ("planner.memory", "weight_bytes"), ("planner.memory", "grad_bytes"), ("planner.memory", "optimizer_bytes"),
    ("planner.memory", "host_bytes"), ("planner.engines.deepspeed.memory", "deepspeed_reduce_buckets"),
    ("planner.engines.deepspeed.memory", "deepspeed_straddle_bytes"), ("planner.engines.deepspeed.memory", "deepspeed_step_grad_copies"),
    ("planner.memory", "reduction_copy_bytes"), ("planner.engines.deepspeed.memory", "zero3_live_param_bytes"), ("planner.engines.deepspeed.memory", "zero3_ahead_params"), ("planner.engines.fsdp.memory", "fsdp_unsharded_unit_bytes"),
    ("planner.engines.fsdp.memory", "torchtitan_edge_unit_bytes"),
    ("planner.memory", "reserved_bytes"), ("planner.memory", "userbuffers_bytes"),
    ("planner.memory", "autocast_weight_bytes"), ("planner.memory", "liger_fused_loss_bytes"),
    ("planner.activations", "deepspeed_pipe_buffer_bytes"),
    ("planner.activations", "layer_bytes"), ("planner.activations", "recompute_working_bytes"),
    ("planner.activations", "embedding_dropout_bytes"), ("planner.activations", "head_input_bytes"),
    ("planner.activations", "logits_bytes"), ("planner.activations", "recomputed_layers"),
    ("planner.activations", "kept_bytes"), ("planner.activations", "op_sac_bytes"),
    ("planner.activations", "checkpoints"), ("planner.activations", "boundary_bytes"),
    ("planner.activations", "cp_gathered_kv_bytes"),
    ("planner.memory", "loss_bytes_per_logit"), ("planner.pipeline", "p2p_buffers"),
    ("planner.moe", "routed_per_token"), ("planner.moe", "expert_capacity"),
    ("planner.pipeline", "microbatches_in_flight"), ("planner.pipeline", "bubble_slots"), ("planner.pipeline", "bubble_s"),
    ("planner.pipeline", "p2p_transfers"), ("planner.pipeline", "dense_layers_on_stage"),
    ("planner.pipeline", "first_routed_stage"),
    # step time
    ("planner.compute", "flops_per_step"), ("planner.compute", "gemm_fwd_s"), ("planner.compute", "attention_core_s"),
    ("planner.compute", "elementwise_fwd_s"), ("planner.compute", "eager_bytes_per_s"), ("planner.compute", "eager_host_s"), ("planner.compute", "op_sac_recompute_s"), ("planner.compute", "elementwise_bwd_s"), ("planner.compute", "head_s"),
    ("planner.compute", "attention_kernel_slowdown"), ("planner.compute", "compute_flops_per_s"), ("planner.compute", "llm_foundry_elementwise_bytes"), ("planner.compute", "autocast_weight_traffic_s"),
    ("planner.collectives", "nccl_time_s"), ("planner.collectives", "ring_latency_us"),
    ("planner.collectives", "tree_latency_us"), ("planner.collectives", "group_bus_bytes_per_s"),
    ("planner.collectives", "p2p_bytes_per_s"), ("planner.collectives", "ring_pod_share"),
    ("planner.collectives", "p2p_pod_share"), ("planner.collectives", "members_per_pod"),
    ("planner.mp_comm", "tp_all_reduce_s"), ("planner.mp_comm", "checkpoint_restore_s"), ("planner.dp_comm", "dp_collective_s"), ("planner.mp_comm", "tp_pass_exposed_s"), ("planner.engines.megatron.timing", "ub_pass_exposed_s"), ("planner.mp_comm", "ep_all_to_all_s"), ("planner.mp_comm", "moe_count_sync_s"), ("planner.mp_comm", "cp_ring_exposed_s"),
    ("planner.timing", "pipeline_bubble_s"), ("planner.timing", "pipeline_p2p_s"), ("planner.timing", "grad_reduce_s"),
    ("planner.dp_comm", "grad_reductions_per_step"), ("planner.timing", "param_gather_s"),
    ("planner.dp_comm", "zero3_gather_s"), ("planner.held", "gathered_param_bytes"), ("planner.dp_comm", "zero3_exposed_s"), ("planner.optimizer_time", "gpu_optimizer_step_s"), ("planner.optimizer_time", "cpu_adam_s"),
    ("planner.timing", "offload_s"), ("planner.dp_comm", "overlapped_exposed_s"), ("planner.engines.megatron.timing", "chunked_sync_exposed_s"),
    ("planner.pipeline", "interleaved_groups"),
    ("planner.engines.fsdp.timing", "fsdp_copies_s"), ("planner.engines.deepspeed.timing", "zero3_rank_copies_s"), ("planner.engines.deepspeed.timing", "deepspeed_step_s"),
    ("planner.timing", "param_fetch_s"), ("planner.stragglers", "expected_max_of_normals"), ("planner.stragglers", "straggler_s"),
]

# the five errors issue 6 found passing every fast test, as mutants
DELIBERATE = [
    ("10x pipeline p2p time", "planner.timing:pipeline_p2p_s:x10"),
    ("optimizer bytes 5x low (states)", "planner.sharding:state_bytes:optimizer=0.2"),
    ("optimizer bytes 5x low (step traffic)", "planner.timing:gpu_optimizer_step_s:x0.2"),
    ("2x elementwise backward", "planner.compute:elementwise_bwd_s:x2"),
    ("ZeRO-2 reducing once per step", "planner.dp_comm:grad_reductions_per_step:ones"),
    ("no last-stage head activations", "planner.activations:head_input_bytes:x0"),
]

FAST_TESTS = ["tests/test_memory.py", "tests/test_deepspeed_zero3_live.py", "tests/test_timing.py", "tests/test_validate.py", "tests/test_search.py",
              "tests/test_cli.py", "tests/test_terms.py", "tests/test_activations_real.py", "tests/test_engines.py",
              "tests/test_moe_capacity.py", "tests/test_dense_first.py",
              "tests/test_expert_tp.py", "tests/test_activations_deepseek.py", "tests/test_step_time_h200.py",
              "tests/test_fsdp_torchtitan.py", "tests/test_compiled.py", "tests/test_activations_megatron_moe.py",
              "tests/test_activations_deepspeed_moe.py", "tests/test_deepspeed_offload_real.py", "tests/test_stragglers.py",
              "tests/test_deepspeed_nvme_real.py", "tests/test_megatron_offload.py", "tests/test_modules.py",
              "tests/test_memory_bloom.py"]


def run(spec: str, pytest_args: list[str]) -> tuple[bool, str, float]:
    env = dict(os.environ, PLANNER_MUTANT=spec, PYTHONPATH=f"{ROOT / 'benchmarks'}:{os.environ.get('PYTHONPATH', '')}")
    tests = [t for t in FAST_TESTS if (ROOT / t).exists()]
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "mutant_plugin",
                           "-m", "not slow", *tests, *pytest_args], cwd=ROOT, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    failed = [line.split(" ")[1] for line in proc.stdout.splitlines() if line.startswith("FAILED ")]
    killed = proc.returncode == 1 and bool(failed)
    if proc.returncode not in (0, 1):
        return True, f"pytest exit {proc.returncode}: {proc.stdout.strip().splitlines()[-1:]}", elapsed
    return killed, failed[0] if failed else "", elapsed


def main() -> int:
    args = sys.argv[1:]
    only = None
    if args[:1] == ["-k"]:
        only, args = args[1], args[2:]
    mutants = [(label, spec) for label, spec in DELIBERATE]
    mutants += [(f"{m.split('.')[-1]}.{f} {t}", f"{m}:{f}:{t}") for m, f in TERMS for t in ("x10", "x0.1")]
    if only:
        mutants = [(label, spec) for label, spec in mutants if only in label or only in spec]
    survivors = 0
    for label, spec in mutants:
        killed, by, elapsed = run(spec, args)
        survivors += not killed
        print(f"{'killed  ' if killed else 'SURVIVED'} {label:55s} {elapsed:5.1f} s  {by}", flush=True)
    print(f"{len(mutants) - survivors} of {len(mutants)} mutants killed; {survivors} survived")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
