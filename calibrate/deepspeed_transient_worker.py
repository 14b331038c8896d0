"""Worker: the transient peaks of DeepSpeed's backward and step() on 2 gloo ranks (DS_ACCELERATOR=cpu),
run under DeepSpeed's launcher (calibrate/launch.py, launcher="deepspeed").

Each rank first runs the same tiny Llama (calibrate/deepspeed_worker.py LLAMA, bf16) without
DeepSpeed: one micro-batch's forward + backward with every gradient dropped as soon as it is
accumulated (a post-accumulate-grad hook sets p.grad = None: activations and autograd temporaries
alone, "plain_drop") and with the gradients kept ("plain_keep"). Then, for every run of the config
({"runs": [{"name", "zero", "gas", "zero_optimization": {...}}, ...]}), it trains 2 optimizer steps
and, in the second, profiles each micro-batch's forward + engine.backward ("micro_step", with the
backward alone under "backward") and each engine.step() ("step") with calibrate.saved's method: the
peak of live allocated bytes above what was live before, from torch.profiler's allocation events in
time order. Every allocation is tagged by its innermost frame (autograd node, model forward,
DeepSpeed's Python code, torch's optimizer): the result has the bytes of each kind live at the peak,
the peak of each kind's allocations alone, and the largest allocations live at the peak.

Usage: ... -m calibrate.deepspeed_transient_worker '{"runs": [{"name": "z2", "zero": 2, "gas": 1}]}'
"""

from __future__ import annotations

import os
import time

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported

from calibrate.deepspeed_worker import LLAMA, run_and_leave  # noqa: E402
from calibrate.worker_io import device, rank, write_result  # noqa: E402

SEQ = 16
STEPS = 2


def _category(e) -> tuple:
    """(category, where) of the allocation event `e`, from the innermost enclosing frame that is an
    autograd node ("autograd"), torch's optimizer ("optimizer"), DeepSpeed's Python code ("deepspeed")
    or the model's (transformers, torch.nn: "model"); with_stack=True records Python frames as events.
    ZeRO-3's LinearFunctionForZeroStage3 (zero/linear.py) is the model's own matmul, not DeepSpeed's."""
    op, p = None, e.parent
    while p is not None:
        name = _name(p)
        if op is None and name.startswith("aten::"):
            op = name
        if name.startswith("autograd::engine::evaluate_function"):
            return "autograd", name.split(": ")[-1]
        if ".py(" in name:
            if "torch/optim/" in name:
                return "optimizer", name.split("/")[-1]
            if "deepspeed/" in name and "zero/linear.py" not in name:
                return "deepspeed", name.split("/")[-1]
            if "transformers/" in name or "torch/nn/" in name:
                return "model", name.split("/")[-1]
        p = p.parent
    return "model", op or "?"


def _name(e) -> str:
    """The profiler event's name ("" where torch.profiler hands back bytes that are not UTF-8: seen
    once on a Python-frame event)."""
    try:
        return e.name
    except UnicodeDecodeError:
        return ""


CATEGORIES = ("autograd", "deepspeed", "optimizer", "model")


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
    only = {}
    for c in CATEGORIES:
        run = top = 0
        for size, cat, *_ in tagged:
            if cat == c:
                run += size
                top = max(top, run)
        only[c] = top
    rows = sorted((list(v) for v in alive.values()), key=lambda r: -r[0])
    return {"peak": peak, "end": live, "by": by, "freed_before": freed_before, "live": rows[:24],
            "peak_only": only}


def profiled_allocations(fn, with_stack: bool, mark: str = "") -> tuple:
    """(allocation and free events of fn() in time order as (time_ns, signed bytes, ptr, event), the
    last profiled event named `mark` or None), from torch.profiler's memory events."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=with_stack) as prof:
        fn()
    todo, events, marked = list(prof.profiler.kineto_results.experimental_event_tree()), [], None
    while todo:
        e = todo.pop()
        todo.extend(e.children)
        if e.tag == _EventType.Allocation:
            events.append((e.start_time_ns, e.extra_fields.alloc_size, e.extra_fields.ptr, e))
        elif mark and _name(e) == mark:
            marked = e
    events.sort(key=lambda x: x[0])
    return events, marked


def transient(fn, mark: str = "") -> dict:
    """calibrate.saved.transient_peak_bytes of `fn` (profiled with Python frames), and what is live at
    the peak: {"peak", "end" (net bytes when fn returns), "by": {category: bytes made during fn and
    alive at the peak}, "freed_before": bytes of earlier tensors freed by the peak, "live": [[bytes,
    category, where], ...] largest first, "peak_only": {category: the peak of the running sum of that
    category's allocations and their frees alone}}; with `mark`, the same for the part
    of fn from the start of the record_function(mark) range on under key mark."""
    events, marked = profiled_allocations(fn, with_stack=True, mark=mark)
    since = marked.start_time_ns if marked is not None else None
    tagged, owner = [], {}  # (signed bytes, category of the allocation, where, ptr)
    for _, size, ptr, e in events:
        if size > 0:
            owner[ptr] = _category(e)
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
          "zero_optimization": {"stage": cfg["zero"], **cfg.get("zero_optimization", {})}}
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
    run_and_leave(main)  # as calibrate/deepspeed_worker.py: barrier, then os._exit
