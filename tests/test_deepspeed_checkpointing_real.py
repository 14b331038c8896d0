"""deepspeed.checkpointing as Megatron-DeepSpeed runs it (--deepspeed-activation-checkpointing), on 2
gloo ranks under torchrun (calibrate/engines/deepspeed_checkpointing_worker.py), against the planner: a fully
recomputed layer keeps its input, s b h x 2 bytes, split over the model-parallel ranks when
activation_checkpointing.partition_activations is on (DeepSpeed 0.19
runtime/activation_checkpointing/checkpointing.py partition_activations)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner import activations, layout
from planner.model import ModelSpec

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    pytest.importorskip("deepspeed")
    import socket

    out = tmp_path_factory.mktemp("ckpt") / "kept.json"
    with socket.socket() as probe:  # a free port for torchrun's rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    worker = ROOT / "calibrate" / "engines" / "deepspeed_checkpointing_worker.py"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_addr", "127.0.0.1", "--master_port", str(port), str(worker), str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("partition", [False, True])
def test_checkpointed_layer_keeps_its_input_split_over_tp(measured, partition):
    m = measured
    kept = m["kept_per_layer_bytes"][str(partition).lower()]
    assert kept == m["seq"] * m["batch"] * m["hidden"] * 2 / (m["mp_size"] if partition else 1)  # 131,072 / 2
    spec = ModelSpec(layers=4, hidden=m["hidden"], heads=m["heads"], kv_heads=m["heads"], ffn=m["ffn"], vocab=128,
                     ffn_kind="gelu", norm="layernorm", bias=True, positions="learned", max_positions=m["seq"],
                     dropout=True, architecture="gpt2")
    training = layout.Training(seq_len=m["seq"], engine="megatron-deepspeed", flash_attention=False,
                               zero_config=layout.ZeroConfig(partition_activations=partition))
    lay = layout.single(tp=m["mp_size"], mbs=m["batch"], recompute="full")
    assert float(activations.kept_bytes(spec, training, lay, 4)[0]) / 4 == kept
