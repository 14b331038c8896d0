"""transformers 5.25 GPTNeoXLayer with attn_implementation 'eager' at micro-batch 1 and above
(planner/activations.py hf_gpt_neox_saved, the micro-batch size threaded from layer_bytes through
saved_tensors), counted with saved_tensors_hooks (calibrate/benches/saved.py hf_layer_bytes) and translated
to CUDA like the other GPT-NeoX cases (tests/test_activations_real.py hf_measured: LayerNorm
statistics fp32, dropout masks 1 byte).

eager_attention_forward's torch.matmul(attn_weights, value) folds value [b, a, s, d] to [b a, s, d]
with reshape (aten native/LinearAlgebra.cpp _matmul_impl). value is a chunk of query_key_value's
output viewed [b, s, a, 3d] and transposed: strides (3 s a d, 3d, 3 a d, 1), whose b and a merge only
where b is 1. At b 1 the reshape is a view and bmm keeps the whole query_key_value output, 2(q + 2kv)
= 6h a token, where at b > 1 it keeps a copy of v, 2h: 4h a token more at micro-batch 1, with or
without dropout, nothing else moving (q and k are torch.cat copies after rotary, contiguous, and k^T
folds to a view at any b)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from planner import activations, layout  # noqa: E402
from planner.hf_config import from_hf_config  # noqa: E402
from test_activations_real import hf_measured, hf_planner_per_layer, neox_config  # noqa: E402

CASES = [  # (hidden, heads, ffn, seq, batch)
    (64, 4, 128, 64, 1),
    (64, 4, 128, 64, 2),
    (128, 4, 128, 32, 1),  # h
    (128, 4, 128, 32, 3),
    (64, 16, 128, 32, 1),  # heads (head_dim 4)
]


def eager_per_token(h, a, f, s, b, dropout) -> int:
    """test_gpt_neox_layer_bf16's eager formula, 14h + 6as + 4f + 16 (+ 2h + as with dropout), and
    4h more at b 1 (the whole query_key_value output 6h in place of the 2h v copy)."""
    return 14 * h + 6 * a * s + 4 * f + 16 + dropout * (2 * h + a * s) + (b == 1) * 4 * h


@pytest.mark.parametrize("hidden, heads, ffn, seq, batch", CASES)
@pytest.mark.parametrize("dropout", [False, True])
def test_gpt_neox_eager_at_every_micro_batch(dropout, hidden, heads, ffn, seq, batch):
    """Measured (CUDA-translated), per token: e.g. s64 b1 h64 a4 f128, no dropout: 14 x 64 + 6 x 4 x 64
    + 4 x 128 + 16 + 4 x 64 = 3,216 (205,824 a layer); b2: 2,960 (378,880). The planner equals it
    exactly."""
    measured = hf_measured(neox_config, "eager", dropout, hidden, heads, ffn, seq, batch)
    assert measured == seq * batch * eager_per_token(hidden, heads, ffn, seq, batch, dropout)
    assert hf_planner_per_layer(neox_config, "eager", dropout, hidden, heads, ffn, seq, batch) == measured


def test_micro_batch_reaches_the_list_per_layout():
    """Layouts are arrays: one call over micro-batches 1, 2 and 4 books 6h for v at 1 and 2h above,
    and the SDPA list does not move per token."""
    spec = from_hf_config(neox_config(2, "eager", 64, 4, 128, 0.0, 0.0))
    lay = layout.single(mbs=1).concat(layout.single(mbs=2)).concat(layout.single(mbs=4))
    seq, tokens = 64, 64 * np.array([1, 2, 4])
    eager = layout.Training(seq_len=seq, precision="bf16", flash_attention=False, engine="deepspeed")
    sdpa = layout.Training(seq_len=seq, precision="bf16", flash_attention=True, engine="deepspeed")
    per_token = activations.kept_per_layer(spec, eager, lay) / tokens
    assert list(per_token) == [eager_per_token(64, 4, 128, seq, b, False) for b in (1, 2, 4)]
    assert len(set(activations.kept_per_layer(spec, sdpa, lay) / tokens)) == 1
