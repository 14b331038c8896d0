"""Where the ranks sit (--rank-order): Megatron's default tp-cp-dp-pp against tp-cp-pp-dp
(Megatron-LM --use-tp-pp-dp-mapping, the order Llama 3 trained in), checked against megatron-core's
own rank generator and against what Llama 3's paper says its order was for."""

from __future__ import annotations

import json

import pytest

from planner import api, hardware, layout, results, search
from planner.collectives import members_per_pod, ranks_per_node
from planner.errors import InputError
from planner.model import lookup

ORDERS = {"tp-cp-dp-pp": "tp-cp-ep-dp-pp", "tp-cp-pp-dp": "tp-cp-ep-pp-dp"}  # ours -> megatron-core's string


@pytest.mark.parametrize("order", list(ORDERS))
@pytest.mark.parametrize("tp, cp, dp, pp", [(2, 2, 4, 2), (8, 1, 16, 4), (4, 1, 8, 8), (1, 2, 8, 4), (2, 1, 64, 2)])
def test_groups_share_nodes_and_pods_as_megatron_cores_rank_generator_places_them(order, tp, cp, dp, pp):
    """megatron-core 0.16.1 parallel_state.RankGenerator: the data-parallel (dp-cp) group's members on
    its first node and pod, and whether a pipeline leaves its node or its pod, on 8-GPU nodes and
    64-GPU pods."""
    core = pytest.importorskip("megatron.core.parallel_state")
    gen = core.RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=ORDERS[order])
    dp_group, pp_group = gen.get_ranks("dp-cp")[0], gen.get_ranks("pp")[0]
    lay = layout.single(tp=tp, cp=cp, dp=dp, pp=pp, rank_order=order)
    cluster = hardware.Cluster(hardware.lookup_gpu("h100-sxm"), tp * cp * dp * pp, 8, pod_gpus=64, oversubscription=2.0)
    on_node = sum(r // 8 == dp_group[0] // 8 for r in dp_group)
    in_pod = sum(r // 64 == dp_group[0] // 64 for r in dp_group)
    assert ranks_per_node(cluster, lay.dp_stride, lay.zero_ranks)[0] == on_node
    assert members_per_pod(cluster, lay.dp_stride, lay.zero_ranks)[0] == in_pod
    assert (lay.pp_stride * lay.pp > 8)[0] == (len({r // 8 for r in pp_group}) > 1)
    assert (lay.pp_stride * lay.pp > 64)[0] == (len({r // 64 for r in pp_group}) > 1)


def _llama3_405b(order: str):
    """Llama 3 405B on 16,384 H100s as Meta ran it (Dubey et al. 2024 table 4: tp 8, pp 16, dp 128,
    2048 x 8192 tokens, interleaved), in pods of 3,072 GPUs with 1:7 above them (section 3.3.1)."""
    return api.estimate("llama-3.1-405b", {"gpus": 16384, "pod_gpus": 3072, "oversubscription": 7},
                        {"engine": "megatron", "seq_len": 8192, "gbs": 2048, "pipeline_edge_layers": 1},
                        {"tp": 8, "pp": 16, "vpp": 2, "zero": 1, "sequence_parallel": True, "recompute": "selective",
                         "rank_order": order})


def test_llama3s_order_keeps_its_pipelines_inside_a_pod():
    """Section 3.3.2 orders the ranks [TP, CP, PP, DP] so that pipeline sends stay inside a pod and only
    data parallelism, tolerant of latency, crosses the oversubscribed layer. With it a pipeline spans
    8 x 16 = 128 GPUs of one pod and its sends keep the NIC's rate; in Megatron's default order the
    stages sit 1,024 GPUs apart and the boundaries at a pod's edge share 3072 / 7 GPUs' uplinks. Its
    data-parallel groups (128 ranks 128 apart: 24 in a pod, one a node) lose nothing either way."""
    meta, megatron = _llama3_405b("tp-cp-pp-dp"), _llama3_405b("tp-cp-dp-pp")
    flat = api.estimate("llama-3.1-405b", {"gpus": 16384},
                        {"engine": "megatron", "seq_len": 8192, "gbs": 2048, "pipeline_edge_layers": 1},
                        {"tp": 8, "pp": 16, "vpp": 2, "zero": 1, "sequence_parallel": True, "recompute": "selective"})
    assert meta.time["breakdown"]["pp_comm"] == pytest.approx(flat.time["breakdown"]["pp_comm"], rel=1e-12)
    assert megatron.time["breakdown"]["pp_comm"] > 2 * meta.time["breakdown"]["pp_comm"]
    assert meta.time["breakdown"]["dp_comm"] == pytest.approx(megatron.time["breakdown"]["dp_comm"], rel=1e-12)
    assert meta.memory["gpu_bytes"] == megatron.memory["gpu_bytes"]  # where ranks sit moves no byte


def test_recommend_places_llama3s_ranks_as_meta_did():
    rec = api.recommend("llama-3.1-405b", {"gpus": 16384, "pod_gpus": 3072, "oversubscription": 7},
                        {"engine": "megatron", "seq_len": 8192, "gbs": 2048},
                        pinned={"tp": 8, "pp": 16, "vpp": 2}, top=1)
    assert rec.layouts[0]["layout"]["rank_order"] == "tp-cp-pp-dp"
    assert "pp-inner" in results.short(rec.layouts[0]["layout"])
    pinned = api.recommend("llama-3.1-405b", {"gpus": 16384, "pod_gpus": 3072, "oversubscription": 7},
                           {"engine": "megatron", "seq_len": 8192, "gbs": 2048},
                           pinned={"tp": 8, "pp": 16, "vpp": 2, "rank_order": "tp-cp-dp-pp"}, top=1)
    assert pinned.layouts[0]["layout"]["rank_order"] == "tp-cp-dp-pp"
    assert pinned.layouts[0]["throughput"]["tokens_per_s"] < rec.layouts[0]["throughput"]["tokens_per_s"]


def test_the_order_is_exported_and_refused_where_the_engine_has_one_order(tmp_path):
    from planner.export import megatron_args

    model, training = lookup("llama-3-70b"), layout.Training(engine="megatron")
    row = layout.single(tp=8, pp=4, dp=2, zero=1, gas=8, rank_order="tp-cp-pp-dp").row(0)
    assert row["rank_order"] == "tp-cp-pp-dp"
    assert "--use-tp-pp-dp-mapping" in megatron_args(model, training, row)
    assert "--use-tp-pp-dp-mapping" not in megatron_args(model, training, {**row, "rank_order": "tp-cp-dp-pp"})
    with pytest.raises(InputError, match="^--rank-order: --engine fsdp places pipeline stages outermost"):
        api.estimate("llama-3-8b", {"gpus": 16}, {"engine": "fsdp"}, {"dp": 16, "rank_order": "tp-cp-pp-dp"})
    with pytest.raises(InputError, match="^--rank-order: must be one of tp-cp-dp-pp, tp-cp-pp-dp"):
        layout.single(rank_order="pp-dp-tp")


def test_moe_pipelines_need_equal_data_parallel_sizes_to_put_the_pipeline_inside():
    """megatron-core 0.16.1 initialize_model_parallel asserts that the experts' data-parallel size equals
    the dense one unless the order ends in pp: Mixtral on 32 GPUs, tp 2, pp 2, dp 8, ep 2 keeps its
    experts' data parallelism at 2 x 8 / (2 x 2) = 4 with etp 2, 2 x 8 / (1 x 2) = 8 with etp 1."""
    base = {"tp": 2, "pp": 2, "ep": 2, "zero": 1, "sequence_parallel": True, "rank_order": "tp-cp-pp-dp"}
    with pytest.raises(InputError, match="^--rank-order: tp-cp-pp-dp with a pipeline needs"):
        api.estimate("mixtral-8x7b", {"gpus": 32}, {"engine": "megatron", "gbs": 64}, {**base, "etp": 2})
    assert api.estimate("mixtral-8x7b", {"gpus": 32}, {"engine": "megatron", "gbs": 64}, {**base, "etp": 1}).layout[
        "rank_order"] == "tp-cp-pp-dp"
    # the search tries the other order only where megatron-core takes it: in pods of 16 GPUs the
    # pipeline inside would be faster for every expert-parallel layout, and none may take it
    from planner import rules

    model = lookup("mixtral-8x7b")
    cluster = hardware.Cluster(hardware.lookup_gpu("h100-sxm"), 128, 8, pod_gpus=16, oversubscription=4.0)
    training = layout.Training(engine="megatron", seq_len=4096, gbs=256)
    valid = search.search(model, cluster, training, pinned={"pp": 4}).valid
    assert (rules.first_violation(model, cluster, training, valid)[0] < 0).all()


def test_cli_takes_the_order(capsys):
    import io

    from planner import cli

    out = io.StringIO()
    argv = ["estimate", "--model", "llama-3-70b", "--gpus", "64", "--engine", "megatron", "--tp", "8", "--pp", "4",
            "--gbs", "64", "--rank-order", "tp-cp-pp-dp", "--json"]
    assert cli.main(argv, out=out) == 0
    assert json.loads(out.getvalue())["layout"]["rank_order"] == "tp-cp-pp-dp"
    assert cli.main(["estimate", "--model", "llama-3-70b", "--gpus", "64", "--rank-order", "dp-first"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--rank-order" in err and "Traceback" not in err


def test_deepspeeds_pipeline_topology_has_one_order():
    """DeepSpeed's PipeModelDataParallelTopology (axes pipe, data, model; the last varies fastest)
    puts the pipeline outermost, Megatron's default: with 2 stages x 2 data x 2 model ranks, ranks 0-3
    are all stage 0 and a data-parallel neighbour is 2 ranks (the model-parallel size) away."""
    topology = pytest.importorskip("deepspeed.runtime.pipe.topology")
    t = topology.PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=2)
    assert [t.get_coord(r).pipe for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert t.get_rank(pipe=0, data=1, model=0) - t.get_rank(pipe=0, data=0, model=0) == 2
    lay = layout.single(tp=2, pp=2, dp=2)
    assert int(lay.pp_stride[0]) == 4 and int(lay.dp_stride[0]) == 2
    with pytest.raises(InputError, match="^--rank-order: --engine deepspeed places pipeline stages outermost"):
        api.estimate("llama-3-8b", {"gpus": 8}, {"engine": "deepspeed"},
                     {"pp": 2, "dp": 4, "zero": 1, "rank_order": "tp-cp-pp-dp"})
