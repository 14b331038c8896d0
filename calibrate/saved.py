"""Count what a module saves for backward: torch.autograd.graph.saved_tensors_hooks over a forward.

Saved tensors are deduplicated by storage (a view of a tensor already kept costs nothing more) and
the module's parameters are left out (a saved weight is not an activation). The bytes are those
of each storage's live extent, the way the caching allocator would hold them.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


class SavedCounter:
    """Collects (storage pointer -> bytes, shape, dtype, creator) of every tensor saved in the block."""

    def __init__(self, exclude=()):
        self.exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self.saved = {}

    def pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr and ptr not in self.exclude and ptr not in self.saved:
            self.saved[ptr] = (storage.nbytes(), tuple(t.shape), str(t.dtype).replace("torch.", ""),
                               type(t.grad_fn).__name__ if t.grad_fn is not None else "leaf")
        return t

    @staticmethod
    def unpack(t):
        return t

    @property
    def total_bytes(self) -> int:
        return sum(v[0] for v in self.saved.values())

    def table(self) -> list:
        return sorted(self.saved.values(), key=lambda v: -v[0])


@contextmanager
def counting(exclude=()):
    """`with counting(model.parameters()) as c: loss = model(x)` -> c.total_bytes saved for backward."""
    c = SavedCounter(exclude)
    with torch.autograd.graph.saved_tensors_hooks(c.pack, c.unpack):
        yield c


def hf_saved_counter(hf_config: dict, seq: int, batch: int, dtype: str = "bfloat16",
                     checkpointing: bool = False) -> SavedCounter:
    """The SavedCounter of one forward of the transformers base model (AutoModel) of `hf_config`:
    its model_type (default llama; gpt2, gpt_neox, ... alike) and fields go to AutoConfig.for_model;
    num_hidden_layers works for every model_type (GPT2Config.attribute_map maps it to n_layer).
    Call .table() on it to see each saved tensor."""
    import transformers

    torch.manual_seed(0)
    fields = dict(hf_config)
    config = transformers.AutoConfig.for_model(fields.pop("model_type", "llama"), **fields)
    model = transformers.AutoModel.from_config(config).to(getattr(torch, dtype)).train()
    if checkpointing:
        model.gradient_checkpointing_enable()  # transformers: torch.utils.checkpoint around each decoder layer
    ids = torch.randint(0, hf_config["vocab_size"], (batch, seq))
    with counting(model.parameters()) as c:
        model(input_ids=ids, use_cache=False)
    return c


def hf_saved_bytes(hf_config: dict, seq: int, batch: int, dtype: str = "bfloat16", checkpointing: bool = False) -> int:
    """Bytes the transformers base model of `hf_config` (its model_type, default llama) saves for
    backward in one forward."""
    return hf_saved_counter(hf_config, seq, batch, dtype, checkpointing).total_bytes


def hf_layer_bytes(hf_config: dict, seq: int, batch: int, dtype: str = "bfloat16", checkpointing: bool = False) -> int:
    """What one decoder layer saves: half the difference between 4 and 2 layers (every storage once)."""
    two = hf_saved_bytes({**hf_config, "num_hidden_layers": 2}, seq, batch, dtype, checkpointing)
    four = hf_saved_bytes({**hf_config, "num_hidden_layers": 4}, seq, batch, dtype, checkpointing)
    assert (four - two) % 2 == 0
    return (four - two) // 2


def transient_peak_bytes(fn) -> int:
    """Peak, above what was live before, of the bytes allocated while `fn` runs on the CPU:
    torch.profiler(profile_memory=True) records every allocation and free as an Allocation event
    with its own timestamp (signed alloc_size); their running sum in time order peaks at the step's
    peak. (Summing each op's self_cpu_memory_usage at the op's start instead misplaces a free made
    between ops, e.g. a tensor dropped in Python, at the start of the op that encloses it: on
    torch.distributed.pipelining's Schedule1F1B that read 3.19 micro-batches held where 2 were.)"""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    todo, events = list(prof.profiler.kineto_results.experimental_event_tree()), []
    while todo:
        e = todo.pop()
        todo.extend(e.children)
        if e.tag == _EventType.Allocation:
            events.append((e.start_time_ns, e.extra_fields.alloc_size))
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    return peak
