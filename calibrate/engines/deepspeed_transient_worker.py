"""Worker: the transient peaks of DeepSpeed's backward and step() on 2 gloo ranks (DS_ACCELERATOR=cpu),
run under DeepSpeed's launcher (calibrate/harness/launch.py, launcher="deepspeed").

Each rank first runs the same tiny Llama (calibrate/engines/deepspeed_worker.py LLAMA, bf16) without
DeepSpeed: one micro-batch's forward + backward with every gradient dropped as soon as it is
accumulated (a post-accumulate-grad hook sets p.grad = None: activations and autograd temporaries
alone, "plain_drop") and with the gradients kept ("plain_keep"). Then, for every run of the config
({"runs": [{"name", "zero", "gas", "zero_optimization": {...}}, ...]}), it trains 2 optimizer steps
and, in the second, profiles each micro-batch's forward + engine.backward ("micro_step", with the
backward alone under "backward") and each engine.step() ("step") with calibrate.benches.saved's method: the
peak of live allocated bytes above what was live before, from torch.profiler's allocation events in
time order. Every allocation is tagged by its innermost frame (autograd node, model forward,
DeepSpeed's Python code, torch's optimizer): the result has the bytes of each kind live at the peak,
the peak of each kind's allocations alone, and the largest allocations live at the peak.

Usage: ... -m calibrate.engines.deepspeed_transient_worker '{"runs": [{"name": "z2", "zero": 2, "gas": 1}]}'
"""

from __future__ import annotations

import os
import sys
import time

import torch  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported

from calibrate.engines.deepspeed_worker import LLAMA, run_and_leave  # noqa: E402
from calibrate.harness.worker_io import device, rank, write_result  # noqa: E402

SEQ = 16
STEPS = 2


def _frame_category(frame) -> tuple:
    """(category, where) of an op called from `frame`: the innermost Python frame that is torch's
    optimizer ("optimizer"), DeepSpeed's code ("deepspeed") or the model's (transformers, torch.nn:
    "model"); "autograd" where the walk first reaches the autograd engine's entry (torch 2.13
    autograd/graph.py _engine_run_backward): an op of a node's backward, or of a Python backward.
    ZeRO-3's LinearFunctionForZeroStage3 (zero/linear.py) is the model's own matmul, not DeepSpeed's."""
    f = frame
    while f is not None:
        path, fn = f.f_code.co_filename, f.f_code.co_name
        where = f"{path.split('/')[-1]}({f.f_lineno}): {fn}"
        if "torch/optim/" in path:
            return "optimizer", where
        if "deepspeed/" in path and "zero/linear.py" not in path:
            return "deepspeed", where
        if "transformers/" in path or "torch/nn/" in path:
            return "model", where
        if fn == "_engine_run_backward" and path.endswith("torch/autograd/graph.py"):
            node = torch._C._current_autograd_node()
            return "autograd", node.name() if node is not None else "?"
        f = f.f_back
    return "model", "?"


_RANGE = "category::"


def _attributed_call(func, args, kwargs):
    """func(*args, **kwargs) inside record_function("category::<category>::<where>") of its Python
    caller (_frame_category: two frames up, past the mode's handler); record_function's own
    enter/exit ops (profiler::) as they are: wrapped, their ranges would mis-nest."""
    if str(getattr(func, "_qualified_op_name", getattr(func, "namespace", ""))).startswith("profiler"):
        return func(*args, **(kwargs or {}))
    category, where = _frame_category(sys._getframe(2))
    with torch.profiler.record_function(f"{_RANGE}{category}::{where}"):
        return func(*args, **(kwargs or {}))


class _AttributedOps(TorchDispatchMode):
    """Every op dispatched on this thread (c10d's too) runs inside its caller's category range, so
    that an allocation's category is read from the profiler's op ranges alone. Not from with_stack's
    Python-frame events: with torch 2.13 on 2 gloo ranks those came back, in a run or two out of
    five, with a name that was not UTF-8, or nested so that a few KB changed category
    (tests/test_*_transients_real.py failed at random)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _attributed_call(func, args, kwargs)


class _AttributedCalls(TorchFunctionMode):
    """The same around each torch call made from Python, for what it allocates before it dispatches
    an op. A Python scalar operand wrapped as a tensor (8 B: AdamW's `exp_avg_sq.sqrt() /
    bias_correction2_sqrt` on FSDP2's DTensors) is made before even this: it is "unattributed"."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return _attributed_call(func, args, kwargs)


def _category(e) -> tuple:
    """(category, where) of the allocation event `e`: its innermost category range; else an
    autograd node's evaluation ("autograd": ops not dispatched from Python); else "model" and the
    op; "unattributed" outside every op (_AttributedCalls)."""
    op, p = None, e.parent
    while p is not None:
        name = p.name
        if op is None and name.startswith("aten::"):
            op = name
        if name.startswith(_RANGE):
            category, where = name[len(_RANGE):].split("::", 1)
            return category, where
        if name.startswith("autograd::engine::evaluate_function"):
            return "autograd", name.split(": ")[-1]
        p = p.parent
    return ("model", op) if op else ("unattributed", "?")


CATEGORIES = ("autograd", "deepspeed", "optimizer", "model", "unattributed")


def _stats(tagged: list) -> dict:
    """Peak of the running sum of `tagged` allocation events [(signed bytes, category, where, ptr)]
    in time order, and what is live at it (see transient)."""
    live = peak = 0
    at = -1
    for i, (size, *_) in enumerate(tagged):
        live += size
        if live > peak:
            peak, at = live, i
    alive, freed_before = {}, 0
    for size, cat, where, ptr in tagged[:at + 1]:
        if size > 0:
            alive[ptr] = (size, cat, where)
        elif ptr in alive:
            del alive[ptr]
        else:
            freed_before -= size
    by = {c: sum(v[0] for v in alive.values() if v[1] == c) for c in CATEGORIES}
    only, own = {}, {}
    for c in CATEGORIES:
        run = top = 0
        for i, (size, cat, *_) in enumerate(tagged):
            if cat == c:
                run += size
                if run > top:
                    top, own[c] = run, i
        only[c] = top
    # DeepSpeed's own allocations live at their own peak
    mine = {}
    for size, cat, where, ptr in tagged[:own.get("deepspeed", -1) + 1]:
        if cat == "deepspeed" and size > 0:
            mine[ptr] = [size, where]
        elif cat == "deepspeed":
            mine.pop(ptr, None)
    rows = sorted((list(v) for v in alive.values()), key=lambda r: -r[0])
    return {"peak": peak, "end": live, "by": by, "freed_before": freed_before, "live": rows[:24],
            "peak_only": only, "live_deepspeed": sorted(mine.values(), key=lambda r: -r[0])[:12]}


def profiled_allocations(fn, classify, mark: str = "") -> tuple:
    """(allocation and free events of fn() in time order as (time_ns, signed bytes, ptr, label), the
    (start_time_ns, start_tid) of the last profiled event named `mark` or None), from torch.profiler's
    memory events; label = classify(event) for an allocation, None for a free. The event tree's nodes
    point into the profiler's results, which die with `prof`: read them only here (read after, their
    parents came back None, and once a name as undecodable bytes)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    todo, events, marked = list(prof.profiler.kineto_results.experimental_event_tree()), [], None
    while todo:
        e = todo.pop()
        todo.extend(e.children)
        if e.tag == _EventType.Allocation:
            size = e.extra_fields.alloc_size
            events.append((e.start_time_ns, size, e.extra_fields.ptr, classify(e) if size > 0 else None))
        elif mark and e.name == mark:
            marked = (e.start_time_ns, e.start_tid)
    events.sort(key=lambda x: x[0])
    return events, marked


def transient(fn, mark: str = "") -> dict:
    """calibrate.benches.saved.transient_peak_bytes of `fn` (its ops and torch calls in category ranges), and
    what is live at the peak: {"peak", "end" (net bytes when fn returns), "by": {category: bytes made during fn and
    alive at the peak}, "freed_before": bytes of earlier tensors freed by the peak, "live": [[bytes,
    category, where], ...] largest first, "peak_only": {category: the peak of the running sum of that
    category's allocations and their frees alone}}; with `mark`, the same for the part
    of fn from the start of the record_function(mark) range on under key mark."""
    def attributed():
        with _AttributedCalls(), _AttributedOps():
            fn()

    events, marked = profiled_allocations(attributed, classify=_category, mark=mark)
    since = marked[0] if marked is not None else None
    tagged, owner = [], {}  # (signed bytes, category of the allocation, where, ptr)
    for _, size, ptr, label in events:
        if size > 0:
            owner[ptr] = label
            tagged.append((size, *owner[ptr], ptr))
        else:
            tagged.append((size, *owner.pop(ptr, ("pre", "")), ptr))
    out = _stats(tagged)
    if mark:
        out[mark] = _stats([t for t, (time_ns, *_) in zip(tagged, events) if time_ns >= since])
    return out


def _micro(forward, backward) -> None:
    """One micro-batch: forward, then backward inside record_function("backward")."""
    loss = forward()
    with torch.profiler.record_function("backward"):
        backward(loss)


def plain(ids) -> dict:
    """One micro-batch's backward of the model without DeepSpeed (bf16), gradients dropped or kept."""
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).to(torch.bfloat16).to(device())
    out = {}
    for name, drop in (("plain_drop", True), ("plain_keep", False)):
        hooks = [p.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None)) for p in model.parameters()] \
            if drop else []
        for _ in range(2):  # the second is measured (allocator and lazy state warm)
            model.zero_grad(set_to_none=True)
            got = transient(lambda: _micro(lambda: model(input_ids=ids, labels=ids).loss, lambda loss: loss.backward()),
                            "backward")
        out[name] = got
        for h in hooks:
            h.remove()
    return out


def run(cfg: dict, ids) -> dict:
    import deepspeed
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": cfg["gas"], "bf16": {"enabled": True},
          "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
          "zero_optimization": {"stage": cfg["zero"], **cfg.get("zero_optimization", {})}, **cfg.get("ds", {})}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=ds)
    rows = []
    for step in range(STEPS):
        for micro in range(cfg["gas"]):
            if step < STEPS - 1:
                engine.backward(engine(input_ids=ids, labels=ids).loss)
                engine.step()
                continue
            got = transient(lambda: _micro(lambda: engine(input_ids=ids, labels=ids).loss, engine.backward), "backward")
            rows.append({"micro": micro, "micro_step": got, "step": transient(engine.step)})
    zo = engine.optimizer
    out = {"name": cfg["name"], "optimizer": type(zo).__name__, "rows": rows,
           "overlap_comm": bool(getattr(zo, "overlap_comm", False)),
           "contiguous_gradients": bool(getattr(zo, "contiguous_gradients", False))}
    return out


def main(cfg: dict) -> None:
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl")
    torch.manual_seed(0)
    ids = torch.randint(0, LLAMA["vocab_size"], (1, SEQ), device=device())
    start = time.perf_counter()
    result = {"rank": rank(), **(plain(ids) if cfg.get("plain", True) else {}), "runs": []}
    result["plain_seconds"] = round(time.perf_counter() - start, 2)
    for r in cfg["runs"]:
        start = time.perf_counter()
        result["runs"].append({**run(r, ids), "seconds": round(time.perf_counter() - start, 2)})
    write_result(result)


if __name__ == "__main__":
    run_and_leave(main)  # as calibrate/engines/deepspeed_worker.py: barrier, then os._exit
