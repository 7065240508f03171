"""Advantage estimators against hand-computed values (trainer/advantages.py).

Std convention under test: POPULATION std (ddof=0), A = (R - mean) / (std + eps).
"""

import math
from pathlib import Path

import numpy as np
import pytest

from rollout.trace import Sequence, Trace
from trainer.advantages import advantage_stats, compute_advantages, role_advantage_counts
from trainer.config import AdvantageConfig

pytestmark = pytest.mark.unit


def seq(agent="solver", **kw):
    base = dict(prompt_ids=[1, 2], completion_ids=[3], logprobs=[-0.1], agent=agent, policy="main", version=0)
    return Sequence(**{**base, **kw})


_n = 0


def trace(reward, group="g", seqs=None, **kw):
    global _n
    _n += 1
    if kw.get("status") == "failed":
        kw.setdefault("error", "harness crashed")
    return Trace(id=f"t{_n}", group=group, sequences=seqs or [seq()], reward=reward, **kw)


def flat(advs):
    """One value per single-sequence trace."""
    assert all(len(row) == 1 for row in advs)
    return [row[0] for row in advs]


def advantages(estimator: str, traces: list[Trace], **opts) -> list[list[float]]:
    """compute_advantages under AdvantageConfig(estimator=estimator, **opts): the config's
    defaults otherwise (scale_by_std=True, eps=1e-6)."""
    return compute_advantages(traces, AdvantageConfig(estimator=estimator, **opts))


# -- GRPO -------------------------------------------------------------------------


def test_grpo_1001_without_std():
    # mean = 0.5 -> A = R - 0.5
    advs = advantages("grpo", [trace(r) for r in (1, 0, 0, 1)], scale_by_std=False)
    assert flat(advs) == [0.5, -0.5, -0.5, 0.5]


def test_grpo_1001_with_population_std():
    ts = [trace(r) for r in (1, 0, 0, 1)]
    # population std = sqrt(mean((R - 0.5)^2)) = sqrt(0.25) = 0.5 -> A = +-0.5 / 0.5 = +-1
    assert flat(advantages("grpo", ts, eps=0.0)) == [1.0, -1.0, -1.0, 1.0]
    # with the default eps = 1e-6: +-0.5 / 0.500001 = +-0.999998
    assert flat(advantages("grpo", ts)) == pytest.approx([0.999998, -0.999998, -0.999998, 0.999998], abs=1e-9)
    # not the sample std (ddof=1): sqrt(1/3) = 0.57735 would give +-0.866025
    assert flat(advantages("grpo", ts, eps=0.0))[0] != pytest.approx(0.866025, abs=1e-3)


def test_grpo_all_equal_rewards_exactly_zero():
    # 0.1 is not exact in binary: the mean of [0.1]*3 need not equal 0.1; still exactly 0.
    for rewards in ([0.7, 0.7, 0.7], [0.1, 0.1, 0.1], [0.0, 0.0], [1.0] * 8):
        for scale in (True, False):
            advs = flat(advantages("grpo", [trace(r) for r in rewards], scale_by_std=scale))
            assert advs == [0.0] * len(rewards)
            assert all(math.isfinite(a) for a in advs)
    # eps = 0 would divide by 0: still exactly 0
    assert flat(advantages("grpo", [trace(0.3), trace(0.3)], eps=0.0)) == [0.0, 0.0]


def test_groups_are_independent_and_order_is_kept():
    # interleaved groups: g1 = [1, 0] -> mean 0.5; g2 = [3, 5] -> mean 4
    ts = [trace(1, "g1"), trace(3, "g2"), trace(0, "g1"), trace(5, "g2")]
    assert flat(advantages("grpo", ts, scale_by_std=False)) == [0.5, -1.0, -0.5, 1.0]
    # with population std: g1 std 0.5 -> +-1; g2 std 1 -> +-1
    assert flat(advantages("grpo", ts, eps=0.0)) == [1.0, -1.0, -1.0, 1.0]


def test_single_trace_groups_get_zero():
    ts = [trace(1.0, "g1"), trace(0.3, "g2"), trace(-2.0, "g3")]
    assert flat(advantages("grpo", ts)) == [0.0, 0.0, 0.0]
    assert flat(advantages("grpo", ts, scale_by_std=False)) == [0.0, 0.0, 0.0]
    assert flat(advantages("rloo", ts)) == [0.0, 0.0, 0.0]


# -- RLOO ---------------------------------------------------------------------------


def test_rloo_100():
    # A_0 = 1 - (0+0)/2 = 1;  A_1 = 0 - (1+0)/2 = -0.5;  A_2 = 0 - (1+0)/2 = -0.5
    assert flat(advantages("rloo", [trace(r) for r in (1, 0, 0)])) == [1.0, -0.5, -0.5]


def test_rloo_ignores_scale_by_std():
    ts = [trace(r) for r in (1, 0, 0)]
    cfg = AdvantageConfig(estimator="rloo", scale_by_std=True)
    assert flat(compute_advantages(ts, cfg)) == [1.0, -0.5, -0.5]


# -- batch mean / uniform -----------------------------------------------------------


def test_batch_mean_across_two_groups():
    ts = [trace(1, "g1"), trace(0, "g1"), trace(1, "g2"), trace(1, "g2")]
    # batch mean = 3/4 = 0.75 -> A = R - 0.75 (groups ignored)
    assert flat(advantages("batch_mean", ts, scale_by_std=False)) == [0.25, -0.75, 0.25, 0.25]
    # population var = (3 * 0.25^2 + 0.75^2) / 4 = 0.1875 -> std = sqrt(3)/4 = 0.4330127
    # 0.25 / 0.4330127 = 1/sqrt(3) = 0.5773503;  -0.75 / 0.4330127 = -sqrt(3) = -1.7320508
    got = flat(advantages("batch_mean", ts, scale_by_std=True, eps=0.0))
    assert got == pytest.approx([0.5773503, -1.7320508, 0.5773503, 0.5773503], abs=1e-7)
    # grpo on the same batch: g1 -> [0.5, -0.5], g2 all equal -> [0, 0]
    assert flat(advantages("grpo", ts, scale_by_std=False)) == [0.5, -0.5, 0.0, 0.0]


def test_uniform_is_the_raw_reward():
    ts = [trace(1, "g1"), trace(0, "g1"), trace(0.25, "g2")]
    assert flat(advantages("uniform", ts)) == [1.0, 0.0, 0.25]
    assert flat(compute_advantages(ts, AdvantageConfig(estimator="uniform"))) == [1.0, 0.0, 0.25]


# -- sequence structure: frozen, multi-sequence ------------------------------------


def test_frozen_zero_and_every_trainable_sequence_same_advantage():
    multi = [seq("solver"), seq("solver", parent=0), seq("judge", policy="frozen", trainable=False), seq("verifier")]
    ts = [trace(1, seqs=multi), trace(0, seqs=[seq("solver"), seq("judge", trainable=False)])]
    # group [1, 0], population std 0.5 -> +-1
    assert advantages("grpo", ts, eps=0.0) == [[1.0, 1.0, 0.0, 1.0], [-1.0, 0.0]]
    assert advantages("uniform", ts) == [[1.0, 1.0, 0.0, 1.0], [0.0, 0.0]]


# -- failed traces ------------------------------------------------------------------


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "batch_mean", "uniform"])
def test_failed_traces_zero_and_excluded_from_statistics(estimator):
    cfg = AdvantageConfig(estimator=estimator)
    with_failed = [trace(1), trace(0), trace(5.0, status="failed", seqs=[seq(), seq(), seq(trainable=False)])]
    without = [trace(1), trace(0)]
    a = compute_advantages(with_failed, cfg)
    assert a[2] == [0.0, 0.0, 0.0]
    assert a[:2] == compute_advantages(without, cfg)


def test_failed_traces_hand_values():
    ts = [trace(1), trace(0), trace(5.0, status="failed")]
    # grpo on [1, 0]: +-1 (std 0.5); rloo on [1, 0]: [1 - 0, 0 - 1] = [1, -1]
    assert flat(advantages("grpo", ts, eps=0.0)) == [1.0, -1.0, 0.0]
    assert flat(advantages("rloo", ts)) == [1.0, -1.0, 0.0]
    # a group whose only other trace failed is a group of one -> 0
    assert flat(advantages("grpo", [trace(1), trace(0, status="failed")])) == [0.0, 0.0]


def test_truncated_traces_count():
    ts = [trace(1), trace(0, status="truncated")]
    assert flat(advantages("grpo", ts, scale_by_std=False)) == [0.5, -0.5]


# -- per-agent rewards --------------------------------------------------------------


def two_role_trace(ra, rb, reward=0.0, group="g"):
    return trace(reward, group, seqs=[seq("a"), seq("b"), seq("a")], agent_rewards={"a": ra, "b": rb})


def test_per_agent_rewards_flow_to_their_role():
    # zero-sum game: a wins the first, b the second
    ts = [two_role_trace(1, -1), two_role_trace(-1, 1)]
    assert advantages("uniform", ts, per_agent_rewards=True) == [[1.0, -1.0, 1.0], [-1.0, 1.0, -1.0]]
    # role a pool [1, -1] -> mean 0; role b pool [-1, 1] -> mean 0
    assert advantages("grpo", ts, per_agent_rewards=True, scale_by_std=False) == [[1.0, -1.0, 1.0], [-1.0, 1.0, -1.0]]
    # without the option the trace reward (0 for both) is used: all 0
    assert advantages("grpo", ts) == [[0.0] * 3, [0.0] * 3]


def test_per_agent_baselines_are_per_role():
    ts = [two_role_trace(1, 10), two_role_trace(0, 20)]
    # a: [1, 0] mean 0.5 -> [0.5, -0.5];  b: [10, 20] mean 15 -> [-5, 5]
    # (one pooled mean over [1, 10, 0, 20] = 7.75 would give a very different answer)
    assert advantages("grpo", ts, per_agent_rewards=True, scale_by_std=False) == [[0.5, -5.0, 0.5], [-0.5, 5.0, -0.5]]
    # with std: a std 0.5 -> +-1; b std 5 -> +-1
    assert advantages("grpo", ts, per_agent_rewards=True, eps=0.0) == [[1.0, -1.0, 1.0], [-1.0, 1.0, -1.0]]
    # rloo per role: a: [1 - 0, 0 - 1] = [1, -1]; b: [10 - 20, 20 - 10] = [-10, 10]
    assert advantages("rloo", ts, per_agent_rewards=True) == [[1.0, -10.0, 1.0], [-1.0, 10.0, -1.0]]
    # batch_mean per role across two groups: a: [1, 0, 1] mean 2/3; b: [10, 20, 40] mean 70/3
    ts3 = ts + [two_role_trace(1, 40, group="other")]
    got = advantages("batch_mean", ts3, scale_by_std=False, per_agent_rewards=True)
    assert got[0] == pytest.approx([1 / 3, 10 - 70 / 3, 1 / 3])
    assert got[1] == pytest.approx([-2 / 3, 20 - 70 / 3, -2 / 3])
    assert got[2] == pytest.approx([1 / 3, 40 - 70 / 3, 1 / 3])


def test_one_pooled_baseline_for_every_role():
    # role_baseline=False: each role keeps its own reward, the pool is every role's of the group
    ts = [two_role_trace(1, 10), two_role_trace(0, 20)]
    pooled = AdvantageConfig(scale_by_std=False, per_agent_rewards=True, role_baseline=False)
    # pool [1, 10, 0, 20], mean 7.75 (the per-role baselines of the test above give [0.5, -5, ...])
    assert compute_advantages(ts, pooled) == [[-6.75, 2.25, -6.75], [-7.75, 12.25, -7.75]]
    # a zero-sum game: the pooled mean is 0, so the rewards pass unbaselined (a first mover who
    # wins 3 games of 4 keeps +1 per win; per-role baselines would centre it on its 0.5 mean)
    games = [two_role_trace(1, -1), two_role_trace(1, -1), two_role_trace(1, -1), two_role_trace(-1, 1)]
    assert [row[0] for row in compute_advantages(games, pooled)] == [1.0, 1.0, 1.0, -1.0]
    per_role = compute_advantages(games, AdvantageConfig(scale_by_std=False, per_agent_rewards=True))
    assert [row[0] for row in per_role] == [0.5, 0.5, 0.5, -1.5]
    # rloo and batch_mean pool the same way
    assert compute_advantages(ts, AdvantageConfig("rloo", per_agent_rewards=True, role_baseline=False))[0][0] == (
        pytest.approx(1 - 30 / 3)
    )
    got = compute_advantages(ts, AdvantageConfig("batch_mean", False, per_agent_rewards=True, role_baseline=False))
    assert got == compute_advantages(ts, pooled)
    # without per-agent rewards the option changes nothing
    plain = AdvantageConfig(role_baseline=False)
    assert compute_advantages(ts, plain) == compute_advantages(ts, AdvantageConfig())


def test_per_agent_falls_back_to_trace_reward():
    # role c is not in agent_rewards -> uses trace.reward (3 and 1: mean 2 -> [1, -1])
    ts = [
        trace(3, seqs=[seq("a"), seq("c")], agent_rewards={"a": 1.0}),
        trace(1, seqs=[seq("a"), seq("c")], agent_rewards={"a": 0.0}),
    ]
    assert advantages("grpo", ts, per_agent_rewards=True, scale_by_std=False) == [[0.5, 1.0], [-0.5, -1.0]]
    # no agent_rewards at all -> same as trace-level
    plain = [trace(1, seqs=[seq("a"), seq("b")]), trace(0, seqs=[seq("a"), seq("b")])]
    assert advantages("grpo", plain, per_agent_rewards=True) == advantages("grpo", plain)


# -- per-agent normalisation --------------------------------------------------------


def test_normalize_per_agent_hand_values():
    # a rewards [1, 0, 0, 1] -> grpo (no std) [.5, -.5, -.5, .5], batch std .5 -> +-1
    # b rewards [100, 0, 0, 100] -> [50, -50, -50, 50], batch std 50 -> +-1
    ts = [two_role_trace(ra, rb) for ra, rb in [(1, 100), (0, 0), (0, 0), (1, 100)]]
    raw = advantages("grpo", ts, per_agent_rewards=True, scale_by_std=False)
    assert [row[:2] for row in raw] == [[0.5, 50.0], [-0.5, -50.0], [-0.5, -50.0], [0.5, 50.0]]
    got = advantages("grpo", ts, per_agent_rewards=True, scale_by_std=False, normalize_per_agent=True, eps=0.0)
    assert got == [[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]]


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "batch_mean", "uniform"])
def test_normalize_per_agent_makes_scales_comparable(estimator):
    rng = np.random.default_rng(0)
    ts = [two_role_trace(float(rng.normal(0, 1)), float(rng.normal(50, 100)), group=f"g{k // 4}") for k in range(32)]

    def role_std(advs, j):  # column 0 is role a, column 1 role b (one value per trace and role)
        return float(np.std([row[j] for row in advs]))

    base = AdvantageConfig(estimator=estimator, scale_by_std=False, per_agent_rewards=True)
    raw = compute_advantages(ts, base)
    assert role_std(raw, 1) / role_std(raw, 0) > 20  # ~100x apart before
    norm = compute_advantages(
        ts, AdvantageConfig(estimator=estimator, scale_by_std=False, per_agent_rewards=True, normalize_per_agent=True)
    )
    assert role_std(norm, 0) == pytest.approx(1.0, abs=1e-4)
    assert role_std(norm, 1) == pytest.approx(1.0, abs=1e-4)


def test_normalize_per_agent_constant_role_left_unchanged():
    # uniform, trace-level: every trace reward 2 -> std 0 -> advantages stay 2 (not 2/eps)
    ts = [trace(2.0), trace(2.0)]
    assert flat(advantages("uniform", ts, normalize_per_agent=True)) == [2.0, 2.0]


# -- per-turn rewards ---------------------------------------------------------------


def test_turn_rewards_are_a_bonus_without_baseline():
    ts = [
        trace(1, seqs=[seq(), seq(reward=0.5), seq(reward=3.0, trainable=False)]),
        trace(0, seqs=[seq(), seq(reward=-0.25)]),
    ]
    # trace level: group [1, 0] mean 0.5 -> +-0.5; turn rewards are added as is
    assert advantages("grpo", ts, scale_by_std=False, use_turn_rewards=True) == [[0.5, 1.0, 0.0], [-0.5, -0.75]]
    # off: the per-turn rewards are ignored
    assert advantages("grpo", ts, scale_by_std=False) == [[0.5, 0.5, 0.0], [-0.5, -0.5]]
    # failed traces stay 0 even with turn rewards
    failed = trace(1, status="failed", seqs=[seq(reward=1.0)])
    assert advantages("grpo", [failed], use_turn_rewards=True) == [[0.0]]


# -- config -------------------------------------------------------------------------


def test_bad_estimator_name():
    with pytest.raises(ValueError, match=r"algorithm\.advantage\.estimator.*'ppo'.*grpo.*rloo"):
        AdvantageConfig(estimator="ppo")
    cfg = AdvantageConfig()
    cfg.estimator = "gae"  # mutated after construction: still caught at use
    with pytest.raises(ValueError, match=r"algorithm\.advantage\.estimator"):
        compute_advantages([trace(1)], cfg)
    with pytest.raises(ValueError, match="eps"):
        AdvantageConfig(eps=-1.0)


def test_empty_batch_and_default_config():
    assert compute_advantages([]) == []
    assert flat(compute_advantages([trace(1), trace(0)])) == pytest.approx([0.999998, -0.999998])


def test_advantage_stats():
    ts = [trace(1, seqs=[seq(), seq(trainable=False)]), trace(0), trace(9, status="failed")]
    advs = advantages("grpo", ts, eps=0.0)  # [[1, 0], [-1], [0]]
    st = advantage_stats(ts, advs)
    # over trainable sequences of ok traces: [1, -1]
    assert st == {"mean": 0.0, "std": 1.0, "min": -1.0, "max": 1.0, "count": 2.0, "frac_zero": 0.0}
    assert advantage_stats([], [])["count"] == 0.0
    with pytest.raises(ValueError):
        advantage_stats(ts, advs[:2])


def test_role_advantage_counts_show_a_role_trained_only_at_zero_advantage():
    """Group "a" (solver then checker) differs in reward: both roles get a gradient. Group "b" (the
    checker alone) is rewarded alike: its checker rows are trained at zero advantage. A frozen
    sequence and a failed trace count nowhere."""
    ts = [
        trace(1, "a", seqs=[seq("solver"), seq("checker")]),
        trace(0, "a", seqs=[seq("solver"), seq("checker"), seq("judge", trainable=False)]),
        trace(1, "b", seqs=[seq("checker")]),
        trace(1, "b", seqs=[seq("checker")]),
        trace(0, "b", seqs=[seq("supervisor")], status="failed"),
    ]
    counts = role_advantage_counts(ts, advantages("grpo", ts))
    assert counts == {
        "checker": {"sequences": 4.0, "nonzero_adv": 2.0},
        "solver": {"sequences": 2.0, "nonzero_adv": 2.0},
    }
    assert role_advantage_counts([], []) == {}
    with pytest.raises(ValueError):
        role_advantage_counts(ts, [])


def test_no_heavy_imports():
    import subprocess
    import sys

    code = "import sys, trainer.advantages; print([m for m in ('ray', 'vllm', 'torch') if m in sys.modules])"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    assert out.stdout.strip() == "[]"


# -- rewards too large to square ------------------------------------------------------


def test_large_finite_rewards_give_finite_advantages():
    """rewards review #6: [1e308, 1e308, 0, 0] gave NaN for every trace (the mean's sum and the
    std's squares overflowed) and [1e308, -1e308, 0, 1] silently gave zeros (std inf). The
    statistics are taken on rewards scaled by a power of two: the same values as for [1, 1, 0, 0]
    and [1, -1, ~0, ~0]."""
    assert flat(advantages("grpo", [trace(r) for r in (1e308, 1e308, 0, 0)], eps=0.0)) == [1.0, 1.0, -1.0, -1.0]
    big = flat(advantages("grpo", [trace(r) for r in (1e308, -1e308, 0, 1)]))
    assert big[:2] == pytest.approx([math.sqrt(2), -math.sqrt(2)]) and all(map(math.isfinite, big))
    assert big[3] > 0 > big[2]  # 1 is above the group's mean (0.25), 0 below: their order kept
    assert flat(advantages("batch_mean", [trace(r) for r in (1e308, 1e308, 0, 0)], scale_by_std=True, eps=0.0)) == [
        1,
        1,
        -1,
        -1,
    ]
    loo = flat(advantages("rloo", [trace(r) for r in (1e308, -1e308, 0, 1)]))
    assert loo == pytest.approx([1e308 + 1e308 / 3, -1e308 - 1e308 / 3, -1 / 3, 1.0])
    per_role = [trace(r, seqs=[seq("a"), seq("b")]) for r in (1e308, 1e308, 0, 0)]
    advs = compute_advantages(per_role, AdvantageConfig(normalize_per_agent=True, eps=0.0))
    assert all(math.isfinite(a) for row in advs for a in row)


def test_scaling_changes_no_advantage_of_ordinary_rewards():
    """The power-of-two scaling is exact: the advantages of ordinary rewards equal the textbook
    formula computed directly, to the bit."""
    rewards = np.array([0.3, 0.7, 0.1, 0.9, 0.25])
    mean, std = rewards.mean(), rewards.std()
    assert flat(advantages("grpo", [trace(float(r)) for r in rewards])) == list((rewards - mean) / (std + 1e-6))
    assert flat(advantages("rloo", [trace(float(r)) for r in rewards])) == list(rewards - (rewards.sum() - rewards) / 4)


def test_advantages_that_are_not_finite_are_refused_naming_the_trace():
    """rewards review #6: a NaN advantage made the loss NaN, and the learner skipped the whole
    optimizer step for every group of the batch. Without std scaling, rewards of +-1.7e308 leave a
    difference no float holds: the group is refused, naming its trace (rewards within
    harness.reward_range never get here)."""
    ts = [trace(r, group="huge") for r in (1.7e308, -1.7e308, -1.7e308)]
    for estimator in (lambda t: advantages("rloo", t), lambda t: advantages("grpo", t, scale_by_std=False)):
        with pytest.raises(ValueError, match=rf"trace '{ts[0].id}' of group 'huge' has advantages .* not finite"):
            estimator(ts)
    turn = [trace(1.7e308, seqs=[seq(reward=1.7e308)]), trace(0.0)]
    with pytest.raises(ValueError, match=r"keep rewards within harness.reward_range"):
        compute_advantages(turn, AdvantageConfig(use_turn_rewards=True, estimator="uniform"))
