"""planner.export: the emitted files load in DeepSpeed's and Accelerate's own loaders.

ds_config.json goes through deepspeed.runtime.config.DeepSpeedConfig (pydantic, extra='forbid'
inside zero_optimization / bf16 / fp16 / offload_*), accelerate_config.yaml through
Accelerate's load_config_from_file and the argument/environment preparation of
`accelerate launch`, and the resulting environment through DeepSpeedPlugin /
FullyShardedDataParallelPlugin, as a launched training process would.
"""

import itertools
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

os.environ["DS_ACCELERATOR"] = "cpu"  # must precede any deepspeed import

import pytest

from planner.errors import InputError
from planner.export import emit
from planner.hardware import Cluster, lookup_gpu
from planner.layout import Training, ZeroConfig, single
from planner.model import ModelSpec

ds_config_mod = pytest.importorskip("deepspeed.runtime.config")
ds_comm = pytest.importorskip("deepspeed.comm")
accel_config_args = pytest.importorskip("accelerate.commands.config.config_args")
accel_launch = pytest.importorskip("accelerate.commands.launch")
accel_launch_utils = pytest.importorskip("accelerate.utils.launch")
accel_utils = pytest.importorskip("accelerate.utils")

# Llama-3-8B-like (GQA, SwiGLU), 32 layers so pp*vpp up to 32 divides it
MODEL = ModelSpec(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, name="test-8b")
MOE = ModelSpec(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=32000, experts=8,
                experts_per_token=2, name="test-moe")
GPU = lookup_gpu("h100-sxm")


def cluster(n):
    return Cluster(GPU, n, min(n, 8))


class FakeMpu:
    """What Megatron-DeepSpeed hands deepspeed.initialize(mpu=...): DeepSpeedConfig takes the
    batch world size from get_data_parallel_world_size()."""

    def __init__(self, dp):
        self.dp = dp

    def get_data_parallel_world_size(self):
        return self.dp


def ds_load(path, row, engine, monkeypatch):
    """DeepSpeedConfig(path) as the launched job would build it. Without a process group
    deepspeed.comm.get_rank() raises and DeepSpeedConfig silently falls back to world size 1
    (ignoring any mpu), so stand in for an initialised group of tp*pp*dp*cp ranks."""
    world = row["tp"] * row["pp"] * row["dp"] * row["cp"]
    monkeypatch.setattr(ds_comm, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(ds_comm, "get_world_size", lambda *a, **k: world)
    mpu = FakeMpu(row["dp"]) if engine == "megatron-deepspeed" else None
    return ds_config_mod.DeepSpeedConfig(str(path), mpu=mpu)


def accelerate_env(yaml_path, extra_args=()):
    """Parse the YAML the way `accelerate launch --config_file` does; return (defaults, env)."""
    parser = accel_launch.launch_command_parser()
    args = parser.parse_args(["--config_file", str(yaml_path), *extra_args, "train.py"])
    args, defaults, mp_from_config = accel_launch._validate_launch_command(args)
    if args.use_deepspeed:
        # accelerate.commands.launch.launch_command, verbatim
        fields = list(defaults.deepspeed_config.keys())
        if mp_from_config:
            fields.append("mixed_precision")
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        _, env = accel_launch_utils.prepare_deepspeed_cmd_env(args)
    else:
        env = accel_launch_utils.prepare_multi_gpu_env(args)
    keep = ("ACCELERATE_", "FSDP_", "MEGATRON_LM_", "PARALLELISM_CONFIG_")
    return defaults, {k: v for k, v in env.items() if k.startswith(keep)}


def device(offload):
    """Offload device name from a DeepSpeed offload config (enum or, with use_enum_values, str)."""
    if offload is None:
        return "none"
    return str(getattr(offload.device, "value", offload.device))


def files(paths):
    return {p.name: p for p in paths}


# ---------------------------------------------------------------------------------------------
# layout grid

def deepspeed_grid():
    cases = []
    combos = itertools.product(
        [0, 1, 2, 3],                                   # zero
        [("none", "none"), ("cpu", "none"), ("nvme", "none"), ("cpu", "cpu"), ("nvme", "nvme")],
        ["bf16", "fp16", "fp32", "bf16-pure"],
    )
    batches = [(1, 1, 1), (2, 4, 8), (4, 2, 16), (1, 16, 2), (3, 5, 8)]
    recomputes = ["none", "full"]  # Hugging Face modules have no selective switch (rules.py engine_selective_recompute)
    optimizers = ["adamw", "adamw", "sgd", "adafactor", "adam8bit"]
    for i, (zero, (oo, op), prec) in enumerate(combos):
        # rules.py: offload needs ZeRO (params ZeRO-3), and DeepSpeed swaps to NVMe under ZeRO-3 only
        if (oo != "none" and zero == 0) or (op != "none" and zero != 3) or (oo == "nvme" and zero < 3):
            continue
        if prec == "bf16-pure" and zero == 0:  # runtime/config.py _do_error_check: bf16 master weights need ZeRO 1-3
            continue
        mbs, gas, dp = batches[i % len(batches)]
        cases.append(dict(engine="deepspeed", precision=prec, optimizer=optimizers[i % len(optimizers)],
                          row=dict(dp=dp, zero=zero, offload_optimizer=oo, offload_params=op, mbs=mbs,
                                   gas=gas, recompute=recomputes[i % 2])))
    return cases


MEGATRON_DS = [
    dict(tp=2, pp=2, dp=4, zero=1, mbs=1, gas=8, recompute="full", sequence_parallel=True),
    dict(tp=4, pp=1, dp=2, zero=3, mbs=2, gas=4, recompute="selective", offload_optimizer="cpu"),
    dict(tp=2, pp=4, dp=2, zero=0, mbs=1, gas=16),  # DeepSpeed pipe: 1F1B, no interleaving
    # DeepSpeed's sequence parallelism as CP, which Megatron-DeepSpeed refuses beside --sequence-parallel
    dict(tp=2, pp=2, dp=2, cp=2, zero=1, mbs=1, gas=4, recompute="selective"),
    dict(tp=1, pp=8, dp=2, zero=1, mbs=4, gas=32),
]

GRID = deepspeed_grid() + [dict(engine="megatron-deepspeed", precision=p, optimizer="adamw", row=r)
                           for r, p in zip(MEGATRON_DS, ["bf16", "fp16", "bf16", "bf16-pure", "fp32"])]


def case_id(c):
    r = c["row"]
    return (f"{c['engine']}-z{r['zero']}-{r.get('offload_optimizer', 'none')}/{r.get('offload_params', 'none')}"
            f"-{c['precision']}-{c['optimizer']}-tp{r.get('tp', 1)}pp{r.get('pp', 1)}cp{r.get('cp', 1)}"
            f"dp{r['dp']}-b{r['mbs']}x{r['gas']}-{r.get('recompute', 'none')}")


def emit_case(tmp_path, case, model=MODEL, **training_kw):
    r = dict(case["row"])
    lay = single(**r)
    row = lay.row(0)
    n = row["tp"] * row["pp"] * row["dp"] * row["cp"]
    training = Training(engine=case["engine"], precision=case["precision"], optimizer=case["optimizer"],
                        **training_kw)
    paths = emit(tmp_path / "out", model, cluster(n), training, row)
    return row, training, files(paths)


# ---------------------------------------------------------------------------------------------
# DeepSpeed

@pytest.mark.parametrize("case", GRID, ids=case_id)
def test_ds_config_round_trips_through_deepspeed(tmp_path, case, monkeypatch):
    row, training, out = emit_case(tmp_path, case)
    cfg = ds_load(out["ds_config.json"], row, case["engine"], monkeypatch)
    assert cfg.zero_optimization_stage == row["zero"]
    assert cfg.train_micro_batch_size_per_gpu == row["mbs"]
    assert cfg.gradient_accumulation_steps == row["gas"]
    assert cfg.train_batch_size == row["mbs"] * row["gas"] * row["dp"] == row["gbs"]
    assert cfg.bfloat16_config.enabled == (training.precision in ("bf16", "bf16-pure"))
    assert cfg.float16_config.enabled == (training.precision == "fp16")
    if training.precision == "fp16":
        assert cfg.float16_config.loss_scale == 0  # dynamic
    assert cfg.bfloat16_config.bf16_master_weights_and_grads == (
        training.precision == "bf16-pure" and row["zero"] >= 1)
    zc = cfg.zero_config
    oo, op = row["offload_optimizer"], row["offload_params"]
    assert device(zc.offload_optimizer) == oo
    assert device(zc.offload_param) == op
    if "nvme" in (oo, op):
        assert str((zc.offload_optimizer or zc.offload_param).nvme_path) == "/local_nvme"
    if row["zero"] >= 1:
        assert zc.overlap_comm == (row["zero"] == 3)  # DeepSpeed's own default, written resolved
        assert zc.reduce_bucket_size == ZeroConfig().reduce_bucket_size
    if row["zero"] == 3:
        assert zc.prefetch_bucket_size == ZeroConfig().stage3_prefetch_bucket_size
        assert zc.param_persistence_threshold == ZeroConfig().stage3_param_persistence_threshold
    assert cfg.gradient_clipping == 1.0
    assert cfg.activation_checkpointing_config.partition_activations == (
        row["recompute"] != "none" and row["tp"] > 1 and training.zero_config.partition_activations)
    expected_opt = {"adamw": "adamw", "sgd": "SGD"}.get(training.optimizer)
    assert cfg.optimizer_name == expected_opt
    assert cfg.zero_allow_untested_optimizer == (training.optimizer != "adamw" and row["zero"] >= 1)


def test_ds_batch_check_is_live(tmp_path, monkeypatch):
    """Negative control: the batch assertion really uses the data-parallel size. Without the mpu a
    TP/PP job's world (tp*pp*dp) would not match train_batch_size = mbs*gas*dp."""
    case = dict(engine="megatron-deepspeed", precision="bf16", optimizer="adamw", row=MEGATRON_DS[0])
    row, _, out = emit_case(tmp_path, case)
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):
        ds_load(out["ds_config.json"], row, "deepspeed", monkeypatch)


def test_zero_config_values_and_overrides_reach_deepspeed(tmp_path, monkeypatch):
    zc = ZeroConfig(reduce_bucket_size=123_456, allgather_bucket_size=654_321, overlap_comm=True,
                    contiguous_gradients=False, stage3_prefetch_bucket_size=7_000,
                    stage3_max_live_parameters=8_000, stage3_max_reuse_distance=9_000,
                    stage3_param_persistence_threshold=10_000, sub_group_size=11_000)
    for zero in (2, 3):
        case = dict(engine="deepspeed", precision="bf16", optimizer="adamw",
                    row=dict(dp=8, zero=zero, mbs=1, gas=1))
        row, _, out = emit_case(tmp_path / str(zero), case, zero_config=zc)
        got = ds_load(out["ds_config.json"], row, "deepspeed", monkeypatch).zero_config
        assert got.overlap_comm is True and got.contiguous_gradients is False
        assert got.reduce_bucket_size == 123_456 and got.sub_group_size == 11_000
        raw = json.loads(out["ds_config.json"].read_text())["zero_optimization"]
        if zero == 2:
            assert got.allgather_bucket_size == 654_321
            assert not any(k.startswith("stage3_") for k in raw)
        else:
            assert "allgather_bucket_size" not in raw
            assert (got.prefetch_bucket_size, got.max_live_parameters, got.max_reuse_distance,
                    got.param_persistence_threshold) == (7_000, 8_000, 9_000, 10_000)


def test_extra_overrides(tmp_path, monkeypatch):
    row = single(dp=8, zero=3, offload_optimizer="nvme", offload_params="nvme").row(0)
    out = files(emit(tmp_path, MODEL, cluster(8), Training(), row,
                     {"nvme_path": "/scratch/nvme", "lr": 1e-5, "ticket": "PLAN-42",
                      "ds_config": {"steps_per_print": 100}}))
    cfg = ds_load(out["ds_config.json"], row, "deepspeed", monkeypatch)
    assert str(cfg.zero_config.offload_optimizer.nvme_path) == "/scratch/nvme"
    assert str(cfg.zero_config.offload_param.nvme_path) == "/scratch/nvme"
    assert cfg.optimizer_params["lr"] == 1e-5 and cfg.steps_per_print == 100
    assert "# ticket: PLAN-42" in out["launch.sh"].read_text()


# ---------------------------------------------------------------------------------------------
# Accelerate

DATA_PARALLEL = [c for c in GRID if c["row"].get("tp", 1) * c["row"].get("pp", 1) * c["row"].get("cp", 1) == 1]


@pytest.mark.parametrize("case", DATA_PARALLEL[::4] + DATA_PARALLEL[-2:], ids=case_id)
def test_accelerate_deepspeed_config_loads_and_launches(tmp_path, case, monkeypatch):
    row, training, out = emit_case(tmp_path, case)
    n = row["tp"] * row["pp"] * row["dp"] * row["cp"]
    cfg = accel_config_args.load_config_from_file(str(out["accelerate_config.yaml"]))
    assert isinstance(cfg, accel_config_args.ClusterConfig)
    assert cfg.distributed_type == accel_utils.DistributedType.DEEPSPEED
    assert cfg.num_processes == n and cfg.num_machines == cluster(n).num_nodes
    assert cfg.machine_rank == 0 and cfg.use_cpu is False and cfg.same_network is True
    # mixed precision comes from ds_config.json (see test_mixed_precision_key_would_break_deepspeed)
    assert cfg.mixed_precision is None
    ds_file = cfg.deepspeed_config["deepspeed_config_file"]
    assert os.path.isabs(ds_file) and os.path.samefile(ds_file, out["ds_config.json"])
    assert cfg.deepspeed_config["zero3_init_flag"] == (row["zero"] == 3)

    # the plugin straight from the file ...
    plugin = accel_utils.DeepSpeedPlugin(hf_ds_config=ds_file)
    assert plugin.zero_stage == row["zero"]
    assert plugin.deepspeed_config["train_micro_batch_size_per_gpu"] == row["mbs"]
    assert plugin.gradient_accumulation_steps == row["gas"]
    assert plugin.offload_optimizer_device == row["offload_optimizer"] or (
        row["offload_optimizer"] == "none" and plugin.offload_optimizer_device in (None, "none"))
    # ... and as `accelerate launch` hands it to the training process (env vars)
    _, env = accelerate_env(out["accelerate_config.yaml"])
    assert env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] == ds_file
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    plugin = accel_utils.DeepSpeedPlugin()
    assert plugin.zero_stage == row["zero"] and plugin.zero3_init_flag == (row["zero"] == 3)
    # AcceleratorState.mixed_precision's rule for DeepSpeed: read it from the ds config
    ds = plugin.deepspeed_config
    effective = "fp16" if ds["fp16"]["enabled"] else ("bf16" if ds["bf16"]["enabled"] else "no")
    assert effective == {"bf16": "bf16", "bf16-pure": "bf16", "fp16": "fp16", "fp32": "no"}[training.precision]


def test_mixed_precision_key_would_break_deepspeed(tmp_path, monkeypatch):
    """Accelerate quirk the emitter avoids: with deepspeed_config_file, a mixed_precision in the
    accelerate config makes DeepSpeedPlugin raise, so the YAML must not carry one."""
    row = single(dp=8, zero=2).row(0)
    out = files(emit(tmp_path, MODEL, cluster(8), Training(), row))
    text = out["accelerate_config.yaml"].read_text()
    assert not re.search(r"^\s*mixed_precision:", text, re.M)
    bad = tmp_path / "bad.yaml"
    bad.write_text(text + "mixed_precision: bf16\n")
    _, env = accelerate_env(bad)
    assert "mixed_precision" in env["ACCELERATE_CONFIG_DS_FIELDS"]
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match="deepspeed_config_file"):
        accel_utils.DeepSpeedPlugin()


@pytest.mark.parametrize("zero,prec,tp,offload,recompute", [
    (3, "bf16", 1, "cpu", "full"), (2, "fp16", 1, "none", "full"), (0, "fp32", 1, "none", "none"),
    (3, "bf16", 2, "none", "none"), (0, "bf16", 2, "none", "full"),
])
def test_accelerate_fsdp_config(tmp_path, zero, prec, tp, offload, recompute, monkeypatch):
    dp = 8 // tp
    row = single(tp=tp, dp=dp, zero=zero, offload_optimizer=offload if zero else "none",
                 offload_params=offload if zero == 3 else "none", recompute=recompute).row(0)
    out = files(emit(tmp_path, MODEL, cluster(8), Training(engine="fsdp", precision=prec), row))
    assert "ds_config.json" not in out
    cfg = accel_config_args.load_config_from_file(str(out["accelerate_config.yaml"]))
    assert cfg.distributed_type == accel_utils.DistributedType.FSDP
    assert cfg.num_processes == 8 and cfg.num_machines == 1
    assert cfg.mixed_precision == {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[prec]  # 'no' stays a string
    assert "deepspeed_config" not in out["accelerate_config.yaml"].read_text()
    _, env = accelerate_env(out["accelerate_config.yaml"])
    assert env["FSDP_SYNC_MODULE_STATES"] == env["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "true"
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    # sync_module_states makes the plugin raise on a CPU-only host ("not supported on cpu");
    # it is checked above, so build the plugin without it here
    monkeypatch.setenv("FSDP_SYNC_MODULE_STATES", "false")
    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "false")
    plugin = accel_utils.FullyShardedDataParallelPlugin()
    from torch.distributed.fsdp import CPUOffload, ShardingStrategy
    if zero == 0 and tp == 1:
        assert plugin.fsdp_version == 1 and plugin.sharding_strategy == ShardingStrategy.NO_SHARD
    else:
        assert plugin.fsdp_version == 2 and plugin.reshard_after_forward == (zero == 3)
    offloaded = (plugin.cpu_offload.offload_params if isinstance(plugin.cpu_offload, CPUOffload)
                 else type(plugin.cpu_offload).__name__ == "CPUOffloadPolicy")  # FSDP2 policy class
    assert offloaded == (offload != "none" and zero > 0)
    assert plugin.activation_checkpointing == (recompute == "full")
    assert "torchrun" not in out["launch.sh"].read_text()
    assert ("megatron_args.txt" in out) == (tp > 1)  # the equivalent Megatron layout, for reference
    if tp > 1:
        assert env["PARALLELISM_CONFIG_TP_SIZE"] == str(tp)
        assert env["PARALLELISM_CONFIG_DP_SHARD_SIZE"] == str(dp if zero else 1)
        assert env["PARALLELISM_CONFIG_DP_REPLICATE_SIZE"] == str(1 if zero else dp)


def test_accelerate_megatron_lm_config(tmp_path):
    row = single(tp=2, pp=2, dp=4, zero=1, gas=8, recompute="selective", sequence_parallel=True).row(0)
    out = files(emit(tmp_path, MODEL, cluster(16), Training(engine="megatron"), row))
    assert "ds_config.json" not in out
    cfg = accel_config_args.load_config_from_file(str(out["accelerate_config.yaml"]))
    assert cfg.distributed_type == accel_utils.DistributedType.MEGATRON_LM
    assert cfg.num_processes == 16 and cfg.num_machines == 2 and cfg.mixed_precision == "bf16"
    _, env = accelerate_env(out["accelerate_config.yaml"])
    assert env["MEGATRON_LM_TP_DEGREE"] == "2" and env["MEGATRON_LM_PP_DEGREE"] == "2"
    assert env["MEGATRON_LM_NUM_MICRO_BATCHES"] == "8"
    assert env["MEGATRON_LM_SEQUENCE_PARALLELISM"] == "True"
    assert env["MEGATRON_LM_USE_DISTRIBUTED_OPTIMIZER"] == "True"
    assert env["MEGATRON_LM_RECOMPUTE_GRANULARITY"] == "selective"


# ---------------------------------------------------------------------------------------------
# launch.sh / megatron_args.txt

def args_of(text):
    return [line.strip() for line in text.splitlines() if line.strip()]


def test_launch_sh_tp_pp_layout(tmp_path):
    row = single(tp=2, pp=4, dp=2, cp=1, vpp=2, zero=1, mbs=1, gas=16, recompute="full",
                 sequence_parallel=True).row(0)
    out = files(emit(tmp_path, MODEL, cluster(16), Training(engine="megatron", seq_len=8192), row))
    sh = out["launch.sh"]
    assert sh.stat().st_mode & stat.S_IXUSR
    subprocess.run(["bash", "-n", str(sh)], check=True)
    text = sh.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert 'accelerate launch --config_file "$HERE/accelerate_config.yaml"' in text
    assert "torchrun --nproc_per_node 8 --nnodes 2" in text and '"$MEGATRON_SCRIPT"' in text
    assert "deepspeed --num_gpus" not in text  # pure Megatron: no DeepSpeed launcher / config
    margs = args_of(out["megatron_args.txt"].read_text())
    for a in ["--tensor-model-parallel-size 2", "--pipeline-model-parallel-size 4",
              "--num-layers-per-virtual-pipeline-stage 4", "--sequence-parallel", "--micro-batch-size 1",
              "--global-batch-size 32", "--seq-length 8192", "--num-layers 32", "--hidden-size 4096",
              "--num-attention-heads 32", "--group-query-attention", "--num-query-groups 8",
              "--ffn-hidden-size 14336", "--swiglu", "--use-distributed-optimizer",
              "--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1",
              "--bf16", "--use-flash-attn"]:
        assert a in margs, a
        assert "  " + a in text, a  # same arguments inline in launch.sh
    assert not any(a.startswith(("--context-parallel-size", "--expert-model-parallel-size")) for a in margs)
    # the Llama shape where Megatron-LM's defaults (LayerNorm, learned positions, biases, tied output
    # layer, dropout 0.1) differ: without these Megatron would train another model
    for a in ["--normalization RMSNorm", "--position-embedding-type rope", "--disable-bias-linear",
              "--untie-embeddings-and-output-weights", "--attention-dropout 0.0", "--hidden-dropout 0.0"]:
        assert a in margs, a
    assert "--qk-layernorm" not in margs and "--add-qkv-bias" not in margs
    # interleaved sends overlap compute by default (Megatron-LM arguments.py overlap_p2p_comm); planned
    # without it, the launch says so
    assert "--no-overlap-p2p-communication" not in margs
    blocking = Training(engine="megatron", seq_len=8192, overlap_p2p=False)
    again = files(emit(tmp_path / "blocking", MODEL, cluster(16), blocking, row))
    assert "--no-overlap-p2p-communication" in args_of(again["megatron_args.txt"].read_text())
    assert "--account-for-embedding-in-pipeline-split" not in margs
    edges = Training(engine="megatron", seq_len=8192, pipeline_edge_layers=1)
    two = single(tp=2, pp=2, dp=4, cp=1, zero=1, mbs=1, gas=8, sequence_parallel=True).row(0)  # (32 + 2)/2 a stage
    split = args_of(files(emit(tmp_path / "edges", MODEL, cluster(16), edges, two))["megatron_args.txt"].read_text())
    assert "--account-for-embedding-in-pipeline-split" in split and "--account-for-loss-in-pipeline-split" in split


def test_launch_sh_sets_the_environment_megatrons_tp_overlaps_need(tmp_path):
    # megatron-core 0.16.1 tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication
    # "requires that the environment variable CUDA_DEVICE_MAX_CONNECTIONS=1" for its async TP
    # collectives; TransformerEngine 2.20.2 initialize_ub raises without CUDA multicast (compute
    # capability 9.0 on) unless UB_SKIPMC=1
    row = single(tp=4, pp=1, dp=4, zero=1, mbs=1, gas=8, sequence_parallel=True).row(0)
    overlap = Training(engine="megatron", seq_len=4096, tp_comm_overlap=True)
    for gpu, skip_multicast in (("a100-80gb", True), ("h100-sxm", False)):
        nodes = Cluster(lookup_gpu(gpu), 16, 8)
        out = files(emit(tmp_path / gpu, MODEL, nodes, overlap, row))
        env = [line for line in out["launch.sh"].read_text().splitlines() if line.startswith("export ")]
        assert env[0].startswith("export CUDA_DEVICE_MAX_CONNECTIONS=1")
        assert any(line.startswith("export UB_SKIPMC=1") for line in env) == skip_multicast
        subprocess.run(["bash", "-n", str(out["launch.sh"])], check=True)
    plain = files(emit(tmp_path / "dp", MODEL, cluster(16), Training(engine="megatron"),
                       single(tp=1, dp=16, zero=1, mbs=1, gas=2).row(0)))
    assert "export " not in plain["launch.sh"].read_text()  # no TP: nothing to order


def test_launch_sh_exports_the_allocator_setting_the_plan_assumed(tmp_path):
    # torchtitan's run_train.sh sets expandable segments (Engine.expandable_segments), so its plan
    # books the smaller reserve (memory.reserved_bytes) and its launch.sh must set it too; the others
    # only where the user asks (--expandable-segments)
    from planner import api
    from planner.model import lookup

    layout = {"dp": 8, "zero": 3}
    titan = api.estimate("llama-3-8b", {"gpus": 8}, {"engine": "torchtitan"}, layout)
    plain = api.estimate("llama-3-8b", {"gpus": 8}, {"engine": "torchtitan", "expandable_segments": False}, layout)
    assert titan.defaults["expandable_segments"] is True and "expandable_segments" not in plain.defaults
    assert titan.memory["allocated_bytes"] == plain.memory["allocated_bytes"]
    assert titan.memory["reserved_bytes"] < plain.memory["reserved_bytes"]  # no split blocks across segments
    assert titan.memory["required_bytes"] == plain.memory["required_bytes"]  # the fit reads the allocated peak
    row = single(dp=8, zero=3, mbs=1, gas=2).row(0)
    line = "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    for engine, asked, exported in (("torchtitan", None, True), ("torchtitan", False, False),
                                    ("deepspeed", None, False), ("deepspeed", True, True)):
        out = files(emit(tmp_path / f"{engine}{asked}", lookup("llama-3-8b"), cluster(8),
                         Training(engine=engine, expandable_segments=asked), row))
        assert any(x.startswith(line) for x in out["launch.sh"].read_text().splitlines()) == exported, (engine, asked)
        subprocess.run(["bash", "-n", str(out["launch.sh"])], check=True)


def test_launch_sh_megatron_deepspeed(tmp_path):
    row = single(tp=2, pp=1, dp=4, cp=2, ep=2, zero=1, mbs=2, gas=2, recompute="selective").row(0)
    training = Training(engine="megatron-deepspeed", precision="fp16", flash_attention=False)
    out = files(emit(tmp_path, MOE, cluster(16), training, row))
    text = out["launch.sh"].read_text()
    subprocess.run(["bash", "-n", str(out["launch.sh"])], check=True)
    assert "deepspeed --num_gpus 8 --num_nodes 2 --hostfile" in text
    assert '--deepspeed_config "$HERE/ds_config.json"' in text
    margs = args_of(out["megatron_args.txt"].read_text())
    assert f"--deepspeed_config {out['ds_config.json']}" in margs
    for a in ["--tensor-model-parallel-size 2", "--pipeline-model-parallel-size 1", "--deepspeed",
              "--zero-stage 1", "--no-pipeline-parallel", "--ds-sequence-parallel-size 2",
              "--num-experts 8", "--moe-expert-parallel-size 2", "--recompute-granularity selective",
              "--deepspeed-activation-checkpointing", "--fp16", "--global-batch-size 16"]:
        assert a in margs, a
    assert "--use-distributed-optimizer" not in margs and not any(a.startswith("--use-flash-attn") for a in margs)
    assert "--moe-token-dispatcher-type" not in " ".join(margs)  # DeepSpeed-MoE has no such dispatcher


def test_megatron_args_carry_qwen3_moe_shape(tmp_path):
    from planner.model import lookup

    row = single(tp=4, pp=2, dp=2, ep=2, zero=1, mbs=1, gas=8, recompute="full", recompute_layers=3,
                 sequence_parallel=True).row(0)  # megatron-core: MoE with TP needs SP
    out = files(emit(tmp_path, lookup("qwen3-30b-a3b"), cluster(16), Training(engine="megatron"), row))
    margs = args_of(out["megatron_args.txt"].read_text())
    for a in ["--qk-layernorm", "--kv-channels 128", "--num-experts 128", "--moe-router-topk 8",
              "--moe-ffn-hidden-size 768", "--expert-model-parallel-size 2", "--recompute-method block",
              "--moe-token-dispatcher-type alltoall",  # megatron-core's default is allgather; the planner times alltoall
              "--recompute-num-layers 3", "--untie-embeddings-and-output-weights"]:
        assert a in margs, a


def test_megatron_args_uniform_recompute_groups(tmp_path):
    # --recompute-method uniform with 2 layers per checkpoint, as megatron-core's
    # TransformerBlock._checkpointed_forward reads it; the JSON row carries the method back
    row = single(tp=2, pp=2, dp=4, zero=1, mbs=1, gas=8, recompute="full", recompute_layers=2,
                 recompute_method="uniform").row(0)
    assert (row["recompute_layers"], row["recompute_method"]) == (2, "uniform")
    out = files(emit(tmp_path, MODEL, cluster(16), Training(engine="megatron"), row))
    margs = args_of(out["megatron_args.txt"].read_text())
    assert "--recompute-method uniform" in margs and "--recompute-num-layers 2" in margs


def test_launch_sh_plain_deepspeed(tmp_path):
    row = single(dp=16, zero=3, offload_optimizer="cpu", offload_params="cpu").row(0)
    out = files(emit(tmp_path, MODEL, cluster(16), Training(), row))
    assert "megatron_args.txt" not in out
    text = out["launch.sh"].read_text()
    subprocess.run(["bash", "-n", str(out["launch.sh"])], check=True)
    assert ('deepspeed --num_gpus 8 --num_nodes 2 --hostfile "${HOSTFILE:-$HERE/hostfile}" --master_port '
            '"$MASTER_PORT" "$TRAIN_SCRIPT" --deepspeed --deepspeed_config "$HERE/ds_config.json"') in text
    assert '--machine_rank "$NODE_RANK" --main_process_ip "$MASTER_ADDR"' in text
    assert "torchrun" not in text and "pretrain_gpt.py" not in text


def test_launch_sh_runs_selected_launcher(tmp_path):
    """Execute launch.sh with stub launchers on PATH: the right command line comes out."""
    row = single(tp=2, pp=2, dp=2, zero=1).row(0)
    out = files(emit(tmp_path / "o", MODEL, cluster(8), Training(engine="megatron-deepspeed"), row))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("accelerate", "deepspeed", "torchrun"):
        stub = bin_dir / tool
        stub.write_text(f'#!/bin/sh\necho {tool} "$@"\n')
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    for launcher in ("torchrun", "deepspeed"):
        res = subprocess.run(["bash", str(out["launch.sh"]), "--extra"], env={**env, "LAUNCHER": launcher},
                             capture_output=True, text=True, check=True)
        words = res.stdout.split()
        assert words[0] == launcher and words[-1] == "--extra"
        assert "pretrain_gpt.py" in words
        i = words.index("--tensor-model-parallel-size")
        assert words[i + 1] == "2"
        assert words[words.index("--deepspeed_config") + 1] == str(out["ds_config.json"])
    # Accelerate drives DeepSpeed data parallel only (its train_batch_size counts every process), and a
    # pipeline's PipelineEngine allows train_batch() alone: no accelerate config, and the launcher refuses
    assert "accelerate_config.yaml" not in out
    acc = subprocess.run(["bash", str(out["launch.sh"])], env={**env, "LAUNCHER": "accelerate"},
                         capture_output=True, text=True)
    assert acc.returncode == 2 and "LAUNCHER=deepspeed" in acc.stderr and not acc.stdout
    bad = subprocess.run(["bash", str(out["launch.sh"])], env={**env, "LAUNCHER": "nope"}, capture_output=True)
    assert bad.returncode == 2


# ---------------------------------------------------------------------------------------------
# files, errors, imports

def test_overwrites_atomically_and_keeps_other_files(tmp_path):
    out_dir = tmp_path / "a" / "b"  # parents are created
    first = emit(out_dir, MODEL, cluster(8), Training(), single(dp=8, zero=2, mbs=1).row(0))
    (out_dir / "notes.txt").write_text("mine")
    second = emit(out_dir, MODEL, cluster(8), Training(), single(dp=8, zero=2, mbs=4).row(0))
    assert [p.name for p in first] == [p.name for p in second] == [
        "ds_config.json", "accelerate_config.yaml", "launch.sh", "plan.json"]
    assert json.loads((out_dir / "ds_config.json").read_text())["train_micro_batch_size_per_gpu"] == 4
    assert sorted(p.name for p in out_dir.iterdir()) == [
        "accelerate_config.yaml", "ds_config.json", "launch.sh", "notes.txt", "plan.json"]  # no temp files left
    assert all(p.is_absolute() for p in second)


def test_emit_into_a_file_is_an_input_error(tmp_path):
    target = tmp_path / "plan.json"
    target.write_text("{}")
    row = single(dp=8).row(0)
    for bad in (target, target / "sub"):
        with pytest.raises(InputError) as info:
            emit(bad, MODEL, cluster(8), Training(), row)
        assert str(info.value).startswith("--emit:")
    assert target.read_text() == "{}"


def test_invalid_layout_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="--gpus"):
        emit(tmp_path, MODEL, cluster(16), Training(), single(dp=8).row(0))
    with pytest.raises(InputError, match="--offload-optimizer"):
        emit(tmp_path, MODEL, cluster(8), Training(), single(dp=8, zero=0, offload_optimizer="cpu").row(0))
    with pytest.raises(InputError, match="^--emit:"):
        emit(tmp_path, MODEL, cluster(8), Training(), {"tp": 1})
    assert not any(tmp_path.iterdir())


def test_export_imports_no_heavy_packages():
    code = ("import sys, planner.export; heavy = [m for m in ('torch', 'deepspeed', 'yaml', 'accelerate') "
            "if m in sys.modules]; print(heavy); sys.exit(bool(heavy))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert res.returncode == 0, res.stdout + res.stderr


def test_fp32_grad_accumulation_reaches_deepspeed(tmp_path, monkeypatch):
    # runtime/config.py get_data_types_params -> DeepSpeedConfig.grad_accum_dtype: "fp32", which with
    # bf16 and ZeRO-1 makes deepspeed.initialize wrap the optimizer in BF16_Optimizer
    case = dict(engine="deepspeed", precision="bf16", optimizer="adamw", row=dict(dp=8, zero=1, mbs=1, gas=1))
    row, _, out = emit_case(tmp_path, case, zero_config=ZeroConfig(fp32_grad_accum=True))
    assert ds_load(out["ds_config.json"], row, "deepspeed", monkeypatch).grad_accum_dtype == "fp32"
    row, _, out = emit_case(tmp_path / "default", case)
    assert ds_load(out["ds_config.json"], row, "deepspeed", monkeypatch).grad_accum_dtype is None


# ---------------------------------------------------------------------------------------------
# torchtitan: its trainer's own overrides, parsed by its own ConfigManager
#
# data/references/torchtitan_cli.json: planner.engines.torchtitan.export's overrides for 13 layouts, parsed by
# torchtitan 0.3.0's config.manager.ConfigManager (python -m calibrate.engines.torchtitan_cli; torchtitan is not
# a test dependency). The parsed Trainer.Config must say what the layout means.

TORCHTITAN_CLI = json.loads((Path(__file__).resolve().parent.parent / "data/references/torchtitan_cli.json").read_text())


@pytest.mark.parametrize("case", TORCHTITAN_CLI["rows"], ids=lambda c: f"{c['model']}-{c['precision']}-"
                         + "-".join(f"{k}{c['row'][k]}" for k in ("tp", "pp", "vpp", "cp", "ep", "zero")))
def test_torchtitan_overrides_parse_into_the_layout(case):
    from planner.engines.torchtitan import export as export_torchtitan
    from planner.engines.torchtitan.export import torchtitan_args
    from planner.model import lookup

    row, parsed = case["row"], case["parsed"]
    training = Training(seq_len=4096, precision=case["precision"], engine="torchtitan")
    assert torchtitan_args(lookup(case["model"]), training, row) == case["args"]  # what was parsed is what we write
    assert export_torchtitan.fp8_module(lookup(case["model"]), training) == case["fp8_module"]
    assert "error" not in parsed and len(parsed["linears"]) >= 3, parsed
    assert "error" not in parsed, parsed
    par, train = parsed["parallelism"], parsed["training"]
    replicate, shard = (row["dp"], 1) if row["zero"] == 0 else (1, row["dp"])
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (replicate, shard)
    if row["zero"]:
        assert par["fsdp_reshard_after_forward"] == ("always" if row["zero"] == 3 else "never")
    assert [par[k] for k in ("tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree",
                             "expert_parallel_degree")] == [row["tp"], row["pp"], row["cp"], row["ep"]]
    assert par["enable_sequence_parallel"] == (row["sequence_parallel"] or row["tp"] == 1)
    if row["pp"] > 1:
        assert par["pipeline_parallel_microbatch_size"] == row["mbs"]
        assert par["pipeline_parallel_schedule"] == {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B",
                                                     "zb-h1": "InterleavedZeroBubble"}[row["schedule"]]
        # micro-batches per step: local batch / micro-batch = gas
        assert train["local_batch_size"] == row["mbs"] * row["gas"]
    else:
        assert train["local_batch_size"] == row["mbs"]  # accumulation: global / (local x dp) = gas
    if row["vpp"] > 2:  # pipeline_parallel.py: ceil((80 layers + 2 edge weights) / per stage) stages = pp x vpp
        assert -(-(80 + 2) // par["pipeline_parallel_layers_per_stage"]) == row["pp"] * row["vpp"]
    assert train["global_batch_size"] == row["mbs"] * row["gas"] * row["dp"] and train["seq_len"] == 4096
    assert train["disable_cuda_graphs"] == (row["pp"] > 1 or row["ep"] > 1)
    assert train["enable_cpu_offload"] == (row["offload_optimizer"] != "none")
    assert (train["dtype"], train["mixed_precision_param"]) == {
        "bf16": ("float32", "bfloat16"), "fp32": ("float32", "float32"), "bf16-pure": ("bfloat16", "bfloat16"),
        "fp8": ("float32", "bfloat16")}[case["precision"]]
    # FP8 (the torchtitan_fp8.py module --emit writes): every block linear torchao's rowwise
    # Float8Linear, the output layer bf16 (planner/fp8.py: only the blocks' GEMMs run FP8)
    block = "Float8Linear.Config (rowwise)" if case["precision"] == "fp8" else "Linear.Config"
    assert parsed["linears"] == {name: "Linear.Config" if name == "lm_head" else block for name in parsed["linears"]}
    assert parsed["activation_checkpoint"] == {"none": "NoneType", "selective": "SelectiveAC.Config",
                                               "full": "FullAC.Config"}[row["recompute"]]


def test_torchtitan_emit_writes_a_launch_script(tmp_path):
    from planner.model import lookup

    training = Training(seq_len=4096, engine="torchtitan")
    row = single(dp=16, zero=3, mbs=2, gas=32).row(0)
    paths = emit(tmp_path, lookup("llama-3-8b"), Cluster(lookup_gpu("h100-sxm"), 16, 8), training, row)
    assert [p.name for p in paths] == ["launch.sh", "plan.json"] and os.stat(paths[0]).st_mode & stat.S_IXUSR
    text = paths[0].read_text()
    assert "-m torchtitan.train" in text and "TORCHTITAN_CONFIG:-llama3_8b" in text and "--nnodes 2" in text
    assert subprocess.run(["bash", "-n", str(paths[0])]).returncode == 0
    # a shape torchtitan's registry does not have: the script asks for the user's entry
    custom = ModelSpec(layers=4, hidden=256, heads=4, kv_heads=4, ffn=512, vocab=1000)
    text = emit(tmp_path / "custom", custom, Cluster(lookup_gpu("h100-sxm"), 16, 8), training, row)[0].read_text()
    assert 'TORCHTITAN_MODULE:?' in text
    with pytest.raises(InputError, match="--precision: torchtitan trains in bf16, bf16-pure or fp32, not fp16"):
        emit(tmp_path / "fp16", custom, Cluster(lookup_gpu("h100-sxm"), 16, 8),
             Training(seq_len=4096, engine="torchtitan", precision="fp16"), row)  # the planner's rule, before any file


def test_torchtitan_interleaving_needs_a_stage_size_it_can_express():
    # torchtitan counts num_virtual_stages = ceil((80 + 2) / layers_per_stage): 4 x 4 = 16 stages has no size
    # (6 gives 14, 5 gives 17), 2 x 4 = 8 has 11 (ceil(82 / 11) = 8)
    from planner.model import lookup
    from planner.rules import check_single

    model, training = lookup("llama-3-70b"), Training(seq_len=4096, engine="torchtitan")
    cluster = Cluster(lookup_gpu("h100-sxm"), 16, 8)
    with pytest.raises(InputError, match="--vpp: torchtitan cuts its 80 layers"):
        check_single(model, cluster, training, single(pp=4, vpp=4, dp=4, zero=3, gas=8))
    check_single(model, cluster, training, single(pp=2, vpp=4, dp=8, zero=3, gas=8))


@pytest.mark.parametrize("engine, layers_recomputed", [("deepspeed", 11), ("fsdp", 16), ("fsdp", 1), ("deepspeed", 32)])
def test_hugging_face_partial_recompute_is_the_train_scripts_every_n_layers(tmp_path, engine, layers_recomputed,
                                                                             monkeypatch):
    """No config file switches Hugging Face checkpointing, so launch.sh names the call, and the k it
    names checkpoints the planned N of the 32 layers when transformers runs it (every layer under
    accelerate's FSDP is its own fsdp_activation_checkpointing, which a partial plan turns off)."""
    import re

    import transformers

    row = single(dp=8, zero=3, recompute="full", recompute_layers=layers_recomputed).row(0)
    out = files(emit(tmp_path, MODEL, cluster(8), Training(engine=engine), row))
    script = out["launch.sh"].read_text()
    every = re.search(r"activation_checkpointing_enable\(every_n_layers=(\d+)\)", script)
    if engine == "fsdp":
        _, env = accelerate_env(out["accelerate_config.yaml"])
        assert env["FSDP_ACTIVATION_CHECKPOINTING"] == ("true" if layers_recomputed == 32 else "false")
    if engine == "fsdp" and layers_recomputed == 32:
        assert every is None and "fsdp_activation_checkpointing checkpoints every decoder layer" in script
        return
    config = transformers.LlamaConfig(num_hidden_layers=32, hidden_size=16, intermediate_size=32,
                                      num_attention_heads=2, num_key_value_heads=2, vocab_size=64)
    model = transformers.LlamaModel(config)
    model.activation_checkpointing_enable(every_n_layers=int(every.group(1)))
    assert sum(layer.gradient_checkpointing for layer in model.layers) == layers_recomputed


def test_hugging_face_partial_recompute_outside_every_n_layers_is_refused(tmp_path):
    # of 32 layers every k-th gives 32, 16, 11, 8, 7, 6, 5, 4, 3, 2, 1 (ceil(32 / k)); not 30 or 9
    for engine, kw, flag in (("deepspeed", dict(recompute_layers=30), "ceil(32/k)"),
                             ("fsdp", dict(recompute_layers=9), "ceil(32/k)"),
                             ("deepspeed", dict(recompute_layers=16, pp=2, dp=4), "--pp 1")):
        row = single(**{"dp": 8, **kw}, zero=1 if "pp" in kw else 3, recompute="full").row(0)
        with pytest.raises(InputError, match="^--recompute-layers") as info:
            emit(tmp_path, MODEL, cluster(8), Training(engine=engine), row)
        assert flag in str(info.value)
    assert not any(tmp_path.iterdir())


def test_hugging_face_checkpoint_offload_is_the_train_scripts_offload_flag(tmp_path):
    # accelerate's fsdp_activation_checkpointing keeps the inputs on the device, so --cpu-checkpointing
    # turns it off and launch.sh names transformers' offload=True (save_on_cpu around each checkpoint)
    row = single(dp=8, zero=3, recompute="full").row(0)
    training = Training(engine="fsdp", zero_config=ZeroConfig(cpu_checkpointing=True))
    out = files(emit(tmp_path, MODEL, cluster(8), training, row))
    _, env = accelerate_env(out["accelerate_config.yaml"])
    assert env["FSDP_ACTIVATION_CHECKPOINTING"] == "false"
    assert "activation_checkpointing_enable(every_n_layers=1, offload=True)" in out["launch.sh"].read_text()
    with pytest.raises(InputError, match="^--cpu-checkpointing: --engine megatron has no host copy"):
        emit(tmp_path / "m", MODEL, cluster(8), Training(engine="megatron", zero_config=ZeroConfig(cpu_checkpointing=True)),
             single(tp=8, dp=1, recompute="full").row(0))


def test_deepspeed_pipeline_recompute_is_pipeline_modules_interval(tmp_path):
    # DeepSpeed's pipeline checkpoints nothing by default (pipe/module.py PipelineModule
    # activation_checkpoint_interval=0); a full-recompute plan names interval 1, not transformers' call
    import inspect

    from deepspeed.runtime.pipe.module import PipelineModule

    assert inspect.signature(PipelineModule.__init__).parameters["activation_checkpoint_interval"].default == 0
    row = single(pp=2, dp=4, zero=1, gas=8, recompute="full").row(0)
    script = files(emit(tmp_path, MODEL, cluster(8), Training(engine="deepspeed"), row))["launch.sh"].read_text()
    assert "PipelineModule(..., activation_checkpoint_interval=1, checkpointable_layers=['<decoder layer class>'])" \
        in script
    assert "every_n_layers" not in script
    # PipelineModule._is_checkpointable, DeepSpeed's own: by default the embedding (it has parameters) is
    # checkpointed, reentrantly, which leaves it no gradient; named decoder layers alone are not
    from types import SimpleNamespace

    import torch
    from deepspeed.runtime import activation_checkpointing

    embedding, block = torch.nn.Embedding(8, 4), type("LlamaDecoderLayer", (torch.nn.Linear,), {})(4, 4)
    for named, expected in ((None, (True, True)), (["LlamaDecoderLayer"], (False, True))):
        stage = SimpleNamespace(activation_checkpoint_func=activation_checkpointing.checkpointing.checkpoint,
                                checkpointable_layers=named)
        assert tuple(PipelineModule._is_checkpointable(stage, [f]) for f in (embedding, block)) == expected


def test_deepspeed_pipeline_asks_for_the_even_block_split_it_was_planned_with(tmp_path):
    # PipelineModule's default partition_method 'parameters' balances parameter counts (pipe/module.py
    # _partition_layers): Llama-3-8B's 525M-parameter embedding weighs 2.4 of its 218M blocks, so the
    # first stage would hold fewer blocks than the planner's even split; 'type:<class>' splits blocks evenly
    import inspect

    from deepspeed.runtime.pipe.module import PipelineModule

    assert inspect.signature(PipelineModule.__init__).parameters["partition_method"].default == "parameters"
    row = single(pp=2, dp=4, zero=1, gas=8).row(0)
    script = files(emit(tmp_path, MODEL, cluster(8), Training(engine="deepspeed"), row))["launch.sh"].read_text()
    assert "partition_method='type:<decoder layer class>'" in script
    # and 'type:' splits the blocks as pipeline.layers_on_stage does: the embedding, norm and head weigh 0
    from deepspeed.runtime.utils import partition_balanced

    from planner.pipeline import layers_on_stage

    for layers, stages in ((9, 2), (10, 4), (32, 4), (80, 6)):
        weights = [0] + [1] * layers + [0, 0]
        parts = partition_balanced(weights=weights, num_parts=stages)
        assert [sum(weights[parts[i]:parts[i + 1]]) for i in range(stages)] == \
            [int(layers_on_stage(layers, stages, s)) for s in range(stages)]


def test_deepspeed_pipeline_layouts_get_no_accelerate_config(tmp_path):
    """DeepSpeed 0.19.8 PipelineEngine.backward and .step raise 'Only train_batch() is accessible in pipeline
    mode.', which Accelerate's backward/step call: a DeepSpeed pipeline layout is launched by deepspeed alone."""
    import inspect

    from deepspeed.runtime.pipe.engine import PipelineEngine

    for method in (PipelineEngine.backward, PipelineEngine.step):
        assert "Only train_batch() is accessible in pipeline mode" in inspect.getsource(method)
    row = single(pp=2, dp=4, zero=1, mbs=1, gas=8).row(0)
    out = files(emit(tmp_path, MODEL, cluster(8), Training(engine="deepspeed"), row))
    assert "accelerate_config.yaml" not in out and "ds_config.json" in out
    text = out["launch.sh"].read_text()
    assert "LAUNCHER=deepspeed" in text and "accelerate launch" not in text
