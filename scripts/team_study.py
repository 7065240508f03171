"""The multi-agent study with its controls: does training the team beat training one agent?

    python scripts/team_study.py                           # every arm, 2 seeds (hours on a 2-core box)
    python scripts/team_study.py --arms team --seeds 1 2   # role specialisation and its controls
    python scripts/team_study.py --arms credit_global,credit_per_agent --seeds 1
    python scripts/team_study.py --quick --out /tmp/b      # every arm on the tiny model, 2 steps (tests)
    python scripts/team_study.py --no-train                # the table of the runs finished so far

Each arm is an experiment preset (conf/experiment/study_*.yaml) trained by scripts/train.py
once per seed into OUT/<arm>/seed<k>; a finished run (its summary.json) is kept and read, so an
interrupted call picks up where it stopped. After training, scripts/evaluate.py measures what the
run's own held-out eval cannot:

- `swap` (team_lora, team_full): the trained roles' weights swapped (the verifier's weights
  solve, the solver's verify), on the same held-out questions.
- `vote` (single_agent): a majority vote over 3 samples, untrained and trained: the team's 3
  model calls spent on samples instead of roles.
- `seats` (selfplay arms): the trained player against the untrained model in either seat.

Then one table (OUT/team_study.md and .json: held-out before -> after with the paired sign test,
each role's own reward, generated and trained tokens, gradient norms, wall time; each team arm
paired against the single agent of the same seed; a game's illegal moves, moves, perfect-play
winners and one-stone games before -> after) and the sampled training reward per step of every
arm (OUT/curves.png). The last output line is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from rollout.trace import Trace, read_jsonl
from trainer.metrics import paired_comparison, write_atomic

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Arm:
    name: str
    question: str  # the comparison it is part of: team, credit or selfplay
    swap: dict[str, str] = field(default_factory=dict)  # role -> policy for the swapped evaluation
    vote: bool = False  # also evaluate a majority vote over 3 samples, untrained and trained
    seats: tuple[str, ...] = ()  # a game's seats: the trained player against the untrained in each
    curve: str = "rollout/reward"  # the metric drawn per step (a zero-sum game's trace reward is 0)

    @property
    def preset(self) -> str:
        return f"study_{self.name}"


SEATS = ("player_a", "player_b")
ARMS = {
    a.name: a
    for a in (
        Arm("team_shared", "team"),
        Arm("team_lora", "team", swap={"solver": "verifier", "verifier": "solver"}),
        Arm("team_full", "team", swap={"solver": "critic", "verifier": "main"}),
        Arm("single_agent", "team", vote=True),
        Arm("credit_global", "credit"),
        Arm("credit_per_agent", "credit"),
        Arm("selfplay", "selfplay", seats=SEATS, curve="rollout/reward/player_a"),
        Arm("selfplay_no_role_baseline", "selfplay", seats=SEATS, curve="rollout/reward/player_a"),
    )
}
# --quick: the tiny model, 2 steps of 2 groups of 4, 8 held-out items: every code path in minutes
QUICK = [
    "model=tiny",
    "logger=disabled",
    "trainer.steps=2",
    "trainer.groups_per_step=2",
    "rollout.group_size=4",
    "eval.size=8",
    "task.eval_size=8",
    "sampling.max_tokens=16",
    "engine.kv_cache_gb=0.25",
]
VOTE_K = 3  # the team's model calls per question (draft, critique, final)


def pick_arms(spec: str) -> list[Arm]:
    """`all`, a question (team, credit, selfplay) or arm names, comma-separated."""
    names: list[str] = []
    for word in spec.split(","):
        if word == "all":
            names += list(ARMS)
        elif word in {a.question for a in ARMS.values()}:
            names += [n for n, a in ARMS.items() if a.question == word]
        elif word in ARMS:
            names.append(word)
        else:
            raise ValueError(
                f"--arms: {word!r} is not all, a question (team, credit, selfplay) or an arm ({list(ARMS)})"
            )
    return [ARMS[n] for n in dict.fromkeys(names)]


def run(cmd: list[str], log: Path, timeout_s: float) -> float:
    """Run a script of ours to completion, its output to `log`; its wall seconds. A failure or an
    overrun raises naming the log."""
    t0 = time.perf_counter()
    with log.open("w") as out:
        try:
            proc = subprocess.run(
                [sys.executable, *cmd], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{cmd[0]} ran past {timeout_s:.0f} s; its output: {log}") from None
    if proc.returncode:
        raise RuntimeError(f"{cmd[0]} exited {proc.returncode}; its output: {log}")
    return time.perf_counter() - t0


@dataclass
class Job:
    arm: Arm
    seed: int
    out: Path
    quick: bool
    timeout_s: float

    @property
    def dir(self) -> Path:
        return self.out / self.arm.name / f"seed{self.seed}"

    def overrides(self) -> list[str]:
        return [f"experiment={self.arm.preset}", f"seed={self.seed}", *(QUICK if self.quick else [])]

    @property
    def label(self) -> str:
        return f"{self.arm.name} seed {self.seed}"

    def train(self) -> None:
        if (self.dir / "summary.json").exists():
            print(f"[team_study] {self.label}: trained already ({self.dir})", flush=True)
            return
        log = self.dir.with_suffix(".train.log")
        print(f"[team_study] {self.label}: training into {self.dir} (output: {log})", flush=True)
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        cmd = ["scripts/train.py", *self.overrides(), f"run_dir={self.dir}", "trainer.resume=auto"]
        wall = run(cmd, log, self.timeout_s)
        print(f"[team_study] {self.label}: trained in {wall:.0f} s", flush=True)

    def evaluate(self, label: str, extra: list[str]) -> dict:
        """scripts/evaluate.py on this run's final weights (with `extra` flags and overrides); its
        report, kept in <run>/<label>.json and reused."""
        out = self.dir / f"{label}.json"
        if not out.exists():
            print(f"[team_study] {self.label}: evaluating {label} (output: {self.dir / label}.log)", flush=True)
            cmd = ["scripts/evaluate.py", *self.overrides(), *extra, "--model", str(self.dir), "--out", str(out)]
            run(cmd, self.dir / f"{label}.log", self.timeout_s)
        return json.loads(out.read_text())

    def base_model(self) -> str:
        return "tiny" if self.quick else "smollm2_135m"

    def extra_evals(self) -> dict:
        arm, found = self.arm, {}
        if arm.swap:
            found["swap"] = self.evaluate("swapped", [f"agents.{role}={p}" for role, p in arm.swap.items()])
        if arm.vote:
            found["vote"] = self.evaluate("vote", ["harness=majority_vote", "--reference", self.base_model()])
        for seat in arm.seats:  # the other seat played by the untrained model (`frozen`)
            other = next(s for s in arm.seats if s != seat)
            found[seat] = self.evaluate(f"as_{seat}", [f"agents.{other}=frozen", "--reference", self.base_model()])
        return found


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


def draft_score(t: Trace) -> float | None:
    return t.info.get("draft_score")


def mean(xs: list[float]) -> float | None:
    return round(statistics.fmean(xs), 4) if xs else None


def mean_of(traces: list[Trace], reward) -> float | None:
    """The mean of `reward(trace)` over the traces that have one (role_reward, draft_score)."""
    return mean([t.reward for t in with_reward(traces, reward)])


def grad_spikes(norms: list[float], factor: float = 3.0) -> dict:
    """Max and median gradient norm over a run's steps, and the steps above `factor` x the median."""
    if not norms:
        return {"max": None, "median": None, "spikes": 0}
    med = statistics.median(norms)
    return {"max": round(max(norms), 4), "median": round(med, 4), "spikes": sum(n > factor * med for n in norms)}


def read_run(job: Job) -> dict:
    """One row of the table: the run's summary, metrics and extra evaluations."""
    summary = json.loads((job.dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (job.dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    policies = summary["trainable_policies"]
    first, last = eval_traces(job.dir, "first"), eval_traces(job.dir, "last")
    roles = sorted({r for t in last for r in (t.agent_rewards or {})})
    row = {
        "arm": job.arm.name,
        "seed": job.seed,
        "before": summary["initial_eval_reward"],
        "after": summary["final_eval_reward"],
        "paired": summary["eval_paired"],
        "roles": {r: {"before": mean_of(first, role_reward(r)), "after": mean_of(last, role_reward(r))} for r in roles},
        "draft": {"before": mean_of(first, draft_score), "after": mean_of(last, draft_score)},
        "generated_tokens": int(sum(m.get("rollout/generated_tokens", 0) for m in rows)),
        "trained_tokens": int(summary["trained_tokens"]),
        "grad_norm": {
            p: grad_spikes([m[f"train/{p}/grad_norm"] for m in rows if f"train/{p}/grad_norm" in m]) for p in policies
        },
        "wall_s": summary["wall_s"],
        "eval_generated_tokens_per_item": mean([t.num_generated_tokens for t in last]),
        "curve": [m[job.arm.curve] for m in rows if job.arm.curve in m],  # training steps only
    }
    if (games := game_stats(last)) is not None:
        row["games"] = {"before": game_stats(first), "after": games}
    for key, rep in job.extra_evals().items():
        row[key] = read_eval(rep, last)
    return row


def read_eval(rep: dict, run_final: list[Trace]) -> dict:
    """An evaluate.py report in short: mean reward of the model (and the untrained reference), per-role rewards,
    generated tokens per item, and the model's traces paired against the run's own final eval."""
    model = list(read_jsonl(rep["model"]["traces"]))
    out = {
        "reward": rep["model"]["reward"],
        "roles": {
            r: mean_of(model, role_reward(r)) for r in sorted({r for t in model for r in (t.agent_rewards or {})})
        },
        "draft": mean_of(model, draft_score),
        "generated_tokens_per_item": mean([t.num_generated_tokens for t in model]),
        "vs_run_final": paired_comparison(run_final, model),
    }
    if "reference" in rep:
        base = list(read_jsonl(rep["reference"]["traces"]))
        out["untrained_reward"] = rep["reference"]["reward"]
        out["paired"] = rep["eval_paired"]
        out["untrained_roles"] = {r: mean_of(base, role_reward(r)) for r in out["roles"]}
        if any("forfeit" in t.info for t in model):  # a game: how often each seat lost by an illegal move
            out["forfeits"] = {r: mean_of(model, forfeited(r)) for r in out["roles"]}
            out["untrained_forfeits"] = {r: mean_of(base, forfeited(r)) for r in out["roles"]}
        out["paired_roles"] = {
            r: paired_comparison(with_reward(base, role_reward(r)), with_reward(model, role_reward(r)))
            for r in out["roles"]
        }
    return out


def against_single_agent(rows: list[dict], jobs: dict[tuple[str, int], Job]) -> None:
    """Each team arm's final held-out eval paired against the single agent's of the same seed
    (greedy, the same questions), and against the trained single agent's majority vote."""
    for row in rows:
        single = jobs.get(("single_agent", row["seed"]))
        if ARMS[row["arm"]].question == "selfplay" or row["arm"] == "single_agent" or single is None:
            continue
        if not (single.dir / "summary.json").exists():
            continue
        team = eval_traces(jobs[(row["arm"], row["seed"])].dir, "last")
        row["vs_single"] = paired_comparison(eval_traces(single.dir, "last"), team)
        vote = single.dir / "vote.model.jsonl"
        if vote.exists():
            row["vs_vote"] = paired_comparison(list(read_jsonl(vote)), team)


# ---- the table ----------------------------------------------------------------------------


def fmt(x, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def moved(d: dict | None) -> str:
    return "-" if not d else f"{fmt(d.get('before'))} → {fmt(d.get('after'))}"


def sign(p: dict | None) -> str:
    return "-" if not p else f"{p['better']} / {p['worse']}, p = {p['sign_test_p']:.2g}"


def md(caption: str, header: str, lines: list[str]) -> list[str]:
    """A markdown table after a caption (none: no caption); `header`: the columns' names between
    ' | '. No lines, no table."""
    if not lines:
        return []
    head = [f"| {header} |", "|" + "---|" * len(header.split(" | ")), *lines, ""]
    return ([caption, ""] if caption else []) + head


def table(rows: list[dict]) -> str:
    """The markdown of OUT/team_study.md: each arm over its seeds, every run, then one table per
    extra evaluation (those the runs have)."""
    parts = (arms_table, runs_table, swaps_table, votes_table, games_table, seats_table)
    return "\n".join(line for part in parts for line in part(rows))


def arms_table(rows: list[dict]) -> list[str]:
    lines = []
    for arm in dict.fromkeys(r["arm"] for r in rows):
        runs = [r for r in rows if r["arm"] == arm]
        change = mean([r["after"] - r["before"] for r in runs if r["after"] is not None and r["before"] is not None])
        lines.append(
            f"| {arm} | {len(runs)} | {', '.join(fmt(r['before']) for r in runs)} "
            f"| {', '.join(fmt(r['after']) for r in runs)} | {'-' if change is None else f'{change:+.3f}'} "
            f"| {'; '.join(sign(r.get('vs_single')) for r in runs)} |"
        )
    header = "arm | seeds | held-out before | after, each seed | mean change | final vs single agent, each seed"
    return md("", header, lines)


def runs_table(rows: list[dict]) -> list[str]:
    lines = []
    for r in rows:
        norms = "; ".join(
            f"{p} {fmt(g['max'], 2)} / {fmt(g['median'], 2)} ({g['spikes']})" for p, g in r["grad_norm"].items()
        )
        lines.append(
            f"| {r['arm']} | {r['seed']} | {fmt(r['before'])} → {fmt(r['after'])} | {sign(r['paired'])} "
            f"| {moved(r['draft'])} | {moved(r['roles'].get('verifier'))} "
            f"| {r['generated_tokens']:,} / {r['trained_tokens']:,} | {norms} | {r['wall_s'] / 60:.1f} min "
            f"| {sign(r.get('vs_single'))} | {sign(r.get('vs_vote'))} |"
        )
    header = (
        "arm | seed | held-out before → after | better / worse, p | solver's draft | verifier's verdict right "
        "| generated / trained tokens | grad norm max / median (spikes > 3x) | wall | final vs single agent "
        "| final vs its majority vote"
    )
    return md("Every run:", header, lines)


def swaps_table(rows: list[dict]) -> list[str]:
    lines = [
        f"| {r['arm']} | {r['seed']} | {fmt(r['after'])}, {fmt(r['draft']['after'])}, "
        f"{fmt(r['roles'].get('verifier', {}).get('after'))} | {fmt(w['reward'])}, {fmt(w['draft'])}, "
        f"{fmt(w['roles'].get('verifier'))} | {sign(w['vs_run_final'])} |"
        for r in rows
        if (w := r.get("swap"))
    ]
    header = (
        "arm | seed | final: reward, draft, verdict right | swapped: reward, draft, verdict right | swapped vs final"
    )
    caption = "Roles' weights swapped (the verifier's weights solve, the solver's verify), the same questions:"
    return md(caption, header, lines)


def votes_table(rows: list[dict]) -> list[str]:
    lines = [
        f"| {r['seed']} | {fmt(v['untrained_reward'])} | {fmt(v['reward'])} | {sign(v['paired'])} "
        f"| {sign(v['vs_run_final'])} | {fmt(v['generated_tokens_per_item'], 1)} / "
        f"{fmt(r['eval_generated_tokens_per_item'], 1)} |"
        for r in rows
        if (v := r.get("vote"))
    ]
    header = (
        "seed | untrained vote | trained vote | trained vs untrained | trained vote vs trained greedy "
        "| generated tokens per question: vote / greedy"
    )
    caption = f"Majority vote over {VOTE_K} samples (temperature 0.7) of the single agent:"
    return md(caption, header, lines)


def games_table(rows: list[dict]) -> list[str]:
    lines = [
        f"| {r['arm']} | {r['seed']} | {fmt(b['forfeits'])} → {fmt(a['forfeits'])} "
        f"| {fmt(b['moves'], 1)} → {fmt(a['moves'], 1)} | {fmt(b['as_theory'])} → {fmt(a['as_theory'])} "
        f"| {fmt(b['one_a_move'])} → {fmt(a['one_a_move'])} |"
        for r in rows
        if (g := r.get("games")) and (b := g["before"]) and (a := g["after"])
    ]
    header = (
        "arm | seed | games lost by an illegal move | moves a game | won by the seat perfect play wins "
        "| played out one stone a move"
    )
    caption = "The game's held-out positions played by the policy in both seats (greedy), before → after training:"
    return md(caption, header, lines)


def seats_table(rows: list[dict]) -> list[str]:
    lines = [
        f"| {r['arm']} | {r['seed']} | {seat} | {fmt(r[seat]['untrained_roles'].get(seat))} "
        f"| {fmt(r[seat]['roles'].get(seat))} | {sign(r[seat]['paired_roles'].get(seat))} "
        f"| {fmt(r[seat].get('untrained_forfeits', {}).get(seat))} → {fmt(r[seat].get('forfeits', {}).get(seat))} |"
        for r in rows
        for seat in ARMS[r["arm"]].seats
        if seat in r
    ]
    header = "arm | seed | seat | untrained | trained | better / worse, p | its games lost by an illegal move"
    caption = (
        "The trained player against the untrained model (zero-sum: +1 win, -1 loss), each seat; "
        "untrained = the untrained model in both seats:"
    )
    return md(caption, header, lines)


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", default="all", help="all, team, credit, selfplay or arm names (comma-separated)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2], help="the seeds (default 1 2)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "team_study", help="where the runs go")
    parser.add_argument("--quick", action="store_true", help="the tiny model, 2 steps: the code paths only")
    parser.add_argument(
        "--no-train",
        action="store_true",
        help="train nothing: the finished runs' table (and their missing evaluations)",
    )
    parser.add_argument("--timeout-s", type=float, default=3600, help="the deadline of each training or evaluation")
    args = parser.parse_args(argv)
    try:
        arms = pick_arms(args.arms)
    except ValueError as e:
        parser.error(str(e))
    out = args.out.resolve()
    jobs = {(a.name, s): Job(a, s, out, args.quick, args.timeout_s) for a in arms for s in args.seeds}
    t0 = time.perf_counter()
    failed: dict[str, str] = {}  # a run that fails is reported; the others go on
    rows = []
    missing = [j.label for j in jobs.values() if args.no_train and not (j.dir / "summary.json").exists()]
    jobs = {key: j for key, j in jobs.items() if j.label not in missing}
    for job in jobs.values():
        try:
            job.train()
        except RuntimeError as e:
            failed[job.label] = str(e)
            print(f"[team_study] {job.label}: FAILED: {e}", flush=True)
    for job in jobs.values():
        if job.label not in failed:
            try:
                rows.append(read_run(job))
            except RuntimeError as e:
                failed[job.label] = str(e)
                print(f"[team_study] {job.label}: FAILED: {e}", flush=True)
    against_single_agent(rows, jobs)
    write_atomic(out / "team_study.json", json.dumps(rows, indent=2, allow_nan=False))
    if rows:
        (out / "team_study.md").write_text(table(rows), encoding="utf-8")
        plot(rows, out / "curves.png")
    print(f"[team_study] wrote {out / 'team_study.md'}, {out / 'team_study.json'}, {out / 'curves.png'}", flush=True)
    print(
        json.dumps(
            {
                "arms": [a.name for a in arms],
                "seeds": args.seeds,
                "runs": len(rows),
                "after": {f"{r['arm']}/seed{r['seed']}": r["after"] for r in rows},
                "wall_s": round(time.perf_counter() - t0, 1),
                "failed": failed,
                "not_trained": missing,
                "out": str(out),
            }
        )
    )
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
