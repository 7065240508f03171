"""A harness's reward is a finite number in harness.reward_range, or its trace fails with the reason
(harnesses/base.py `as_result`; rewards review #6). The worker's side of it:
tests/rollout/agents/test_gateway_rewards.py."""

import math
import re

import pytest

from harnesses.base import REWARD_RANGE, HarnessResult, as_result


@pytest.mark.unit
def test_a_reward_outside_the_range_is_refused_naming_the_key():
    """rewards review #6: a finite 1e308 passed (and turned its group's advantages into NaN)."""
    for value, what in (
        (1e308, "reward = 1e+308"),
        (-2e6, "reward = -2e+06"),
        ({"a": 0.5, "b": 1e7}, "agent_rewards['b'] = 1e+07"),
        (HarnessResult(reward=0.5, agent_rewards={"a": -1e300}), "agent_rewards['a'] = -1e+300"),
    ):
        with pytest.raises(ValueError, match=rf"harness returned {re.escape(what)}, outside harness.reward_range"):
            as_result(value)
    with pytest.raises(ValueError, match=r"reward = 1.5, outside harness.reward_range \[0, 1\]"):
        as_result(1.5, reward_range=(0.0, 1.0))


@pytest.mark.unit
def test_the_range_holds_its_ends_and_everything_between():
    low, high = REWARD_RANGE
    assert as_result(high).reward == high and as_result(low).reward == low
    assert as_result({"a": low, "b": high}).reward == 0.0
    assert (
        as_result(1, reward_range=(0.0, 1.0)).reward == 1.0 and as_result(False, reward_range=(0.0, 1.0)).reward == 0.0
    )


@pytest.mark.unit
def test_an_integer_past_the_float_range_is_a_non_finite_reward():
    """A 401-digit integer (what JSON gives for `1` and 400 zeros) raised OverflowError from
    math.isfinite, not the ValueError that names the reward."""
    with pytest.raises(ValueError, match=r"non-finite reward: an integer past the float range"):
        as_result(10**400)
    with pytest.raises(ValueError, match=r"non-finite agent_rewards\['a'\]"):
        as_result({"a": math.nan})
