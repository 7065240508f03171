"""The relay's pre-registered analysis (docs/preregistration/relay.md, "Analysis"), from the
per-item files alone: the three contrasts and the success criterion, the positive control, the
verdict, the secondary contrasts, each role's sub-task accuracy and addendum 3's sensitivity check.
Its markdown is studies/relay/report.py; docs/results.md's relay_analysis table is this analysis
(studies/results_check.py)."""

from __future__ import annotations

import statistics
from fractions import Fraction
from pathlib import Path

from studies.contrasts import (
    control_rows,
    final_items,
    holm_family,
    items_by_seed,
    load_study,
    mean_ci,
    paired_contrast,
    run_rows,
    seeds_state,
    sign_tests_by_seed,
    step_table,
)
from studies.items import read_items
from studies.relay.controls import CONTROL_META, CONTROLS
from studies.relay.runs import ARMS, SEEDS
from studies.stats import sign_test
from studies.study import ROOT

# the analysis (docs/preregistration/relay.md, "Analysis")
PILOT = ROOT / "docs" / "results" / "relay_pilot" / "ops1"
LOST = "weights_lost"  # first runs rerun from scratch after their weights were lost (addendum 3)
ALPHA = 0.05
SUCCESS_EFFECT = Fraction(5, 100)  # mean(C - A) of at least 5 points
CALCULATOR_CEILING = 0.98  # the positive control's exemption: C's calculator right on >= 98% of its calls
RESAMPLES = 10000  # the bootstrap's, with generator seed 0 (bootstrap_ci)


def role_values(recs: list[dict]) -> dict[str, list[float]]:
    """The relay's sub-tasks: the reader's expression right per story (a failed trace: its miss),
    the calculator's calls right; {} for a single agent's items."""
    if not any("expression" in r for r in recs):
        return {}
    out = {"reader": [r.get("roles", {}).get("reader", 0.0) for r in recs]}
    calls = [float(c) for r in recs for c in r.get("calculator_right", [])]
    return out | ({"calculator": calls} if calls else {})


def roles(by_seed: dict[int, list[dict]]) -> dict:
    """Each role's sub-task accuracy per seed, its mean over seeds and the CI."""
    values = {s: role_values(recs) for s, recs in by_seed.items()}
    out = {}
    for role in ("reader", "calculator"):
        per = {s: v[role] for s, v in values.items() if v.get(role)}
        if per:
            out[role] = {
                "per_seed": {str(s): round(statistics.fmean(v), 4) for s, v in per.items()},
                "calls": sum(len(v) for v in per.values()),
                "mean": round(statistics.fmean(statistics.fmean(v) for v in per.values()), 4),
                "ci": mean_ci(list(per.values()), RESAMPLES),
            }
    return out


def positive_control(finals: dict, oracle: dict, seeds: list[int], pilot: Path) -> dict:
    """(i) the pilot: the untrained oracle team above the untrained team on the items (exact sign
    test); (ii) oracle-C above C over seeds (paired t), unless C's calculator is right on >= 98% of
    its calls in every seed. Detected: (i) and (ii) or its exemption."""
    one = sign_test(*(read_items(pilot / f"{c}.items.jsonl.gz") for c in ("team", "oracle")))
    one["pass"] = one["better"] > one["worse"] and one["p"] < ALPHA
    two = paired_contrast(finals["team_lora"], oracle, seeds, RESAMPLES)
    two["pass"] = two["p"] is not None and two["mean_points"] > 0 and two["p"] < ALPHA
    calls = {s: role_values(finals["team_lora"][s]).get("calculator", []) for s in seeds}
    share = {str(s): round(statistics.fmean(c), 4) if c else None for s, c in calls.items()}
    ceiling = bool(seeds) and all(c and statistics.fmean(c) >= CALCULATOR_CEILING for c in calls.values())
    return {
        "pilot_oracle_vs_team": one,
        "oracle_minus_c": two,
        "calculator_right": share,
        "calculator_at_ceiling": ceiling,
        "detected": one["pass"] and (two["pass"] or ceiling),
    }


def verdict(seeds: dict, primary: dict, holm_p: dict, positive: dict) -> dict:
    """The success criterion and the verdict, pending until every planned seed is in or dropped."""
    c_a, c_vote = primary["C_vs_A"], primary["C_vs_vote"]
    success = (
        holm_p.get("C_vs_A") is not None
        and Fraction(c_a["mean_exact"]) >= SUCCESS_EFFECT
        and holm_p["C_vs_A"] < ALPHA
        and Fraction(c_vote["mean_exact"]) > 0
        and holm_p["C_vs_vote"] < ALPHA
    )
    n, planned = len(seeds["in"]), len(seeds["planned"])
    if n + len(seeds["dropped"]) < planned:
        text = f"pending: {n} of {planned} seeds in; the verdict waits for every seed (or its failure rule)"
    elif n < 2:
        text = f"no test: {n} seed(s) left after the failure rule"
    elif not positive["detected"]:
        text = "the pipeline is insensitive (positive control not detected): the primary result is not interpreted"
    elif success:
        text = "success: C beats A by >= 5 points and the token-matched vote (Holm-adjusted p < 0.05)"
    else:
        text = "no detectable team advantage at this resolution"
    reading = None
    if success and holm_p.get("C_vs_transplant") is not None:
        p, m = holm_p["C_vs_transplant"], primary["C_vs_transplant"]["mean_points"]
        reading = (
            "training in the team adds to the harness (C - transplant significantly positive)"
            if p < ALPHA and m > 0
            else "C below the transplant (significant; no pre-registered reading)"
            if p < ALPHA
            else "the gain is the relay harness's at inference, not training in the team (C - transplant n.s.)"
        )
    return {"success": success, "final": n + len(seeds["dropped"]) >= planned, "text": text, "transplant": reading}


def analyze(results: Path, planned: tuple[int, ...] = SEEDS, pilot: Path = PILOT) -> dict:
    """Every number the pre-registration's analysis names, from the per-item files alone."""
    data = load_study(results, list(ARMS.values()), list(CONTROLS))
    seeds = seeds_state(data, planned, list(CONTROLS))
    s_in = seeds["in"]
    finals, ctl = items_by_seed(data, list(CONTROLS))
    c = finals["team_lora"]
    primary = {
        "C_vs_A": paired_contrast(finals["single_agent"], c, s_in, RESAMPLES),
        "C_vs_vote": paired_contrast(ctl["vote"], c, s_in, RESAMPLES),
        "C_vs_transplant": paired_contrast(ctl["transplant"], c, s_in, RESAMPLES),
    }
    holm_p = holm_family(primary)
    positive = positive_control(finals, ctl["oracle"], s_in, pilot)
    role_conditions = {  # the team arms before and after (each evaluation), the controls that hold roles
        f"{arm} step {n}": {s: runs[s]["steps"][n][0] for s in s_in if n in runs[s]["steps"]}
        for arm, runs in ((a, data["runs"][a]) for a in ("team_shared", "team_lora"))
        for n in sorted({n for s in s_in for n in runs[s]["steps"]})
    } | {name: {s: ctl[name][s] for s in s_in} for name in ("transplant", "swap", "oracle")}
    return {
        "seeds": seeds,
        "verdict": verdict(seeds, primary, holm_p, positive),
        "primary": primary,
        "positive_control": positive,
        "secondary": {
            "C_vs_B": paired_contrast(finals["team_shared"], c, s_in, RESAMPLES),
            "swap_vs_C": paired_contrast(c, ctl["swap"], s_in, RESAMPLES),
            "transplant_vs_A": paired_contrast(finals["single_agent"], ctl["transplant"], s_in, RESAMPLES),
            "oracle_vs_C": positive["oracle_minus_c"],
            "run_vs_run_C_vs_A": sign_tests_by_seed(finals["single_agent"], c, s_in),
            "roles": {name: r for name, recs in role_conditions.items() if (r := roles(recs))},
        },
        "sensitivity": first_runs(results, finals, s_in),
        "arms": step_table(data, s_in, RESAMPLES),
        "runs": run_rows(data),
        "controls": control_rows(data, CONTROL_META),
    }


def first_runs(results: Path, finals: dict, seeds: list[int]) -> dict | None:
    """Addendum 3's sensitivity check: C - A with the first runs whose weights were lost
    (`weights_lost/<arm>/seed<s>/`) in place of their reruns, over the seeds in; None where no
    seed in has one."""
    lost = load_study(results / LOST, list(ARMS.values()), [])["runs"]
    swapped = {
        arm: {s: items for s, run in runs.items() if s in seeds and (items := final_items(run))}
        for arm, runs in lost.items()
    }
    if not any(swapped.values()):
        return None
    with_first = {arm: finals[arm] | swapped[arm] for arm in ("single_agent", "team_lora")}
    return {
        "first_runs": {arm: sorted(by_seed) for arm, by_seed in swapped.items() if by_seed},
        "C_vs_A": paired_contrast(with_first["single_agent"], with_first["team_lora"], seeds, RESAMPLES),
    }
