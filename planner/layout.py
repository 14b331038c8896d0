"""The execution: how the job is split (TP/PP/DP/CP/EP, ZeRO, offload, micro-batching, recompute).

`Layouts` holds many candidate layouts as parallel numpy arrays (a single layout is an array of
one); every formula in memory.py and timing.py takes a `Layouts`, so the search evaluates all
candidates in one vectorized pass. `Training` holds the settings shared by all candidates.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from planner.errors import InputError
from planner.hardware import Cluster
from planner.model import ModelSpec

RECOMPUTE = ("none", "selective", "full")
OFFLOAD = ("none", "cpu", "nvme")
SCHEDULES = ("1f1b", "interleaved", "gpipe")
PRECISIONS = ("bf16", "fp16", "fp32", "bf16-pure")
OPTIMIZERS = ("adamw", "sgd", "adafactor", "adam8bit")
ENGINES = ("deepspeed", "megatron-deepspeed", "megatron", "fsdp")


def code(value: str, allowed: tuple, flag: str) -> int:
    """Index of a categorical value; clear error naming the flag otherwise."""
    key = str(value).lower()
    if key not in allowed:
        raise InputError(f"{flag}: must be one of {', '.join(allowed)}, got {value!r}")
    return allowed.index(key)


@dataclass(frozen=True)
class ZeroConfig:
    """DeepSpeed `zero_optimization` fields that size buffers (defaults: DeepSpeed 0.19 DeepSpeedZeroConfig)."""

    reduce_bucket_size: int = 500_000_000
    """Elements per gradient reduce bucket."""
    allgather_bucket_size: int = 500_000_000
    """Elements per ZeRO-1/2 parameter all-gather bucket."""
    overlap_comm: bool | None = None
    """None resolves to True for stage 3, False otherwise (DeepSpeed behaviour)."""
    contiguous_gradients: bool = True
    """Copy gradients into a contiguous partition buffer as produced (also installs ZeRO-1 hooks)."""
    stage3_prefetch_bucket_size: int = 50_000_000
    """Elements of parameters prefetched ahead of use (ZeRO-3)."""
    stage3_max_live_parameters: int = 1_000_000_000
    """Upper bound on gathered parameters kept alive (ZeRO-3)."""
    stage3_max_reuse_distance: int = 1_000_000_000
    """Gathered parameters reused within this many elements are kept (ZeRO-3)."""
    stage3_param_persistence_threshold: int = 100_000
    """Parameters smaller than this stay whole on every rank (ZeRO-3)."""
    sub_group_size: int = 1_000_000_000
    """Elements per optimizer sub-group step (ZeRO-3 fp32 gradient chunk)."""

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "overlap_comm" and f.name != "contiguous_gradients" and (value is None or value < 0):
                raise InputError(f"--{f.name.replace('_', '-')}: must be a non-negative integer, got {value!r}")


@dataclass(frozen=True)
class Training:
    """Settings shared by every candidate layout of one question."""

    seq_len: int = 4096
    """Tokens per sequence s."""
    gbs: int = 0
    """Global batch in sequences (0: mbs * dp, one micro-batch per step)."""
    precision: str = "bf16"
    """'bf16'/'fp16': mixed precision with fp32 master weights; 'fp32'; 'bf16-pure': no fp32 copy."""
    optimizer: str = "adamw"
    """'adamw', 'sgd' (with momentum), 'adafactor' (factored, no momentum), 'adam8bit'."""
    flash_attention: bool = True
    """FlashAttention (no s^2 score tensors kept)."""
    engine: str = "deepspeed"
    """'deepspeed', 'megatron-deepspeed', 'megatron', 'fsdp'."""
    zero_config: ZeroConfig = field(default_factory=ZeroConfig)
    """DeepSpeed buffer sizes."""

    def __post_init__(self):
        if not isinstance(self.seq_len, int) or self.seq_len < 1:
            raise InputError(f"--seq-len: must be a positive integer, got {self.seq_len!r}")
        if not isinstance(self.gbs, int) or self.gbs < 0:
            raise InputError(f"--gbs: must be a positive integer, got {self.gbs!r}")
        code(self.precision, PRECISIONS, "--precision")
        code(self.optimizer, OPTIMIZERS, "--optimizer")
        code(self.engine, ENGINES, "--engine")

    @property
    def uses_deepspeed(self) -> bool:
        return self.engine in ("deepspeed", "megatron-deepspeed")


# field name -> (categorical values or None); order is the JSON order
_FIELDS = ("tp", "pp", "dp", "cp", "ep", "vpp", "zero", "offload_optimizer", "offload_params",
           "mbs", "gas", "recompute", "sequence_parallel", "schedule")


@dataclass
class Layouts:
    """Candidate layouts as parallel int64 arrays of one shape. Categoricals hold indices into
    RECOMPUTE / OFFLOAD / SCHEDULES."""

    tp: np.ndarray
    """Tensor-parallel degree t (inside a node)."""
    pp: np.ndarray
    """Pipeline stages p."""
    dp: np.ndarray
    """Data-parallel degree d (ZeRO shards over d*cp)."""
    cp: np.ndarray
    """Context-parallel degree (sequence split for attention)."""
    ep: np.ndarray
    """Expert-parallel degree (taken from the data-parallel ranks)."""
    vpp: np.ndarray
    """Virtual stages per pipeline rank (interleaved schedule when > 1)."""
    zero: np.ndarray
    """ZeRO stage 0-3 (Megatron distributed optimizer = 1, FSDP full shard = 3)."""
    offload_optimizer: np.ndarray
    """Index into OFFLOAD: optimizer states (and fp32 grads) to CPU or NVMe."""
    offload_params: np.ndarray
    """Index into OFFLOAD: ZeRO-3 parameter partitions to CPU or NVMe."""
    mbs: np.ndarray
    """Micro-batch size b in sequences."""
    gas: np.ndarray
    """Micro-batches per step per data-parallel rank m (gradient accumulation steps)."""
    recompute: np.ndarray
    """Index into RECOMPUTE."""
    sequence_parallel: np.ndarray
    """1 when Megatron sequence parallelism splits the non-TP regions over t."""
    schedule: np.ndarray
    """Index into SCHEDULES."""

    def __post_init__(self):
        arrays = np.broadcast_arrays(*(np.asarray(getattr(self, k), dtype=np.int64) for k in _FIELDS))
        for k, a in zip(_FIELDS, arrays):
            setattr(self, k, np.ascontiguousarray(a))

    @property
    def size(self) -> int:
        return int(self.tp.size)

    @property
    def gbs(self) -> np.ndarray:
        """Global batch in sequences: mbs * gas * dp."""
        return self.mbs * self.gas * self.dp

    @property
    def world(self) -> np.ndarray:
        return self.tp * self.pp * self.dp * self.cp

    def codes(self) -> "FieldCodes":
        """Per-field grouping codes, computed once per Layouts and shared by memory and timing."""
        if "_codes" not in self.__dict__:
            self.__dict__["_codes"] = FieldCodes(self)
        return self.__dict__["_codes"]

    def take(self, index) -> "Layouts":
        """The candidates at `index` (mask or integer array)."""
        return Layouts(**{k: getattr(self, k)[index] for k in _FIELDS})

    def row(self, i: int) -> dict:
        """One candidate as the JSON `layout` object (categoricals as names)."""
        out = {k: int(getattr(self, k).flat[i]) for k in _FIELDS}
        out["recompute"] = RECOMPUTE[out["recompute"]]
        out["offload_optimizer"] = OFFLOAD[out["offload_optimizer"]]
        out["offload_params"] = OFFLOAD[out["offload_params"]]
        out["schedule"] = SCHEDULES[out["schedule"]]
        out["sequence_parallel"] = bool(out["sequence_parallel"])
        out["gbs"] = out["mbs"] * out["gas"] * out["dp"]
        return out


def single(tp=1, pp=1, dp=1, cp=1, ep=1, vpp=1, zero=0, offload_optimizer="none", offload_params="none",
           mbs=1, gas=1, recompute="none", sequence_parallel=False, schedule=None) -> Layouts:
    """One layout, from names, as a Layouts of size 1."""
    if schedule is None:
        schedule = "interleaved" if vpp > 1 else "1f1b"
    return Layouts(
        tp=[tp], pp=[pp], dp=[dp], cp=[cp], ep=[ep], vpp=[vpp], zero=[zero],
        offload_optimizer=[code(offload_optimizer, OFFLOAD, "--offload-optimizer")],
        offload_params=[code(offload_params, OFFLOAD, "--offload-params")],
        mbs=[mbs], gas=[gas], recompute=[code(recompute, RECOMPUTE, "--recompute")],
        sequence_parallel=[int(bool(sequence_parallel))], schedule=[code(schedule, SCHEDULES, "--schedule")],
    )


# ---------------------------------------------------------------------------------------------
# evaluating a formula once per distinct combination of the fields it reads


class FieldCodes:
    """Layouts fields as small integer codes for grouping, computed once per field: the value itself
    when small, else its rank among the field's distinct values."""

    def __init__(self, lay: Layouts):
        self.lay, self.cache, self.groups = lay, {}, {}

    def __call__(self, name: str, compress: bool = False) -> tuple[np.ndarray, int]:
        if (name, compress) not in self.cache:
            col = getattr(self.lay, name).ravel()
            low, high = int(col.min()), int(col.max())
            if not compress and 0 <= low and high < 64:
                code = (col, high + 1)
            elif high - low < 1 << 20:
                present = np.zeros(high - low + 1, dtype=bool)
                shifted = col - low if low else col
                present[shifted] = True
                code = (np.take(np.cumsum(present) - 1, shifted), int(present.sum()))
            else:
                distinct, inverse = np.unique(col, return_inverse=True)
                code = (inverse.ravel(), distinct.size)
            self.cache[name, compress] = code
        return self.cache[name, compress]


def grouped(codes: FieldCodes, names: tuple, fn) -> dict:
    """fn(sub-Layouts) evaluated once per distinct combination of fields `names`, gathered back to the full
    shape; fn must depend on those fields only (elementwise formulas give identical values)."""
    lay = codes.lay
    if lay.size <= 64:  # too few to be worth grouping: evaluate directly
        return {k: np.maximum(np.broadcast_to(v, lay.tp.shape), 0.0) for k, v in fn(lay).items()}
    if names not in codes.groups:
        codes.groups[names] = _group(codes, names)
    first, inverse = codes.groups[names]
    sub = Layouts(**{f.name: getattr(lay, f.name).ravel()[first] for f in fields(Layouts)})
    return {k: np.take(np.maximum(np.broadcast_to(v, sub.tp.shape), 0.0), inverse).reshape(lay.tp.shape)
            for k, v in fn(sub).items()}


def _group(codes: FieldCodes, names: tuple) -> tuple:
    """(index of one representative per distinct combination of `names`, each row's combination)."""
    lay = codes.lay
    limit = max(1 << 22, 4 * lay.size)
    compress = np.prod([float(codes(name)[1]) for name in names]) > limit
    key, space = codes(names[0], compress)[0].astype(np.int64), codes(names[0], compress)[1]
    for name in names[1:]:  # mixed-radix code
        code, span = codes(name, compress)
        key *= span
        key += code
        space *= span
    if space <= limit:  # dense table: O(N), no sort
        rep = np.full(space, -1, dtype=np.int64)
        rep[key] = np.arange(key.size)
        distinct = np.flatnonzero(rep >= 0)
        slot = np.empty(space, dtype=np.int64)
        slot[distinct] = np.arange(distinct.size)
        first, inverse = rep[distinct], np.take(slot, key)
    else:
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        inverse = inverse.ravel()
    return first, inverse


# ---------------------------------------------------------------------------------------------
# validity rules, vectorized; the single-layout path raises the first broken rule's message

def rule_violations(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts) -> dict:
    """{reason: (bool array of candidates breaking it, message for one layout)}; reasons are grouped
    'divisibility', 'topology' and 'engine rule' by the search's rejection counts."""
    t, p, d, c, e, v, z = lay.tp, lay.pp, lay.dp, lay.cp, lay.ep, lay.vpp, lay.zero
    oo, op, _r, sp = lay.offload_optimizer, lay.offload_params, lay.recompute, lay.sequence_parallel
    ds = training.uses_deepspeed
    L = model.layers
    rules = {
        "world": (t * p * d * c != cluster.num_gpus,
                  f"--tp*--pp*--dp*--cp must equal --gpus {cluster.num_gpus}"),
        "tp_heads": ((model.heads % t != 0) | (model.kv_heads % t != 0),
                     f"--tp: must divide --heads {model.heads} and --kv-heads {model.kv_heads}"),
        "tp_node": (t > cluster.gpus_per_node,
                    f"--tp: must not exceed --gpus-per-node {cluster.gpus_per_node} (TP stays inside a node)"),
        "pp_layers": (p * v > L, f"--pp*--vpp: must not exceed the layer count {L}"),
        "vpp_divides": ((v > 1) & ((L % np.maximum(p * v, 1) != 0) | (p < 2)),
                        f"--vpp: interleaving needs --pp > 1 and --pp*--vpp dividing the layer count {L}"),
        "cp_seq": ((training.seq_len % (2 * c) != 0) & (c > 1), f"--cp: 2*cp must divide --seq-len {training.seq_len}"),
        "ep_experts": ((model.experts % e != 0) | (d % e != 0),
                       f"--ep: must divide the expert count {model.experts} and --dp"),
        "zero_range": ((z < 0) | (z > 3), "--zero: must be one of 0, 1, 2, 3"),
        "offload_params_zero3": ((op > 0) & (z != 3), "--offload-params: needs --zero 3"),
        "offload_needs_deepspeed": (((oo > 0) | (op > 0)) & (not ds) & (training.engine != "fsdp"),
                                    "--offload-optimizer/--offload-params: need --engine deepspeed or fsdp"),
        "offload_optimizer_zero": ((oo > 0) & (z == 0), "--offload-optimizer: needs --zero 1, 2 or 3"),
        "sp_needs_tp": ((sp > 0) & (t < 2), "--sequence-parallel: needs --tp > 1"),
        "batch": ((lay.mbs < 1) | (lay.gas < 1), "--mbs/--gbs: must be positive, with --gbs divisible by --mbs*--dp"),
        # deepspeed/runtime/pipe/engine.py: ZeRO-2/3 are incompatible with pipeline parallelism
        "ds_pipe_zero": (ds & (p > 1) & (z >= 2), "--zero: DeepSpeed's pipeline engine takes --zero 0 or 1 when --pp > 1"),
        # deepspeed/runtime/pipe/schedule.py has TrainSchedule (1F1B) only: no interleaving, no GPipe
        "ds_pipe_schedule": (ds & (p > 1) & ((v > 1) | (lay.schedule != 0)),
                             "--vpp/--schedule: DeepSpeed's pipeline engine runs 1F1B only (use --engine megatron)"),
        # plain DeepSpeed (no Megatron) has no tensor/sequence/context parallel or interleaving of its own
        "ds_no_tp": ((training.engine == "deepspeed") & ((t > 1) | (c > 1) | (v > 1)),
                     "--tp/--cp/--vpp: need --engine megatron-deepspeed or megatron (DeepSpeed alone has no TP)"),
        # Megatron's distributed optimizer shards optimizer states only (ZeRO-1-like)
        "megatron_zero": ((training.engine == "megatron") & (z > 1), "--zero: Megatron's distributed optimizer is 0 or 1"),
        # FSDP has no pipeline engine of its own in this planner; shard stages map to ZeRO 0/2/3
        "fsdp_rules": ((training.engine == "fsdp") & ((p > 1) | (z == 1)), "--engine fsdp: takes --pp 1 and --zero 0, 2 or 3"),
        # FSDP2 CPUOffloadPolicy moves params, grads and optimizer step to the CPU together; no NVMe
        "fsdp_offload": ((training.engine == "fsdp") & ((oo != op) | (oo == 2)),
                         "--offload-optimizer/--offload-params: FSDP offloads both to cpu together (no nvme)"),
    }
    return {k: (np.broadcast_to(np.asarray(mask, dtype=bool), lay.tp.shape), msg) for k, (mask, msg) in rules.items()}


REASON_GROUP = {
    "world": "divisibility", "tp_heads": "divisibility", "pp_layers": "divisibility", "vpp_divides": "divisibility",
    "cp_seq": "divisibility", "ep_experts": "divisibility", "batch": "divisibility",
    "tp_node": "topology", "zero_range": "engine rule", "offload_params_zero3": "engine rule",
    "offload_needs_deepspeed": "engine rule", "offload_optimizer_zero": "engine rule", "sp_needs_tp": "engine rule",
    "ds_pipe_zero": "engine rule", "ds_pipe_schedule": "engine rule", "ds_no_tp": "engine rule", "megatron_zero": "engine rule", "fsdp_rules": "engine rule",
    "fsdp_offload": "engine rule",
}


def check_single(model: ModelSpec, cluster: Cluster, training: Training, lay: Layouts) -> None:
    """Raise InputError naming the flag of the first rule a one-layout `lay` breaks."""
    assert lay.size == 1
    for mask, msg in rule_violations(model, cluster, training, lay).values():
        if mask.any():
            raise InputError(msg)
