"""RolloutWorker + TraceBuffer as real Ray actors against a real engine."""

import pytest
import ray

from rollout.config import HarnessConfig
from rollout.orchestration.cluster import spawn_buffer

pytestmark = pytest.mark.integration


def test_failing_and_hanging_harnesses_make_failed_traces(run_worker):
    harness = HarnessConfig(
        _target_="tests.rollout.orchestration.flaky_harnesses.flaky", name="flaky", roles=["solver"]
    )
    stats, groups, bstats = run_worker(harness, {"solver": "main"}, n_tasks=6, timeout_s=5.0)
    by_task = {g[0].info["task"].rsplit("/", 1)[1]: g for g in groups}
    assert sorted(by_task) == ["0", "1", "2", "3", "4", "5"], "every group completes, failed or not"
    for g in by_task.values():
        assert len(g) == 2 and {t.group for t in g} == {g[0].info["task"]}
    assert all(t.status == "failed" and "RuntimeError: harness bug on task 1" in t.error for t in by_task["1"])
    assert all(t.status == "failed" and "timeout" in t.error for t in by_task["2"])
    assert all(t.status == "failed" and "non-finite reward" in t.error for t in by_task["3"])
    # a per-agent reward for a role that never spoke is a bad harness result, not a crash
    assert all(t.status == "failed" and "role 'judge'" in t.error for t in by_task["4"])
    for k in ("0", "5"):
        for t in by_task[k]:
            assert t.status in ("ok", "truncated") and t.error is None
            assert len(t.sequences) == 1 and 0.0 <= t.reward <= 1.0
    # failed traces keep the model calls made before the failure
    assert all(len(t.sequences) == 1 for t in by_task["1"])
    assert stats["traces_failed"] == 8 and stats["traces_ok"] + stats["traces_truncated"] == 4
    assert bstats["received"] == 12 and bstats["rejected"] == 0


def test_bad_harness_results_make_failed_traces(run_worker):
    harness = HarnessConfig(
        _target_="tests.rollout.orchestration.flaky_harnesses.bad_results", name="bad", roles=["solver"]
    )
    stats, groups, bstats = run_worker(harness, {"solver": "main"}, n_tasks=6)
    by_task = {int(g[0].info["task"].rsplit("/", 1)[1]): g for g in groups}
    expected = {
        0: "info of type list",
        1: "info that is not plain JSON data",
        2: "reward = np.float32(0.5) of type float32",
        3: "reward = '0.5' of type str",
        4: "agent_rewards['solver'] = None of type NoneType",
    }
    for k, msg in expected.items():
        assert all(t.status == "failed" and msg in t.error for t in by_task[k]), (k, [t.error for t in by_task[k]])
        assert all(len(t.sequences) == 1 for t in by_task[k]), "the model call made before is kept"
    assert all(t.status != "failed" and t.reward == 0.5 and t.info["note"] == "fine" for t in by_task[5])
    assert stats["traces_failed"] == 10 and bstats["received"] == 12 and bstats["rejected"] == 0


def test_a_hostile_answer_scores_zero_and_the_trace_says_why(run_worker):
    """`9**9**9**9` for countdown never reaches a verifier (before, SymPy evaluated it until the
    sandbox's limit failed the trace): it scores 0 and the trace's info["scoring"] says why."""
    harness = HarnessConfig(
        _target_="tests.rollout.orchestration.flaky_harnesses.hostile_answer", name="hostile", roles=["solver"]
    )
    stats, groups, _ = run_worker(harness, {"solver": "main"}, n_tasks=3, timeout_s=120.0)
    by_task = {int(g[0].info["task"].rsplit("/", 1)[1]): g for g in groups}
    for t in by_task[0]:
        assert t.status != "failed" and t.reward == 0.0, t.error
        assert any(note.startswith("answer rejected") for note in t.info["scoring"]), t.info
    assert all(t.status != "failed" for k in (1, 2) for t in by_task[k]), "the worker goes on scoring"
    assert stats["traces_failed"] == 0


def test_a_trace_the_buffer_rejects_still_completes_its_group(run_worker):
    """A buffer that takes only token ids < 8 rejects every real trace: each group still completes,
    with a failed trace in each rejected one's place that says why (before, the group never did)."""
    harness = HarnessConfig(
        _target_="tests.rollout.orchestration.flaky_harnesses.flaky", name="flaky", roles=["solver"]
    )
    stats, groups, bstats = run_worker(harness, {"solver": "main"}, n_tasks=1, vocab_size=8)
    [group] = groups
    assert len(group) == 2 and all(t.status == "failed" and t.sequences == [] for t in group)
    assert all(
        t.error.startswith("rejected by the trace buffer: ") and "out of vocabulary" in t.error for t in group
    ), [t.error for t in group]
    assert all(t.info["task"] == "chain_sum/train/0" for t in group)
    assert stats["traces_rejected"] == 2 and bstats["rejected"] == 2 and bstats["received"] == 2


def test_frozen_role_and_agent_rewards(run_worker):
    harness = HarnessConfig(
        _target_="tests.rollout.orchestration.flaky_harnesses.judged", name="judged", roles=["solver", "judge"]
    )
    _, groups, _ = run_worker(harness, {"solver": "main", "judge": "frozen"}, n_tasks=2)
    traces = [t for g in groups for t in g]
    assert len(traces) == 4
    for t in traces:
        assert t.status != "failed", t.error
        assert [(s.agent, s.policy, s.trainable) for s in t.sequences] == [
            ("solver", "main", True),
            ("judge", "frozen", False),
        ]
        assert t.agent_rewards == {"solver": 1.0, "judge": -1.0} and t.reward == 0.0


def test_buffer_rejects_malformed_traces_with_reason(ray_cluster):
    from rollout.trace import Sequence, Trace

    buffer = spawn_buffer(2, {"main": 512})
    good = Trace(id="a", group="g", sequences=[Sequence([1, 2], [3], [-0.1], "solver", "main", 0)])
    oov = Trace(id="b", group="g", sequences=[Sequence([1, 2], [3, 9999], [-0.1, -0.2], "solver", "main", 0)])
    bad_dict = {
        "id": "c",
        "group": "g",
        "sequences": [
            {
                "prompt_ids": [1],
                "completion_ids": [2, 3],
                "logprobs": [-0.1],
                "agent": "s",
                "policy": "main",
                "version": 0,
            }
        ],
    }
    assert ray.get(buffer.put.remote(good)) is None  # taken
    assert "9999 is out of vocabulary" in ray.get(buffer.put.remote(oov))  # rejected: why
    assert "logprobs has 1 entries" in ray.get(buffer.put.remote(bad_dict))
    stats = ray.get(buffer.stats.remote())
    assert stats["rejected"] == 2 and stats["received"] == 1
    assert "9999 is out of vocabulary" in stats["last_errors"][0]
    assert "logprobs has 1 entries but completion_ids has 2" in stats["last_errors"][1]
    # the group is incomplete (1 of 2): nothing is released
    assert ray.get(buffer.get.remote(1, timeout_s=0.2)) == []
    assert ray.get(buffer.put.remote(good.__class__(**{**good.to_dict(), "id": "a2"}))) is None
    [group] = ray.get(buffer.get.remote(1, timeout_s=1))
    assert [t.id for t in group] == ["a", "a2"]
