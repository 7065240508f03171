"""A finished team-study run read back (its summary, metrics, a game's outcomes and seats), and
the study's report: OUT/team_study.md's tables and OUT/curves.png."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import msgspec

from rollout.trace import Trace, read_jsonl
from studies.contrasts import CONTRAST_HEAD, contrast_rows, table as md_table
from studies.stats import holm, mean, num, pval, sign_line
from studies.team.arms import ARMS, Job
from trainer.metrics import paired_comparison

# ---- reading a finished run ------------------------------------------------------------


def eval_traces(run_dir: Path, which: str) -> list[Trace]:
    """The run's initial (`first`) or final (`last`) held-out traces."""
    steps = sorted((run_dir / "eval").glob("step_*.jsonl"), key=lambda p: int(p.stem.split("_")[1]))
    return list(read_jsonl(steps[0 if which == "first" else -1])) if steps else []


def with_reward(traces: list[Trace], reward) -> list[Trace]:
    """Copies of the traces whose reward is `reward(trace)` (None: the trace is left out)."""
    return [msgspec.structs.replace(t, reward=r) for t in traces if (r := reward(t)) is not None]


def role_reward(role: str):
    return lambda t: (t.agent_rewards or {}).get(role)


def forfeited(role: str):
    """1.0 when `role` lost a game by an illegal move (harnesses/programs/selfplay.py's info), 0.0 when it
    played and did not; None when it never moved."""
    return lambda t: (
        None
        if role not in (t.agent_rewards or {})
        else float(bool(t.info.get("forfeit")) and t.info.get("winner") != role)
    )


def game_stats(traces: list[Trace]) -> dict | None:
    """A game's traces in short (harnesses/programs/selfplay.py's info; None for other harnesses): how
    many, the share lost by an illegal move, moves per game, the share won by the seat that
    perfect play wins (`first_player_wins`; a game cut at max_moves counts as not), and the share
    played out one stone a move (moves == the starting pile: legal, but no strategy; its winner
    is the pile's parity)."""
    games = [t.info for t in traces if "forfeit" in t.info]
    if not games:
        return None
    return {
        "games": len(games),
        "forfeits": mean([float(bool(g["forfeit"])) for g in games]),
        "moves": mean([float(g["moves"]) for g in games]),
        "as_theory": mean(
            [float(g["winner"] is not None and (g["winner"] == "player_a") == g["first_player_wins"]) for g in games]
        ),
        "one_a_move": mean([float(not g["forfeit"] and g["moves"] == g["stones"]) for g in games]),
    }


def mean_of(traces: list[Trace], reward) -> float | None:
    """The mean of `reward(trace)` over the traces that have one (role_reward)."""
    return mean([t.reward for t in with_reward(traces, reward)])


def grad_spikes(norms: list[float], factor: float = 3.0) -> dict:
    """Max and median gradient norm over a run's steps, and the steps above `factor` x the median."""
    if not norms:
        return {"max": None, "median": None, "spikes": 0}
    med = statistics.median(norms)
    return {"max": round(max(norms), 4), "median": round(med, 4), "spikes": sum(n > factor * med for n in norms)}


def read_run(job: Job) -> dict:
    """One row of the runs' table: the run's summary and metrics, a game's outcomes and the seats."""
    summary = json.loads((job.dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (job.dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    first, last = eval_traces(job.dir, "first"), eval_traces(job.dir, "last")
    row = {
        "arm": job.arm.name,
        "seed": job.seed,
        "run_seed": job.run_seed,
        "before": summary["initial_eval_reward"],
        "after": summary["final_eval_reward"],
        "paired": summary["eval_paired"],
        "generated_tokens": int(sum(m.get("rollout/generated_tokens", 0) for m in rows)),
        "trained_tokens": int(summary["trained_tokens"]),
        "grad_norm": {
            p: grad_spikes([m[f"train/{p}/grad_norm"] for m in rows if f"train/{p}/grad_norm" in m])
            for p in summary["trainable_policies"]
        },
        "wall_s": summary["wall_s"],
        "eval_generated_tokens_per_item": mean([t.num_generated_tokens for t in last]),
        "eval_truncated": sum(t.status == "truncated" for t in last),
        "curve": [m[job.arm.curve] for m in rows if job.arm.curve in m],  # training steps only
    }
    if (games := game_stats(last)) is not None:
        row["games"] = {"before": game_stats(first), "after": games}
    for seat in job.arm.seats:
        rep = job.out / "controls" / f"seed{job.seed}" / f"{job.arm.name}_as_{seat}.json"
        if rep.exists():
            row[seat] = read_seat(list(read_jsonl(json.loads(rep.read_text())["model"]["traces"])), first)
    return row


def read_seat(model: list[Trace], base: list[Trace]) -> dict:
    """A seat's evaluation (`model`) against the untrained model in both seats (`base`: the run's step-0
    evaluation) in short: each role's reward, trained and untrained, the paired comparison of each
    role's reward, and how often each seat lost by an illegal move."""
    roles = sorted({r for t in model for r in (t.agent_rewards or {})})
    return {
        "roles": {r: mean_of(model, role_reward(r)) for r in roles},
        "untrained_roles": {r: mean_of(base, role_reward(r)) for r in roles},
        "forfeits": {r: mean_of(model, forfeited(r)) for r in roles},
        "untrained_forfeits": {r: mean_of(base, forfeited(r)) for r in roles},
        "paired_roles": {
            r: paired_comparison(with_reward(base, role_reward(r)), with_reward(model, role_reward(r))) for r in roles
        },
    }


# ---- the tables ----------------------------------------------------------------------------


def sign(p: dict | None) -> str:
    """A paired_comparison's sign test (trainer/metrics.py) as text."""
    return "-" if not p else sign_line(p["better"], p["worse"], p["sign_test_p"])


def md(caption: str, header: str, lines: list[str]) -> list[str]:
    """A markdown table after a caption (none: no caption); `header`: the columns' names between
    ' | '. No lines, no table."""
    if not lines:
        return []
    head = [f"| {header} |", "|" + "---|" * len(header.split(" | ")), *lines, ""]
    return ([caption, ""] if caption else []) + head


def contrasts_md(caption: str, fam: dict) -> list[str]:
    """A family of contrasts over seeds, then its per-seed sign tests (run vs run)."""
    if not fam:
        return []
    per_seed = [
        [name.replace("_vs_", " vs "), s, f"{t['better']} / {t['worse']}", pval(t["p"]), pval(t["p_holm"])]
        for name, c in fam.items()
        for s, t in c["run_vs_run"].items()
    ]
    few = " (fewer than 2 seeds: no test over seeds, and the CI resamples items only)"
    few = few if all(c["p"] is None for c in fam.values()) else ""
    return [
        f"{caption} Over seeds: mean difference, paired t over seeds, two-level bootstrap CI, Holm over the "
        f"{len(fam)} contrast(s){few}:",
        "",
        *md_table(CONTRAST_HEAD, contrast_rows(fam)),
        f"The same, per seed, run vs run (exact sign test over the items of two training runs or evaluations; "
        f"it says nothing about the arms, whose seed variance it ignores); Holm over the {len(per_seed)} test(s):",
        "",
        *md_table(["contrast (run vs run)", "seed", "better / worse", "p", "Holm p"], per_seed),
    ]


def team_md(evals: list[dict]) -> list[str]:
    lines = []
    for e in evals:
        c = e["confusion"]
        lines.append(
            f"| {e['condition']} | {e['seed']} | {'-' if e['step'] is None else e['step']} | {e['items']} "
            f"({e['failed']}) | {num(e['draft'], 3)} → {num(e['final'], 3)} "
            f"| {e['changed']}: {e['fixes']} / {e['breaks']} "
            f"| {c['right']['correct']} / {c['right']['wrong']} / {c['right']['none']} "
            f"| {c['wrong']['correct']} / {c['wrong']['wrong']} / {c['wrong']['none']} | {num(e['tpr'], 2)} / "
            f"{num(e['tnr'], 2)} / {num(e['youden_j'], 2)} "
            f"| {num(e['verdict_right'], 3)} vs {num(e['best_constant'], 3)} "
            f"| {num(e['missing_verdict'], 3)} | {num(e['truncated'], 3)} ({e['cut_calls']['solver']} / "
            f"{e['cut_calls']['verifier']}) |"
        )
    header = (
        "condition | seed | step | items (failed) | draft → final | answer changed: fixes / breaks "
        "| right drafts: said CORRECT / WRONG / none | wrong drafts: said CORRECT / WRONG / none "
        "| TPR / TNR / Youden's J | verdict right vs best constant | missing verdict | truncated (cut calls: "
        "solver / verifier)"
    )
    caption = (
        "Every team evaluation (greedy, held-out): the revision and the verifier's verdict against the "
        "draft's correctness (a missing verdict counts as neither CORRECT nor WRONG):"
    )
    return md(caption, header, lines)


def votes_md(matched: dict) -> list[str]:
    lines = [
        f"| {s} | {arm} | {m['tokens_team']:.1f} / {m['tokens_single']:.1f} | {m['k_rule']} | {m['k']} "
        f"| {m['condition']} |"
        for s, by_arm in matched.items()
        for arm, m in by_arm.items()
    ]
    header = "seed | team arm | generated tokens per question: team / single agent | k by the rule | k | the vote"
    caption = "The vote each team arm is compared with: k = max(1, round(T_team / T_single)) samples at 0.7:"
    return md(caption, header, lines)


def runs_md(rows: list[dict]) -> list[str]:
    lines = []
    for r in rows:
        norms = "; ".join(
            f"{p} {num(g['max'], 2)} / {num(g['median'], 2)} ({g['spikes']})" for p, g in r["grad_norm"].items()
        )
        lines.append(
            f"| {r['arm']} | {r['seed']} ({r['run_seed']}) | {num(r['before'], 3)} → {num(r['after'], 3)} "
            f"| {sign(r['paired'])} | {r['generated_tokens']:,} / {r['trained_tokens']:,} | {norms} "
            f"| {num(r['eval_generated_tokens_per_item'], 1)} | {r['eval_truncated']} | {r['wall_s'] / 60:.1f} min |"
        )
    header = (
        "arm | seed (run seed) | held-out before → after | better / worse, p (run vs run) | generated / trained "
        "tokens | grad norm max / median (spikes > 3x) | last eval: tokens per question | last eval: truncated "
        "| wall"
    )
    return md("Every run:", header, lines)


def games_md(rows: list[dict]) -> list[str]:
    lines = [
        f"| {r['arm']} | {r['seed']} | {num(b['forfeits'], 3)} → {num(a['forfeits'], 3)} "
        f"| {num(b['moves'], 1)} → {num(a['moves'], 1)} | {num(b['as_theory'], 3)} → {num(a['as_theory'], 3)} "
        f"| {num(b['one_a_move'], 3)} → {num(a['one_a_move'], 3)} |"
        for r in rows
        if (g := r.get("games")) and (b := g["before"]) and (a := g["after"])
    ]
    header = (
        "arm | seed | games lost by an illegal move | moves a game | won by the seat perfect play wins "
        "| played out one stone a move"
    )
    caption = "The game's held-out positions played by the policy in both seats (greedy), before → after training:"
    return md(caption, header, lines)


def seats_md(rows: list[dict]) -> list[str]:
    tests = {
        (r["arm"], r["seed"], seat): t
        for r in rows
        for seat in ARMS[r["arm"]].seats
        if seat in r and (t := r[seat]["paired_roles"].get(seat))
    }
    adjusted = holm({f"{k}": t["sign_test_p"] for k, t in tests.items()})
    lines = [
        f"| {arm} | {seed} | {seat} | {num(r[seat]['untrained_roles'].get(seat), 3)} "
        f"| {num(r[seat]['roles'].get(seat), 3)} "
        f"| {sign(t)} | {pval(adjusted[str((arm, seed, seat))])} "
        f"| {num(r[seat]['untrained_forfeits'].get(seat), 3)} → {num(r[seat]['forfeits'].get(seat), 3)} |"
        for r in rows
        for (arm, seed, seat), t in tests.items()
        if (arm, seed) == (r["arm"], r["seed"])
    ]
    header = "arm | seed | seat | untrained | trained | better / worse, p | Holm p | its games lost by an illegal move"
    caption = (
        "The trained player against the untrained model, each seat (+1 win, -1 loss, over the games the seat moved "
        "in); untrained = the untrained model in both seats; Holm over the seats' tests:"
    )
    return md(caption, header, lines)


def report(rows: list[dict], analysis: dict) -> str:
    """OUT/team_study.md: the team arms against the controls, the secondary contrasts, training,
    every team evaluation, the votes, every run, and a game's tables."""
    a = analysis
    parts = [
        "# The team study",
        "",
        f"Seeds: {', '.join(map(str, a['seeds']))}. Accuracy: the final answer's reward on the held-out "
        "questions at the last step; differences in points.",
        "",
        *contrasts_md(
            "Each team arm against the single agent, its token-matched vote and the transplant.", a["team_vs_controls"]
        ),
        *contrasts_md("Secondary contrasts (CIs only, no claims).", a["secondary"]),
        *contrasts_md("Each arm's training (after - before).", a["training"]),
        *contrasts_md("The harness untrained (the team - one agent, the same base model).", a["harness_untrained"]),
        *team_md(a["team_evals"]),
        *votes_md(a["matched_votes"]),
        *runs_md(rows),
        *games_md(rows),
        *seats_md(rows),
    ]
    return "\n".join(parts)


def plot(rows: list[dict], path: Path) -> None:
    """The sampled training reward per step of each arm (seeds as thin lines), a panel per question."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    questions = list(dict.fromkeys(ARMS[r["arm"]].question for r in rows))
    fig, axes = plt.subplots(1, len(questions), figsize=(5 * len(questions), 3.6), squeeze=False)
    for ax, q in zip(axes[0], questions):
        for k, arm in enumerate(dict.fromkeys(r["arm"] for r in rows if ARMS[r["arm"]].question == q)):
            for r in (r for r in rows if r["arm"] == arm):
                ax.plot(
                    range(1, len(r["curve"]) + 1),
                    r["curve"],
                    color=f"C{k}",
                    alpha=0.8,
                    lw=1,
                    label=f"{arm} seed {r['seed']}",
                )
        ax.set_title(q)
        ax.set_xlabel("step")
        ax.set_ylabel(ARMS[arm].curve.replace("rollout/", "sampled "))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
