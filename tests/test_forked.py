"""planner/forked.py and recommend's other-engine searches in forked workers: the same answer for
any number of workers."""

from __future__ import annotations

import os

import pytest

from planner import api, forked
from planner.engines import NAMES
from planner.comparison import engine_groups as _engine_groups

fork_only = pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only")


@fork_only
def test_a_piece_runs_in_another_process_and_returns_its_value():
    wait = forked.start(lambda x: (os.getpid(), x * 2), 21)
    pid, value = wait()
    assert value == 42 and pid != os.getpid()


def test_what_the_piece_raises_is_raised_here():
    wait = forked.start(int, "not a number")
    with pytest.raises(ValueError):
        wait()


def test_where_fork_fails_the_piece_runs_here(monkeypatch):
    def refuse():
        raise OSError("fork refused")

    monkeypatch.setattr(os, "fork", refuse)
    assert forked.start(lambda: os.getpid())() == os.getpid()


@pytest.mark.parametrize("own", NAMES)
@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_every_other_engine_is_searched_once(own, workers):
    names = [n for n in NAMES if n != own]
    groups = _engine_groups(own, names, workers)
    assert sorted(n for g in groups for n in g) == sorted(names)
    assert len(groups) <= workers  # this process's group last, possibly empty


def test_two_deepspeed_family_searches_split_on_two_workers():
    """The default (deepspeed) on 2 workers: megatron, the slowest search, in the child beside the two
    cheap ones, megatron-deepspeed here beside deepspeed's own (Engine.search_ms: 70 + 15 + 14 against
    52 + 43 ms)."""
    assert _engine_groups("deepspeed", [n for n in NAMES if n != "deepspeed"], 2) == \
        [["megatron", "fsdp", "torchtitan"], ["megatron-deepspeed"]]


@fork_only
@pytest.mark.parametrize("args", [dict(model=7e9, cluster={"gpus": 8}),
                                  dict(model="mixtral-8x7b", cluster={"gpus": 32})])
def test_recommend_answers_the_same_with_workers(args):
    one = api.recommend(args["model"], args["cluster"], workers=1).to_json()
    three = api.recommend(args["model"], args["cluster"], workers=3).to_json()
    assert one == three
    assert [e["engine"] for e in one["engines"]] == [n for n in NAMES if n != one["assumptions"]["engine"]]
