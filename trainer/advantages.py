"""Advantage estimators over a batch of traces: one advantage per sequence.

API
---
Every function takes a FLAT list of traces (the batch; traces of one task
share `trace.group`, and a group is simply every trace of the batch with that
`group`, wherever it sits in the list) and returns `list[list[float]]`, with
`advs[i][j]` the advantage of `traces[i].sequences[j]`, in input order. The
loss broadcasts a sequence's advantage to each of its generated tokens.

    compute_advantages(traces, cfg)          # the entry point, driven by AdvantageConfig
    advantage_stats(traces, advs)            # mean/std/min/max over trainable sequences
    role_advantage_counts(traces, advs)      # per role: trainable sequences, and those with a gradient

This runs BEFORE prefix merging (docs/design.md, "Training math").

Estimators (`AdvantageConfig.estimator`): `grpo` (group mean [/ std]), `rloo` (leave-one-out),
`batch_mean` (batch mean [/ std]), `uniform` (the trace reward, no baseline); per-agent rewards
with per-role or pooled baselines (`role_baseline`), per-agent normalisation (Dr. MAS) and
per-turn reward bonuses. Frozen sequences and failed traces get 0.0 and stay out of every
statistic; std is the population std, and a pool whose rewards are all equal gives exactly 0.0.
docs/design.md, "Advantages", has each convention, the formulas and the papers; each convention
is tested in tests/trainer/test_advantages.py.

No torch, ray or vllm here: plain Python + numpy.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence as Seq

import numpy as np

from rollout.trace import Sequence, Trace
from trainer.config import AdvantageConfig, Estimator, validate_config

# -- estimators over one pool of rewards ------------------------------------------


def _all_equal(r: np.ndarray) -> bool:
    return r.size == 0 or bool(r.max() == r.min())


def _unit_scale(r: np.ndarray) -> tuple[np.ndarray, int]:
    """`r` over s = 2**e, and e, for the power of two s at or above max |r| (1 for a pool of zeros). Sums and
    squares of r / s cannot overflow, as those of r can (rewards [1e308, 1e308, 0, 0] made every
    advantage NaN; [1e308, -1e308, 0, 1] made them 0: rewards review #6), and dividing by a power
    of two is exact, so rewards that never overflowed give the same advantages to the bit."""
    top = float(np.max(np.abs(r))) if r.size else 0.0
    exponent = math.frexp(top)[1] if top > 0 else 0
    return np.ldexp(r, -exponent), exponent


def _centred(r: np.ndarray, scale_by_std: bool, eps: float) -> np.ndarray:
    """(r - mean) [/ (population std + eps)]; exactly 0 when all r are equal."""
    if _all_equal(r):
        return np.zeros_like(r)
    u, e = _unit_scale(r)
    a = u - u.mean()  # (r - mean) / 2**e
    if scale_by_std:
        return a / (u.std() + math.ldexp(eps, -e))
    with np.errstate(over="ignore"):  # +-inf: _check_finite refuses it, naming the trace
        return np.ldexp(a, e)


def _leave_one_out(r: np.ndarray) -> np.ndarray:
    """A_i = r_i - mean_{j != i} r_j; 0 for a pool of one (or of equal rewards)."""
    n = r.size
    if n < 2 or _all_equal(r):
        return np.zeros_like(r)
    u, e = _unit_scale(r)
    with np.errstate(over="ignore"):  # +-inf: _check_finite refuses it, naming the trace
        return np.ldexp(u - (u.sum() - u) / (n - 1), e)


# -- the entry point ----------------------------------------------------------------


def compute_advantages(traces: Seq[Trace], cfg: AdvantageConfig | None = None) -> list[list[float]]:
    """One advantage per sequence: `advs[i][j]` for `traces[i].sequences[j]`.

    `traces` is the flat batch; groups are formed by `trace.group`. See the
    module docstring for every convention (failed traces, std, roles, turns).
    """
    cfg = cfg or AdvantageConfig()
    validate_config(cfg)
    traces = list(traces)
    ok = [i for i, t in enumerate(traces) if t.status != "failed"]
    unit_adv = _baselined(traces, _unit_rewards(traces, ok, cfg.per_agent_rewards), cfg)

    # Advantage of (trace, role), whichever the unit was.
    role_adv: dict[tuple[int, str], float] = {}
    for i in ok:
        for role in sorted({s.agent for s in traces[i].sequences}):
            role_adv[(i, role)] = unit_adv[(i, role if cfg.per_agent_rewards else None)]
    if cfg.normalize_per_agent:
        _normalize_per_role(role_adv, cfg.eps)

    out: list[list[float]] = []
    for i, t in enumerate(traces):
        row = []
        for s in t.sequences:
            if t.status == "failed" or not s.trainable:
                row.append(0.0)
                continue
            a = role_adv[(i, s.agent)]
            if cfg.use_turn_rewards and s.reward is not None:
                a += float(s.reward)
            row.append(float(a))
        out.append(row)
    _check_finite(traces, out)
    return out


def _check_finite(traces: list[Trace], advs: list[list[float]]) -> None:
    """Refuse advantages that are not finite, naming the trace: one NaN in the loss voids the whole
    optimizer step (the learner skips it). Rewards within harness.reward_range never give one."""
    for t, row in zip(traces, advs):
        if not all(map(math.isfinite, row)):
            raise ValueError(
                f"trace {t.id!r} of group {t.group!r} has advantages {row} that are not finite (its reward "
                f"{t.reward}, agent rewards {t.agent_rewards}, turn rewards {[s.reward for s in t.sequences]}): "
                f"its group is refused; keep rewards within harness.reward_range"
            )


Unit = tuple[int, str | None]  # (trace index, role), role None for trace-level credit


def _unit_rewards(traces: list[Trace], ok: list[int], per_agent: bool) -> dict[Unit, float]:
    """The reward of each unit of credit: (trace, role) when per-agent, else (trace, None)."""
    unit_reward: dict[Unit, float] = {}
    for i in ok:
        t = traces[i]
        if per_agent:
            agent_rewards = t.agent_rewards or {}
            for role in sorted({s.agent for s in t.sequences}):
                unit_reward[(i, role)] = float(agent_rewards.get(role, t.reward))
        else:
            unit_reward[(i, None)] = float(t.reward)
    return unit_reward


def _baselined(traces: list[Trace], unit_reward: dict[Unit, float], cfg: AdvantageConfig) -> dict[Unit, float]:
    """Each unit's reward minus its pool's baseline (and over its std, if asked)."""
    if cfg.estimator == Estimator.uniform:
        return dict(unit_reward)

    def pool_key(unit: Unit) -> Hashable:
        i, role = unit
        role = role if cfg.role_baseline else None
        if cfg.estimator in (Estimator.grpo, Estimator.rloo):
            return (traces[i].group, role)
        return role  # batch_mean: the whole batch (per role when per-agent)

    pools: dict[Hashable, list[Unit]] = {}
    for unit in unit_reward:
        pools.setdefault(pool_key(unit), []).append(unit)
    unit_adv: dict[Unit, float] = {}
    for units in pools.values():
        r = np.array([unit_reward[u] for u in units], dtype=np.float64)
        if cfg.estimator == Estimator.rloo:
            a = _leave_one_out(r)
        else:  # grpo, batch_mean
            a = _centred(r, cfg.scale_by_std, cfg.eps)
        unit_adv.update(zip(units, (float(x) for x in a)))
    return unit_adv


def _normalize_per_role(role_adv: dict[tuple[int, str], float], eps: float) -> None:
    """Divide each role's advantages by that role's batch std, in place (Dr. MAS)."""
    by_role: dict[str, list[tuple[int, str]]] = {}
    for key in role_adv:
        by_role.setdefault(key[1], []).append(key)
    for _, keys in sorted(by_role.items()):
        a = np.array([role_adv[k] for k in keys], dtype=np.float64)
        if not _all_equal(a):
            u, e = _unit_scale(a)
            role_adv.update(zip(keys, (float(x) for x in u / (u.std() + math.ldexp(eps, -e)))))


# -- stats ------------------------------------------------------------------------


def _trainable_advantages(traces: Seq[Trace], advs: Seq[Seq[float]]) -> list[tuple[Sequence, float]]:
    """(sequence, advantage) of every trainable sequence of a non-failed trace; a ValueError when
    `advs` does not have one row per trace and one entry per sequence."""
    if len(traces) != len(advs):
        raise ValueError(f"{len(traces)} traces but {len(advs)} advantage rows")
    pairs = []
    for i, (t, row) in enumerate(zip(traces, advs)):
        if len(row) != len(t.sequences):
            raise ValueError(f"advs[{i}] has {len(row)} entries for {len(t.sequences)} sequences")
        if t.status != "failed":
            pairs.extend((s, a) for s, a in zip(t.sequences, row) if s.trainable)
    return pairs


def advantage_stats(traces: Seq[Trace], advs: Seq[Seq[float]]) -> dict[str, float]:
    """mean/std/min/max (population std) over trainable sequences of non-failed traces.

    Keys: mean, std, min, max, count, frac_zero; all 0.0 (count 0) when there is no
    such sequence.
    """
    vals = [a for _, a in _trainable_advantages(traces, advs)]
    if not vals:
        return {"mean": 0.0, "std": 0.0, "min": 0.0, "max": 0.0, "count": 0.0, "frac_zero": 0.0}
    v = np.array(vals, dtype=np.float64)
    return {
        "mean": float(v.mean()),
        "std": float(v.std()),
        "min": float(v.min()),
        "max": float(v.max()),
        "count": float(v.size),
        "frac_zero": float(np.mean(v == 0.0)),
    }


def role_advantage_counts(traces: Seq[Trace], advs: Seq[Seq[float]]) -> dict[str, dict[str, float]]:
    """Per role (a sequence's agent), over trainable sequences of non-failed traces: `sequences`, and
    `nonzero_adv`, those whose advantage is not 0.0: the sequences that move the weights. A role
    whose rows are trained only at zero advantage (every trace of its group rewarded alike) has
    sequences and no nonzero_adv. Roles in sorted order."""
    counts: dict[str, dict[str, float]] = {}
    for s, a in _trainable_advantages(traces, advs):
        c = counts.setdefault(s.agent, {"sequences": 0.0, "nonzero_adv": 0.0})
        c["sequences"] += 1.0
        c["nonzero_adv"] += float(a != 0.0)
    return dict(sorted(counts.items()))
