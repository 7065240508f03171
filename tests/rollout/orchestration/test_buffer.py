"""TraceBuffer (rollout/orchestration/buffer.py) on its own, as the plain class it is: every group
is released once, whatever is retried, repeated or late."""

import asyncio

import pytest

from rollout.orchestration.buffer import TraceBuffer
from rollout.trace import Sequence, Trace

pytestmark = pytest.mark.unit


def trace(group: str, sample: int, reward: float = 0.0) -> Trace:
    seq = Sequence([1, 2], [3], [-0.1], "solver", "main", 0)
    return Trace(id=f"{group}#{sample}", group=group, sequences=[seq], reward=reward)


def run(coro):
    return asyncio.run(coro)


def test_a_repeated_put_replaces_and_never_completes_a_group_alone():
    """A put retried (the RPC's answer lost) must not count twice: the same trace id twice is one
    trace (before: a group of 2 completed from one trace put twice)."""

    async def scenario():
        b = TraceBuffer(2)
        await b.put(trace("g", 0, reward=0.1), slot=0)
        await b.put(trace("g", 0, reward=0.2), slot=0)  # the repeat: replaces
        early = await b.get(1, timeout_s=0.05)
        await b.put(trace("g", 1), slot=0)
        [group] = await b.get(1, timeout_s=1)
        return early, group, await b.stats()

    early, group, stats = run(scenario())
    assert early == []
    assert sorted(t.id for t in group) == ["g#0", "g#1"] and group[0].reward == 0.2
    assert stats["repeated"] == 1 and stats["groups_ready"] == 1


def test_a_late_put_to_a_complete_group_is_dropped_not_a_second_group():
    """A second copy of a complete group from the same call (a retried RPC) or an older one is late;
    the same slot submitted anew (a newer call, not a rerun: the driver asked for it again) is a
    new group."""

    async def scenario():
        b = TraceBuffer(2)
        for k in (0, 1):
            await b.put(trace("g", k), epoch=4, slot=3)
        for epoch in (4, 3):
            for k in (0, 1):
                await b.put(trace("g", k), epoch=epoch, slot=3)
        once = await b.get(5, timeout_s=0.1), await b.stats()
        for k in (0, 1):
            await b.put(trace("g", k), epoch=6, slot=3)
        return once, await b.get(5, timeout_s=0.1)

    (groups, stats), anew = run(scenario())
    assert len(groups) == 1 and stats["late"] == 4 and stats["groups_partial"] == 0
    assert len(anew) == 1


def test_a_rerun_fences_off_the_failed_call_that_still_runs():
    """The failed call (epoch 1) and its rerun (epoch 2) both run: after reopen(epoch 2) only the
    rerun's traces fill the group; the old call's later puts are refused, so the group is never
    completed from two calls' traces (before: one group of mixed samples and a second one)."""

    async def scenario():
        b = TraceBuffer(2)
        await b.put(trace("g", 0, reward=-1.0), epoch=1, slot=7)  # the old call, before the rerun
        complete = await b.reopen([7, 8], epoch=2)
        await b.put(trace("g", 0, reward=1.0), epoch=2, slot=7)
        await b.put(trace("g", 1, reward=-1.0), epoch=1, slot=7)  # the old call goes on: fenced
        await b.put(trace("g", 1, reward=1.0), epoch=2, slot=7)
        return complete, await b.get(5, timeout_s=0.1), await b.stats()

    complete, groups, stats = run(scenario())
    assert complete == []
    [group] = groups
    assert [t.reward for t in group] == [1.0, 1.0], "only the rerun's traces"
    assert stats["fenced"] == 1 and stats["discarded"] == 1 and stats["groups_partial"] == 0


def test_slots_keep_apart_two_submissions_of_one_task():
    """A task source that wraps around gives two submitted indices (slots) one task id, hence one
    group id: they are two groups, each released once (before, by group id, they would have merged)."""

    async def scenario():
        b = TraceBuffer(2)
        for slot in (5, 105):
            for k in (0, 1):
                await b.put(trace("chain_sum/train/5", k), slot=slot)
        return await b.get(5, timeout_s=0.1)

    assert [len(g) for g in run(scenario())] == [2, 2]


def test_a_reset_forgets_every_group_and_refuses_older_calls():
    """The driver rolled back to a checkpoint (a learner rank was rebuilt): the groups after it are
    submitted again, so the buffer forgets them all, and a put of a call from before is refused."""

    async def scenario():
        b = TraceBuffer(2)
        for k in (0, 1):
            await b.put(trace("g", k), epoch=3, slot=1)
        await b.put(trace("h", 0), epoch=3, slot=2)
        await b.reset(epoch=4)
        await b.put(trace("h", 1), epoch=3, slot=2)  # from before the reset
        for k in (0, 1):  # slot 1 again, submitted anew: not "late"
            await b.put(trace("g", k), epoch=5, slot=1)
        return await b.get(5, timeout_s=0.1), await b.stats()

    groups, stats = run(scenario())
    assert [[t.id for t in g] for g in groups] == [["g#0", "g#1"]]
    assert stats["fenced"] == 1 and stats["discarded"] == 3 and stats["groups_partial"] == 0
