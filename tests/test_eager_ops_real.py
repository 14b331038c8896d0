"""The operator counts and bytes planner/compute.py eager_host_s and eager_layer_bytes read (data/references/eager_ops_cpu.json)
against transformers' own decoder layers, recounted here (calibrate/benches/eager_ops.py: a TorchDispatchMode
over one training micro-batch, the 2-layer model less the 1-layer model, bf16, SDPA)."""

from __future__ import annotations

import pytest

from calibrate.benches import eager_ops
from planner import compute
from planner.data import catalog
from planner.model import lookup

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("variant", list(eager_ops.VARIANTS))
def test_recorded_counts_are_the_modules_own(variant):
    assert catalog("references/eager_ops_cpu.json")["layer_ops"][variant] == eager_ops.layer_ops(variant)


def test_llama_layer_counts():
    # the llama layer (transformers modeling_llama.py LlamaDecoderLayer.forward with
    # sdpa_attention_forward): 81 forward, 146 backward; Qwen3's q/k RMSNorms add 18 forward operators,
    # two of LlamaRMSNorm's eight (to fp32, pow, mean, add, rsqrt, mul, to bf16, mul) and two more
    ops = eager_ops.layer_ops("llama")
    assert ops == {"forward": 81, "backward": 146}
    assert eager_ops.layer_ops("llama-qk-norm")["forward"] == 81 + 18


@pytest.mark.parametrize("variant", list(eager_ops.VARIANTS))
def test_recorded_bytes_are_the_modules_own(variant):
    recorded = catalog("references/eager_ops_cpu.json")["layer_bytes"][variant]
    counted = eager_ops.layer_bytes(variant)
    for phase in ("forward", "backward"):
        assert recorded[phase] == pytest.approx(counted[phase], rel=1e-12)


def test_llama_layer_forward_bytes():
    # per MLP element: act_fn(gate) * up, silu r2 w2 and mul r2 r2 w2 = 10 bytes; per hidden element:
    # two RMSNorms of 36 (to fp32 r2 w4, pow r4 w4, mean r4, x * rstd r4 w4, to bf16 r4 w2, * weight
    # r2 w2), two residual adds of 6, and rotary on q (q * cos r2 w2, rotate_half's neg of a half r1 w1
    # and cat r2 w2, * sin r2 w2, add r2 r2 w2 = 20)
    fwd = eager_ops.layer_bytes("llama")["forward"]
    assert fwd["f"] == 10
    assert fwd["h"] == 2 * 36 + 2 * 6 + 20  # 104


@pytest.mark.parametrize("name,variant", [("llama-2-7b", "llama"), ("mistral-7b", "llama"), ("qwen3-8b", "llama-qk-norm"),
                                          ("mixtral-8x7b", None)])
def test_catalog_models_map_to_their_layer(name, variant):
    assert compute.eager_ops_variant(lookup(name)) == variant
