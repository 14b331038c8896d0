"""The categorical choices of a training job, as enums (their values are the array codes the
vectorized formulas compare against) and the one parser that turns a user's word into one."""

from __future__ import annotations

from enum import Enum, IntEnum

from planner.errors import InputError


class Choice(IntEnum):
    """An IntEnum whose members have the lower-case names users type (`--recompute full`)."""

    @property
    def word(self) -> str:
        return self.name.lower().replace("_", "-")

    @classmethod
    def words(cls) -> tuple[str, ...]:
        return tuple(m.word for m in cls)

    @classmethod
    def parse(cls, value, flag: str) -> "Choice":
        """The member named `value` (a member, its word or its code); InputError naming `flag` otherwise."""
        if isinstance(value, cls):
            return value
        key = str(value).strip().lower().replace("_", "-")
        for member in cls:
            if key == member.word:
                return member
        raise InputError(f"{flag}: must be one of {', '.join(cls.words())}, got {value!r}")


class Recompute(Choice):
    """Activation recomputation (Korthikanti et al. 2022 section 5); what 'selective' keeps is
    the engine's policy (planner/engines/)."""

    NONE = 0
    SELECTIVE = 1
    FULL = 2


class RecomputeMethod(Choice):
    """Which layers full recompute checkpoints with --recompute-layers N (megatron-core 0.16.1
    transformer/transformer_block.py TransformerBlock._checkpointed_forward): 'block' the first N
    layers of each chunk, one checkpoint each; 'uniform' every layer, in checkpoints of N layers."""

    BLOCK = 0
    UNIFORM = 1


class Offload(Choice):
    """Where ZeRO-Offload / ZeRO-Infinity put optimizer states or parameters."""

    NONE = 0
    CPU = 1
    NVME = 2


class Schedule(Choice):
    """Pipeline schedule (Narayanan et al. 2021 section 2.2; GPipe: Huang et al. 2019; ZB-H1: Qi et
    al. 2023, "Zero Bubble Pipeline Parallelism", section 3)."""

    ONE_F_ONE_B = 0
    INTERLEAVED = 1
    GPIPE = 2
    ZB_H1 = 3

    @property
    def word(self) -> str:
        return {0: "1f1b", 1: "interleaved", 2: "gpipe", 3: "zb-h1"}[int(self)]


class RankOrder(Choice):
    """Rank placement, innermost first: which of data and pipeline parallelism is nearer in ranks.
    megatron-core 0.16.1 parallel_state.py initialize_model_parallel(order='tp-cp-ep-dp-pp') is
    Megatron's default (pipeline stages the farthest apart); Megatron-LM --use-tp-pp-dp-mapping
    passes 'tp-cp-ep-pp-dp', the order Llama 3 trained in to keep pipeline sends inside a pod (Dubey
    et al. 2024 section 3.3.2: [TP, CP, PP, DP])."""

    DP_INNER = 0
    PP_INNER = 1

    @property
    def word(self) -> str:
        return {0: "tp-cp-dp-pp", 1: "tp-cp-pp-dp"}[int(self)]


class Word(str, Enum):
    """A string enum: members compare equal to, and serialize as, their word."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def words(cls) -> tuple[str, ...]:
        return tuple(m.value for m in cls)

    @classmethod
    def parse(cls, value, flag: str) -> "Word":
        key = str(value).strip().lower()
        for member in cls:
            if key == member.value:
                return member
        raise InputError(f"{flag}: must be one of {', '.join(cls.words())}, got {value!r}")


class Precision(Word):
    """'bf16'/'fp16': mixed precision with fp32 master weights; 'fp32'; 'bf16-pure': no fp32 copy."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"
    BF16_PURE = "bf16-pure"

    @property
    def element_bytes(self) -> float:
        """Bytes of one weight, activation or gradient element in the compute dtype."""
        return 4.0 if self is Precision.FP32 else 2.0

    @property
    def gemm_dtype(self) -> str:
        """The GPU catalog's peak key of the GEMM dtype (fp32 without TF32, PyTorch's default)."""
        return "bf16" if self in (Precision.BF16, Precision.BF16_PURE) else self.value

    @property
    def has_master_copy(self) -> bool:
        """Mixed precision keeps fp32 master weights beside the 16-bit ones."""
        return self in (Precision.BF16, Precision.FP16)


class Fp8Recipe(Word):
    """How a job's FP8 GEMMs scale their operands (--fp8-recipe; planner/fp8.py holds what each keeps
    and costs). The words are the engines' own where they have one."""

    DELAYED = "delayed"
    """Transformer Engine DelayedScaling: one scale per tensor from an amax history of earlier steps
    (Megatron-LM --fp8-recipe delayed, NeMo's FP8 recipes, Composer's amp_fp8, Accelerate's TE backend)."""
    TENSORWISE = "tensorwise"
    """One scale per tensor from its own amax in this step (current scaling): Megatron-LM
    --fp8-recipe tensorwise (TE Float8CurrentScaling), torchao/torchtitan Float8LinearConfig 'tensorwise'."""
    ROWWISE = "rowwise"
    """torchao/torchtitan Float8LinearConfig 'rowwise': a scale per row of each operand."""
    MXFP8 = "mxfp8"
    """OCP microscaling: an 8-bit power-of-two scale per 32 elements (Blackwell's tensor cores:
    Megatron-LM --fp8-recipe mxfp8, TE MXFP8BlockScaling; torchtitan's MX converter)."""


class Optimizer(Word):
    """'adamw', 'sgd' (with momentum), 'adafactor' (factored, no momentum), 'adam8bit'."""

    ADAMW = "adamw"
    SGD = "sgd"
    ADAFACTOR = "adafactor"
    ADAM8BIT = "adam8bit"
