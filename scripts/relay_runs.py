"""The relay experiment's main runs (docs/preregistration/relay.md): the three arms per seed, the
evaluation-only controls 2-5, their per-item results, and the pre-registered analysis.

    python scripts/relay_runs.py train --lr single_agent=2e-5,team_shared=2e-5,team_lora=2e-4
    python scripts/relay_runs.py controls                     # the seeds whose arms are trained
    python scripts/relay_runs.py analyze                      # reads docs/results/relay/ only
    python scripts/relay_runs.py all --lr ...                 # per seed its arms, then its controls
    python scripts/relay_runs.py all --quick --out /tmp/rr/runs --results /tmp/rr/results  # tests

`train`: for each seed (--seeds, default 1-8) and arm (--arms, default all three) scripts/train.py
experiment=relay_<arm> seed=<s> learner.lr=<the arm's lr> run_dir=OUT/<arm>/seed<s>. A finished
run (summary.json) is kept; a stopped one resumes (the presets' trainer.resume=auto), so rerunning
the command picks up where it stopped. The failure rule: a run whose attempt fails (exits non-zero
or runs past --timeout-s) resumes, up to 3 times; then it is rerun from scratch once (the failed
run dir set aside as seed<s>.failed), with the same 3 resumes; if that fails too, the seed is
dropped (its other arms and controls are not run) and reported. An attempt that stops before the
run begins (nothing in metrics.jsonl: Ray's start timing out, a setup or code error) is not
counted: it is tried again, and 3 in a row stop this script. One stopped from outside (this script
killed) is recorded as interrupted, not counted. Every attempt is in
RESULTS/<arm>/seed<s>/status.json.

`controls`: per seed whose arms are trained, scripts/evaluate.py (greedy) on the trained weights,
as the pre-registration writes them: `transplant` (A's weights in both roles of the relay),
`swap` (C's adapters swapped), `vote` (A's majority vote over k_s samples, k_s = max(1,
round(T_C / T_A)) from the mean generated tokens per story of C's and A's last evaluations; k_s = 1:
A's own greedy evaluation, copied), `oracle` (C's reader with exact arithmetic). A failed evaluation
is tried again (3 tries); a control not done is reported, and done by the next call.

Per-item results (the format of docs/results/relay_pilot/), written as each run or control
finishes: RESULTS/<arm>/seed<s>/step_<N>.items.jsonl.gz and .meta.json for each of the run's
evaluations (steps 0/10/20/30), RESULTS/controls/seed<s>/<control>.items.jsonl.gz and .meta.json.
`analyze` reads only those (and the pilot's, for the positive control's first part) and writes
RESULTS/analysis.json and analysis.md: the pre-registered analysis (docs/preregistration/relay.md,
"Analysis"), below the runs and controls here. A seed is in when every arm's last evaluation and
every control are written; the contrasts are over the seeds in, and the verdict is pending until
every planned seed is in or dropped. The tests are trainer/results.py's (paired_t, bootstrap_ci,
holm, sign_test: scripts/relay.py's at the pre-registration's commit, moved unchanged); the
contrasts, summaries and tables over them trainer/contrasts.py's, the jobs' helpers trainer/jobs.py's.
The last output line of every command is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path

from rollout.trace import read_jsonl
from trainer import checkpoint
from trainer.config import compose
from trainer.contrasts import (
    CONTRAST_HEAD,
    RUN_HEAD,
    STEP_HEAD,
    contrast_rows,
    control_rows,
    final_items,
    holm_family,
    interval,
    items_by_seed,
    load_study,
    mean_ci,
    num,
    paired_contrast,
    pval,
    run_rows,
    run_table_rows,
    seeds_state,
    sign_tests_by_seed,
    step_rows,
    step_table,
    table,
    token_matched_k,
)
from trainer.jobs import eval_steps, provenance, run_script
from trainer.metrics import write_atomic
from trainer.results import decoder, read_condition, read_items, records, sign_test, write_condition

ROOT = Path(__file__).resolve().parents[1]
ARMS = {"A": "single_agent", "B": "team_shared", "C": "team_lora"}
SEEDS = tuple(range(1, 9))
MAX_RESUMES = 3  # the failure rule: a failed run resumes up to 3 times (its rerun from scratch too)
# train.py attempts in a row that stop before the run begins (Ray's start timing out on a loaded box,
# a code error) before this script stops, not counted by the failure rule; tries of an evaluation
START_TRIES = 3
FAILED = ("failed", "timed out")  # outcomes the failure rule counts
# control -> (the arm whose trained weights it evaluates, its scripts/evaluate.py overrides); the analysis
# reads each of them
CONTROLS = {
    "transplant": ("single_agent", ["experiment=relay_team_shared"]),
    "swap": ("team_lora", ["experiment=relay_team_lora", "agents.reader=calculator", "agents.calculator=reader"]),
    "vote": ("single_agent", ["experiment=relay_single_agent", "harness=majority_vote"]),  # + harness.options.k
    "oracle": ("team_lora", ["experiment=relay_team_lora", "harness.options.oracle_calculator=true"]),
}
CONTROL_META = ("wall_s", "k", "k_rule", "tokens_team_lora", "tokens_single_agent", "source")  # reported per control
# --quick: the tiny model, 2 steps of 2 groups of 4 with an evaluation and a checkpoint after each, 8 stories
QUICK = [
    "model=tiny",
    "logger=disabled",
    "trainer.steps=2",
    "trainer.eval_every=1",
    "trainer.save_every=1",
    "trainer.groups_per_step=2",
    "rollout.group_size=4",
    "eval.size=8",
    "task.eval_size=8",
    "engine.kv_cache_gb=0.25",
]
QUICK_MIN_K = 2  # --quick votes over at least 2 samples, so that the vote's evaluation runs (k_s is 1 there)
CODE = ("harnesses", "rollout", "trainer", "scripts", "conf")  # what a run's provenance lists uncommitted changes of
# the analysis (docs/preregistration/relay.md, "Analysis")
PILOT = ROOT / "docs" / "results" / "relay_pilot" / "ops1"
LOST = "weights_lost"  # first runs rerun from scratch after their weights were lost (addendum 3)
ALPHA = 0.05
SUCCESS_EFFECT = Fraction(5, 100)  # mean(C - A) of at least 5 points
CALCULATOR_CEILING = 0.98  # the positive control's exemption: C's calculator right on >= 98% of its calls
RESAMPLES = 10000  # the bootstrap's, with generator seed 0 (bootstrap_ci)


def log(msg: str) -> None:
    print(f"[relay_runs] {msg}", flush=True)


def rel(p: Path) -> str:
    """A path as the commands and the committed files give it: relative to the root if inside it."""
    p = p.resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


# ---- the arms -------------------------------------------------------------------------------


def next_attempt(attempts: list[dict]) -> str:
    """The failure rule's next move: `go` (a start, or a resume after at most MAX_RESUMES failures of
    this phase), `scratch` (the first run failed on its start and its resumes: once more from
    scratch) or `drop` (the rerun failed so too). Interrupted attempts do not count."""
    phase = "scratch" if any(a["phase"] == "scratch" for a in attempts) else "first"
    failures = sum(a["phase"] == phase and a["outcome"] in FAILED for a in attempts)
    if failures <= MAX_RESUMES:
        return "go"
    return "scratch" if phase == "first" else "drop"


@dataclass
class Run:
    arm: str  # preset suffix: single_agent, team_shared, team_lora
    seed: int
    out: Path  # where the run dirs go
    results: Path  # where the per-item files go
    quick: bool = False
    lr: float | None = None  # the arm's swept lr (None: the preset's; --quick only)
    timeout_s: float = 4 * 3600

    @property
    def label(self) -> str:
        return f"{self.arm} seed {self.seed}"

    @property
    def dir(self) -> Path:
        return self.out / self.arm / f"seed{self.seed}"

    @property
    def docs(self) -> Path:
        return self.results / self.arm / f"seed{self.seed}"

    def preset(self) -> list[str]:
        return [f"experiment=relay_{self.arm}", *(QUICK if self.quick else [])]

    def overrides(self) -> list[str]:
        lr = [] if self.lr is None else [f"learner.lr={self.lr:g}"]
        return [f"experiment=relay_{self.arm}", f"seed={self.seed}", *lr, f"run_dir={rel(self.dir)}"] + (
            QUICK if self.quick else []
        )

    def status(self) -> dict:
        path = self.docs / "status.json"
        if path.exists():
            return json.loads(path.read_text())
        return {"arm": self.arm, "seed": self.seed, "overrides": self.overrides(), "state": "new", "attempts": []}

    def save(self, status: dict) -> None:
        status["wall_s"] = round(sum(a["wall_s"] or 0.0 for a in status["attempts"]), 1)
        self.docs.mkdir(parents=True, exist_ok=True)
        write_atomic(self.docs / "status.json", json.dumps(status, indent=2, allow_nan=False))

    def final_step(self) -> int:
        return eval_steps(self.preset())[-1]

    def exported(self) -> bool:
        return all((self.docs / f"step_{n}.meta.json").exists() for n in eval_steps(self.preset()))

    def train(self) -> str:
        """Train (or resume, or keep) this run by the failure rule, then write its per-item files.
        Returns its state: finished or dropped."""
        status = self.status()
        if status["state"] == "dropped" or (status["state"] == "finished" and self.exported()):
            log(f"{self.label}: {status['state']} already ({rel(self.docs / 'status.json')})")
            return status["state"]
        if status["overrides"] != self.overrides():
            raise ValueError(
                f"{self.label}: {rel(self.docs / 'status.json')} was trained with {status['overrides']}, not "
                f"{self.overrides()}: give the same --lr (and --quick), or move that run and its results away"
            )
        for a in status["attempts"]:
            if a["outcome"] == "running":  # this script was stopped during it
                a["outcome"] = "interrupted"
        while not (self.dir / "summary.json").exists():
            move = next_attempt(status["attempts"])
            if move == "drop":
                status["state"] = "dropped"
                self.save(status)
                log(f"{self.label}: DROPPED by the failure rule (see {rel(self.docs / 'status.json')})")
                return "dropped"
            if move == "scratch":
                self.set_aside()
            scratch = move == "scratch" or any(a["phase"] == "scratch" for a in status["attempts"])
            self.attempt(status, "scratch" if scratch else "first")
        self.export(status)
        status["state"] = "finished"
        self.save(status)
        return "finished"

    def set_aside(self) -> None:
        """The failed run dir to seed<s>.failed (its checkpoints deleted), so that the rerun starts
        from scratch; its logs and evaluations stay to be looked at."""
        aside = self.dir.with_name(f"seed{self.seed}.failed")
        shutil.rmtree(aside, ignore_errors=True)
        if self.dir.exists():
            self.dir.rename(aside)
            shutil.rmtree(aside / "checkpoints", ignore_errors=True)
        log(f"{self.label}: failed on its start and {MAX_RESUMES} resumes: rerun from scratch ({rel(aside)} kept)")

    def attempt(self, status: dict, phase: str) -> None:
        n = len(status["attempts"]) + 1
        log_path = self.dir.with_name(f"seed{self.seed}.attempt{n}.log")
        kind = "resume" if checkpoint.latest(self.dir) else "fresh"
        a = {"n": n, "phase": phase, "kind": kind, **provenance(ROOT, CODE)}
        a |= {"started": datetime.now(UTC).isoformat(timespec="seconds"), "outcome": "running", "wall_s": None}
        a["log"] = rel(log_path)
        status["attempts"].append(a)
        status["state"] = "running"
        self.save(status)
        log(f"{self.label}: attempt {n} ({kind}) into {rel(self.dir)} (output: {rel(log_path)})")
        t0, cmd = time.time(), ["scripts/train.py", *self.overrides()]
        try:
            a["outcome"], a["wall_s"] = run_script(cmd, log_path, self.timeout_s, ROOT)
        except BaseException:  # this script is stopping: the run's processes are ended, the attempt recorded
            a["outcome"], a["wall_s"] = "interrupted", round(time.time() - t0, 1)
            self.save(status)
            raise
        metrics = self.dir / "metrics.jsonl"
        if a["outcome"] != "finished" and not (metrics.exists() and metrics.stat().st_mtime >= t0):
            a["outcome"] = "did not start"
        self.save(status)
        log(f"{self.label}: attempt {n} {a['outcome']} after {a['wall_s']:.0f} s")
        tail = [x["outcome"] for x in status["attempts"][-START_TRIES:]]
        if tail == ["did not start"] * START_TRIES:
            raise RuntimeError(
                f"{self.label}: scripts/train.py stopped before the run began {START_TRIES} times in a row (a "
                f"setup or code error, not the run's: the failure rule does not count it); the last output: "
                f"{rel(log_path)}"
            )

    def export(self, status: dict) -> None:
        """Each evaluation of the finished run as per-item files, with the training it took to get
        there: generated and trained tokens, rollout truncations and the training steps' wall time
        (start-up, evaluations and checkpoints left out; a resumed step counted once)."""
        cfg = compose("train", self.overrides())
        rows = [json.loads(line) for line in (self.dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        done = [a for a in status["attempts"] if a["outcome"] == "finished"]
        last = done[-1] if done else {"commit": None, "dirty": None, "phase": "first"}  # finished outside this script
        decode = decoder(self.overrides())
        for step in eval_steps(self.overrides()):
            recs = records(list(read_jsonl(self.dir / "eval" / f"step_{step}.jsonl")), decode)
            assert len(recs) == cfg.eval.size, f"{self.label}: step {step}'s evaluation has {len(recs)} stories"
            steps = [r for r in rows if "rollout/generated_tokens" in r and r["step"] <= step]
            meta = {
                "commit": last["commit"],
                "commits": sorted({a["commit"] for a in status["attempts"] if a["phase"] == last["phase"]} - {None}),
                "dirty": last["dirty"],
                "overrides": self.overrides(),
                "step": step,
                "steps": cfg.trainer.steps,
                "wall_s": round(sum(r["perf/step_s"] for r in steps), 1),
                "generated_tokens": int(sum(r["rollout/generated_tokens"] for r in steps)),
                "trained_tokens": int(sum(r.get("train/trained_tokens", 0) for r in steps)),
                "rollout_truncated": int(sum(r.get("rollout/truncated", 0) for r in steps)),
            }
            write_condition(self.docs, f"step_{step}", recs, meta)
        log(f"{self.label}: per-item files in {rel(self.docs)}")


# ---- the controls ---------------------------------------------------------------------------


def vote_k(team_lora: list[dict], single: list[dict]) -> tuple[int, float, float]:
    """k_s = max(1, round(T_C / T_A)) (a half rounds up), with T_C and T_A the mean generated tokens
    per story of C's and A's last evaluations; (k_s, T_C, T_A): trainer.contrasts.token_matched_k."""
    return token_matched_k(team_lora, single)


@dataclass
class Controls:
    seed: int
    out: Path
    results: Path
    quick: bool = False
    timeout_s: float = 2 * 3600

    @property
    def docs(self) -> Path:
        return self.results / "controls" / f"seed{self.seed}"

    def run(self, arm: str) -> Run:
        return Run(arm, self.seed, self.out, self.results, self.quick)

    def all(self) -> dict[str, str]:
        """Each control not done yet whose arms are trained; control -> what happened (errors too)."""
        runs = {arm: self.run(arm) for arm in ARMS.values()}
        if any(r.status()["state"] == "dropped" for r in runs.values()):
            log(f"seed {self.seed}: dropped: no controls")
            return {name: "seed dropped" for name in CONTROLS}
        done = {}
        for name, (arm, overrides) in CONTROLS.items():
            needs = [arm, "team_lora"] if name == "vote" else [arm]
            if read_condition(self.docs, name) is not None:
                done[name] = "kept"
                log(f"seed {self.seed} {name}: evaluated already ({rel(self.docs)})")
            elif not all(runs[a].exported() for a in needs):
                done[name] = "waits for " + " and ".join(needs)
            else:
                try:
                    self.vote(overrides) if name == "vote" else self.evaluate(name, overrides, runs[arm])
                    done[name] = "done"
                except RuntimeError as e:
                    done[name] = f"FAILED: {e}"
                    log(f"seed {self.seed} {name}: FAILED: {e}")
        if all(what in ("kept", "done") for what in done.values()):
            self.prune(runs.values())
        return done

    @staticmethod
    def prune(runs) -> None:
        """Once every control of the seed is evaluated, each run keeps only its last checkpoint (the
        weights the controls read): 8 seeds' full checkpoints would not fit this box's disk."""
        for run in runs:
            if (newest := checkpoint.latest(run.dir)) is not None:
                for old in checkpoint.prune(run.dir, 1, checkpoint.step_of(newest)):
                    log(f"{run.label}: deleted {rel(old)} (every control evaluated; {newest.name} kept)")

    def vote(self, overrides: list[str]) -> None:
        single, lora = self.run("single_agent"), self.run("team_lora")
        a_items, a_meta = read_condition(single.docs, f"step_{single.final_step()}")
        c_items, _ = read_condition(lora.docs, f"step_{lora.final_step()}")
        k_rule, t_c, t_a = vote_k(c_items, a_items)
        k = max(k_rule, QUICK_MIN_K) if self.quick else k_rule
        extra = {"k": k, "k_rule": k_rule, "tokens_team_lora": round(t_c, 3), "tokens_single_agent": round(t_a, 3)}
        if k > 1:
            self.evaluate("vote", [*overrides, f"harness.options.k={k}"], single, extra)
            return
        source = f"{single.arm}/seed{self.seed}/step_{single.final_step()}"
        meta = {**{key: a_meta[key] for key in ("commit", "dirty", "overrides")}, "source": source, "wall_s": 0.0}
        write_condition(self.docs, "vote", a_items, meta | extra)
        log(f"seed {self.seed} vote: k_s = 1: A's own greedy evaluation ({source})")

    def evaluate(self, name: str, overrides: list[str], run: Run, extra: dict | None = None) -> None:
        """scripts/evaluate.py with `overrides` on the run's final checkpoint; its items to docs."""
        overrides = overrides + (QUICK if self.quick else [])
        newest = checkpoint.latest(run.dir)
        if newest is None or checkpoint.step_of(newest) != run.final_step():
            raise RuntimeError(
                f"{name} needs {run.label}'s trained weights, and {rel(run.dir)} has no step-{run.final_step()} "
                f"checkpoint (run dirs do not outlive a session: train that run again, or drop the control)"
            )
        work = self.out / "controls" / f"seed{self.seed}"
        report, log_path = work / f"{name}.json", work / f"{name}.log"
        prov = provenance(ROOT, CODE)
        log(f"seed {self.seed} {name}: evaluating {rel(run.dir)} (output: {rel(log_path)})")
        cmd = ["scripts/evaluate.py", *overrides, "--model", rel(run.dir), "--out", str(report)]
        for tries in range(1, START_TRIES + 1):  # seeded: a retry evaluates the same (Ray's start times out at times)
            outcome, wall = run_script(cmd, log_path, self.timeout_s, ROOT)
            if outcome == "finished":
                break
            log(f"seed {self.seed} {name}: scripts/evaluate.py {outcome} after {wall:.0f} s (try {tries})")
        else:
            raise RuntimeError(f"scripts/evaluate.py {outcome} {START_TRIES} times; the last output: {rel(log_path)}")
        rep = json.loads(report.read_text())
        recs = records(list(read_jsonl(rep["model"]["traces"])), decoder(overrides))
        size = compose("train", overrides).eval.size
        assert len(recs) == size, f"seed {self.seed} {name}: {len(recs)} stories evaluated, not {size}"
        meta = {**prov, "overrides": overrides, "model": rel(run.dir), "checkpoint": newest.name, "tries": tries}
        write_condition(self.docs, name, recs, meta | {"wall_s": rep["model"]["wall_s"]} | (extra or {}))
        log(f"seed {self.seed} {name}: reward {rep['model']['reward']:.3f} in {wall:.0f} s")


# ---- the analysis (docs/preregistration/relay.md, "Analysis") ---------------------------------


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


# ---- the analysis as markdown ---------------------------------------------------------------


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
        "Written by `python scripts/relay_runs.py analyze` from the per-item files beside it "
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


# ---- the commands ---------------------------------------------------------------------------


def pick_arms(spec: str) -> list[str]:
    names = [ARMS.get(w.strip(), w.strip()) for w in spec.split(",")]
    bad = [n for n in names if n not in ARMS.values()]
    if bad:
        raise ValueError(f"--arms: {bad[0]!r} is none of {', '.join(f'{k} {v}' for k, v in ARMS.items())}")
    return list(dict.fromkeys(names))


def parse_lr(spec: str | None, arms: list[str], quick: bool) -> dict[str, float | None]:
    """--lr single_agent=2e-5,team_shared=..,team_lora=..: each trained arm's swept lr (required but
    with --quick, whose runs take the presets')."""
    lrs: dict[str, float | None] = {}
    for part in filter(None, (spec or "").split(",")):
        name, _, value = part.partition("=")
        arm = ARMS.get(name.strip(), name.strip())
        if arm not in ARMS.values():
            raise ValueError(f"--lr: {name!r} is not an arm ({', '.join(ARMS.values())})")
        try:
            lrs[arm] = float(value)
        except ValueError:
            raise ValueError(f"--lr {name}={value!r}: not a number") from None
        if not lrs[arm] > 0:
            raise ValueError(f"--lr {name}={value}: a learning rate is > 0")
    missing = [a for a in arms if a not in lrs]
    if missing and not quick:
        raise ValueError(
            f"--lr: no learning rate for {', '.join(missing)}; the sweep's choices (the pre-registration's "
            f"addendum) are required, e.g. --lr single_agent=2e-5,team_shared=2e-5,team_lora=2e-4"
        )
    return {a: lrs.get(a) for a in arms}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("train", "controls", "all", "analyze"))
    parser.add_argument("--seeds", type=int, nargs="+", help="default 1-8 (--quick: 1)")
    parser.add_argument("--arms", default="A,B,C", help="A/single_agent, B/team_shared, C/team_lora (comma-separated)")
    parser.add_argument("--lr", help="each arm's lr: single_agent=..,team_shared=..,team_lora=.. (train, all)")
    parser.add_argument("--out", type=Path, help="the run dirs and the controls' reports (default runs/relay)")
    parser.add_argument("--results", type=Path, help="the per-item files and the analysis (default docs/results/relay)")
    parser.add_argument("--quick", action="store_true", help="the tiny model, 2 steps, 8 stories: the code paths only")
    parser.add_argument("--timeout-s", type=float, default=4 * 3600, help="the deadline of each attempt / evaluation")
    args = parser.parse_args(argv)
    if args.quick and (args.out is None or args.results is None):
        parser.error("--quick writes the tiny model's numbers: give --out and --results (not the experiment's)")
    args.seeds = args.seeds or ([1] if args.quick else list(SEEDS))
    args.out = (args.out or ROOT / "runs" / "relay").resolve()
    args.results = (args.results or ROOT / "docs" / "results" / "relay").resolve()
    try:
        args.arms = pick_arms(args.arms)
        args.lrs = parse_lr(args.lr, args.arms, args.quick) if args.command in ("train", "all") else {}
    except ValueError as e:
        parser.error(str(e))
    return args


def write_analysis(results: Path) -> dict:
    a = analyze(results)
    write_atomic(results / "analysis.json", json.dumps(a, indent=2, allow_nan=False))
    write_atomic(results / "analysis.md", markdown(a))
    log(f"wrote {rel(results / 'analysis.json')} and analysis.md: {a['verdict']['text']}")
    return a


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stop ends the runs' processes (run_script)
    t0, runs, controls, error = time.perf_counter(), {}, {}, None
    try:
        for seed in args.seeds if args.command != "analyze" else []:
            for arm in args.arms if args.command in ("train", "all") else []:
                run = Run(arm, seed, args.out, args.results, args.quick, args.lrs[arm], args.timeout_s)
                runs[f"{arm}/seed{seed}"] = state = run.train()
                if state == "dropped":
                    break
            if args.command in ("controls", "all"):
                for name, what in Controls(seed, args.out, args.results, args.quick, args.timeout_s).all().items():
                    controls[f"{name}/seed{seed}"] = what
    except (RuntimeError, ValueError) as e:  # a run that could not start, a run dir of other settings
        error = str(e)
        log(f"STOPPED: {e}")
    summary = {"command": args.command, "runs": runs, "controls": controls, "error": error}
    if args.command in ("analyze", "all") and error is None:
        a = write_analysis(args.results)
        summary |= {"seeds_in": len(a["seeds"]["in"]), "planned": len(a["seeds"]["planned"])}
        summary |= {"verdict": a["verdict"]["text"], "C_vs_A": a["primary"]["C_vs_A"]}
    failed = error is not None or any(str(w).startswith("FAILED") for w in controls.values())
    print(json.dumps(summary | {"wall_s": round(time.perf_counter() - t0, 1), "results": rel(args.results)}))
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
