"""What DeepSpeed ZeRO-Offload keeps on the GPU and on the host, counted on the real engine.

    python -m calibrate.engines.deepspeed_offload [--out PATH]

Launches calibrate/engines/deepspeed_offload_worker.py on 2 gloo ranks under DeepSpeed's launcher: the
2-layer Llama of calibrate/engines/deepspeed_worker.py (158,016 parameters, bf16, reduce bucket 4,096), ZeRO
1, 2 and 3 with the optimizer offloaded to the CPU, ZeRO-3 with the parameters too, gradient
accumulation 1 and 2, 16-bit and fp32 gradient accumulation, and ZeRO-2/3 accumulating in fp32
without offload (ZeRO's own fp32 gradient buffers on the GPU); each rank counts the bytes of every
distinct storage the engine holds by the attribute it is held under, after each micro-batch's
backward of the second step and after its step(). The rows go to
data/references/deepspeed_offload_cpu.json (atomically), read by tests/test_deepspeed_offload_real.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from planner.stage import Stage

OUT = Path(__file__).resolve().parents[2] / "data" / "references" / "deepspeed_offload_cpu.json"
FP32_ACCUM = {"data_types": {"grad_accum_dtype": "fp32"}}
RUNS = [  # name, ZeRO stage, gradient accumulation, optimizer offloaded, parameters offloaded too, extra ds_config
    ("zero1-gas2", 1, 2, True, False, {}),
    ("zero2-gas1", 2, 1, True, False, {}),
    ("zero2-gas2", 2, 2, True, False, {}),
    ("zero3-gas2", 3, 2, True, False, {}),
    ("zero3-gas2-params", 3, 2, True, True, {}),
    ("zero3-gas2-fp32-accum", 3, 2, True, False, FP32_ACCUM),
    ("zero1-gas2-fp32-accum", 1, 2, True, False, FP32_ACCUM),
    ("zero2-gas2-fp32-accum", 2, 2, True, False, FP32_ACCUM),
    ("zero2-gas2-fp32-accum-gpu", 2, 2, False, False, FP32_ACCUM),
    ("zero3-gas2-fp32-accum-gpu", 3, 2, False, False, FP32_ACCUM),
]


# Where DeepSpeed 0.19.8 allocates each attribute the worker counts (on the CPU accelerator the GPU
# and the host are one memory; on a GPU the tensor's own device says it, and must agree).
# Accelerator: stage_1_and_2.py bit16_groups_flat and its param.grad / grad_accum (use_grad_accum_attribute),
# temp_grad_buffer_for_gpu_offload and _build_compact_grad_partition_buffer (averaged_gradients), both on
# current_device_name(); stage3.py lp_param_buffer (ds_tensor) unless offload_param.
DEVICE = ("param.data", "param.grad", "param.grad_accum", "optimizer.temp_grad_buffer_for_gpu_offload",
          "optimizer.averaged_gradients[][]")
# setup_buckets (stage_1_and_2.py) and stage3.py __init__: ipg bucket buffers on current_device_name()
BUCKETS = ("optimizer.ipg_buckets[].buffer[]", "optimizer.ipg_buckets[].buffer")
# self.device, 'cpu' under offload (stage_1_and_2.py: 'cpu' if cpu_offload; stage3.py: OffloadDeviceEnum.cpu
# if offload_optimizer), else the accelerator: the fp32 partition, its gradient and the inner optimizer's states, the 16-bit
# partition copy, the host staging buffer, accumulated_grads_in_cpu, ZeRO-3's gradient partitions;
# stage3.py _create_param_groups_fp16_flat_cpu_memory holds ds_tensor with offload_param
HOST = ("inner.state[].exp_avg", "inner.state[].exp_avg_sq", "optimizer.single_partition_of_fp32_groups[]",
        "optimizer.single_partition_of_fp32_groups[].grad", "optimizer.param_buffer_of_bit16_for_cpu_offload_groups[]",
        "optimizer.temp_grad_buffer_for_cpu_offload", "optimizer.accumulated_grads_in_cpu[]",
        "optimizer.fp32_partitioned_groups_flat[]", "optimizer.fp32_partitioned_groups_flat[].grad",
        "optimizer.grad_partitions_flat_buffer",
        # ZeRO-Infinity (calibrate/engines/deepspeed_nvme.py): swap_tensor/utils.py SwapBufferManager's
        # get_accelerator().pin_memory'd buffers, stage3.py _create_param_groups_fp16_flat_cpu_memory,
        # partitioned_param_swapper.py buffers and reserve_partitioned_swap_space (new_cpu_locked_tensor)
        "optimizer.optimizer_swapper.swap_buffer_manager.all_buffers[]", "optimizer.param_groups_fp16_flat_cpu_memory[]",
        "swapper.buffers", "swapper.partitioned_swap_buffer")


def where(path: str, offload_param: bool, offload_optimizer: bool = True) -> str:
    """device | buckets | host | unknown: where the engine allocates the attribute at `path`."""
    if path == "param.ds_tensor":
        return "host" if offload_param else "device"
    for kind, paths in (("device", DEVICE), ("buckets", BUCKETS), ("host", HOST)):
        if path in paths:
            return "device" if kind == "host" and not offload_optimizer else kind
    return "unknown"


def split(held: dict, offload_param: bool, offload_optimizer: bool = True) -> dict:
    """A moment's {"path:dtype@device": bytes} as {device, buckets, host: bytes, unknown: {key: bytes}}."""
    out = {"device": 0, "buckets": 0, "host": 0, "unknown": {}}
    for key, nbytes in held.items():
        path, device = key.rsplit(":", 1)[0], key.rsplit("@", 1)[1]
        kind = where(path, offload_param, offload_optimizer)
        if kind == "unknown":
            out["unknown"][key] = nbytes
            continue
        # a GPU says it itself (a CPU run cannot: both are "cpu")
        assert device == "cpu" or (device == "cuda") == (kind != "host"), key
        out[kind] += nbytes
    return out


def prediction(zero: int, gas: int, offload_param: bool, fp32_grad_accum: bool, ranks: int = 2,
               offload_optimizer: bool = True) -> dict:
    """The planner's bytes for a run of the worker: the GPU's model states between micro-batches
    (weights, optimizer part, gradients), at the boundary, after the step, the reduce buckets and
    the host's (planner.memory terms, deepspeed engine)."""
    from planner import layout, memory, states
    from planner.hf_config import from_hf_config

    from calibrate.engines.deepspeed_offload_worker import SEQ
    from calibrate.engines.deepspeed_worker import BUCKET, LLAMA

    model = from_hf_config({**LLAMA, "model_type": "llama"})
    zc = layout.ZeroConfig(reduce_bucket_size=BUCKET, stage3_prefetch_bucket_size=BUCKET,
                           stage3_param_persistence_threshold=10, fp32_grad_accum=fp32_grad_accum)
    training = layout.Training(seq_len=SEQ, precision="bf16", engine="deepspeed", zero_config=zc)
    lay = layout.single(dp=ranks, zero=zero, gas=gas, offload_optimizer="cpu" if offload_optimizer else "none",
                        offload_params="cpu" if offload_param else "none")
    s = Stage(model, training, lay, 0)
    held = states.weight_bytes(s) + states.optimizer_bytes(s)
    terms = {"held_bytes": held, "grad_bytes": states.grad_bytes(s),
             "step_grad_bytes": states.grad_bytes(s, at_step=True),
             "bucket_bytes": memory.deepspeed_reduce_buckets(training, lay),
             "host_bytes": states.host_bytes(s)}
    out = {k: float(v[0]) for k, v in terms.items()}
    # ZeRO-3's bucket is allocated once and kept (stage3.py __init__); ZeRO-1/2 free theirs at the boundary
    out["model_state_bytes"] = out["held_bytes"] + max(out["grad_bytes"], out["step_grad_bytes"]) \
        + (zero == 3) * out["bucket_bytes"]
    return out


def _run_config(run: dict) -> tuple:
    fp32 = run.get("ds", {}).get("data_types", {}).get("grad_accum_dtype") == "fp32"
    return run["zero"], run["gas"], bool(run.get("offload_param")), fp32


def reduce(ranks: list, offload_param: bool, zero: int) -> dict:
    """The largest rank's device model states (ZeRO-1/2's buckets apart: they come and go) and host
    bytes over the moments of the last step, from each rank's worker result of one run."""
    device, host = 0, 0
    for moments in ranks:
        for m in moments:
            parts = split(m["held"], offload_param)
            device = max(device, parts["device"] + (zero == 3) * parts["buckets"])
            host = max(host, parts["host"])
    return {"model_state_bytes": device, "host_bytes": host}


def cases(profile_kind: str) -> list:
    """Harness cases (python -m calibrate run): ZeRO-2 accumulating and ZeRO-3 with the parameters
    offloaded too, on 2 ranks (a one-GPU machine runs them on 1, where each tensor's own device
    checks the sorting of split)."""
    from calibrate.harness.record import Case, ranks_for

    ranks = ranks_for(profile_kind)
    out = []
    for name, zero, gas, _, params, ds in RUNS:
        if name not in ("zero2-gas2", "zero3-gas2-params"):
            continue
        run = {"name": name, "zero": zero, "gas": gas, "offload_optimizer": True, "offload_param": params, "ds": ds}
        out.append(Case(name=f"deepspeed/offload/{name}", kind="memory", config={"engine": "deepspeed", "worker": run},
                        predict=lambda r=run: prediction(*_run_config(r), ranks),
                        reduce=lambda ranks, p=params, z=zero: reduce([r["runs"][0]["moments"] for r in ranks], p, z),
                        module="calibrate.engines.deepspeed_offload_worker", args=[json.dumps({"runs": [run]})],
                        nproc=ranks, launcher="deepspeed", env={"DS_ACCELERATOR": "cpu"} if profile_kind == "cpu" else {},
                        timeout_s=300))
    return out


def record_runs(runs: list[dict], recorder: str) -> list[dict]:
    """One launch of calibrate/engines/deepspeed_offload_worker.py on 2 gloo ranks for all `runs`, one
    reference row each (its config, what the engine offloads, and every rank's moments); the offload and
    NVMe recorders both write these rows. `recorder` names the caller in the error it exits with."""
    from calibrate.harness.launch import launch

    outcome = launch("calibrate.engines.deepspeed_offload_worker", [json.dumps({"runs": runs})], nproc=2,
                     launcher="deepspeed", env={"DS_ACCELERATOR": "cpu"}, timeout_s=900)
    if outcome.status != "ok" or len(outcome.ranks) != 2:
        raise SystemExit(f"{recorder}: the worker ended '{outcome.status}': {outcome.error}\n{outcome.log_tail}")
    rows = []
    for i, run in enumerate(runs):
        ranks = [r["runs"][i] for r in outcome.ranks]
        rows.append({**run, "optimizer": ranks[0]["optimizer"], "engine_offload": ranks[0]["offload"],
                     "params": ranks[0]["params"], "ranks": [r["moments"] for r in ranks]})
        print(run["name"], [sum(m["held"].values()) for m in ranks[0]["moments"]], file=sys.stderr, flush=True)
    return rows


def measure() -> list[dict]:
    runs = [{"name": name, "zero": zero, "gas": gas, "offload_optimizer": optimizer, "offload_param": params, "ds": ds}
            for name, zero, gas, optimizer, params, ds in RUNS]
    return record_runs(runs, "calibrate.engines.deepspeed_offload")


def main(argv=None) -> int:
    from calibrate.harness.recording import run_cli

    return run_cli(argv, __doc__, OUT, "python -m calibrate.engines.deepspeed_offload: DeepSpeed ZeRO-Offload (and "
                   "ZeRO-2/3 accumulating in fp32 without it) on 2 gloo ranks, a 2-layer Llama "
                   "(calibrate/engines/deepspeed_worker.py LLAMA, bf16), bytes of every distinct storage the engine "
                   "holds by attribute, after each micro-batch's backward and after step()",
                   measure, "deepspeed")


if __name__ == "__main__":
    sys.exit(main())
