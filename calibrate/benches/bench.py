"""Micro-benchmarks: GEMM throughput, collective bus bandwidth, CPU AdamW rates, the host's DTensor
cost in an optimizer step, the spread of speed between a machine's GPUs, an eager layer's
memory-bound kernels; each measurement carries what the fit needs (calibrate/harness/fit.py: FLOPs and
seconds; op, bytes, ranks and seconds; parameters and seconds; seconds per tensor; the spread
itself; the layer's kernel seconds, its prediction the bytes).

busbw follows nccl-tests (doc/PERFORMANCE.md): algbw = bytes / seconds; all_reduce busbw =
algbw x 2(n-1)/n, all_gather and reduce_scatter busbw = algbw x (n-1)/n."""

from __future__ import annotations

import json
import statistics
import time

from calibrate.harness.record import Case
from planner.stage import Step

FP8 = "float8_e4m3fn"  # the FP8 GEMM bench's dtype (bench/gemm/float8_e4m3fn/N records)
FP8_MIN_COMPUTE_CAPABILITY = 8.9  # FP8 tensor cores: Ada (8.9), Hopper (9.0), Blackwell (10.x)
CPU_GEMMS = (64, 128, 256, 512, 1024)
GPU_GEMMS = (256, 512, 1024, 2048, 4096, 8192)
CPU_COLLECTIVE_BYTES = tuple(2**k for k in range(10, 25, 2))  # 1 KiB .. 16 MiB
P2P_BYTES = (8, 512, 4096)  # small messages: the send/recv latency (p2p_latency_s)
GPU_COLLECTIVE_BYTES = tuple(2**k for k in range(10, 31, 2))  # 1 KiB .. 1 GiB


def bus_bytes_per_s(op: str, nbytes: float, ranks: int, seconds: float) -> float:
    """nccl-tests' bus bandwidth of one collective (doc/PERFORMANCE.md); a send/recv's is its own."""
    if op == "send_recv":
        return nbytes / seconds
    factor = 2 * (ranks - 1) / ranks if op == "all_reduce" else (ranks - 1) / ranks
    return nbytes / seconds * factor


def gemm_run(n: int, dtype: str, repeats: int = 5) -> dict:
    """Median seconds of an n x n x n matmul (2 n^3 FLOPs) on the default device, each timed alone
    between two synchronizations (gemm_s: what the fit takes), and the mean of `repeats` issued back
    to back between two (back_to_back_s), as a training step issues them: the difference is the
    per-call host time a synchronized call adds (30-40 us on the H200 host at every size); on a GPU
    also the kernels' own seconds (kernel_s), what the fit takes where a record has them."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gemm = _fp8_gemm(n, device) if dtype == FP8 else _gemm(n, getattr(torch, dtype), device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    gemm()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        gemm()
        sync()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        gemm()
    sync()
    back_to_back = (time.perf_counter() - start) / repeats
    out = {"m": n, "n": n, "k": n, "dtype": dtype, "flops": 2.0 * n**3, "gemm_s": seconds,
           "flops_per_s": 2.0 * n**3 / seconds, "back_to_back_s": back_to_back}
    if device == "cuda":  # the kernels' own durations (torch.profiler's CUDA activity): no host time at all
        from calibrate.engines.step_worker import kernel_seconds

        kinds = kernel_seconds(gemm, repeats)
        out["kernel_s"] = sum(v for k, v in kinds.items() if k != "wall")
    return out


def _gemm(n: int, dtype, device: str):
    import torch

    a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
    return lambda: torch.matmul(a, b)


def _fp8_gemm(n: int, device: str):
    """The GEMM a tensor-wise scaled FP8 linear runs: e4m3 operands with one fp32 scale each, the
    second column-major as cuBLASLt's FP8 kernels take it, a bf16 output (torchao v0.18.0
    torchao/float8/float8_ops.py float8_mm -> torch._scaled_mm; Transformer Engine's delayed and
    current scaling call the same cuBLASLt FP8 GEMM)."""
    import torch

    a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()
    scale = torch.tensor(1.0, device=device)
    return lambda: torch._scaled_mm(a, b, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)


def rank_speed_run(n: int = 8192, rounds: int = 6, matmuls: int = 40) -> dict:
    """Each visible GPU's sustained bf16 GEMM rate with every GPU busy at once, as in a training step
    (clocks under power management differ by chip: Sinha et al. SC22), and their spread: the standard
    deviation of the devices' median rates over their mean (planner/stragglers.py rank_speed_cv).
    Each round queues `matmuls` n x n x n matmuls on every device from this thread (launches are
    asynchronous, so the devices run together) and times each device's with CUDA events; the first
    round warms the clocks and is dropped. One device has no spread: speed_cv is None."""
    import torch

    devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    a = [torch.randn(n, n, dtype=torch.bfloat16, device=d) for d in devices]
    out = [torch.empty_like(x) for x in a]
    rates = [[] for _ in devices]
    for _ in range(rounds + 1):
        events = []
        for x, y, d in zip(a, out, devices):
            with torch.cuda.device(d):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(matmuls):
                    torch.matmul(x, x, out=y)
                end.record()
                events.append((start, end))
        for i, (start, end) in enumerate(events):
            end.synchronize()
            rates[i].append(matmuls * 2.0 * n**3 / (start.elapsed_time(end) / 1e3))
    medians = [statistics.median(r[1:]) for r in rates]
    spread = statistics.stdev(medians) / statistics.mean(medians) if len(medians) >= 2 else None
    return {"devices": len(devices), "n": n, "flops_per_s": medians, "speed_cv": spread}


ADAM_SIZES = (2**24, 2**26)  # large enough that a step's fixed cost is a few percent
ADAM_RATES = {"deepspeed": "cpu_adam_params_per_s", "torch-fused": "cpu_adam_params_per_s",
              "torch": "cpu_adam_unfused_params_per_s"}
"""The host optimizers an offloaded step runs (planner/timing.py cpu_adam_s) and the coefficient each
measures: ZeRO-Offload's DeepSpeedCPUAdam, torch's fused AdamW (torchtitan), and torch's AdamW with
its defaults (FSDP2's CPUOffloadPolicy under a plain AdamW: the single-tensor loop on CPU)."""


def _median_step_s(opt, repeats: int) -> float:
    """Median seconds of an optimizer's step after the first, which creates its states."""
    opt.step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def adam_run(params: int, implementation: str, repeats: int = 3) -> dict:
    """Median seconds of one AdamW step over `params` fp32 parameters on the CPU."""
    import torch

    p = torch.nn.Parameter(torch.zeros(params))
    p.grad = torch.ones(params)
    if implementation == "deepspeed":
        # what ZeRO-Offload builds from ds_config "AdamW" (runtime/zero/stage_1_and_2.py, stage3.py)
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        opt = DeepSpeedCPUAdam([p], lr=1e-3, adamw_mode=True)
    else:
        opt = torch.optim.AdamW([p], lr=1e-3, fused=True if implementation == "torch-fused" else None)
    seconds = _median_step_s(opt, repeats)
    return {"params": params, "implementation": implementation, "adam_step_s": seconds,
            "adam_params_per_s": params / seconds}


def _coefficient(name: str) -> float:
    from planner.calibration import coefficient_values

    return coefficient_values("time")[name]


def _adam_prediction(params: int, implementation: str) -> dict:
    """The planner's seconds for one step of `params` parameters under the prior rate."""
    return {"adam_step_s": params / _coefficient(ADAM_RATES[implementation])}


def dtensor_step_run(implementation: str, counts=(50, 400), repeats: int = 9) -> dict:
    """Host seconds per parameter tensor that torch's AdamW step (foreach or fused) spends in
    DTensor's dispatch: its step over `counts` DTensors of a 1-rank gloo mesh less over as many
    plain tensors, per tensor (the slope between the two counts, so fixed costs drop out). Small
    CPU tensors: the host's Python, which a GPU host runs the same way."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))

        def step_s(n: int, dtensor: bool) -> float:
            params = [torch.nn.Parameter(distribute_tensor(torch.zeros(64, 64), mesh, [Shard(0)]) if dtensor
                                         else torch.zeros(64, 64)) for _ in range(n)]
            for p in params:
                p.grad = torch.ones_like(p)
            kind = {"fused": True} if implementation == "fused" else {"foreach": True}
            return _median_step_s(torch.optim.AdamW(params, lr=1e-3, **kind), repeats)

        low, high = counts
        slope = {dt: (step_s(high, dt) - step_s(low, dt)) / (high - low) for dt in (False, True)}
    finally:
        if owned:
            dist.destroy_process_group()
    return {"implementation": implementation, "tensors": list(counts), "plain_s_per_tensor": slope[False],
            "dtensor_s_per_tensor": slope[True], "extra_s_per_tensor": slope[True] - slope[False]}


ATTENTION_SHAPES = ((1, 32, 4096, 128), (1, 16, 8192, 128), (4, 32, 2048, 128))
"""(batch, heads, sequence, head width) of the attention bench: Llama-style heads at training lengths."""


def attention_run(batch: int, heads: int, seq: int, head_dim: int, repeats: int = 5) -> dict:
    """Seconds of one causal scaled_dot_product_attention forward and backward in bf16 (FlashAttention
    where the GPU has it): the median of `repeats` wall times between synchronizations and, on a GPU,
    the kernels' own seconds (kernel_s, what the fit takes); the forward's matmul FLOPs counted as
    planner/compute.py attention_core_s does (QK^T and AV, the causal half)."""
    import torch
    import torch.nn.functional as F

    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    q, k, v = (torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))
    grad = torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def step():
        for t in (q, k, v):
            t.grad = None
        if cuda:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(grad)

    step()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    out = {"batch": batch, "heads": heads, "seq": seq, "head_dim": head_dim,
           "flops_fwd": 4.0 * batch * heads * seq * seq * head_dim * 0.5, "attention_s": statistics.median(times)}
    if cuda:
        from calibrate.engines.step_worker import kernel_seconds

        kinds = kernel_seconds(step, repeats)
        out["kernel_s"] = sum(v for kind, v in kinds.items() if kind != "wall")
    return out


def _attention_prediction(batch: int, heads: int, seq: int, head_dim: int, gpu: str) -> dict:
    """The planner's forward + backward seconds of that attention on the catalog GPU."""
    from planner.calibration import coefficient_values
    from planner.compute import attention_efficiency, attention_matmuls_s
    from planner.hardware import Cluster, lookup_gpu

    cluster = Cluster(lookup_gpu(gpu), 1, 1)
    c = coefficient_values("time")
    fwd, bwd = attention_matmuls_s(4.0 * batch * heads * seq * seq * head_dim * 0.5, cluster.gpu.peak_flops_per_s["bf16"],
                                   attention_efficiency(cluster, c))
    return {"kernel_s": float(fwd + bwd)}


EAGER_LAYER = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
               "vocab_size": 1024, "attn_implementation": "sdpa"}
"""A Llama-3-8B decoder layer (huggingface.co/meta-llama/Meta-Llama-3-8B config.json; vocabulary
shrunk: the layer is timed as a 2-layer model less a 1-layer one)."""
EAGER_LAYER_TOKENS = (2, 4096)  # micro-batch x sequence: 8192 tokens, a training step's


def eager_layer_run(repeats: int = 3) -> dict:
    """GPU seconds of one eager Hugging Face Llama decoder layer's kernels in a training micro-batch
    (forward and backward, bf16, SDPA), by kind (calibrate/engines/step_worker.py kernel_kind): torch.profiler's
    kernel durations of a 2-layer LlamaForCausalLM less a 1-layer one, each after a warm-up step. The
    'elementwise' kind (pointwise, reductions, casts, cat) is what planner/compute.py elementwise_fwd_s
    and elementwise_bwd_s predict; 'gemm' and 'attention' are timed without the host time a synchronized
    single call adds (gemm_run)."""
    import torch
    import transformers

    from calibrate.engines.step_worker import kernel_seconds

    def profiled(layers: int) -> dict:
        torch.manual_seed(0)
        config = transformers.LlamaConfig(num_hidden_layers=layers, **EAGER_LAYER)
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).cuda().train()
        ids = torch.randint(0, EAGER_LAYER["vocab_size"], EAGER_LAYER_TOKENS, device="cuda")

        def step():
            model(input_ids=ids).logits.float().sum().backward()
            model.zero_grad(set_to_none=True)

        step()  # warm-up: cuBLAS heuristics, the caching allocator's blocks
        return kernel_seconds(step, repeats)

    one = profiled(1)
    torch.cuda.empty_cache()
    two = profiled(2)
    layer = {k: two.get(k, 0.0) - one.get(k, 0.0) for k in set(one) | set(two) if k != "wall"}
    return {"tokens": EAGER_LAYER_TOKENS[0] * EAGER_LAYER_TOKENS[1], "kernel_s": layer,
            "layer_elementwise_s": layer.get("elementwise", 0.0)}


def _eager_layer_prediction(gpu: str) -> dict:
    """The planner's memory-bound seconds of that layer (planner/compute.py, an eager engine's block)
    on the catalog GPU, and the bytes it counts for them."""
    from planner import compute, layout
    from planner.calibration import coefficient_values
    from planner.hardware import Cluster, lookup_gpu
    from planner.hf_config import from_hf_config

    model = from_hf_config({**EAGER_LAYER, "model_type": "llama", "num_hidden_layers": 1})
    cluster, c = Cluster(lookup_gpu(gpu), 1, 1), coefficient_values("time")
    training = layout.Training(seq_len=EAGER_LAYER_TOKENS[1], engine="fsdp")
    lay = layout.single(mbs=EAGER_LAYER_TOKENS[0])
    seconds = float((compute.elementwise_fwd_s(Step(model, cluster, training, lay, c))
                     + compute.elementwise_bwd_s(Step(model, cluster, training, lay, c)))[0])
    return {"layer_elementwise_s": seconds, "layer_bytes": seconds * compute.eager_bytes_per_s(cluster, c)}


def _eager_run() -> dict:
    from calibrate.benches.eager_ops import layer_host_run

    return layer_host_run("llama")


def _eager_prediction() -> dict:
    """The planner's host seconds for one eager Llama layer (planner/compute.py eager_host_s)."""
    from calibrate.engines.deepspeed_worker import LLAMA
    from planner.compute import eager_host_s
    from planner.hf_config import from_hf_config
    from planner.layout import Training
    from planner.memory import coefficients

    fwd, bwd = eager_host_s(from_hf_config({**LLAMA, "model_type": "llama"}), Training(engine="fsdp"),
                            coefficients("time"))
    return {"layer_host_s": fwd + bwd}


def _gemm_prediction(flops: float, gpu: str | None, dtype: str = "bfloat16") -> dict:
    """The planner's time for one GEMM on the catalog GPU (no catalog peak for a CPU: none); an FP8
    one at the FP8 peak with FP8's efficiency (planner/compute.py fp8_gemm_coefficients)."""
    if gpu in (None, "cpu"):
        return {}
    from planner.calibration import coefficient_values
    from planner.compute import fp8_gemm_coefficients, gemm_s
    from planner.hardware import lookup_gpu

    peak, c = lookup_gpu(gpu).peak_flops_per_s, coefficient_values("time")
    if dtype == FP8:
        return {"gemm_s": float(gemm_s(flops, peak["fp8"], fp8_gemm_coefficients(c, peak["fp8"] / peak["bf16"])))}
    return {"gemm_s": float(gemm_s(flops, peak["bf16"], c))}


def _has_fp8(gpu: str | None) -> bool:
    """Whether the catalog GPU has FP8 tensor cores for the FP8 GEMM bench (CUDA only: torch's
    _scaled_mm on ROCm takes other FP8 types)."""
    from planner.hardware import lookup_gpu

    return gpu not in (None, "cpu") and lookup_gpu(gpu).compute_capability >= FP8_MIN_COMPUTE_CAPABILITY


def _collective_rows(ranks: list) -> dict:
    rows = ranks[0]["rows"]
    for r in rows:
        r["bus_bytes_per_s"] = bus_bytes_per_s(r["op"], r["bytes"], r["ranks"], r["collective_s"])
    return {"rows": rows}


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def cases(profile_kind: str, gpu: str | None = None) -> list:
    gpu_run = profile_kind == "gpu"
    dtype = "bfloat16" if gpu_run else "float32"
    out = []
    # the FP8 sweep beside the 16-bit one where the GPU has FP8 tensor cores: fp8_gemm_efficiency_max
    for dt in (dtype, FP8) if gpu_run and _has_fp8(gpu) else (dtype,):
        for n in GPU_GEMMS if gpu_run else CPU_GEMMS:
            out.append(Case(name=f"bench/gemm/{dt}/{n}", kind="gemm", config={"m": n, "n": n, "k": n, "dtype": dt},
                            predict=lambda n=n, dt=dt: _gemm_prediction(2.0 * n**3, gpu, dt), reduce=lambda r: r[0],
                            run_inline=lambda n=n, dt=dt: gemm_run(n, dt)))
    sizes = GPU_COLLECTIVE_BYTES if gpu_run else CPU_COLLECTIVE_BYTES
    ranks = _gpus() if gpu_run else 2
    if ranks >= 2:  # one launch measures every size; the profile keeps one record per size and op
        # medians of 20: on a shared 2-core host single gloo calls vary by 10x
        spec = {"sizes": list(sizes), "repeats": 20, "p2p_sizes": list(P2P_BYTES)}
        out.append(Case(name="bench/collectives", kind="collective", config=spec, predict=dict,
                        reduce=_collective_rows, module="calibrate.benches.bench_worker", args=[json.dumps(spec)],
                        nproc=ranks, timeout_s=300))
    if gpu_run:  # FlashAttention's forward and backward: attention_efficiency
        for b, h, n, d in ATTENTION_SHAPES:
            out.append(Case(name=f"bench/attention/{b}x{h}x{n}x{d}", kind="attention",
                            config={"batch": b, "heads": h, "seq": n, "head_dim": d, "dtype": "bfloat16", "gpu": gpu},
                            predict=lambda b=b, h=h, n=n, d=d: _attention_prediction(b, h, n, d, gpu),
                            reduce=lambda r: r[0], run_inline=lambda b=b, h=h, n=n, d=d: attention_run(b, h, n, d)))
    if gpu_run:  # an eager layer's memory-bound kernels: eager_bytes_per_s_per_sm
        out.append(Case(name="bench/eager_layer/llama-3-8b", kind="eager_layer",
                        config={"llama": EAGER_LAYER, "tokens": list(EAGER_LAYER_TOKENS), "gpu": gpu},
                        predict=lambda: _eager_layer_prediction(gpu), reduce=lambda r: r[0], run_inline=eager_layer_run))
    if gpu_run and ranks >= 2:  # the spread between GPUs needs two of them
        out.append(Case(name="bench/rank_speed", kind="rank_speed", config={"n": 8192, "dtype": "bfloat16"},
                        predict=lambda: {"speed_cv": _coefficient("rank_speed_cv")}, reduce=lambda r: r[0],
                        run_inline=rank_speed_run))
    out.append(Case(name="bench/eager_ops/llama", kind="eager_ops", config={"variant": "llama"},
                    predict=_eager_prediction, reduce=lambda r: r[0], run_inline=_eager_run))
    for implementation in ("foreach", "fused"):  # the FSDP engine's torch AdamW, torchtitan's fused one
        out.append(Case(name=f"bench/dtensor_step/{implementation}", kind="dtensor_step",
                        config={"implementation": implementation, "tensors": [50, 400], "shape": [64, 64]},
                        predict=lambda: {"extra_s_per_tensor": _coefficient("dtensor_step_host_s_per_tensor")},
                        reduce=lambda r: r[0], run_inline=lambda i=implementation: dtensor_step_run(i)))
    for implementation in ADAM_RATES:
        for params in ADAM_SIZES[:1] if implementation == "torch-fused" else ADAM_SIZES:
            out.append(Case(name=f"bench/cpu_adam/{params}/{implementation}", kind="cpu_adam",
                            config={"params": params, "implementation": implementation},
                            predict=lambda p=params, i=implementation: _adam_prediction(p, i), reduce=lambda r: r[0],
                            run_inline=lambda p=params, i=implementation: adam_run(p, i)))
    return out
