"""`--params 70e9`: a plausible Llama-3-style shape with exactly (nearly) that many parameters."""

from __future__ import annotations

import math
from dataclasses import fields as dataclass_fields

from planner.errors import InputError
from planner.model import ModelSpec

# Llama-3 family rule (Meta llama3 model.py): head_dim 128, 8 KV heads, ffn = 1.3 * 8h/3 rounded up
# to a multiple of 1024, vocab 128,256. Width per layer from Llama-2/3 (h/L = 128 at 7-13B,
# 102 at 70B, 130 at 405B): we target h/L = 128 and pick the depth whose count is nearest.
DERIVED_HEAD_DIM = 128
DERIVED_KV_HEADS = 8
DERIVED_VOCAB = 128256
DERIVED_WIDTH_PER_LAYER = 128.0
MAX_HEADS = 1024


def llama3_ffn(hidden: int) -> int:
    # Meta llama3 model.py FeedForward: int(2*4h/3), times ffn_dim_multiplier 1.3, rounded up to 1024
    raw = int(1.3 * int(2 * 4 * hidden / 3))
    return 1024 * math.ceil(raw / 1024)


def params_name(target_params: float) -> str:
    """A derived model's name from its --params as people write it: 70e9 -> params-70B, 1.5e12 ->
    params-1.5T, 125e6 -> params-125M (three significant digits, as '{:.3g}' gave before)."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K"), (1.0, "")):
        shown = f"{target_params / scale:.3g}"
        if float(shown) >= 1 or scale == 1:  # rounded, as shown: 999.6e9 is 1T, not 1e+03B
            return f"params-{shown}{suffix}"


def _head_choices(fixed: dict, per_head: int) -> list[int]:
    """The query-head counts derive_shape tries, in increasing order: a fixed `heads`, the count a
    fixed `hidden` gives, the multiples of a fixed `kv_heads`, else every count up to MAX_HEADS."""
    if "heads" in fixed:
        return [fixed["heads"]]
    if "hidden" in fixed:
        return [max(1, fixed["hidden"] // per_head)]
    if "kv_heads" in fixed:
        return list(range(fixed["kv_heads"], MAX_HEADS + 1, fixed["kv_heads"]))
    return list(range(1, MAX_HEADS + 1))


def _depths(target_params: float) -> range:
    """The depths derive_shape tries when the depth is free: within 1.5x of the one the count needs,
    at most 256 unless that whole range lies beyond 256."""
    # depths near the one a 12 L h^2 block stack with h = 128 L would need (Kaplan et al. 2020 eq. 2.1)
    depth = (target_params / (12 * DERIVED_WIDTH_PER_LAYER**2)) ** (1 / 3)
    low, high = max(2, int(depth / 1.5)), int(depth * 1.5) + 2
    return range(low, (min(256, high) if low <= 256 else high) + 1)


def derive_shape(target_params: float, **overrides) -> ModelSpec:
    """A Llama-3-style shape whose exact count is nearest `target_params`; overrides win.

    Free choices: depth L (2..256, within 1.5x of the depth a 12 L h^2 stack with h = 128 L
    needs; deeper only when that range lies beyond 256) and query heads a (hidden = 128 a, KV
    heads gcd(a, 8), ffn by the Llama-3 rule, vocab 128,256, untied). Score: |log(count /
    target)|, plus 0.005 per halving of the KV heads below 8 (the family uses 8), plus
    0.02 |log((h / L) / 128)| (aspect ratio). With L free the count is matched by depth, so 8 KV
    heads nearly always win; with L fixed the width is searched in steps of 128, so the count
    stays within ~2.5% (fewer KV heads if needed). Overrides are ModelSpec shape fields (None
    values ignored); a fixed `kv_heads` restricts the heads to its multiples, a fixed `head_dim`
    replaces 128 as the width per head.
    """
    if not target_params > 0:
        raise InputError(f"--params: must be a positive number, got {target_params!r}")
    fixed = {k: v for k, v in overrides.items() if v is not None}
    shape_fields = {f.name for f in dataclass_fields(ModelSpec)} - {"name", "source"}
    unknown = sorted(set(fixed) - shape_fields)
    if unknown:
        raise TypeError(f"derive_shape() got unexpected shape fields {unknown}")
    per_head = fixed.get("head_dim") or DERIVED_HEAD_DIM
    head_choices = _head_choices(fixed, per_head)
    errors: list[InputError] = []
    widths: dict[int, tuple | None] = {}

    def width(heads: int):
        """(one-layer spec, params per block, params outside the blocks) of a width, or None.
        The count is linear in the depth, so one spec per width serves every depth."""
        if heads not in widths:
            hidden = fixed.get("hidden", heads * per_head)
            shape = dict(layers=1, hidden=hidden, heads=heads, kv_heads=math.gcd(heads, DERIVED_KV_HEADS),
                         ffn=llama3_ffn(hidden), vocab=DERIVED_VOCAB, ffn_kind="swiglu", tied_embeddings=False)
            shape.update({k: v for k, v in fixed.items() if k not in ("layers", "hidden", "heads")})
            try:
                spec = ModelSpec(name=params_name(target_params),
                                 source="derived from --params by the Llama-3 family rule (planner/shapes.py)", **shape)
                widths[heads] = (spec, spec.sums.block_total, spec.params - spec.sums.block_total)
            except InputError as exc:
                errors.append(exc)
                widths[heads] = None
        return widths[heads]

    def count(layers: int, heads: int):
        w = width(heads)
        return None if w is None else layers * w[1] + w[2]

    def score(layers: int, heads: int) -> float:
        spec = width(heads)[0]
        kv_penalty = 0.0 if "kv_heads" in fixed else 0.005 * math.log2(DERIVED_KV_HEADS / spec.kv_heads)
        aspect = abs(math.log(spec.hidden / layers / DERIVED_WIDTH_PER_LAYER))
        return abs(math.log(count(layers, heads) / target_params)) + kv_penalty + 0.02 * aspect

    best, best_score = None, math.inf
    for layers in [fixed["layers"]] if "layers" in fixed else _depths(target_params):
        # the count grows with the heads: bisect for the first choice at or above the target,
        # then score a window around it (wide enough to reach the nearest multiples of 8)
        lo, hi = 0, len(head_choices) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            n = count(layers, head_choices[mid])
            if n is not None and n >= target_params:
                hi = mid
            else:
                lo = mid + 1
        for i in range(max(0, lo - 8), min(len(head_choices), lo + 9)):
            if width(head_choices[i]) is not None and score(layers, head_choices[i]) < best_score:
                best, best_score = (layers, head_choices[i]), score(layers, head_choices[i])
    if best is None:
        detail = f" ({errors[-1]})" if errors else ""
        raise InputError(f"--params: no shape satisfies the given overrides{detail}")
    layers, heads = best
    from dataclasses import replace

    return replace(width(heads)[0], layers=layers)
