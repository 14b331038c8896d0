"""Expert tensor parallelism as its own axis (`--etp`): what a rank holds, which ranks reduce the
expert gradients, which layouts each engine accepts, the TP traffic of the routed rows, and the
search and export. Sources: megatron-core 0.16.1 (model_parallel_config.py
expert_tensor_parallel_size, parallel_state.py initialize_model_parallel's expert rank groups
etp x ep x edp over the dense tp x cp x dp ranks, moe/token_dispatcher.py), torchtitan 0.3.0
(config/configs.py expert_parallel_degree), DeepSpeed 0.19 (moe/layer.py
enable_expert_tensor_parallelism=False). The arithmetic is written beside each assert."""

import pytest

from planner import api, export, layout, sharding, timing
from planner.errors import InputError
from planner.hardware import Cluster, lookup_gpu
from planner.memory import coefficients
from planner.model import lookup
from planner.rules import check_single
from planner.stage import Stage, Step

MIXTRAL = lookup("mixtral-8x7b")
EXPERT = 3 * 4096 * 14336  # one Mixtral expert's gate, up and down projections: 176,160,768
MEGATRON = layout.Training(seq_len=4096, engine="megatron")
NODE = Cluster(lookup_gpu("h100-sxm"), 8, 8)


@pytest.mark.parametrize("tp, dp, ep, etp, experts_per_rank", [
    (2, 4, 4, None, 2 / 2),  # default etp = tp: 8 / 4 = 2 experts, each split over 2 TP ranks
    (2, 4, 4, 1, 2),  # etp 1: 2 experts whole; EP 4 folds over tp 2 x dp 4
    (2, 4, 8, 1, 1),  # EP 8 over all 8 ranks: one whole expert each
    (4, 2, 8, 1, 1),  # EP larger than dp: only with folding
])
def test_megatron_expert_parameters_follow_etp(tp, dp, ep, etp, experts_per_rank):
    lay = layout.single(tp=tp, dp=dp, ep=ep, etp=etp, sequence_parallel=True)
    check_single(MIXTRAL, NODE, MEGATRON, lay)
    _, expert = sharding.rank_params(Stage(MIXTRAL, MEGATRON, lay, 0))
    assert expert[0] == 32 * experts_per_rank * EXPERT  # 32 blocks


@pytest.mark.parametrize("tp, dp, ep, etp, edp", [
    (2, 4, 4, None, 1),  # etp = tp: dp / ep = 4 / 4 (as without folding)
    (2, 4, 4, 1, 2),  # tp dp / (etp ep) = 8 / 4: each expert on 2 ranks
    (2, 4, 8, 1, 1),  # 8 / 8
])
def test_expert_data_parallel_ranks_are_the_folded_ones(tp, dp, ep, etp, edp):
    lay = layout.single(tp=tp, dp=dp, ep=ep, etp=etp)
    assert sharding.expert_dp(MEGATRON, lay)[0] == edp
    assert sharding.expert_tp(MEGATRON, lay)[0] == (etp or tp)


def test_deepspeed_moe_keeps_experts_whole_without_folding():
    training = layout.Training(seq_len=4096, engine="megatron-deepspeed")
    lay = layout.single(tp=2, dp=4, ep=4)
    assert sharding.expert_tp(training, lay)[0] == 1
    assert sharding.expert_dp(training, lay)[0] == 1  # dp / ep: each TP rank holds its own copy
    with pytest.raises(InputError, match="--ep: must divide the expert count 8 and --dp$"):
        check_single(MIXTRAL, NODE, training, layout.single(tp=4, dp=2, ep=8))
    with pytest.raises(InputError, match="--etp: megatron-deepspeed keeps experts whole"):
        check_single(MIXTRAL, NODE, training, layout.single(tp=2, dp=4, ep=4, etp=2))


def test_torchtitan_splits_experts_over_tp_only_without_ep():
    training = layout.Training(seq_len=4096, engine="torchtitan")
    assert sharding.expert_tp(training, layout.single(tp=2, dp=4))[0] == 2
    assert sharding.expert_tp(training, layout.single(tp=2, dp=4, ep=8))[0] == 1  # efsdp = 4 x 2 / 8 = 1
    with pytest.raises(InputError, match="--etp: torchtitan"):
        check_single(MIXTRAL, NODE, training, layout.single(tp=2, dp=4, ep=4, etp=2))


@pytest.mark.parametrize("lay, message", [
    (dict(tp=4, dp=2, ep=4, etp=2), "--etp: must be 1 or --tp"),
    (dict(tp=2, dp=4, ep=8, etp=2), r"--ep: must divide the expert count 8 and --tp x --cp x --dp / --etp"),
])
def test_megatron_etp_rules(lay, message):
    with pytest.raises(InputError, match=message):
        check_single(MIXTRAL, NODE, MEGATRON, layout.single(**lay, sequence_parallel=True))


def test_no_routed_row_gathers_with_experts_whole():
    # megatron-core with --expert-tensor-parallel-size 1: the dispatcher's TP group has one rank, so
    # only the attention's TP collectives remain (and a shared expert's): 1 all-reduce equivalent
    c = coefficients("time")
    for etp, expected in ((None, 1 + 2), (1, 1)):
        lay = layout.single(tp=2, dp=4, ep=4, etp=etp, sequence_parallel=True)
        tp_ar = timing.tp_all_reduce_s(Step(MIXTRAL, NODE, MEGATRON, lay, c))
        got = timing.tp_pass_exposed_s(Step(MIXTRAL, NODE, MEGATRON, lay, c), tp_ar, timing.tp_pass_units(MIXTRAL, MEGATRON, lay))
        assert got[0] == pytest.approx(expected * tp_ar[0], rel=1e-12)


def test_recommend_searches_etp_for_megatron_moe_only():
    rec = api.recommend("mixtral-8x7b", {"gpus": 16}, {"engine": "megatron"}, top=50)
    etps = {r["layout"]["etp"] for r in rec.layouts}
    assert 1 in etps  # experts whole with EP folded over TP is among the candidates
    dense = api.recommend("llama-2-7b", {"gpus": 16}, {"engine": "megatron"}, top=50)
    assert {r["layout"]["etp"] for r in dense.layouts} == {None}


def test_megatron_export_writes_expert_tensor_parallel_size(tmp_path):
    lay = layout.single(tp=2, dp=4, ep=8, etp=1, sequence_parallel=True, gas=4)
    args = export.megatron_args(MIXTRAL, MEGATRON, lay.row(0))
    assert "--expert-tensor-parallel-size 1" in args and "--expert-model-parallel-size 8" in args
