"""The team study's analysis, from the per-item files alone: each team arm against the single
agent, its token-matched vote and the transplant; the secondary contrasts; each arm's training;
every team evaluation in short."""

from __future__ import annotations

import json
from pathlib import Path

from studies.contrasts import contrast_family, items_by_seed, load_study
from studies.team.arms import ARMS, RESAMPLES, SECONDARY, SINGLE, TRANSPLANT
from studies.team.records import team_stats


def condition(name: str, finals: dict, ctl: dict) -> dict[int, list[dict]]:
    """A condition's items by seed: an arm's last evaluation, or `controls/<name>`."""
    return ctl.get(name.removeprefix("controls/"), {}) if name.startswith("controls/") else finals.get(name, {})


def vote_of(arm: str, matched: dict, finals: dict, ctl: dict) -> dict[int, list[dict]]:
    """The vote each seed matched to `arm`'s tokens (matched_votes.json), by seed."""
    return {
        s: items
        for s, m in matched.items()
        if arm in m and (items := condition(m[arm]["condition"], finals, ctl).get(s)) is not None
    }


def analyze(results: Path, arms: list[str], seeds: list[int]) -> dict:
    """Every contrast and summary of the study, from the per-item files under `results` alone."""
    names = sorted({p.name.split(".")[0] for p in results.glob("controls/seed*/*.meta.json")})
    data = load_study(results, arms, names)
    finals, ctl = items_by_seed(data, names)
    firsts = {
        a: {s: r["steps"][min(r["steps"])][0] for s, r in runs.items() if r["steps"]}
        for a, runs in data["runs"].items()
    }
    matched = {
        s: json.loads(p.read_text())
        for s in seeds
        if (p := results / "controls" / f"seed{s}" / "matched_votes.json").exists()
    }
    team = [a for a in arms if ARMS[a].team]
    versus = {}
    for arm in team:
        versus[f"{arm}_vs_single_agent"] = (finals.get(SINGLE, {}), finals[arm])
        versus[f"{arm}_vs_vote"] = (vote_of(arm, matched, finals, ctl), finals[arm])
        versus[f"{arm}_vs_transplant"] = (ctl.get(TRANSPLANT, {}), finals[arm])
    secondary = {
        name: (condition(base, finals, ctl), condition(other, finals, ctl)) for name, (base, other) in SECONDARY.items()
    }
    learned = [a for a in arms if ARMS[a].question != "selfplay"]
    return {
        "seeds": seeds,
        "team_vs_controls": contrast_family(versus, seeds, RESAMPLES),
        "secondary": contrast_family(secondary, seeds, RESAMPLES),
        "training": contrast_family(
            {f"{a}_after_vs_before": (firsts[a], finals[a]) for a in learned}, seeds, RESAMPLES
        ),
        # the untrained models are the same in every seed and team arm (greedy; LoRA adapters start at zero):
        # one pair of evaluations, the first seed's
        "harness_untrained": contrast_family(
            {"untrained_team_vs_untrained_single_agent": (firsts.get(SINGLE, {}), firsts[team[0]] if team else {})},
            seeds[:1],
            RESAMPLES,
        ),
        "team_evals": team_evals(data, ctl),
        "matched_votes": {str(s): m for s, m in matched.items()},
    }


def team_evals(data: dict, ctl: dict) -> list[dict]:
    """team_stats of every team evaluation: each run's at each step, then each control of a team."""
    out = []
    for arm, runs in data["runs"].items():
        for s, run in sorted(runs.items()):
            for n, (items, _) in run["steps"].items():
                if (stats := team_stats(items)) is not None:
                    out.append({"condition": arm, "seed": s, "step": n, **stats})
    for name, by_seed in ctl.items():
        for s, items in sorted(by_seed.items()):
            if (stats := team_stats(items)) is not None:
                out.append({"condition": name, "seed": s, "step": None, **stats})
    return out
