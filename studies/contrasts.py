"""Conditions compared over seeds: a study's per-item files read back, the paired contrast of two
conditions (per-seed means, paired t, two-level bootstrap CI), Holm over a family, per-seed
run-vs-run sign tests, the accuracy and token summaries of runs and controls, and their markdown.

A study lays its per-item files (studies/items.py's write_condition) out as
RESULTS/<arm>/seed<s>/step_<n>.* (each evaluation of a run, beside its driver's status.json:
state, wall_s, attempts) and RESULTS/controls/seed<s>/<control>.* (evaluations on a run's weights).
An item's reward is its accuracy (right 1, wrong 0); `*_per_story` keys count per item (the names
of the relay's committed files). The relay's pre-registered analysis (studies/relay/analysis.py,
docs/preregistration/relay.md, "Analysis") and the team study's are built from these; the tests
themselves are studies/stats.py's, the numbers' text too.
"""

from __future__ import annotations

import json
import math
import statistics
from fractions import Fraction
from pathlib import Path

import numpy as np

from studies.items import read_condition
from studies.stats import bootstrap_ci, holm, interval, num, paired_t, pval, sign_test

# ---- a study's files ----------------------------------------------------------------------------


def load_study(results: Path, arms: list[str], controls: list[str]) -> dict:
    """Every per-item file under `results`: runs[arm][seed] = {status, steps: {n: (items, meta)}},
    controls[seed][name] = (items, meta)."""
    runs = {arm: {} for arm in arms}
    for arm in arms:
        for folder in sorted((results / arm).glob("seed*")):
            if folder.name.removeprefix("seed").isdigit():
                steps = {int(p.name.split(".")[0].removeprefix("step_")) for p in folder.glob("step_*.meta.json")}
                status = folder / "status.json"
                runs[arm][int(folder.name[4:])] = {
                    "status": json.loads(status.read_text()) if status.exists() else None,
                    "steps": {n: read_condition(folder, f"step_{n}") for n in sorted(steps)},
                }
    found = {}
    for folder in sorted((results / "controls").glob("seed*")):
        got = {name: read_condition(folder, name) for name in controls}
        found[int(folder.name[4:])] = {name: c for name, c in got.items() if c is not None}
    return {"runs": runs, "controls": found}


def final_items(run: dict) -> list[dict] | None:
    """The items of the run's last evaluation (step trainer.steps), None before it is written."""
    if not run["steps"]:
        return None
    last = max(run["steps"])
    return run["steps"][last][0] if last == run["steps"][last][1]["steps"] else None


def items_by_seed(data: dict, controls: list[str]) -> tuple[dict, dict]:
    """The runs' last evaluations, finals[arm][seed], and the controls' items, controls[name][seed]."""
    finals = {
        arm: {s: f for s, r in runs.items() if (f := final_items(r)) is not None} for arm, runs in data["runs"].items()
    }
    ctl = {name: {s: c[name][0] for s, c in data["controls"].items() if name in c} for name in controls}
    return finals, ctl


def seeds_state(data: dict, planned: tuple[int, ...], controls: list[str]) -> dict:
    """Which planned seeds are in (every arm's last evaluation and every control written), dropped
    (a run of theirs dropped by the driver's failure rule), or incomplete (what is missing)."""
    dropped, incomplete, seeds_in = [], {}, []
    for s in planned:
        runs = {arm: data["runs"][arm].get(s) for arm in data["runs"]}
        if any(r and r["status"] and r["status"]["state"] == "dropped" for r in runs.values()):
            dropped.append(s)
            continue
        missing = [arm for arm, r in runs.items() if r is None or final_items(r) is None]
        missing += [c for c in controls if c not in data["controls"].get(s, {})]
        if missing:
            incomplete[str(s)] = missing
        else:
            seeds_in.append(s)
    return {"planned": list(planned), "in": seeds_in, "dropped": dropped, "incomplete": incomplete}


# ---- statistics over conditions and seeds -------------------------------------------------------


def accuracy(recs: list[dict]) -> float:
    """The mean reward of the items."""
    return statistics.fmean(r["reward"] for r in recs)


def items_summary(recs: list[dict]) -> dict:
    """The items' accuracy (4 digits), mean generated tokens per item (2 digits), truncated count."""
    return {
        "accuracy": round(accuracy(recs), 4),
        "tokens_per_story": round(statistics.fmean(r["tokens"] for r in recs), 2),
        "truncated": sum(r["truncated"] for r in recs),
    }


def paired_contrast(
    base: dict[int, list[dict]], other: dict[int, list[dict]], seeds: list[int], resamples: int
) -> dict:
    """other - base over the seeds (the same items in both): each seed's difference and the mean
    in points, the paired t-test over seeds and the two-level bootstrap 95% CI (`resamples`)."""
    seeds = [s for s in seeds if s in base and s in other]
    if not seeds:
        return {"seeds": [], "mean_points": None, "t": None, "p": None, "ci_points": None}
    for s in seeds:
        assert [r["id"] for r in base[s]] == [r["id"] for r in other[s]], f"seed {s}: not the same stories"
    diffs = [
        sum(Fraction(o["reward"]) - Fraction(b["reward"]) for b, o in zip(base[s], other[s])) / len(base[s])
        for s in seeds
    ]
    mean = sum(diffs) / len(diffs)
    test = paired_t([float(d) for d in diffs]) if len(seeds) >= 2 else {"t": None, "p": None}
    lo, hi = bootstrap_ci(
        [[r["reward"] for r in base[s]] for s in seeds], [[r["reward"] for r in other[s]] for s in seeds], resamples
    )
    return {
        "seeds": seeds,
        "per_seed_points": {str(s): round(100 * float(d), 3) for s, d in zip(seeds, diffs)},
        "mean_points": round(100 * float(mean), 3),
        "mean_exact": str(mean),  # exact: a success rule compares this
        "t": test["t"] if test["t"] is None or math.isfinite(test["t"]) else str(test["t"]),
        "p": test["p"],
        "ci_points": [round(100 * lo, 3), round(100 * hi, 3)],
    }


def holm_family(contrasts: dict[str, dict]) -> dict[str, float]:
    """Holm over a family of paired_contrast results: each gets its `p_holm` (None while any p is);
    the adjusted p-values by name ({} then)."""
    raw = {name: con["p"] for name, con in contrasts.items()}
    adjusted = holm(raw) if None not in raw.values() else {}
    for name, con in contrasts.items():
        con["p_holm"] = adjusted.get(name)
    return adjusted


def sign_tests_by_seed(base: dict[int, list[dict]], other: dict[int, list[dict]], seeds: list[int]) -> dict:
    """Per seed, run vs run: the exact sign test of base's items against other's."""
    return {str(s): sign_test(base[s], other[s]) for s in seeds}


def contrast_family(pairs: dict[str, tuple[dict, dict]], seeds: list[int], resamples: int) -> dict:
    """A table's family of paired contrasts, name -> (base, other) items by seed: each other - base over
    the seeds both have (paired_contrast; those with none left out), Holm over the family, and each
    with its per-seed sign tests (`run_vs_run`: two runs' items, not two arms), Holm-adjusted over all
    of the family's per-seed tests (`p_holm`)."""
    out = {name: paired_contrast(base, other, seeds, resamples) for name, (base, other) in pairs.items()}
    out = {name: c for name, c in out.items() if c["seeds"]}
    holm_family(out)
    for name, c in out.items():
        c["run_vs_run"] = sign_tests_by_seed(*pairs[name], c["seeds"])
    adjusted = holm({f"{name}/{s}": t["p"] for name, c in out.items() for s, t in c["run_vs_run"].items()})
    for name, c in out.items():
        for s, t in c["run_vs_run"].items():
            t["p_holm"] = adjusted[f"{name}/{s}"]
    return out


def token_matched_k(other: list[dict], single: list[dict]) -> tuple[int, float, float]:
    """The samples k of a single agent's vote that spend about the generated tokens per item of
    `other`: k = max(1, round(T_other / T_single)) (a half rounds up), T the mean `tokens` of each's
    items; (k, T_other, T_single). The relay's vote_k is the same rule."""
    t_other, t_single = (statistics.fmean(r["tokens"] for r in recs) for recs in (other, single))
    if t_single == 0:
        raise ValueError("the single agent's items generated no tokens: k = T_other / T_single is undefined")
    return max(1, math.floor(t_other / t_single + 0.5)), t_other, t_single


def mean_ci(per_seed: list[list[float]], resamples: int, seed: int = 0) -> list[float] | None:
    """95% two-level bootstrap CI of the mean over seeds of each seed's mean, for values not paired
    across conditions (an accuracy, a share of calls right): resample seeds, then within each drawn
    seed its values. Seeds without values are left out."""
    groups = [np.asarray(g, dtype=float) for g in per_seed if len(g)]
    if not groups:
        return None
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(groups), size=(resamples, len(groups)))  # (resamples, seeds)
    means = np.empty(picks.shape)
    for j, g in enumerate(groups):  # every draw of seed j resamples its values anew
        where, n = picks == j, len(g)
        if np.isin(g, (0.0, 1.0)).all():  # right / wrong: a resample's mean is Binomial(n, mean) / n
            means[where] = rng.binomial(n, g.mean(), size=int(where.sum())) / n
        else:
            means[where] = g[rng.integers(0, n, size=(int(where.sum()), n))].mean(axis=1)
    stats = means.mean(axis=1)
    return [round(float(np.percentile(stats, 2.5)), 4), round(float(np.percentile(stats, 97.5)), 4)]


# ---- what is reported regardless of outcome -----------------------------------------------------


def run_rows(data: dict) -> list[dict]:
    """Every arm x seed of load_study's `data`: accuracy, tokens and truncations at each evaluation,
    the training it took, and its attempts (the driver's record)."""
    rows = []
    for arm, runs in data["runs"].items():
        for s, run in sorted(runs.items()):
            status = run["status"] or {}
            last = run["steps"][max(run["steps"])][1] if run["steps"] else {}
            at = {str(n): items_summary(items) for n, (items, _) in run["steps"].items()}
            rows.append(
                {
                    "arm": arm,
                    "seed": s,
                    "state": status.get("state"),
                    "accuracy": {n: x["accuracy"] for n, x in at.items()},
                    "eval_tokens_per_story": {n: x["tokens_per_story"] for n, x in at.items()},
                    "eval_truncated": {n: x["truncated"] for n, x in at.items()},
                    **{k: last.get(k) for k in ("generated_tokens", "trained_tokens", "rollout_truncated")},
                    "train_wall_s": last.get("wall_s"),  # the training steps' own
                    "wall_s": status.get("wall_s"),  # every attempt, start-ups and evaluations too
                    "attempts": [
                        {k: a[k] for k in ("n", "phase", "kind", "outcome", "wall_s")}
                        for a in status.get("attempts", [])
                    ],
                }
            )
    return rows


def step_table(data: dict, seeds: list[int], resamples: int) -> dict:
    """Per arm and evaluation step, over `seeds`: accuracy (mean, CI), and the generated and
    trained tokens and training wall time that led there."""
    out = {}
    for arm, runs in data["runs"].items():
        steps = sorted({n for s in seeds if s in runs for n in runs[s]["steps"]})
        out[arm] = {}
        for n in steps:
            got = [runs[s]["steps"][n] for s in seeds if s in runs and n in runs[s]["steps"]]
            out[arm][str(n)] = {
                "seeds": len(got),
                "accuracy": round(statistics.fmean(accuracy(items) for items, _ in got), 4),
                "ci": mean_ci([[r["reward"] for r in items] for items, _ in got], resamples),
                "eval_tokens_per_story": round(statistics.fmean(r["tokens"] for items, _ in got for r in items), 2),
                **{
                    k: round(statistics.fmean(m[k] for _, m in got), 1)
                    for k in ("generated_tokens", "trained_tokens", "wall_s")
                },
            }
    return out


def control_rows(data: dict, meta_keys: tuple[str, ...]) -> dict:
    """Per seed, each control's items_summary and the `meta_keys` its meta file has."""
    return {
        str(s): {
            name: items_summary(items) | {k: meta[k] for k in meta_keys if k in meta}
            for name, (items, meta) in found.items()
        }
        for s, found in sorted(data["controls"].items())
    }


# ---- as markdown --------------------------------------------------------------------------------


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table's lines, and a blank one after it."""
    return [f"| {' | '.join(header)} |", "|" + "---|" * len(header), *(f"| {' | '.join(r)} |" for r in rows), ""]


CONTRAST_HEAD = ["contrast", "seeds", "mean (points)", "95% CI (two-level bootstrap)", "t", "p", "Holm p"]


def contrast_rows(contrasts: dict) -> list[list[str]]:
    """One row per paired_contrast (its name's `_vs_` as ` - `), under CONTRAST_HEAD."""
    return [
        [name.replace("_vs_", " - "), str(len(c["seeds"])), num(c["mean_points"])]
        + [interval(c["ci_points"]), num(c["t"] if isinstance(c["t"], float) else None, 2), pval(c["p"])]
        + [pval(c.get("p_holm"))]
        for name, c in contrasts.items()
    ]


STEP_HEAD = ["arm", "step", "seeds", "accuracy [CI]", "eval tokens / story", "generated tokens", "trained tokens"]
STEP_HEAD += ["training wall"]


def step_rows(arms: dict) -> list[list[str]]:
    """step_table's rows, under STEP_HEAD."""
    return [
        [arm, n, str(x["seeds"]), f"{num(x['accuracy'], 3)} {interval(x['ci'], 3)}", num(x["eval_tokens_per_story"])]
        + [f"{x['generated_tokens']:,.0f}", f"{x['trained_tokens']:,.0f}", f"{x['wall_s'] / 60:.1f} min"]
        for arm, steps in arms.items()
        for n, x in steps.items()
    ]


RUN_HEAD = ["arm", "seed", "state", "accuracy by step", "generated / trained tokens"]
RUN_HEAD += ["truncated: rollouts; last eval", "wall", "attempts"]


def run_table_rows(runs: list[dict]) -> list[list[str]]:
    """run_rows as rows under RUN_HEAD."""
    return [
        [r["arm"], str(r["seed"]), str(r["state"]), ", ".join(f"{n}: {x:.3f}" for n, x in r["accuracy"].items())]
        + [f"{r['generated_tokens'] or 0:,} / {r['trained_tokens'] or 0:,}"]
        + [f"{r['rollout_truncated']}; {list(r['eval_truncated'].values())[-1] if r['eval_truncated'] else '-'}"]
        + [f"{(r['wall_s'] or 0) / 60:.1f} min", "; ".join(f"{x['kind']} {x['outcome']}" for x in r["attempts"])]
        for r in runs
    ]
