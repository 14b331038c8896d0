"""Worker: the transient memory of PyTorch FSDP2 (torch 2.13 fully_shard) on 2 gloo ranks, run under
torchrun (calibrate/harness/launch.py). The model is the tiny Llama of calibrate/engines/fsdp_worker.py with one
fully_shard unit per decoder layer and one at the root (embed_tokens, norm, lm_head), AdamW
foreach=False.

For every run of the config ({"runs": [{"name", "mixed", "reshard_after_forward", "gas"}, ...]}) it
trains one optimizer step of `gas` micro-batches (lazy init, optimizer states), then measures the
second step: each micro-batch's forward and backward, and opt.step(). Gradients are zeroed with
set_to_none=False, as calibrate/engines/fsdp_worker.py does, so the sharded gradients exist before every
micro-batch (the planner books them as model states for the whole step).

What FSDP holds beyond the model states is tracked buffer by buffer (BufferTracker): every buffer
FSDP allocates, at the call that allocates it (KINDS: torch 2.13 file and function), and the
unsharded gradients autograd makes for FSDP's unsharded parameters, with the unit (fully_shard
module) it belongs to. The live bytes are summed right after each of these allocations (between two
allocations they can only fall), so the largest sum is the exact peak of FSDP's bytes, per moment.
A buffer is alive while its storage is (torch.multiprocessing.reductions.StorageWeakRef; the
unsharded parameters by their storage's size, which FSDP resizes to 0 to reshard), not while
torch.profiler says so: on 2 gloo ranks a third to half the profiled micro-batches lacked one free among
their ~1,088 allocation events (a 92,416-B all-gather output then counted alive for the rest of the
step), apparently one made on gloo's worker thread, where the profiler's thread-local state is off.
The collectives hand gloo private copies (private_copy_comms) so that FSDP's buffers die when FSDP
drops them, as with NCCL.

gloo's own temporaries (a flat copy of the all-gather output in c10d::_allgather_base_, a clone of
the reduce-scatter input in c10d::_reduce_scatter_base_) and CPU aten::_chunk_cat's per-parameter
temporary are not FSDP's and not made by NCCL / CUDA's _chunk_cat: they are counted apart
(cpu_only_peak, torch.profiler allocation events under those ops, with FSDP's default comms: a
lower bound, not a planner term).

Usage: python -m torch.distributed.run --standalone --nproc_per_node 2 -m calibrate.engines.fsdp_transient_worker
'{"runs": [{"name": "bf16/reshard-true/gas1", "mixed": true, "reshard_after_forward": true, "gas": 1}]}'
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from calibrate.engines.deepspeed_transient_worker import _micro, profiled_allocations, transient
from calibrate.engines.deepspeed_worker import run_and_leave
from calibrate.engines.fsdp_worker import LLAMA, storage_bytes
from calibrate.harness.worker_io import device, rank, write_result

MBS, SEQ = 2, 32

KINDS = {  # torch 2.13, torch/distributed/fsdp/_fully_shard/...
    "all_gather_input": "_fsdp_collectives.py _get_param_all_gather_inputs: flat_foreach_copy_input, the "
                        "unit's shard cast to param_dtype (MixedPrecisionPolicy only; freed when "
                        "foreach_all_gather returns)",
    "all_gather_output": "_fsdp_collectives.py foreach_all_gather: all_gather_output, the flat unsharded unit "
                         "(freed after the copy-out; in forward when the next unit's wait_for_unshard returns: "
                         "_fsdp_param_group.py comm_ctx.all_gather_state, then its prev_all_gather_state)",
    "unsharded_params": "_fsdp_param.py init_all_gather_outputs / alloc_all_gather_outputs: every parameter's "
                        "unsharded storage (resized to 0 by free_unsharded_param at reshard)",
    "unsharded_grads": "autograd's gradients of the unsharded parameters (FSDPParam._unsharded_param.grad), "
                       "dropped by _fsdp_param_group.py post_backward after foreach_reduce copied them",
    "unsharded_accumulated_grads": "_fsdp_param.py to_accumulated_grad_if_needed: an unsharded gradient cast to "
                                   "reduce_dtype and accumulated there while gradient sync is off "
                                   "(set_requires_gradient_sync(False): torchtitan's chunked loss before its last "
                                   "chunk); handed to foreach_reduce by the synced post_backward",
    "reduce_scatter_input": "_fsdp_collectives.py foreach_reduce: reduce_scatter_input, the unit's gradients in "
                            "reduce_dtype (kept in comm_ctx.reduce_scatter_states until the next unit's "
                            "post_backward, max_input_buffers 1)",
    "reduce_scatter_output": "_fsdp_collectives.py foreach_reduce: reduce_output, the unit's gradient shard in "
                             "reduce_dtype (added into the sharded .grad, then dropped)",
}


def _unit(fqn: str) -> str:
    """The fully_shard unit of a parameter fqn: its decoder layer, or 'root'."""
    parts = fqn.split(".")
    return ".".join(parts[:3]) if parts[:2] == ["model", "layers"] else "root"


class BufferTracker:
    """FSDP's buffers and unsharded gradients, each held by a weak reference to its storage; `sample()`
    sums what is alive into the current phase's peak ({phase: {"peak", "by_unit": {"kind/unit": bytes}}};
    phases forward, backward, final_callback, after) and "at_reduce_scatter" keeps the sum at each
    reduce-scatter buffer's allocation. Installed by wrapping the torch 2.13 functions that allocate
    them (restored by `remove()`); what FSDP does is unchanged."""

    def __init__(self, model, fsdp_params, unit_of=_unit):
        self.unit_of = unit_of  # parameter fqn -> its fully_shard unit
        self.fsdp_params = fsdp_params  # the unsharded parameters are summed from their storages' sizes
        self.held = set()  # storages that are not transient (sharded parameters, gradients)
        for p in model.parameters():
            for t in (p, p.grad):
                if t is not None:
                    self.held.add(t.to_local().untyped_storage().data_ptr())
        self.buffers = []  # [kind, unit, bytes, StorageWeakRef]
        self.phase, self.peaks = None, {}
        self._undo = []

    def add(self, kind: str, unit: str, tensor) -> None:
        from torch.multiprocessing.reductions import StorageWeakRef

        s = tensor.untyped_storage()
        if s.data_ptr() in self.held or any(b[3] == StorageWeakRef(s) for b in self.buffers if not b[3].expired()):
            return
        self.buffers.append([kind, unit, s.nbytes(), StorageWeakRef(s)])
        total = self.sample()
        if kind.startswith("reduce_scatter") and total is not None:  # the instant each is allocated
            self.peaks.setdefault("at_reduce_scatter", {})[f"{kind}/{unit}"] = total

    def sample(self):
        """Sum what is alive into the current phase's peak; return the sum (None outside a phase)."""
        if self.phase is None:
            return None
        self.buffers = [b for b in self.buffers if not b[3].expired()]
        by = {}
        for kind, unit, nbytes, _ in self.buffers:
            by[f"{kind}/{unit}"] = by.get(f"{kind}/{unit}", 0) + nbytes
        for fp in self.fsdp_params:
            n = sum(t.untyped_storage().nbytes() for t in fp.all_gather_outputs)
            if n:
                key = f"unsharded_params/{self.unit_of(fp._param_fqn)}"
                by[key] = by.get(key, 0) + n
        total = sum(by.values())
        if total > self.peaks.get(self.phase, {"peak": -1})["peak"]:
            self.peaks[self.phase] = {"peak": total, "by_unit": by}
        return total

    def _patch(self, owner, name, wrapper) -> None:
        original = getattr(owner, name)
        setattr(owner, name, wrapper(original))
        self._undo.append((owner, name, original))

    def install(self) -> None:
        import torch.distributed.fsdp._fully_shard._fsdp_collectives as coll
        import torch.distributed.fsdp._fully_shard._fsdp_param as fparam
        import torch.distributed.fsdp._fully_shard._fsdp_state as fstate

        tracker = self

        def inputs(original):  # called by foreach_all_gather through the module's global name
            def wrapped(fsdp_params):
                out = original(fsdp_params)
                for ts in out:
                    for t in ts:
                        tracker.add("all_gather_input", tracker.unit_of(fsdp_params[0]._param_fqn), t)
                return out
            return wrapped

        def allocate(original):  # DefaultAllocMixin.allocate: the caller's locals name the buffer
            def wrapped(self, size, *, dtype, device):
                out = original(self, size, dtype=dtype, device=device)
                caller = sys._getframe(1)
                unit = tracker.unit_of(caller.f_locals["fsdp_params"][0]._param_fqn)
                if caller.f_code.co_name == "foreach_all_gather":
                    kind = "all_gather_output"
                else:  # foreach_reduce: the input first, then the output
                    first = "reduce_scatter_input" not in caller.f_locals
                    kind = "reduce_scatter_input" if first else "reduce_scatter_output"
                tracker.add(kind, unit, out)
                return out
            return wrapped

        def after(original):  # FSDPParam methods that (re)allocate the unsharded storage
            def wrapped(self, *args, **kwargs):
                out = original(self, *args, **kwargs)
                tracker.sample()
                return out
            return wrapped

        def final(original):  # the root's post_backward and the waits, after autograd has finished
            def wrapped(self, *args, **kwargs):
                tracker.phase = "final_callback"
                tracker.sample()
                try:
                    return original(self, *args, **kwargs)
                finally:
                    tracker.phase = "after"
            return wrapped

        def accumulated(original):  # FSDPParam.to_accumulated_grad_if_needed: the reduce_dtype copy it keeps
            def wrapped(self, *args, **kwargs):
                out = original(self, *args, **kwargs)
                if self.unsharded_accumulated_grad is not None:
                    tracker.add("unsharded_accumulated_grads", tracker.unit_of(self._param_fqn),
                                self.unsharded_accumulated_grad)
                return out
            return wrapped

        self._patch(fparam.FSDPParam, "to_accumulated_grad_if_needed", accumulated)
        self._patch(fstate.FSDPState, "_root_post_backward_final_callback", final)
        self._patch(coll, "_get_param_all_gather_inputs", inputs)
        self._patch(coll.DefaultAllocMixin, "allocate", allocate)
        self._patch(fparam.FSDPParam, "init_all_gather_outputs", after)
        self._patch(fparam.FSDPParam, "alloc_all_gather_outputs", after)
        for fp in self.fsdp_params:  # the unsharded nn.Parameter is made once and reused
            hook = fp._unsharded_param.register_post_accumulate_grad_hook(
                lambda p, fp=fp: tracker.add("unsharded_grads", tracker.unit_of(fp._param_fqn), p.grad))
            self._undo.append((hook, None, None))

    def remove(self) -> None:
        for owner, name, original in reversed(self._undo):
            if name is None:
                owner.remove()
            else:
                setattr(owner, name, original)
        self._undo = []


def private_copy_comms():
    """(all-gather, reduce-scatter) for FSDPModule.set_custom_all_gather / set_custom_reduce_scatter that
    hand gloo private copies of FSDP's buffers. FSDP allocates, keeps and frees its buffers exactly as
    with its defaults (the same DefaultAllocMixin.allocate, the same calls); only gloo no longer holds a
    reference to them: with the defaults, ProcessGroupGloo's worker thread drops its reference to a
    collective's tensors after the caller resumed, now and then after FSDP dropped its own (measured:
    the last unit's all-gather output alive in the next backward), which NCCL's sync collectives do not
    do to the allocator's count."""
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

    class CopyAllGather(DefaultAllGather):
        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            out = torch.empty_like(output_tensor)
            dist.all_gather_into_tensor(out, input_tensor.clone(), group=group)
            output_tensor.copy_(out)

    class CopyReduceScatter(DefaultReduceScatter):
        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            out = torch.empty_like(output_tensor)
            dist.reduce_scatter_tensor(out, input_tensor.clone(), op=op, group=group)
            output_tensor.copy_(out)

    return CopyAllGather(), CopyReduceScatter()


def cpu_only_peak(fn) -> dict:
    """Peak of the running sum, in time order, of the allocations gloo (c10d ops, its worker thread) and
    the CPU aten::_chunk_cat make while `fn` runs (torch.profiler events, record_function ranges as
    parents), by kind: what NCCL and CUDA's _chunk_cat do not allocate."""
    def classify(e) -> tuple:  # (kind from the enclosing ops or None, the allocating thread)
        p = e.parent
        while p is not None:
            if p.name.startswith("c10d::"):
                return "gloo_copy", e.start_tid
            if p.name == "aten::_chunk_cat":
                return "chunk_cat_cpu", e.start_tid
            p = p.parent
        return None, e.start_tid

    events, marked = profiled_allocations(fn, classify=classify, mark="backward")
    main_tid = marked[1] if marked is not None else None
    live, peak, owner = {}, {}, {}
    for _, size, ptr, label in events:
        if size > 0:
            kind, tid = label
            if kind is None and tid != main_tid:
                kind = "gloo_copy"  # ProcessGroupGloo's worker thread
            if kind is None:
                continue
            owner[ptr] = kind
        else:
            kind = owner.pop(ptr, None)
            if kind is None:
                continue
        live[kind] = live.get(kind, 0) + size
        peak[kind] = max(peak.get(kind, 0), live[kind])
    return peak


def states_and_fsdp_params(model, opt, fsdp_modules) -> tuple[dict, list]:
    """The model states' bytes after a step (parameters, gradients, optimizer states) and FSDP's
    parameters, each once (a unit of several modules, torchtitan's [norm, lm_head], is one state
    that each of its modules returns)."""
    params = list(model.parameters())
    states = {"param_bytes": storage_bytes(params), "grad_bytes": storage_bytes(p.grad for p in params),
              "optimizer_bytes": storage_bytes(v for st in opt.state.values() for v in st.values()
                                               if torch.is_tensor(v) and v.dim() > 0)}
    fsdp_params = {id(fp): fp for m in fsdp_modules for g in m._get_fsdp_state()._fsdp_param_groups
                   for fp in g.fsdp_params}
    return states, list(fsdp_params.values())


def run(cfg: dict) -> dict:
    import transformers

    llama = {**LLAMA, **cfg.get("llama", {})}
    torch.manual_seed(0)
    ids = torch.randint(0, llama["vocab_size"], (MBS, SEQ), device=device())
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**llama)).to(device())
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if cfg["mixed"] \
        else MixedPrecisionPolicy()
    units = {}
    for fqn, p in model.named_parameters():
        units[_unit(fqn)] = units.get(_unit(fqn), 0) + p.numel()
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp, reshard_after_forward=cfg["reshard_after_forward"])
    fully_shard(model, mp_policy=mp, reshard_after_forward=cfg["reshard_after_forward"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    fsdp_modules = [m for m in model.modules() if hasattr(m, "set_custom_all_gather")]
    gather, scatter = private_copy_comms()
    for m in fsdp_modules:
        m.set_custom_all_gather(gather)
        m.set_custom_reduce_scatter(scatter)

    def forward():
        return model(input_ids=ids, labels=ids).loss

    for _ in range(cfg["gas"]):  # step 1: lazy init, optimizer states
        forward().backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
    states, fsdp_params = states_and_fsdp_params(model, opt, fsdp_modules)
    micro = []
    for _ in range(cfg["gas"]):
        tracker = BufferTracker(model, fsdp_params)
        tracker.install()
        try:
            def fwd():
                tracker.phase = "forward"
                tracker.sample()
                return forward()

            def bwd(loss):
                tracker.phase = "backward"
                tracker.sample()
                loss.backward()  # the final callback sets "final_callback", then "after"
                tracker.sample()

            _micro(fwd, bwd)
        finally:
            tracker.remove()
        micro.append(tracker.peaks)
    step = transient(opt.step)  # everything step() allocates above what was live, by frame category
    opt.zero_grad(set_to_none=False)
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

    for m in fsdp_modules:  # FSDP's own gloo path, for what it copies
        m.set_custom_all_gather(DefaultAllGather())
        m.set_custom_reduce_scatter(DefaultReduceScatter())
    cpu = cpu_only_peak(lambda: _micro(forward, lambda loss: loss.backward()))
    opt.zero_grad(set_to_none=False)
    return {**{k: cfg[k] for k in ("name", "mixed", "reshard_after_forward", "gas")}, "llama": llama,
            "units": units, "fsdp_params": len(fsdp_params), "model_states": states, "micro": micro,
            "cpu_only_peak": cpu, "step": {"peak": step["peak"], "by": step["by"], "peak_only": step["peak_only"]}}


def main(cfg: dict) -> None:
    dist.init_process_group("gloo")
    result = {"rank": rank(), "world": dist.get_world_size(), "kinds": KINDS, "runs": []}
    for r in cfg["runs"]:
        start = time.perf_counter()
        result["runs"].append({**run(r), "seconds": round(time.perf_counter() - start, 2)})
    write_result(result)


if __name__ == "__main__":
    run_and_leave(main)  # as calibrate/engines/deepspeed_worker.py: barrier, then os._exit
