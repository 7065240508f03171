"""The multi-agent study with its controls: does training the team beat training one agent?

    python scripts/team_study.py --seeds 1 2 3 4 5          # every arm (hours a seed on a 2-core box)
    python scripts/team_study.py --arms team --seeds 1 2   # role specialisation and its controls
    python scripts/team_study.py --arms credit_global,credit_per_agent --seeds 1
    python scripts/team_study.py --quick --out /tmp/b      # every arm on the tiny model, 2 steps (tests)
    python scripts/team_study.py --no-train                # the analysis of the runs finished so far

Each arm is an experiment preset (conf/experiment/study_*.yaml) trained by scripts/train.py
once per study seed s into OUT/<arm>/seed<s>, with the run seed s x task.size (`run_seed`): the
training stream of a reasoning-gym task is items Random(seed + j), so seeds s and s + 1 would
train on the same questions shifted by one; s x task.size gives each study seed its own window of
task.size items, disjoint from every other seed's and below the held-out stream's (task.eval_seed).
A finished run (its summary.json, of the same run seed) is kept, so an interrupted call picks up
where it stopped. After training, scripts/evaluate.py (greedy) runs the controls on the trained
weights (OUT/controls/seed<s>):

- `transplant`: the single agent's weights in both roles of the team (study_team_shared's harness):
  trained alone, evaluated in the team (AT-GRPO's "trained in SA, eval in MAS").
- `vote_k<k>`: the single agent's majority vote over k samples (temperature 0.7), k matched in
  generated tokens to each team arm of the seed: k = max(1, round(T_team / T_single)) from the mean
  generated tokens per question of their last evaluations (trainer.contrasts.token_matched_k, the
  relay's rule); k = 1
  is the single agent's own greedy evaluation. controls/seed<s>/matched_votes.json says which vote
  each team arm is compared with. --quick votes over 2 samples whatever the rule says.
- `<arm>_swap` (team_lora, team_full): the trained roles' weights swapped (the verifier's weights
  solve, the solver's verify), on the same held-out questions.
- `<arm>_as_player_a` / `_as_player_b` (selfplay arms): the trained player against the untrained
  model in either seat, compared with the untrained model in both (the run's own step-0 evaluation:
  the same weights, greedy, on the same positions).

Per-item results (trainer/results.py's write_condition: <name>.items.jsonl.gz + .meta.json) for
every evaluation, in RESULTS (--results, default OUT/results): RESULTS/<arm>/seed<s>/step_<n> for
each of a run's evaluations, RESULTS/controls/seed<s>/<control> for each control. A team item holds
the draft's score and answer, the verifier's verdict and the calls cut at max_tokens beside the
final answer's. The analysis reads those files (trainer/contrasts.py) and writes OUT/team_study.md
and .json:

- each team arm against the single agent, its token-matched vote and the transplant, over seeds:
  the mean difference, the paired t-test over seeds, the two-level bootstrap 95% CI and the Holm-
  adjusted p over the table's contrasts; beside it each seed's exact sign test, run vs run (two
  training runs on the same items, not two arms), Holm-adjusted over those tests;
- the secondary contrasts (the transplant against the single agent alone, LoRA and full roles
  against the shared policy, per-role credit, the roles swapped), the same way;
- each run before -> after (run vs run sign test, Holm over the runs), and each arm's training
  effect over seeds;
- for every team evaluation (each arm x seed x step, the transplant, the swaps): the revision
  (final != draft: fixes and breaks), the verdict's confusion matrix against the draft's
  correctness (TPR, TNR, Youden's J, against the best constant verdict), the missing-verdict rate and
  the truncation rate;
- every run's tokens, gradient norms and wall time; a game's illegal moves, moves, perfect-play
  winners and one-stone games before -> after; the seats against the untrained model;
- OUT/curves.png: the sampled training reward per step of every run.

The last output line is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import msgspec

from harnesses.verifiers.answers import extract_answer
from rollout.trace import Trace, read_jsonl
from trainer.config import compose
from trainer.contrasts import (
    CONTRAST_HEAD,
    contrast_family,
    contrast_rows,
    items_by_seed,
    load_study,
    pval,
    table as md_table,
    token_matched_k,
)
from trainer.jobs import provenance
from trainer.metrics import paired_comparison, write_atomic
from trainer.results import decoder, holm, read_condition, records, write_condition

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Arm:
    name: str
    question: str  # the comparison it is part of: team, credit or selfplay
    swap: dict[str, str] = field(default_factory=dict)  # role -> policy for the swapped evaluation
    seats: tuple[str, ...] = ()  # a game's seats: the trained player against the untrained in each
    curve: str = "rollout/reward"  # the metric drawn per step (a zero-sum game's trace reward is 0)

    @property
    def preset(self) -> str:
        return f"study_{self.name}"

    @property
    def team(self) -> bool:
        """A solver_verifier team (compared with the single agent and its controls)."""
        return self.question in ("team", "credit") and self.name != SINGLE


SEATS = ("player_a", "player_b")
SINGLE = "single_agent"
ARMS = {
    a.name: a
    for a in (
        Arm("team_shared", "team"),
        Arm("team_lora", "team", swap={"solver": "verifier", "verifier": "solver"}),
        Arm("team_full", "team", swap={"solver": "critic", "verifier": "main"}),
        Arm(SINGLE, "team"),
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
QUICK_VOTE_K = 2  # --quick: one vote of 2 samples for every team arm (the rule's k is recorded beside it)
TRANSPLANT = "transplant"
SECONDARY = {  # name -> (base condition, other): arms by name, controls as `controls/<name>`
    "transplant_vs_single_agent": (SINGLE, f"controls/{TRANSPLANT}"),
    "team_lora_vs_team_shared": ("team_shared", "team_lora"),
    "team_full_vs_team_shared": ("team_shared", "team_full"),
    "credit_per_agent_vs_credit_global": ("credit_global", "credit_per_agent"),
    "team_lora_swap_vs_team_lora": ("team_lora", "controls/team_lora_swap"),
    "team_full_swap_vs_team_full": ("team_full", "controls/team_full_swap"),
}
RESAMPLES = 10000  # the bootstrap's (generator seed 0)
CODE = ("harnesses", "rollout", "trainer", "scripts", "conf")  # what provenance lists uncommitted changes of


def log(msg: str) -> None:
    print(f"[team_study] {msg}", flush=True)


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


@cache
def task_window(preset: str) -> tuple[int, int]:
    """(task.size, task.eval_seed) of an arm's preset."""
    task = compose("train", [f"experiment={preset}"]).task
    return task.size, task.eval_seed


def run_seed(seed: int, preset: str) -> int:
    """The run seed of study seed `seed`: seed x task.size, so that each study seed's training
    stream (reasoning-gym item j: Random(run seed + j); harnesses/tasks/reasoning_gym.py) is a window
    of task.size items of its own, disjoint from every other study seed's and below the held-out
    stream's seeds. A seed whose window would reach those is refused, naming the bound."""
    size, eval_seed = task_window(preset)
    if not 0 <= seed < eval_seed // size:
        raise ValueError(
            f"--seeds {seed}: study seed s trains on task items [s x {size}, (s + 1) x {size}) of {preset}, below "
            f"its held-out stream's seed {eval_seed}: give seeds 0 to {eval_seed // size - 1} (or lower task.size)"
        )
    return seed * size


def run(cmd: list[str], log_path: Path, timeout_s: float) -> float:
    """Run a script of ours to completion, its output to `log_path`; its wall seconds. A failure or
    an overrun raises naming the log."""
    t0 = time.perf_counter()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as out:
        try:
            proc = subprocess.run(
                [sys.executable, *cmd], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{cmd[0]} ran past {timeout_s:.0f} s; its output: {log_path}") from None
    if proc.returncode:
        raise RuntimeError(f"{cmd[0]} exited {proc.returncode}; its output: {log_path}")
    return time.perf_counter() - t0


# ---- per-item records ---------------------------------------------------------------------


def study_records(traces: list[Trace], decode) -> list[dict]:
    """trainer.results.records() of the traces, a team's (harnesses/programs/solver_verifier.py) with
    its draft's score and answer, the verdict (True: CORRECT, False: WRONG, None: none given) and
    each role's calls cut at max_tokens; a game's (harnesses/programs/selfplay.py) with its outcome."""
    recs = records(traces, decode)
    by_id = {t.info.get("task", t.group): t for t in traces}
    for rec in recs:
        t = by_id[rec["id"]]
        if "draft_score" in t.info:
            solver = [s for s in t.sequences if s.agent == "solver"]
            rec["draft_score"] = t.info["draft_score"]
            rec["draft_answer"] = extract_answer(decode(solver[0].completion_ids)) if solver else None
            if "verdict" in t.info:
                rec["verdict"] = t.info["verdict"]
            rec["cut_by_role"] = {
                r: sum(s.finish_reason == "length" for s in t.sequences if s.agent == r) for r in t.agents
            }
        if "forfeit" in t.info:
            rec["game"] = {k: t.info[k] for k in ("winner", "forfeit", "moves", "stones", "first_player_wins")}
    return recs


def team_stats(recs: list[dict]) -> dict | None:
    """A team evaluation's items in short (None for items of no team): the draft's and the final
    answer's accuracy; the revision (final answer != draft's: `changed`; `fixes`: a wrong draft made
    right, `breaks`: a right one made wrong); the verdict against the draft's correctness
    (confusion[draft right | wrong][said correct | wrong | none]; TPR: CORRECT on right drafts, TNR:
    WRONG on wrong ones, a missing verdict counting as neither; Youden's J = TPR + TNR - 1), beside
    the verdict-right rate of the best constant verdict; missing verdicts and truncated traces."""
    team = [r for r in recs if "draft_score" in r]
    if not team:
        return None
    said = {True: "correct", False: "wrong", None: "none"}
    confusion = {d: dict.fromkeys(said.values(), 0) for d in ("right", "wrong")}
    for r in team:
        confusion["right" if r["draft_score"] >= 1 else "wrong"][said[r.get("verdict")]] += 1
    right, wrong = (sum(confusion[d].values()) for d in ("right", "wrong"))
    tpr = confusion["right"]["correct"] / right if right else None
    tnr = confusion["wrong"]["wrong"] / wrong if wrong else None
    n = len(team)
    return {
        "items": n,
        "failed": sum(r["failed"] for r in recs),  # traces with no team record (the harness did not finish)
        "final": round(statistics.fmean(r["reward"] for r in team), 4),
        "draft": round(right / n, 4),
        "changed": sum(r["answer"] != r["draft_answer"] for r in team),
        "fixes": sum(r["draft_score"] < 1 and r["reward"] >= 1 for r in team),
        "breaks": sum(r["draft_score"] >= 1 and r["reward"] < 1 for r in team),
        "confusion": confusion,
        "tpr": None if tpr is None else round(tpr, 4),
        "tnr": None if tnr is None else round(tnr, 4),
        "youden_j": None if tpr is None or tnr is None else round(tpr + tnr - 1, 4),
        "verdict_right": round((confusion["right"]["correct"] + confusion["wrong"]["wrong"]) / n, 4),
        "best_constant": round(max(right, wrong) / n, 4),
        "missing_verdict": round((confusion["right"]["none"] + confusion["wrong"]["none"]) / n, 4),
        "truncated": round(sum(r["truncated"] for r in team) / n, 4),
        "cut_calls": {role: sum(r["cut_by_role"].get(role, 0) for r in team) for role in ("solver", "verifier")},
    }


# ---- the runs -----------------------------------------------------------------------------


@dataclass
class Job:
    arm: Arm
    seed: int  # the study's seed
    out: Path
    results: Path
    quick: bool
    timeout_s: float

    @property
    def dir(self) -> Path:
        return self.out / self.arm.name / f"seed{self.seed}"

    @property
    def docs(self) -> Path:
        return self.results / self.arm.name / f"seed{self.seed}"

    @property
    def run_seed(self) -> int:
        return run_seed(self.seed, self.arm.preset)

    def overrides(self) -> list[str]:
        return [f"experiment={self.arm.preset}", f"seed={self.run_seed}", *(QUICK if self.quick else [])]

    @property
    def label(self) -> str:
        return f"{self.arm.name} seed {self.seed}"

    def trained(self) -> bool:
        return (self.dir / "summary.json").exists()

    def check_seed(self) -> None:
        """A run dir of another run seed (trained before the study's seeds were s x task.size) is refused."""
        if (self.dir / "config.yaml").exists():
            trained_seed = compose_run_seed(self.dir)
            if trained_seed != self.run_seed:
                raise RuntimeError(
                    f"{self.dir} was trained with seed={trained_seed}, and study seed {self.seed} is run seed "
                    f"{self.run_seed} (run_seed): move that run away"
                )

    def train(self) -> None:
        """Train the run (resuming a stopped one), unless finished; then its per-item files."""
        self.check_seed()
        if self.trained():
            log(f"{self.label}: trained already ({self.dir})")
        else:
            log_path = self.dir.with_suffix(".train.log")
            log(f"{self.label}: training into {self.dir} (output: {log_path})")
            self.dir.parent.mkdir(parents=True, exist_ok=True)
            cmd = ["scripts/train.py", *self.overrides(), f"run_dir={self.dir}", "trainer.resume=auto"]
            log(f"{self.label}: trained in {run(cmd, log_path, self.timeout_s):.0f} s")
        self.export()

    def eval_files(self) -> list[tuple[int, Path]]:
        paths = (self.dir / "eval").glob("step_*.jsonl")
        return sorted((int(p.stem.removeprefix("step_")), p) for p in paths)

    def export(self) -> None:
        """Each held-out evaluation of the finished run as per-item files (those not written yet), with
        the training it took to get there."""
        self.check_seed()
        todo = [(n, p) for n, p in self.eval_files() if read_condition(self.docs, f"step_{n}") is None]
        if not todo:
            return
        cfg = compose("train", self.overrides())
        rows = [json.loads(line) for line in (self.dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        decode, prov = decoder(self.overrides()), provenance(ROOT, CODE)
        for step, path in todo:
            steps = [r for r in rows if "rollout/generated_tokens" in r and r["step"] <= step]
            meta = {
                **prov,
                "overrides": self.overrides(),
                "seed": self.seed,
                "run_seed": self.run_seed,
                "step": step,
                "steps": cfg.trainer.steps,
                "wall_s": round(sum(r.get("perf/step_s", 0.0) for r in steps), 1),
                "generated_tokens": int(sum(r["rollout/generated_tokens"] for r in steps)),
                "trained_tokens": int(sum(r.get("train/trained_tokens", 0) for r in steps)),
                "rollout_truncated": int(sum(r.get("rollout/truncated", 0) for r in steps)),
            }
            write_condition(self.docs, f"step_{step}", study_records(list(read_jsonl(path)), decode), meta)
        log(f"{self.label}: per-item files in {self.docs}")


def compose_run_seed(run_dir: Path) -> int:
    from omegaconf import OmegaConf

    return int(OmegaConf.load(run_dir / "config.yaml").seed)


@dataclass
class Controls:
    """The evaluation-only controls of one study seed, on its trained runs' weights."""

    seed: int
    jobs: dict[str, Job]  # arm -> its trained job of this seed
    quick: bool
    timeout_s: float

    @property
    def work(self) -> Path:
        return next(iter(self.jobs.values())).out / "controls" / f"seed{self.seed}"

    @property
    def docs(self) -> Path:
        return next(iter(self.jobs.values())).results / "controls" / f"seed{self.seed}"

    def evaluate(self, name: str, preset: str, extra: list[str], weights: Job) -> dict:
        """scripts/evaluate.py of `preset` (+ `extra`) on `weights`' final weights: its report (kept in
        OUT/controls/seed<s>/<name>.json and reused) and its items in RESULTS/controls/seed<s>/<name>."""
        overrides = [f"experiment={preset}", f"seed={weights.run_seed}", *extra, *(QUICK if self.quick else [])]
        out = self.work / f"{name}.json"
        if not out.exists():
            log(f"seed {self.seed} {name}: evaluating {weights.dir} (output: {self.work / name}.log)")
            cmd = ["scripts/evaluate.py", *overrides, "--model", str(weights.dir), "--out", str(out)]
            run(cmd, self.work / f"{name}.log", self.timeout_s)
        rep = json.loads(out.read_text())
        if read_condition(self.docs, name) is None:
            decode, prov = decoder(overrides), provenance(ROOT, CODE)
            meta = {**prov, "overrides": overrides, "model": str(weights.dir), "seed": self.seed}
            recs = study_records(list(read_jsonl(rep["model"]["traces"])), decode)
            write_condition(self.docs, name, recs, meta | {"wall_s": rep["model"]["wall_s"]})
        return rep

    def all(self) -> dict[str, str]:
        """Every control whose runs are trained; control -> done, or FAILED: why."""
        done: dict[str, str] = {}
        single = self.jobs.get(SINGLE)
        todo = [(f"{a}_swap", self.swap, a) for a, j in self.jobs.items() if j.arm.swap]
        todo += [(f"{a}_as_{seat}", self.seat, (a, seat)) for a, j in self.jobs.items() for seat in j.arm.seats]
        if single is not None and any(j.arm.team for j in self.jobs.values()):
            todo += [(TRANSPLANT, self.transplant, single), ("votes", self.votes, single)]
        for name, fn, what in todo:
            try:
                fn(what)
                done[name] = "done"
            except RuntimeError as e:
                done[name] = f"FAILED: {e}"
                log(f"seed {self.seed} {name}: FAILED: {e}")
        return done

    def swap(self, arm: str) -> None:
        job = self.jobs[arm]
        self.evaluate(f"{arm}_swap", job.arm.preset, [f"agents.{r}={p}" for r, p in job.arm.swap.items()], job)

    def seat(self, what: tuple[str, str]) -> None:
        arm, seat = what
        job = self.jobs[arm]
        other = next(s for s in job.arm.seats if s != seat)  # played by the untrained model (`frozen`)
        self.evaluate(f"{arm}_as_{seat}", job.arm.preset, [f"agents.{other}=frozen"], job)

    def transplant(self, single: Job) -> None:
        self.evaluate(TRANSPLANT, ARMS["team_shared"].preset, [], single)

    def votes(self, single: Job) -> None:
        """Per team arm of the seed, the vote matched to its generated tokens (matched_votes.json), and
        each vote of k > 1 samples evaluated once."""
        last = lambda job: read_condition(job.docs, f"step_{job.eval_files()[-1][0]}")[0]  # noqa: E731
        a_items, matched = last(single), {}
        for arm, job in self.jobs.items():
            if job.arm.team:
                k_rule, t_team, t_single = token_matched_k(last(job), a_items)
                k = QUICK_VOTE_K if self.quick else k_rule
                condition = f"controls/vote_k{k}" if k > 1 else SINGLE
                matched[arm] = {"k": k, "k_rule": k_rule, "tokens_team": round(t_team, 3)}
                matched[arm] |= {"tokens_single": round(t_single, 3), "condition": condition}
        for k in sorted({m["k"] for m in matched.values() if m["k"] > 1}):
            extra = ["harness=majority_vote", f"harness.options.k={k}"]
            self.evaluate(f"vote_k{k}", single.arm.preset, extra, single)
        self.docs.mkdir(parents=True, exist_ok=True)
        write_atomic(self.docs / "matched_votes.json", json.dumps(matched, indent=2, sort_keys=True))


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


def mean(xs: list[float]) -> float | None:
    return round(statistics.fmean(xs), 4) if xs else None


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


# ---- the analysis, from the per-item files ------------------------------------------------


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


# ---- the tables ----------------------------------------------------------------------------


def fmt(x, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def sign(p: dict | None) -> str:
    return "-" if not p else f"{p['better']} / {p['worse']}, p = {p['sign_test_p']:.2g}"


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
            f"({e['failed']}) | {fmt(e['draft'])} → {fmt(e['final'])} | {e['changed']}: {e['fixes']} / {e['breaks']} "
            f"| {c['right']['correct']} / {c['right']['wrong']} / {c['right']['none']} "
            f"| {c['wrong']['correct']} / {c['wrong']['wrong']} / {c['wrong']['none']} | {fmt(e['tpr'], 2)} / "
            f"{fmt(e['tnr'], 2)} / {fmt(e['youden_j'], 2)} | {fmt(e['verdict_right'])} vs {fmt(e['best_constant'])} "
            f"| {fmt(e['missing_verdict'])} | {fmt(e['truncated'])} ({e['cut_calls']['solver']} / "
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
            f"{p} {fmt(g['max'], 2)} / {fmt(g['median'], 2)} ({g['spikes']})" for p, g in r["grad_norm"].items()
        )
        lines.append(
            f"| {r['arm']} | {r['seed']} ({r['run_seed']}) | {fmt(r['before'])} → {fmt(r['after'])} "
            f"| {sign(r['paired'])} | {r['generated_tokens']:,} / {r['trained_tokens']:,} | {norms} "
            f"| {fmt(r['eval_generated_tokens_per_item'], 1)} | {r['eval_truncated']} | {r['wall_s'] / 60:.1f} min |"
        )
    header = (
        "arm | seed (run seed) | held-out before → after | better / worse, p (run vs run) | generated / trained "
        "tokens | grad norm max / median (spikes > 3x) | last eval: tokens per question | last eval: truncated "
        "| wall"
    )
    return md("Every run:", header, lines)


def games_md(rows: list[dict]) -> list[str]:
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


def seats_md(rows: list[dict]) -> list[str]:
    tests = {
        (r["arm"], r["seed"], seat): t
        for r in rows
        for seat in ARMS[r["arm"]].seats
        if seat in r and (t := r[seat]["paired_roles"].get(seat))
    }
    adjusted = holm({f"{k}": t["sign_test_p"] for k, t in tests.items()})
    lines = [
        f"| {arm} | {seed} | {seat} | {fmt(r[seat]['untrained_roles'].get(seat))} | {fmt(r[seat]['roles'].get(seat))} "
        f"| {sign(t)} | {pval(adjusted[str((arm, seed, seat))])} "
        f"| {fmt(r[seat]['untrained_forfeits'].get(seat))} → {fmt(r[seat]['forfeits'].get(seat))} |"
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


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Per-item files go to --results (RESULTS/<arm>/seed<s>/step_<n>, RESULTS/controls/seed<s>/<name>); "
        "the analysis (OUT/team_study.md, .json) is computed from them. Study seed s trains with seed=s x task.size.",
    )
    parser.add_argument("--arms", default="all", help="all, team, credit, selfplay or arm names (comma-separated)")
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[1, 2, 3, 4, 5],
        help="the study's seeds (default 1-5: a test over seeds)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "team_study", help="where the runs go")
    parser.add_argument("--results", type=Path, help="the per-item files (default OUT/results)")
    parser.add_argument("--quick", action="store_true", help="the tiny model, 2 steps: the code paths only")
    parser.add_argument(
        "--no-train",
        action="store_true",
        help="train nothing: the finished runs' analysis (and their missing per-item files and controls)",
    )
    parser.add_argument("--timeout-s", type=float, default=3600, help="the deadline of each training or evaluation")
    args = parser.parse_args(argv)
    try:
        args.arms = pick_arms(args.arms)
        for a in args.arms:
            for s in args.seeds:
                run_seed(s, a.preset)
    except ValueError as e:
        parser.error(str(e))
    args.out = args.out.resolve()
    args.results = (args.results or args.out / "results").resolve()
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    jobs = {
        (a.name, s): Job(a, s, args.out, args.results, args.quick, args.timeout_s)
        for a in args.arms
        for s in args.seeds
    }
    t0, failed = time.perf_counter(), {}  # a run that fails is reported; the others go on
    missing = [j.label for j in jobs.values() if args.no_train and not j.trained()]
    jobs = {key: j for key, j in jobs.items() if j.label not in missing}
    for job in jobs.values():
        try:
            job.export() if args.no_train else job.train()
        except RuntimeError as e:
            failed[job.label] = str(e)
            log(f"{job.label}: FAILED: {e}")
    done = {key: j for key, j in jobs.items() if j.label not in failed}
    controls = {}
    for s in args.seeds:
        seed_jobs = {arm: j for (arm, js), j in done.items() if js == s}
        if seed_jobs:
            for name, what in Controls(s, seed_jobs, args.quick, args.timeout_s).all().items():
                controls[f"{name}/seed{s}"] = what
    rows = [read_run(j) for j in done.values()]
    analysis = analyze(args.results, [a.name for a in args.arms], args.seeds)
    write_atomic(
        args.out / "team_study.json", json.dumps({"runs": rows, "analysis": analysis}, indent=2, allow_nan=False)
    )
    if rows:
        write_atomic(args.out / "team_study.md", report(rows, analysis))
        plot(rows, args.out / "curves.png")
    log(f"wrote {args.out / 'team_study.md'}, {args.out / 'team_study.json'}, {args.out / 'curves.png'}")
    bad = {k: v for k, v in controls.items() if v.startswith("FAILED")}
    print(
        json.dumps(
            {
                "arms": [a.name for a in args.arms],
                "seeds": args.seeds,
                "runs": len(rows),
                "after": {f"{r['arm']}/seed{r['seed']}": r["after"] for r in rows},
                "controls": controls,
                "wall_s": round(time.perf_counter() - t0, 1),
                "failed": failed | bad,
                "not_trained": missing,
                "out": str(args.out),
                "results": str(args.results),
            }
        )
    )
    if failed or bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
