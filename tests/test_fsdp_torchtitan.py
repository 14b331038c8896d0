"""torchtitan's FSDP2 wrapping and chunked loss against the planner's fsdp terms.

The reference, data/references/torchtitan_fsdp_cpu.json, is python -m calibrate.engines.torchtitan_fsdp: torchtitan
0.3.0's own Llama3Model (3 blocks, dim 64, 4 heads, 2 KV heads, ffn 160), its apply_fsdp_to_decoder
and ChunkedLossWrapper (8 chunks) on 2 gloo ranks, FSDP's buffers and unsharded gradients tracked
buffer by buffer (calibrate/engines/fsdp_transient_worker.py BufferTracker): the exact peak per moment. The
moments: forward (the decoder), loss (lm_head and the loss chunk by chunk, each chunk's backward at
once), backward (the decoder) and final_callback (after autograd). The planner's 'backward' is the
larger of loss and backward: both come while the decoder's activations are alive.

Sizes (elements): a block B = 43,136 (wqkv 64 x 128, wo 64 x 64, w1/w3 160 x 64, w2 64 x 160, two
norms 2 x 64); the embedding E = 64 V; [norm, lm_head] Hd = 64 + 64 V with lm = 64 V; V = 256 or
4,096. Tied (enable_weight_tying, as Llama 3.2 1B/3B): one unit [embedding, norm, lm_head] of X = 64 +
64 V, not resharded after forward. Bytes per element: unsharded parameters and their gradients w (bf16 2, fp32 4), reduce dtype r =
4; D = 2 shard ranks. reshard_after_forward_policy "default" is the planner's --zero 3, "never" its
--zero 2, for which the planner books every unit gathered (w P) as weights for the whole step and the
rest as buffers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner import layout, memory, sharding
from planner.model import ModelSpec
from planner.stage import Stage

REFERENCE = Path(__file__).resolve().parent.parent / "data" / "references" / "torchtitan_fsdp_cpu.json"
ROWS = {row["name"]: row for row in json.loads(REFERENCE.read_text())["rows"]}
B, H, D, R_BYTES = 43_136, 64, 2, 4


def _sizes(row):
    V = row["vocab"]
    return H * V, H + H * V, H * V, 2 if row["dtype"] == "bf16" else 4  # E, Hd, lm, w


def _plan(row) -> dict:
    model = ModelSpec(layers=row["layers"], hidden=row["dim"], heads=row["heads"], kv_heads=row["kv_heads"],
                      ffn=row["ffn"], vocab=row["vocab"], tied_embeddings=row["tied"])
    training = layout.Training(seq_len=row["seq"], precision=row["dtype"], engine="torchtitan")
    lay = layout.single(dp=row["ranks"], zero=3 if row["policy"] == "default" else 2, mbs=row["batch"])
    out = {m: float(memory.fsdp_unsharded_unit_bytes(Stage(model, training, lay, 0), moment=m)[0])
           for m in ("forward", "backward", "reduction")}
    out["block"] = float(sharding.block_params(model, training, lay)[0])
    out["rank"] = float(sum(x[0] for x in sharding.rank_params(Stage(model, training, lay, 0))))
    return out


def _peak(row, moment: str) -> int:
    return row["peaks"][moment]["peak"]


def test_reference_is_torchtitans_own_model_and_the_planners_shape():
    assert json.loads(REFERENCE.read_text())["environment"]["torchtitan"] == "0.3.0"
    for row in ROWS.values():
        E, Hd, _, _ = _sizes(row)
        blocks = {"layers.0": B, "layers.1": B, "layers.2": B}
        plan = _plan(row)
        assert plan["block"] == B
        if row["tied"]:  # one unit [embedding, norm, lm_head]: the output is the embedding
            assert row["units"] == {"edges": Hd, **blocks} and plan["rank"] == 3 * B + Hd
        else:
            assert row["units"] == {"embed": E, **blocks, "head": Hd} and plan["rank"] == E + 3 * B + Hd


UNTIED = [n for n in ROWS if not ROWS[n]["tied"]]
TIED = [n for n in ROWS if ROWS[n]["tied"]]


@pytest.mark.parametrize("name", [n for n in UNTIED if "/default/" in n])
def test_zero3_forward_gathers_no_root(name):
    """Forward: each unit's copy-out beside the previous unit's all-gather output; the edges are units
    of their own and the root holds nothing, so a middle block's copy-out, 3 w B, or at the final norm
    [norm, lm_head]'s beside the last block's all-gather output, w (B + 2 Hd)."""
    row = ROWS[name]
    E, Hd, _, w = _sizes(row)
    got = _peak(row, "forward")
    if row["vocab"] == 256:
        assert got == 3 * w * B  # previous block's AG output + this block's AG output and parameters
    else:
        assert got == w * (B + 2 * Hd)  # last block's AG output + [norm, lm_head]'s AG output and parameters
    assert _plan(row)["forward"] == got


@pytest.mark.parametrize("name", [n for n in UNTIED if "/default/" in n])
def test_zero3_chunked_loss_and_backward(name):
    """The loss: lm_head gathered through the chunks; the chunks before the last accumulate its
    gradient in reduce dtype (sync off), the last reduce-scatters it: w Hd + (r + r + r/D) lm, the
    largest of the 4,096 vocabulary. The decoder's backward: a middle block's parameters and gradients,
    the next block prefetched, the previous one's reduce_scatter_input: (3w + r) B, the largest of the
    256 vocabulary, or [norm, lm_head] gathered again for the norm beside lm_head's reduce_scatter_input,
    r lm + 2 w Hd."""
    row = ROWS[name]
    E, Hd, lm, w = _sizes(row)
    loss, bwd = _peak(row, "loss"), _peak(row, "backward")
    assert loss == w * Hd + (4 + 4 + 4 / D) * lm  # params + fp32 accumulated grad + RS input + RS output
    if row["vocab"] == 256:
        assert bwd == (3 * w + R_BYTES) * B  # block params, grads, prefetched AG output + RS input
    else:
        assert bwd == R_BYTES * lm + 2 * w * Hd  # lm_head's RS input + [norm, lm_head] AG output and params
    assert _plan(row)["backward"] == max(loss, bwd)


@pytest.mark.parametrize("name", [n for n in UNTIED if "/default/" in n])
def test_final_callback_reduces_the_embedding(name):
    """After autograd the embedding unit's post_backward (its input needs no gradient): its start, the
    embedding gathered with its gradient and block 0's reduce_scatter_input, w E + w E + r B; or its
    reduce-scatter, r E + r E / D beside the gradient foreach_reduce's loop variable keeps, w E."""
    row = ROWS[name]
    E, _, _, w = _sizes(row)
    got = _peak(row, "final_callback")
    assert got == max(2 * w * E + R_BYTES * B, R_BYTES * E + R_BYTES * E // D + w * E)
    assert _plan(row)["reduction"] == got


@pytest.mark.parametrize("name", [n for n in UNTIED if "/never/" in n])
def test_zero2_beyond_every_unit_gathered(name):
    """reshard_after_forward_policy "never": the planner books w P for the whole step. Forward: the
    last block's copy-out before [norm, lm_head] is gathered, w P - w Hd + 2 w B, or [norm, lm_head]'s,
    w P + w (B + Hd). The loss as under "default" (lm_head's parameters inside w P). Backward: [norm,
    lm_head] gathered again (lm_head.reshard() ended the loss) beside lm_head's reduce_scatter_input, or a
    block's gradients with the previous block and [norm, lm_head] resharded beside that block's
    reduce_scatter_input (D = 2, bf16: its reduce_output ties it but for the 128 B of the last gradient
    foreach_reduce's loop variable keeps, as FSDP2's own test shows). The final callback: what exceeds
    w P of the embedding's reduction, none for these sizes."""
    row = ROWS[name]
    E, Hd, lm, w = _sizes(row)
    P = E + 3 * B + Hd
    fwd, loss, bwd = (_peak(row, m) for m in ("forward", "loss", "backward"))
    assert fwd == w * P + max(w * (2 * B - Hd), w * (B + Hd))
    assert loss == w * P + (4 + 4 + 4 / D) * lm
    block = R_BYTES * B - w * Hd  # (g + r - w) B - w Hd with g = w
    gap = 2 * H if (w == 2 and block > R_BYTES * lm + w * Hd) else 0
    assert bwd == w * P + max(R_BYTES * lm + w * Hd, block) + gap
    plan = _plan(row)
    assert plan["forward"] == fwd - w * P
    assert plan["backward"] == max(loss, bwd - gap) - w * P
    assert plan["reduction"] == max(0, _peak(row, "final_callback") - w * P)


@pytest.mark.parametrize("name", TIED)
def test_tied_edges_stay_gathered_like_a_root(name):
    """Tied: the one unit X is gathered at the embedding and kept through forward (the policy's
    reshard_after_forward is "always" only): block 0's copy-out beside X's all-gather output and X,
    w (2X + 2B), or a later block's beside X, w (X + 3B); the loss as untied with X for Hd; the
    decoder's backward: X gathered again for the norm beside lm_head's reduce_scatter_input, r lm + 2 w X,
    or a middle block's FSDP2 moment beside X and the norm's gradient (g h: the loss reduced lm_head's),
    (3w + r) B + w X + w h; after autograd X's post_backward as a root's, max(w X + w X + r B, r X +
    r X / D + w h) (the norm, registered last, is foreach_reduce's last gradient). "never": beyond w P
    as for FSDP2's root, the backward's block moment one 128-B loop-variable gradient short."""
    row = ROWS[name]
    _, X, lm, w = _sizes(row)
    P = X + 3 * B
    fwd, loss, bwd, red = (_peak(row, m) for m in ("forward", "loss", "backward", "final_callback"))
    # X gathered (inside w P under "never") + fp32 accumulated grad + RS input + RS output
    assert loss == (w * X if row["policy"] == "default" else w * P) + (4 + 4 + 4 / D) * lm
    plan = _plan(row)
    if row["policy"] == "default":
        assert fwd == w * max(2 * X + 2 * B, X + 3 * B)
        assert bwd == max(R_BYTES * lm + 2 * w * X, (3 * w + R_BYTES) * B + w * X + w * H)
        assert red == max(2 * w * X + R_BYTES * B, R_BYTES * X + R_BYTES * X // D + w * H)
        assert (plan["forward"], plan["backward"], plan["reduction"]) == (fwd, max(loss, bwd), red)
    else:
        assert fwd == w * P + max(2 * w * B, w * (2 * X + 2 * B) - w * P)
        gap = 2 * H if row["vocab"] == 256 else 0  # the last block gradient foreach_reduce keeps
        # lm_head's reduce_scatter_input beside X gathered again, or block 2's reduction with block 2
        # resharded: -w B + r B + r B / D + w h (the norm's gradient), = r B + w h at D = 2
        assert bwd == w * P + max(R_BYTES * lm + w * X, R_BYTES * B + w * H) + gap
        assert plan["forward"] == fwd - w * P and plan["backward"] == max(loss, bwd - gap) - w * P
        assert plan["reduction"] == max(0, red - w * P)


def test_edges_are_most_of_what_torchtitan_holds_for_a_large_vocabulary():
    """Llama-3-8B under torchtitan on 8 ranks, bf16: the planner's backward buffers at the chunked
    loss, w Hd + (2r + r/8) lm with lm = 128,256 x 4,096 = 525,336,576: 5.6 GB, against the blocks'
    (3w + r) B = 10 x 218,112,000 = 2.2 GB; before this term the planner booked only the latter."""
    from planner.model import lookup

    m = lookup("llama-3-8b")
    lay = layout.single(dp=8, zero=3, mbs=1)
    got = float(memory.fsdp_unsharded_unit_bytes(Stage(m, layout.Training(seq_len=4096, engine="torchtitan"), lay, 0),
                                                 moment="backward")[0])
    lm = 128_256 * 4096
    assert got == pytest.approx(2 * (4096 + lm) + (4 + 4 + 4 / 8) * lm)  # 5,516,042,240 B


def test_unchunked_loss_of_its_older_releases_meets_their_published_peak():
    """torchtitan's Dec 2024 benchmark (benchmarks/llama3_h100_202412_torchtitan.md Table 3, commit
    9dec370: Llama 3 8B, 128 H100 at 95 GiB, FSDP, local batch 2, seq 8192, selective AC, no compile)
    logs a 67.0 GiB peak (max reserved). That release's components/loss.py cross_entropy_loss takes
    the whole micro-batch's logits upcast to fp32 (--loss-chunks 1): 16,384 tokens x 128,256 logits at
    12 B each is 23.5 GiB at the loss's backward. The chunked loss of today's release holds an eighth
    of them and lands far under the published peak."""
    from planner import api

    def peak_gib(chunks):
        e = api.estimate("llama-3-8b", {"gpu": "h100-sxm", "gpus": 128, "gpu_memory_gib": 95},
                         {"seq_len": 8192, "gbs": 256, "engine": "torchtitan", "loss_chunks": chunks},
                         {"dp": 128, "mbs": 2, "zero": 3, "recompute": "selective"})
        return e.memory["gpu_bytes"] / 2**30

    assert peak_gib(1) == pytest.approx(67.0, rel=0.15)
    assert peak_gib(8) < 67.0 * 0.85
