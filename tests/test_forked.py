"""Two processes through one search (issue 28): :mod:`explorer.engine.core.forked` claims
every item exactly once, shares the best, swaps messages, carries the child's errors to the
parent and leaves no process behind; the pipeline search finds the same plan on two
processes as on one."""

from __future__ import annotations

import os
import sys

import pytest

from explorer.engine.core import forked
from explorer.engine.search import Problem, Request, run

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork: Linux")


def _alive(pid: int) -> bool:
    try:
        got, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return got == 0


def test_one_process_takes_every_item_in_order():
    t = forked.team(1)
    assert isinstance(t, forked.Solo) and t.processes == 1
    assert list(t.claims(4)) == [0, 1, 2, 3]
    assert t.exchange({"a": 1}) == [{"a": 1}]
    t.offer(3.0)
    t.offer(5.0)
    assert t.best() == 3.0


def test_the_environment_caps_the_processes(monkeypatch):
    monkeypatch.setenv(forked.PROCESSES_ENV, "1")
    assert isinstance(forked.team(2), forked.Solo)


def test_a_pair_claims_every_item_once_and_shares_the_best():
    pair = forked.team(2)
    assert isinstance(pair, forked.Pair)
    try:
        mine = list(pair.claims(50))
        pair.offer(10.0 if pair.child else 20.0)
        lists = pair.exchange(mine)
        # both have offered before the exchange ends: each sees the other's
        best = pair.best()
        # the parent alone takes the second list (the child takes from an empty one), so
        # the order the preference gives is the parent's alone: the first preferred (odd)
        # index among the next two untaken, else the first untaken
        second = list(pair.claims(0 if pair.child else 10, prefer=range(1, 10, 2)))
        seconds = pair.exchange((second, best))
    except BaseException as exc:
        pair.close(exc)
        raise
    if pair.child:
        pair.close()                                  # never returns
    pid = pair.pid
    pair.close()
    assert not _alive(pid)
    parent, child = lists
    assert sorted(parent + child) == list(range(50)) and not set(parent) & set(child)
    assert parent == sorted(parent) and child == sorted(child)
    assert best == 10.0 and seconds[1][1] == 10.0
    assert seconds[0][0] == [1, 0, 3, 2, 5, 4, 7, 6, 9, 8] and seconds[1][0] == []


def test_the_childs_error_reaches_the_parent_and_the_child_is_gone():
    pair = forked.team(2)
    try:
        if pair.child:
            raise ValueError("bad input in the child: 7 stages")
        with pytest.raises(ValueError, match="7 stages"):
            pair.recv()
    except BaseException as exc:
        pair.close(exc)
        raise
    pid = pair.pid
    pair.close()
    assert not _alive(pid)


def test_an_error_in_the_parent_kills_the_waiting_child():
    pair = forked.team(2)
    if pair.child:
        try:
            pair.recv()                               # waits for a message never sent
        finally:
            pair.close()
    pid = pair.pid
    assert _alive(pid)
    pair.close(RuntimeError("the parent failed"))
    assert not _alive(pid)


def test_a_child_that_dies_is_reported_not_waited_for():
    pair = forked.team(2)
    if pair.child:
        os._exit(3)
    with pytest.raises(RuntimeError, match="ended before it answered"):
        pair.recv()
    pair.close()


TINY = dict(layers=4, hidden=64, heads=4, kv_heads=2, intermediate=128, seq_len=16, vocab=100)


def test_the_pipeline_search_finds_the_same_plan_on_two_processes():
    """Every configuration's bounds and plans are the same numbers in either process: the
    plan, its step and memory do not depend on how many processes searched."""
    def search(processes):
        p = Problem(Request("llama", 16, dict(TINY), preset="h100-cluster", devices=8,
                            dtype="bf16"))
        return run("pipeline", p, options=dict(optimizer="adam", memory_limit_gib=0.004,
                                               processes=processes))
    one, two = search(1), search(2)
    assert one.info["processes"] == 1 and two.info["processes"] == 2
    assert two.objective_s == one.objective_s
    assert two.plan.layers == one.plan.layers
    assert two.memory_per_device_bytes == one.memory_per_device_bytes
    assert two.plan.pipeline == one.plan.pipeline
    # every configuration is accounted for once, in the order of the bounds
    key = lambda t: (t["stages"], t["micro_batches"])                  # noqa: E731
    assert sorted(map(key, two.info["tried"])) == sorted(map(key, one.info["tried"]))
    costed = {key(t): t["time_s"] for t in one.info["tried"] if "time_s" in t}
    for t in two.info["tried"]:
        if "time_s" in t and key(t) in costed:
            assert t["time_s"] == costed[key(t)]


def test_processes_are_validated():
    from explorer.engine.search.options import PipelineOptions
    with pytest.raises(ValueError, match="processes"):
        PipelineOptions(processes=0)
    with pytest.raises(ValueError, match="processes must be 1 or 2"):
        PipelineOptions(processes=3)


def test_a_plan_the_child_found_is_built_by_the_child(monkeypatch):
    """The parent takes no configuration to cost (its claims of the ordered list are
    empty), so the plan is the child's: built there, sent whole, equal to one process's."""
    claims = forked.Pair.claims

    def lazy_parent(self, n, prefer=None, window=2):
        if not self.child and self._phase == 1:
            self._phase += 1
            return iter(())
        return claims(self, n, prefer, window)
    monkeypatch.setattr(forked.Pair, "claims", lazy_parent)

    def search(processes):
        p = Problem(Request("llama", 16, dict(TINY), preset="h100-cluster", devices=8,
                            dtype="bf16"))
        return run("pipeline", p, options=dict(optimizer="adam", processes=processes))
    one, two = search(1), search(2)
    assert two.info["processes"] == 2
    assert two.objective_s == one.objective_s and two.plan.layers == one.plan.layers
    assert two.search_time_s > 0 and two.plan.graph_digest == one.plan.graph_digest


def test_optcnn_makes_its_first_evaluations_on_two_processes_and_finds_the_same_plan(
        monkeypatch):
    """From ``FORK_DEVICES`` the chain search evaluates equation 1's plan in a child while
    the Lagrangian's first two multipliers are evaluated here: the same evaluations as one
    process makes, so the same plan, multipliers and bound."""
    from explorer.engine.layerwise import constrained

    def search(processes):
        monkeypatch.setenv(forked.PROCESSES_ENV, str(processes))
        p = Problem(Request("llama", 16, dict(TINY), preset="h100-cluster", devices=8,
                            dtype="bf16"))
        return run("optcnn", p, options=dict(optimizer="adam", memory_limit_gib=0.004))
    monkeypatch.setattr(constrained, "FORK_DEVICES", 2)
    forks = []
    team = forked.team
    monkeypatch.setattr(forked, "team", lambda *a, **k: forks.append(1) or team(*a, **k))
    one, two = search(1), search(2)
    assert len(forks) == 2                   # both searches asked; the second forked
    assert one.info["memory"]["constrained"] and one.info["memory"]["lambdas"] >= 3
    assert two.objective_s == one.objective_s and two.plan.layers == one.plan.layers
    for k in ("lambdas", "lambda", "lower_bound_s", "gap", "unconstrained_peak_bytes"):
        assert two.info["memory"][k] == one.info["memory"][k], k


def test_a_fork_that_fails_leaves_the_search_in_one_process(monkeypatch):
    def refuse():
        raise BlockingIOError(11, "Resource temporarily unavailable")
    monkeypatch.setattr(os, "fork", refuse)
    assert isinstance(forked.team(2), forked.Solo)


def test_the_cost_models_lock_is_free_in_a_child_forked_while_another_thread_held_it():
    """A server thread inside the cost model's lock when a search forks: the child's lock is
    a fresh one (``os.register_at_fork``), so the child's search does not wait forever."""
    import threading

    from explorer.engine.layerwise import costmodel, xkernel
    held, release = threading.Event(), threading.Event()

    def hold():
        with costmodel._LRU_LOCK, xkernel._INIT:
            held.set()
            release.wait(10)
    t = threading.Thread(target=hold)
    t.start()
    assert held.wait(5)
    try:
        pair = forked.team(2)
        if pair.child:
            try:
                got = costmodel._LRU_LOCK.acquire(timeout=2) and \
                    xkernel._INIT.acquire(timeout=2)
                pair.send(got)
            finally:
                pair.close()
        got = pair.recv()
        pair.close()
    finally:
        release.set()
        t.join()
    assert got is True
