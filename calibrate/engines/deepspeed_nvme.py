"""What DeepSpeed ZeRO-Infinity (ZeRO-3 offloading to NVMe) keeps in host memory, counted on the
real engine through its aio op.

    python -m calibrate.engines.deepspeed_nvme [--out PATH]

Launches calibrate/engines/deepspeed_offload_worker.py on 2 gloo ranks under DeepSpeed's launcher with
offload_optimizer (and offload_param) on device "nvme", swap files in a scratch folder: the 2-layer
Llama of calibrate/engines/deepspeed_worker.py (158,016 parameters: its optimizer sub-group is under the
swappers' 1 MiB minimum, so nothing is swapped) and the same shape widened (BIG: 29,889,536
parameters, hidden 1,024: every sub-group swaps), with DeepSpeed's defaults, smaller sub-groups
(sub_group_size 4e6: they close past it, one tensor over), and the parameters on NVMe beside a
max_in_cpu buffer the partition spills past or fits in. Each rank counts the bytes of every distinct
storage the engine, its optimizer swapper and its parameter swapper hold, by attribute, after each
micro-batch's backward of the second step and after its step(). The rows go to
data/references/deepspeed_nvme_cpu.json (atomically), read by tests/test_deepspeed_nvme_real.py.
DeepSpeed's aio op builds from source against libaio (its headers: libaio-dev on Debian); where it
cannot, this script says so and writes nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "data" / "references" / "deepspeed_nvme_cpu.json"
BIG = {"hidden_size": 1024, "intermediate_size": 2816, "vocab_size": 2048, "num_attention_heads": 8,
       "num_key_value_heads": 8, "head_dim": 128}
PARAM_SWAP = {"buffer_count": 16, "buffer_size": 3_000_000}  # 16 x 3e6 >= what one forward fetch swaps in
RUNS = [  # name, widened model, parameters on NVMe too, offload_param's extra keys, zero_optimization's extra keys
    ("small-optimizer", False, False, {}, {}),
    ("optimizer", True, False, {}, {}),
    ("optimizer-sub-groups", True, False, {}, {"sub_group_size": 4_000_000}),
    ("params-spill", True, True, {**PARAM_SWAP, "max_in_cpu": 2_000_000}, {}),
    ("params-fit", True, True, {**PARAM_SWAP, "max_in_cpu": 20_000_000}, {}),
]


def aio_available() -> str | None:
    """None where DeepSpeed's aio op builds here, else why not."""
    try:
        from deepspeed.ops.op_builder import AsyncIOBuilder

        if not AsyncIOBuilder().is_compatible(verbose=False):
            return "DeepSpeed's async_io op is not compatible here (libaio and its headers missing?)"
    except Exception as e:  # noqa: BLE001 - any import or build probe failure means no aio
        return f"DeepSpeed's async_io op: {type(e).__name__}: {e}"
    return None


def runs() -> list[dict]:
    return [{"name": name, "zero": 3, "gas": 2, "offload_optimizer": "nvme", "offload_param": "nvme" if params else False,
             "nvme_param": param_extra, "zero_extra": zero_extra, "ds": {}, **({"llama": BIG} if big else {})}
            for name, big, params, param_extra, zero_extra in RUNS]


def measure() -> list[dict]:
    from calibrate.engines.deepspeed_offload import record_runs

    why = aio_available()
    if why:
        raise SystemExit(f"calibrate.engines.deepspeed_nvme: {why}")
    return record_runs(runs(), "calibrate.engines.deepspeed_nvme")


def main(argv=None) -> int:
    from calibrate.harness.recording import run_cli

    return run_cli(argv, __doc__, OUT, "python -m calibrate.engines.deepspeed_nvme: DeepSpeed ZeRO-3 offloading to "
                   "NVMe through its aio op on 2 gloo ranks, 2-layer Llamas (calibrate/engines/deepspeed_worker.py "
                   "LLAMA and calibrate/engines/deepspeed_nvme.py BIG, bf16), bytes of every distinct storage the "
                   "engine and its swappers hold by attribute, after each micro-batch's backward and after step()",
                   measure, "deepspeed")


if __name__ == "__main__":
    sys.exit(main())
