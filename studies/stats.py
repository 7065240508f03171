"""The statistics of the studies over paired items and seeds, and their numbers as text.

The tests docs/preregistration/relay.md fixes ("Analysis": written in the relay's pilot script at
6a842dc, moved unchanged since): the exact sign test over items, the paired t-test over seeds, the
two-level bootstrap CI, Holm's adjustment; with the rounded mean both studies report. The
formatters at the end are the one way a study writes a number, a p-value or a sign test.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from trainer.metrics import sign_test_p


def mean(xs: Iterable[float]) -> float | None:
    """The mean rounded to 4 digits; None for no values."""
    xs = list(xs)
    return round(statistics.fmean(xs), 4) if xs else None


def sign_test(before: list[dict], after: list[dict]) -> dict:
    """Items that got better / worse from `before` to `after` (the same items), and the exact
    two-sided binomial p of that split (McNemar's exact test; ties dropped)."""
    assert [r["id"] for r in before] == [r["id"] for r in after], "the conditions must hold the same items"
    better = sum(a["reward"] > b["reward"] for b, a in zip(before, after))
    worse = sum(a["reward"] < b["reward"] for b, a in zip(before, after))
    return {"better": better, "worse": worse, "p": sign_test_p(better, worse)}


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (Lentz's method, as in
    Numerical Recipes' betacf)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with `df` degrees of freedom: I_x(df/2, 1/2), x = df/(df+t^2)."""
    x, a, b = df / (df + t * t), df / 2.0, 0.5
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def paired_t(diffs: list[float]) -> dict:
    """The paired t-test over seeds of per-seed differences: mean, t, two-sided p (n - 1 df)."""
    n, m = len(diffs), statistics.fmean(diffs)
    assert n >= 2, "a paired t-test needs at least 2 seeds"
    sd = statistics.stdev(diffs)
    if sd == 0.0:
        return {"seeds": n, "mean": m, "t": math.copysign(math.inf, m) if m else 0.0, "p": 0.0 if m else 1.0}
    t = m / (sd / math.sqrt(n))
    return {"seeds": n, "mean": m, "t": t, "p": t_two_sided_p(t, n - 1)}


def bootstrap_ci(a: list[list[float]], c: list[list[float]], resamples: int = 10000, seed: int = 0) -> tuple:
    """95% two-level bootstrap CI of mean over seeds of (mean c - mean a): resample seeds, then
    within each drawn seed its items (one item draw for both arms: they stay paired).
    a[s][i], c[s][i]: the reward of item i in seed s."""
    import numpy as np

    d = np.asarray(c, dtype=float) - np.asarray(a, dtype=float)  # (seeds, items)
    rng = np.random.default_rng(seed)
    seeds, items = d.shape
    stats = []
    for start in range(0, resamples, 500):  # in chunks: (500, seeds, items) indices at a time
        n = min(500, resamples - start)
        picks = rng.integers(0, seeds, size=(n, seeds))
        rows = rng.integers(0, items, size=(n, seeds, items))
        stats.append(d[picks[..., None], rows].mean(axis=(1, 2)))
    stats = np.concatenate(stats)
    return float(np.percentile(stats, 2.5)), float(np.percentile(stats, 97.5))


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm-adjusted p-values of a family (step-down, monotone, capped at 1)."""
    order = sorted(pvalues, key=pvalues.get)
    adjusted, running = {}, 0.0
    for rank, name in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * pvalues[name]))
        adjusted[name] = running
    return adjusted


# ---- as text ------------------------------------------------------------------------------------


def num(x, digits: int = 1) -> str:
    """A number to `digits` decimals; `-` for none."""
    return "-" if x is None else f"{x:.{digits}f}"


def interval(c, digits: int = 1) -> str:
    """A CI `[lo, hi]` to `digits` decimals; `-` for none."""
    return "-" if c is None else f"[{c[0]:.{digits}f}, {c[1]:.{digits}f}]"


def pval(p, exp_below: float = 0.0) -> str:
    """A p-value to 2 significant digits (`-` for none); below `exp_below`, as 1.2e-05."""
    if p is None:
        return "-"
    return f"{p:.1e}" if p < exp_below else f"{p:.2g}"


def sign_line(better: int, worse: int, p: float, exp_below: float = 0.0) -> str:
    """A sign test as `better / worse, p = ...`."""
    return f"{better} / {worse}, p = {pval(p, exp_below)}"
