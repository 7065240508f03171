"""The relay's analysis as markdown (RESULTS/analysis.md): the seeds and the verdict, the
pre-registered tests, the secondaries, and everything reported regardless of outcome."""

from __future__ import annotations

from studies.contrasts import CONTRAST_HEAD, RUN_HEAD, STEP_HEAD, contrast_rows, run_table_rows, step_rows, table
from studies.relay.controls import CONTROLS
from studies.stats import interval, num, pval


def share(role: dict | None, calls: bool = False) -> str:
    """A role's sub-task accuracy: mean [CI] (and its calls)."""
    if role is None:
        return "-"
    return f"{num(role['mean'], 3)} {interval(role['ci'], 3)}" + (f" ({role['calls']})" if calls else "")


def markdown(a: dict) -> str:
    """analysis.md: the seeds and the verdict, the pre-registered tests, the secondaries, and
    everything reported regardless of outcome."""
    out = [
        "# The relay experiment: the pre-registered analysis",
        "",
        "Written by `python -m studies.relay analyze` from the per-item files beside it "
        "(docs/preregistration/relay.md, section Analysis). Accuracy: the trace reward on the held-out "
        "stories at the last step; differences in points.",
        "",
    ]
    return "\n".join(out + headline_md(a) + secondary_md(a["secondary"]) + reported_md(a))


def headline_md(a: dict) -> list[str]:
    """The seeds, the verdict, the pre-registered contrasts, the success criterion, the positive
    control and addendum 3's sensitivity check (docs/results.md's checked relay_analysis table too)."""
    seeds, v = a["seeds"], a["verdict"]
    listed = lambda xs: ", ".join(map(str, xs)) or "none"  # noqa: E731
    missing = ", ".join(f"{s} ({', '.join(m)})" for s, m in seeds["incomplete"].items()) or "none"
    return [
        f"**Seeds in: {len(seeds['in'])} of {len(seeds['planned'])}** ({listed(seeds['in'])}); dropped by the "
        f"failure rule: {listed(seeds['dropped'])}; incomplete: {missing}.",
        "",
        f"**Verdict: {v['text']}.**" + ("" if v["final"] else " Every number below is provisional."),
        "",
        "Pre-registered contrasts (paired t over seeds, Holm over the three):",
        "",
        *table(CONTRAST_HEAD, contrast_rows(a["primary"])),
        "Success criterion (mean(C - A) >= 5 points with Holm p < 0.05, and mean(C - vote) > 0 with Holm p "
        f"< 0.05): {'met' if v['success'] else 'not met'}."
        + (f" C vs the transplant: {v['transplant']}." if v["transplant"] else ""),
        "",
        positive_line(a["positive_control"]),
        "",
        *sensitivity_md(a["sensitivity"]),
    ]


def positive_line(pc: dict) -> str:
    one, two = pc["pilot_oracle_vs_team"], pc["oracle_minus_c"]
    calls = ", ".join(f"seed {s}: {num(x, 3)}" for s, x in pc["calculator_right"].items()) or "-"
    return (
        f"Positive control: (i) the pilot's untrained oracle team vs team: {one['better']} / {one['worse']}, "
        f"p = {pval(one['p'])} ({'passes' if one['pass'] else 'fails'}); (ii) oracle-C - C: "
        f"{num(two['mean_points'])} points, p = {pval(two['p'])} ({'passes' if two['pass'] else 'fails'}); "
        f"C's calculator's calls right: {calls} ({'at' if pc['calculator_at_ceiling'] else 'below'} the 98% "
        f"ceiling). **{'Detected' if pc['detected'] else 'Not detected'}.**"
    )


def sensitivity_md(sens: dict | None) -> list[str]:
    if sens is None:
        return []
    which = "; ".join(f"{arm} seed {', '.join(map(str, seeds))}" for arm, seeds in sens["first_runs"].items())
    return [
        f"Sensitivity check (addendum 3, not a test): C - A with the first runs whose weights were lost ({which}) "
        "in place of their reruns:",
        "",
        *table(CONTRAST_HEAD, contrast_rows({"C_vs_A (first runs)": sens["C_vs_A"]})),
    ]


SECONDARY = ("C_vs_B", "swap_vs_C", "transplant_vs_A", "oracle_vs_C")  # the secondary contrasts' table


def secondary_md(sec: dict) -> list[str]:
    mcnemar = [[s, f"{t['better']} / {t['worse']}", pval(t["p"])] for s, t in sec["run_vs_run_C_vs_A"].items()]
    role_rows = [[name, share(r.get("reader")), share(r.get("calculator"), True)] for name, r in sec["roles"].items()]
    return [
        "Secondary (CIs only, no claims):",
        "",
        *table(CONTRAST_HEAD, contrast_rows({k: sec[k] for k in SECONDARY})),
        "Per-seed exact McNemar tests, C vs A (run vs run):",
        "",
        *table(["seed", "better / worse", "p"], mcnemar),
        "Each role's sub-task accuracy (reader: expression right per story; calculator: calls right):",
        "",
        *table(["condition", "reader [CI]", "calculator [CI] (calls)"], role_rows),
    ]


def reported_md(a: dict) -> list[str]:
    """Each arm by step over the seeds in; every run and every control (reported regardless)."""
    vote = lambda v: f"{v['k']} ({num(v['tokens_team_lora'])} / {num(v['tokens_single_agent'])})"  # noqa: E731
    controls = [
        [s, *(f"{num(c[n]['accuracy'], 3)}; {num(c[n]['tokens_per_story'])}" if n in c else "-" for n in CONTROLS)]
        + [vote(c["vote"]) if "vote" in c else "-"]
        for s, c in a["controls"].items()
    ]
    return [
        "Each arm over the seeds in, at each evaluation (tokens and training wall time up to that step):",
        "",
        *table(STEP_HEAD, step_rows(a["arms"])),
        "Every run (all attempts' wall time; the failure rule's record):",
        "",
        *table(RUN_HEAD, run_table_rows(a["runs"])),
        "Controls (accuracy; tokens per story):",
        "",
        *table(["seed", *CONTROLS, "vote's k_s (T_C / T_A)"], controls),
    ]
