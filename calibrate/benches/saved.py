"""Count what a module saves for backward: torch.autograd.graph.saved_tensors_hooks over a forward.

Saved tensors are deduplicated by storage (a view of a tensor already kept costs nothing more) and
the module's parameters are left out (a saved weight is not an activation). The bytes are those
of each storage's live extent, the way the caching allocator would hold them.
"""

from __future__ import annotations

import weakref
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


class _Packed:
    """What LiveSavedCounter hands autograd for a saved tensor: alive as long as the node that saved it."""

    __slots__ = ("t", "__weakref__")

    def __init__(self, t):
        self.t = t


class LiveSavedCounter(SavedCounter):
    """A SavedCounter of the tensors the graph still holds once the forward has returned: call
    .settle() while its output is alive. A node on a branch nothing downstream uses (e.g. torch.topk
    whose values are dropped and only the indices used) saves its tensors and frees them with
    itself during the forward; SavedCounter counts those, and may then skip a later tensor that
    reuses the freed address as a duplicate."""

    def __init__(self, exclude=()):
        super().__init__(exclude)
        self.packed = []

    def pack(self, t: torch.Tensor):
        held = _Packed(t)
        storage = t.untyped_storage()
        self.packed.append((weakref.ref(held), storage.data_ptr(), (storage.nbytes(), tuple(t.shape),
                            str(t.dtype).replace("torch.", ""), type(t.grad_fn).__name__ if t.grad_fn else "leaf")))
        return held

    @staticmethod
    def unpack(held):
        return held.t

    def settle(self) -> "LiveSavedCounter":
        """Keep in .saved what the graph holds now; list in .freed (pointer, info) what was saved by a
        node gone since (its storage may still be held by another node, or its address reused)."""
        self.saved, self.freed = {}, []
        for ref, ptr, info in self.packed:
            if ptr and ptr not in self.exclude:
                if ref() is not None:
                    self.saved.setdefault(ptr, info)
                else:
                    self.freed.append((ptr, info))
        return self


@contextmanager
def counting(exclude=(), live: bool = False):
    """`with counting(model.parameters()) as c: loss = model(x)` -> c.total_bytes saved for backward
    (live: a LiveSavedCounter, to .settle() while `loss` is alive)."""
    c = LiveSavedCounter(exclude) if live else SavedCounter(exclude)
    with torch.autograd.graph.saved_tensors_hooks(c.pack, c.unpack):
        yield c


def hf_saved_counter(hf_config: dict, seq: int, batch: int, dtype: str = "bfloat16",
                     checkpointing: bool = False, live: bool = False, device: str = "cpu") -> SavedCounter:
    """The SavedCounter of one forward of the transformers base model (AutoModel) of `hf_config`:
    its model_type (default llama; gpt2, gpt_neox, ... alike) and fields go to AutoConfig.for_model;
    num_hidden_layers works for every model_type (GPT2Config.attribute_map maps it to n_layer).
    checkpointing: True checkpoints every decoder layer, an int k every k-th.
    live: count only what the graph still holds after the forward (LiveSavedCounter).
    device: "cuda" counts what CUDA's kernels save (fp32 GQA SDPA: the math kernel's, not a flash kernel's).
    Call .table() on it to see each saved tensor."""
    import transformers

    torch.manual_seed(0)
    fields = dict(hf_config)
    config = transformers.AutoConfig.for_model(fields.pop("model_type", "llama"), **fields)
    model = transformers.AutoModel.from_config(config).to(getattr(torch, dtype)).to(device).train()
    if checkpointing is True:  # transformers: torch.utils.checkpoint around each decoder layer
        # activation_checkpointing_enable is 5.x's name; gradient_checkpointing_enable its deprecated alias
        getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
    elif checkpointing:  # an int k: every k-th decoder layer from the first (transformers 5.25 every_n_layers)
        model.activation_checkpointing_enable(every_n_layers=int(checkpointing))
    ids = torch.randint(0, hf_config["vocab_size"], (batch, seq), device=device)
    with counting(model.parameters(), live) as c:
        out = model(input_ids=ids, use_cache=False)
    if live:
        c.settle()
    del out
    return c


def hf_saved_bytes(hf_config: dict, seq: int, batch: int, dtype: str = "bfloat16", checkpointing: bool = False,
                   live: bool = False, device: str = "cpu") -> int:
    """Bytes the transformers base model of `hf_config` (its model_type, default llama) saves for
    backward in one forward."""
    return hf_saved_counter(hf_config, seq, batch, dtype, checkpointing, live, device).total_bytes


def hf_layer_bytes(hf_config: dict, seq: int, batch: int, dtype: str = "bfloat16", checkpointing: bool = False,
                   live: bool = False, device: str = "cpu") -> int:
    """What one decoder layer saves: half the difference between 4 and 2 layers (every storage once)."""
    two = hf_saved_bytes({**hf_config, "num_hidden_layers": 2}, seq, batch, dtype, checkpointing, live, device)
    four = hf_saved_bytes({**hf_config, "num_hidden_layers": 4}, seq, batch, dtype, checkpointing, live, device)
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
