"""The relay experiment's pre-registered analysis (docs/preregistration/relay.md, "Analysis") on its
per-item files: what scripts/relay_runs.py writes and its `analyze` command reads.

    python scripts/relay_runs.py analyze          # docs/results/relay/analysis.{json,md}

The files (the format of docs/results/relay_pilot/): RESULTS/<arm>/seed<s>/step_<N>.items.jsonl.gz
and .meta.json per evaluation of a run (arm single_agent, team_shared or team_lora; N = 0, 10, 20,
30), its status.json (the failure rule's record), and RESULTS/controls/seed<s>/<control>.items.jsonl.gz
and .meta.json (transplant, swap, vote, oracle). A seed is in when every arm's last evaluation and
every control are written; the contrasts are over the seeds in, and the verdict is pending until
every planned seed is in or dropped. The tests live on scripts/relay.py's functions (paired_t,
bootstrap_ci, holm, sign_test), frozen by the pre-registration.
"""

from __future__ import annotations

import json
import math
import statistics
from fractions import Fraction
from pathlib import Path

import numpy as np

try:
    from scripts import relay
except ModuleNotFoundError:  # `python scripts/relay_runs.py`: scripts/ is on sys.path, the repository root is not
    import relay

ARMS = {"A": "single_agent", "B": "team_shared", "C": "team_lora"}
CONTROLS = ("transplant", "swap", "vote", "oracle")  # controls 2-5
SEEDS = tuple(range(1, 9))
PILOT = relay.ROOT / "docs" / "results" / "relay_pilot" / "ops1"
ALPHA = 0.05
SUCCESS_EFFECT = Fraction(5, 100)  # mean(C - A) of at least 5 points
CALCULATOR_CEILING = 0.98  # the positive control's exemption: C's calculator right on >= 98% of its calls
RESAMPLES = 10000  # the bootstrap's, with generator seed 0 (relay.bootstrap_ci)


def read_condition(folder: Path, name: str) -> tuple[list[dict], dict] | None:
    if not (folder / f"{name}.meta.json").exists():
        return None
    return relay.read_items(folder / f"{name}.items.jsonl.gz"), json.loads((folder / f"{name}.meta.json").read_text())


# ---- the analysis (docs/preregistration/relay.md, "Analysis") ---------------------------------


def load(results: Path) -> dict:
    """Every per-item file under `results`: runs[arm][seed] = {status, steps: {n: (items, meta)}},
    controls[seed][name] = (items, meta)."""
    runs = {arm: {} for arm in ARMS.values()}
    for arm in ARMS.values():
        for folder in sorted((results / arm).glob("seed*")):
            if folder.name.removeprefix("seed").isdigit():
                steps = {int(p.name.split(".")[0].removeprefix("step_")) for p in folder.glob("step_*.meta.json")}
                status = folder / "status.json"
                runs[arm][int(folder.name[4:])] = {
                    "status": json.loads(status.read_text()) if status.exists() else None,
                    "steps": {n: read_condition(folder, f"step_{n}") for n in sorted(steps)},
                }
    controls = {}
    for folder in sorted((results / "controls").glob("seed*")):
        found = {name: read_condition(folder, name) for name in CONTROLS}
        controls[int(folder.name[4:])] = {name: c for name, c in found.items() if c is not None}
    return {"runs": runs, "controls": controls}


def final(run: dict) -> list[dict] | None:
    """The items of the run's last evaluation (step trainer.steps), None before it is written."""
    if not run["steps"]:
        return None
    last = max(run["steps"])
    return run["steps"][last][0] if last == run["steps"][last][1]["steps"] else None


def acc(recs: list[dict]) -> float:
    return statistics.fmean(r["reward"] for r in recs)


def contrast(base: dict[int, list[dict]], other: dict[int, list[dict]], seeds: list[int]) -> dict:
    """other - base over the seeds (the same stories in both): each seed's difference and the mean
    in points, the paired t-test over seeds and the two-level bootstrap 95% CI (scripts/relay.py)."""
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
    test = relay.paired_t([float(d) for d in diffs]) if len(seeds) >= 2 else {"t": None, "p": None}
    lo, hi = relay.bootstrap_ci(
        [[r["reward"] for r in base[s]] for s in seeds], [[r["reward"] for r in other[s]] for s in seeds], RESAMPLES
    )
    return {
        "seeds": seeds,
        "per_seed_points": {str(s): round(100 * float(d), 3) for s, d in zip(seeds, diffs)},
        "mean_points": round(100 * float(mean), 3),
        "mean_exact": str(mean),  # the success rule compares this exactly
        "t": test["t"] if test["t"] is None or math.isfinite(test["t"]) else str(test["t"]),
        "p": test["p"],
        "ci_points": [round(100 * lo, 3), round(100 * hi, 3)],
    }


def mean_ci(per_seed: list[list[float]], seed: int = 0) -> list[float] | None:
    """95% two-level bootstrap CI of the mean over seeds of each seed's mean, for values not paired
    across conditions (an accuracy, the calculator's calls): resample seeds, then within each drawn
    seed its values. Seeds without values are left out."""
    groups = [np.asarray(g, dtype=float) for g in per_seed if len(g)]
    if not groups:
        return None
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(groups), size=(RESAMPLES, len(groups)))  # (resamples, seeds)
    means = np.empty(picks.shape)
    for j, g in enumerate(groups):  # every draw of seed j resamples its values anew
        where, n = picks == j, len(g)
        if np.isin(g, (0.0, 1.0)).all():  # right / wrong: a resample's mean is Binomial(n, mean) / n
            means[where] = rng.binomial(n, g.mean(), size=int(where.sum())) / n
        else:
            means[where] = g[rng.integers(0, n, size=(int(where.sum()), n))].mean(axis=1)
    stats = means.mean(axis=1)
    return [round(float(np.percentile(stats, 2.5)), 4), round(float(np.percentile(stats, 97.5)), 4)]


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
                "ci": mean_ci(list(per.values())),
            }
    return out


def seeds_state(data: dict, planned: tuple[int, ...]) -> dict:
    """Which planned seeds are in (every arm's last evaluation and every control written), dropped
    (the failure rule), or incomplete (what is missing)."""
    dropped, incomplete, seeds_in = [], {}, []
    for s in planned:
        runs = {arm: data["runs"][arm].get(s) for arm in ARMS.values()}
        if any(r and r["status"] and r["status"]["state"] == "dropped" for r in runs.values()):
            dropped.append(s)
            continue
        missing = [arm for arm, r in runs.items() if r is None or final(r) is None]
        missing += [c for c in CONTROLS if c not in data["controls"].get(s, {})]
        if missing:
            incomplete[str(s)] = missing
        else:
            seeds_in.append(s)
    return {"planned": list(planned), "in": seeds_in, "dropped": dropped, "incomplete": incomplete}


def positive_control(finals: dict, oracle: dict, seeds: list[int], pilot: Path) -> dict:
    """(i) the pilot: the untrained oracle team above the untrained team on the items (exact sign
    test); (ii) oracle-C above C over seeds (paired t), unless C's calculator is right on >= 98% of
    its calls in every seed. Detected: (i) and (ii) or its exemption."""
    one = relay.sign_test(*(relay.read_items(pilot / f"{c}.items.jsonl.gz") for c in ("team", "oracle")))
    one["pass"] = one["better"] > one["worse"] and one["p"] < ALPHA
    two = contrast(finals["team_lora"], oracle, seeds)
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


def by_seed(data: dict) -> tuple[dict, dict]:
    """The runs' last evaluations, finals[arm][seed], and the controls' items, controls[name][seed]."""
    finals = {arm: {s: f for s, r in data["runs"][arm].items() if (f := final(r)) is not None} for arm in ARMS.values()}
    ctl = {name: {s: c[name][0] for s, c in data["controls"].items() if name in c} for name in CONTROLS}
    return finals, ctl


def run_rows(data: dict) -> list[dict]:
    """Every arm x seed written so far: accuracy, tokens and truncations at each evaluation, the
    training it took, and its attempts (the failure rule's record)."""
    rows = []
    for arm, runs in data["runs"].items():
        for s, run in sorted(runs.items()):
            attempts = (run["status"] or {}).get("attempts", [])
            last = run["steps"][max(run["steps"])][1] if run["steps"] else {}
            rows.append(
                {
                    "arm": arm,
                    "seed": s,
                    "state": (run["status"] or {}).get("state"),
                    "accuracy": {str(n): round(acc(items), 4) for n, (items, _) in run["steps"].items()},
                    "eval_tokens_per_story": {
                        str(n): round(statistics.fmean(r["tokens"] for r in items), 2)
                        for n, (items, _) in run["steps"].items()
                    },
                    "eval_truncated": {
                        str(n): sum(r["truncated"] for r in items) for n, (items, _) in run["steps"].items()
                    },
                    **{k: last.get(k) for k in ("generated_tokens", "trained_tokens", "rollout_truncated")},
                    "train_wall_s": last.get("wall_s"),  # the training steps' own
                    "wall_s": (run["status"] or {}).get("wall_s"),  # every attempt, start-ups and evaluations too
                    "attempts": [{k: a[k] for k in ("n", "phase", "kind", "outcome", "wall_s")} for a in attempts],
                }
            )
    return rows


def arm_table(data: dict, seeds: list[int]) -> dict:
    """Per arm and evaluation step, over the seeds in: accuracy (mean, CI), and the generated and
    trained tokens and training wall time that led there."""
    out = {}
    for arm, runs in data["runs"].items():
        steps = sorted({n for s in seeds if s in runs for n in runs[s]["steps"]})
        out[arm] = {}
        for n in steps:
            got = [runs[s]["steps"][n] for s in seeds if s in runs and n in runs[s]["steps"]]
            out[arm][str(n)] = {
                "seeds": len(got),
                "accuracy": round(statistics.fmean(acc(items) for items, _ in got), 4),
                "ci": mean_ci([[r["reward"] for r in items] for items, _ in got]),
                "eval_tokens_per_story": round(statistics.fmean(r["tokens"] for items, _ in got for r in items), 2),
                **{
                    k: round(statistics.fmean(m[k] for _, m in got), 1)
                    for k in ("generated_tokens", "trained_tokens", "wall_s")
                },
            }
    return out


def control_rows(data: dict) -> dict:
    rows = {}
    for s, found in sorted(data["controls"].items()):
        rows[str(s)] = {
            name: {
                "accuracy": round(acc(items), 4),
                "tokens_per_story": round(statistics.fmean(r["tokens"] for r in items), 2),
                "truncated": sum(r["truncated"] for r in items),
                **{
                    k: meta[k]
                    for k in ("wall_s", "k", "k_rule", "tokens_team_lora", "tokens_single_agent", "source")
                    if k in meta
                },
            }
            for name, (items, meta) in found.items()
        }
    return rows


def analyze(results: Path, planned: tuple[int, ...] = SEEDS, pilot: Path = PILOT) -> dict:
    """Every number the pre-registration's analysis names, from the per-item files alone."""
    data = load(results)
    seeds = seeds_state(data, planned)
    s_in = seeds["in"]
    finals, ctl = by_seed(data)
    c = finals["team_lora"]
    primary = {
        "C_vs_A": contrast(finals["single_agent"], c, s_in),
        "C_vs_vote": contrast(ctl["vote"], c, s_in),
        "C_vs_transplant": contrast(ctl["transplant"], c, s_in),
    }
    raw = {name: con["p"] for name, con in primary.items()}
    holm_p = relay.holm(raw) if None not in raw.values() else {}
    for name, con in primary.items():
        con["p_holm"] = holm_p.get(name)
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
            "C_vs_B": contrast(finals["team_shared"], c, s_in),
            "swap_vs_C": contrast(c, ctl["swap"], s_in),
            "transplant_vs_A": contrast(finals["single_agent"], ctl["transplant"], s_in),
            "oracle_vs_C": positive["oracle_minus_c"],
            "run_vs_run_C_vs_A": {str(s): relay.sign_test(finals["single_agent"][s], c[s]) for s in s_in},
            "roles": {name: r for name, recs in role_conditions.items() if (r := roles(recs))},
        },
        "arms": arm_table(data, s_in),
        "runs": run_rows(data),
        "controls": control_rows(data),
    }


# ---- the analysis as markdown ---------------------------------------------------------------


def num(x, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def interval(c, digits: int = 1) -> str:
    return "-" if c is None else f"[{c[0]:.{digits}f}, {c[1]:.{digits}f}]"


def pval(p) -> str:
    return "-" if p is None else f"{p:.2g}"


def share(role: dict | None, calls: bool = False) -> str:
    """A role's sub-task accuracy: mean [CI] (and its calls)."""
    if role is None:
        return "-"
    return f"{num(role['mean'], 3)} {interval(role['ci'], 3)}" + (f" ({role['calls']})" if calls else "")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [f"| {' | '.join(header)} |", "|" + "---|" * len(header), *(f"| {' | '.join(r)} |" for r in rows), ""]


def contrast_rows(contrasts: dict) -> list[list[str]]:
    return [
        [name.replace("_vs_", " - "), str(len(c["seeds"])), num(c["mean_points"])]
        + [interval(c["ci_points"]), num(c["t"] if isinstance(c["t"], float) else None, 2), pval(c["p"])]
        + [pval(c.get("p_holm"))]
        for name, c in contrasts.items()
    ]


HEAD = ["contrast", "seeds", "mean (points)", "95% CI (two-level bootstrap)", "t", "p", "Holm p"]


def markdown(a: dict) -> str:
    """analysis.md: the seeds and the verdict, the pre-registered tests, the secondaries, and
    everything reported regardless of outcome."""
    seeds, v = a["seeds"], a["verdict"]
    listed = lambda xs: ", ".join(map(str, xs)) or "none"  # noqa: E731
    missing = ", ".join(f"{s} ({', '.join(m)})" for s, m in seeds["incomplete"].items()) or "none"
    out = [
        "# The relay experiment: the pre-registered analysis",
        "",
        "Written by `python scripts/relay_runs.py analyze` from the per-item files beside it "
        "(docs/preregistration/relay.md, section Analysis). Accuracy: the trace reward on the held-out "
        "stories at the last step; differences in points.",
        "",
        f"**Seeds in: {len(seeds['in'])} of {len(seeds['planned'])}** ({listed(seeds['in'])}); dropped by the "
        f"failure rule: {listed(seeds['dropped'])}; incomplete: {missing}.",
        "",
        f"**Verdict: {v['text']}.**" + ("" if v["final"] else " Every number below is provisional."),
        "",
        "Pre-registered contrasts (paired t over seeds, Holm over the three):",
        "",
        *table(HEAD, contrast_rows(a["primary"])),
        "Success criterion (mean(C - A) >= 5 points with Holm p < 0.05, and mean(C - vote) > 0 with Holm p "
        f"< 0.05): {'met' if v['success'] else 'not met'}."
        + (f" C vs the transplant: {v['transplant']}." if v["transplant"] else ""),
        "",
        positive_line(a["positive_control"]),
        "",
    ]
    return "\n".join(out + secondary_md(a["secondary"]) + reported_md(a))


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


def secondary_md(sec: dict) -> list[str]:
    mcnemar = [[s, f"{t['better']} / {t['worse']}", pval(t["p"])] for s, t in sec["run_vs_run_C_vs_A"].items()]
    role_rows = [[name, share(r.get("reader")), share(r.get("calculator"), True)] for name, r in sec["roles"].items()]
    return [
        "Secondary (CIs only, no claims):",
        "",
        *table(HEAD, contrast_rows({k: sec[k] for k in ("C_vs_B", "swap_vs_C", "transplant_vs_A", "oracle_vs_C")})),
        "Per-seed exact McNemar tests, C vs A (run vs run):",
        "",
        *table(["seed", "better / worse", "p"], mcnemar),
        "Each role's sub-task accuracy (reader: expression right per story; calculator: calls right):",
        "",
        *table(["condition", "reader [CI]", "calculator [CI] (calls)"], role_rows),
    ]


def reported_md(a: dict) -> list[str]:
    """Each arm by step over the seeds in; every run and every control (reported regardless)."""
    arms = [
        [arm, n, str(x["seeds"]), f"{num(x['accuracy'], 3)} {interval(x['ci'], 3)}", num(x["eval_tokens_per_story"])]
        + [f"{x['generated_tokens']:,.0f}", f"{x['trained_tokens']:,.0f}", f"{x['wall_s'] / 60:.1f} min"]
        for arm, steps in a["arms"].items()
        for n, x in steps.items()
    ]
    runs = [
        [r["arm"], str(r["seed"]), str(r["state"]), ", ".join(f"{n}: {x:.3f}" for n, x in r["accuracy"].items())]
        + [f"{r['generated_tokens'] or 0:,} / {r['trained_tokens'] or 0:,}"]
        + [f"{r['rollout_truncated']}; {list(r['eval_truncated'].values())[-1] if r['eval_truncated'] else '-'}"]
        + [f"{(r['wall_s'] or 0) / 60:.1f} min", "; ".join(f"{x['kind']} {x['outcome']}" for x in r["attempts"])]
        for r in a["runs"]
    ]
    vote = lambda v: f"{v['k']} ({num(v['tokens_team_lora'])} / {num(v['tokens_single_agent'])})"  # noqa: E731
    controls = [
        [s, *(f"{num(c[n]['accuracy'], 3)}; {num(c[n]['tokens_per_story'])}" if n in c else "-" for n in CONTROLS)]
        + [vote(c["vote"]) if "vote" in c else "-"]
        for s, c in a["controls"].items()
    ]
    step_head = ["arm", "step", "seeds", "accuracy [CI]", "eval tokens / story", "generated tokens", "trained tokens"]
    run_head = ["arm", "seed", "state", "accuracy by step", "generated / trained tokens"]
    run_head += ["truncated: rollouts; last eval", "wall", "attempts"]
    return [
        "Each arm over the seeds in, at each evaluation (tokens and training wall time up to that step):",
        "",
        *table([*step_head, "training wall"], arms),
        "Every run (all attempts' wall time; the failure rule's record):",
        "",
        *table(run_head, runs),
        "Controls (accuracy; tokens per story):",
        "",
        *table(["seed", *CONTROLS, "vote's k_s (T_C / T_A)"], controls),
    ]
