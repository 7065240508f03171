"""The eval summary helpers of trainer/loop.py: paired sign test and per-agent eval rewards."""

import pytest

from rollout.trace import Sequence, Trace
from trainer.loop import eval_metrics, paired_comparison


def trace(reward, agent_rewards=None):
    seqs = [Sequence([1], [2], [-0.1], role, "main", 0) for role in (agent_rewards or {"solver": 0})]
    return Trace("t", "g", seqs, reward=reward, agent_rewards=agent_rewards)


def test_paired_comparison_counts_and_sign_test():
    before = [trace(r) for r in (0, 0, 0, 0, 0, 0, 1, 1)]
    after = [trace(r) for r in (1, 1, 1, 1, 1, 0, 1, 0)]
    got = paired_comparison(before, after)
    assert got["better"] == 5 and got["worse"] == 1
    # two-sided sign test, 6 untied pairs, 1 the minority: 2 * (C(6,0) + C(6,1)) / 2^6
    assert got["sign_test_p"] == pytest.approx(2 * 7 / 64)
    assert paired_comparison(before, before) == {"better": 0, "worse": 0, "sign_test_p": 1.0}
    even = paired_comparison([trace(0), trace(1)], [trace(1), trace(0)])
    assert even["sign_test_p"] == 1.0


def test_eval_metrics_per_agent():
    ts = [trace(0.0, {"player_a": 1.0, "player_b": -1.0}), trace(0.0, {"player_a": -1.0, "player_b": 1.0}),
          trace(0.0, {"player_a": 1.0, "player_b": -1.0})]
    m = eval_metrics(ts)
    assert m["eval/reward"] == 0.0 and m["eval/success"] == 0.0
    assert m["eval/reward/player_a"] == pytest.approx(1 / 3) and m["eval/reward/player_b"] == pytest.approx(-1 / 3)
    assert eval_metrics([trace(1.0), trace(0.5)]) == {"eval/reward": 0.75, "eval/success": 0.5}
