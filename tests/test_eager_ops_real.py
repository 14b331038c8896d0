"""The operator counts planner/compute.py eager_host_s reads (data/references/eager_ops_cpu.json)
against transformers' own decoder layers, recounted here (calibrate/eager_ops.py: a TorchDispatchMode
over one training micro-batch, the 2-layer model less the 1-layer model, bf16, SDPA)."""

from __future__ import annotations

import pytest

from calibrate import eager_ops
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


@pytest.mark.parametrize("name,variant", [("llama-2-7b", "llama"), ("mistral-7b", "llama"), ("qwen3-8b", "llama-qk-norm"),
                                          ("mixtral-8x7b", None)])
def test_catalog_models_map_to_their_layer(name, variant):
    assert compute.eager_ops_variant(lookup(name)) == variant
