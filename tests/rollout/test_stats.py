"""rollout/stats.py: the statistics of a batch of traces, named for the step (rollout/) or eval (eval/)."""

import pytest

from rollout.stats import trace_metrics
from rollout.trace import Sequence, Trace

pytestmark = pytest.mark.unit


def trace(reward, agent_rewards=None, status="ok", n_seqs=1):
    roles = list(agent_rewards or {"solver": 0})
    seqs = [
        Sequence([1], [2, 3], [-0.1, -0.2], roles[i % len(roles)], "main", 0) for i in range(max(n_seqs, len(roles)))
    ]
    return Trace(
        "t",
        "g",
        seqs,
        reward=reward,
        agent_rewards=agent_rewards,
        status=status,
        error="boom" if status == "failed" else None,
    )


def test_trace_metrics_counts_and_means():
    ts = [trace(1.0, n_seqs=3), trace(0.5), trace(0.0, status="failed"), trace(1.0, status="truncated")]
    m = trace_metrics(ts, "eval")
    assert m == {
        "eval/traces": 4.0,
        "eval/reward": 0.625,
        "eval/success": 0.5,
        "eval/failed": 1.0,
        "eval/truncated": 1.0,
        "eval/sequences_per_trace": 1.5,
        "eval/agents_per_trace": 1.0,
        "eval/generated_tokens": 12.0,
    }


def test_trace_metrics_per_agent_rewards():
    ts = [
        trace(0.0, {"player_a": 1.0, "player_b": -1.0}),
        trace(0.0, {"player_a": -1.0, "player_b": 1.0}),
        trace(0.0, {"player_a": 1.0, "player_b": -1.0}),
    ]
    m = trace_metrics(ts, "rollout")
    assert m["rollout/reward"] == 0.0 and m["rollout/success"] == 0.0 and m["rollout/agents_per_trace"] == 2.0
    assert m["rollout/reward/player_a"] == pytest.approx(1 / 3)
    assert m["rollout/reward/player_b"] == pytest.approx(-1 / 3)


def test_trace_metrics_count_gateway_calls_only_for_gateway_runs():
    ts = [trace(1.0), trace(0.0)]
    assert not any("gateway" in k for k in trace_metrics(ts, "rollout"))
    ts[0].info.update(gateway_extended=3, gateway_fresh=1)
    ts[1].info.update(gateway_extended=0, gateway_fresh=2)
    m = trace_metrics(ts, "rollout")
    assert m["rollout/gateway_extended"] == 3.0 and m["rollout/gateway_fresh"] == 3.0


def test_a_harness_info_metrics_are_averaged_over_the_traces_that_have_each():
    """A game's `win_vs_random` counts only games against the random player; flags are no numbers."""
    ts = [trace(1.0), trace(0.0), trace(0.5), trace(0.0)]
    ts[0].info["metrics"] = {"win_vs_random": 1.0, "illegal_rate": 0.5, "random": True}
    ts[1].info["metrics"] = {"win_vs_random": 0.0, "illegal_rate": 0.0}
    ts[2].info["metrics"] = {"win_vs_frozen": 1, "illegal_rate": 0.25, "note": "x"}
    m = trace_metrics(ts, "eval")
    assert {k: v for k, v in m.items() if "/info/" in k} == {
        "eval/info/illegal_rate": 0.25,
        "eval/info/win_vs_frozen": 1.0,
        "eval/info/win_vs_random": 0.5,
    }
