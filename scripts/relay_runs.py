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
RESULTS/analysis.json and analysis.md. The last output line of every command is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from harnesses.programs.majority_vote import majority
from rollout.models import resolve_model
from rollout.trace import Trace, read_jsonl
from trainer import checkpoint
from trainer.config import compose
from trainer.metrics import write_atomic

try:
    from scripts import relay, relay_analysis
except ModuleNotFoundError:  # `python scripts/relay_runs.py`: scripts/ is on sys.path, the repository root is not
    import relay
    import relay_analysis

ROOT = relay.ROOT
ARMS, SEEDS, read_condition = relay_analysis.ARMS, relay_analysis.SEEDS, relay_analysis.read_condition
MAX_RESUMES = 3  # the failure rule: a failed run resumes up to 3 times (its rerun from scratch too)
# train.py attempts in a row that stop before the run begins (Ray's start timing out on a loaded box,
# a code error) before this script stops, not counted by the failure rule; tries of an evaluation
START_TRIES = 3
FAILED = ("failed", "timed out")  # outcomes the failure rule counts
# control -> (the arm whose trained weights it evaluates, its scripts/evaluate.py overrides)
CONTROLS = {
    "transplant": ("single_agent", ["experiment=relay_team_shared"]),
    "swap": ("team_lora", ["experiment=relay_team_lora", "agents.reader=calculator", "agents.calculator=reader"]),
    "vote": ("single_agent", ["experiment=relay_single_agent", "harness=majority_vote"]),  # + harness.options.k
    "oracle": ("team_lora", ["experiment=relay_team_lora", "harness.options.oracle_calculator=true"]),
}
assert tuple(CONTROLS) == relay_analysis.CONTROLS, "the analysis reads every control this script runs"
# --quick: the tiny model, 2 steps of 2 groups of 4 with an evaluation after each, 8 stories
QUICK = [
    "model=tiny",
    "logger=disabled",
    "trainer.steps=2",
    "trainer.eval_every=1",
    "trainer.groups_per_step=2",
    "rollout.group_size=4",
    "eval.size=8",
    "task.eval_size=8",
    "engine.kv_cache_gb=0.25",
]
QUICK_MIN_K = 2  # --quick votes over at least 2 samples, so that the vote's evaluation runs (k_s is 1 there)
CODE = ("harnesses", "rollout", "trainer", "scripts", "conf")  # what a run's provenance lists uncommitted changes of


def log(msg: str) -> None:
    print(f"[relay_runs] {msg}", flush=True)


def rel(p: Path) -> str:
    """A path as the commands and the committed files give it: relative to the root if inside it."""
    p = p.resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def provenance() -> dict:
    """The commit the code runs at, and the code files that differ from it or are not in it (git
    status of harnesses/ rollout/ trainer/ scripts/ conf/): the checkout is shared, so uncommitted
    work runs too, and is recorded."""
    lines = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=normal", "--", *CODE],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    return {"commit": relay.head_commit(), "dirty": sorted(line[3:] for line in lines if line.strip())}


# ---- running a script of ours ---------------------------------------------------------------


def run_script(args: list[str], log_path: Path, timeout_s: float) -> tuple[str, float]:
    """`python <args>` from the root, its output to `log_path`: (finished | failed | timed out, wall
    seconds). Its process group (the job's Ray and engines) is ended on a timeout, and when this
    script stops (Ctrl-C, SIGTERM), so that nothing of it outlives the attempt."""
    t0 = time.perf_counter()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            outcome = "finished" if proc.wait(timeout=timeout_s) == 0 else "failed"
        except subprocess.TimeoutExpired:
            outcome = "timed out"
        finally:
            end_group(proc)
    return outcome, round(time.perf_counter() - t0, 1)


def end_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the process's group (its own shutdown ends Ray), then SIGKILL to what is left."""
    for sig, grace_s in ((signal.SIGTERM, 60), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # the group is gone
            return
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass


# ---- per-item files -------------------------------------------------------------------------


def decoder(overrides: list[str]):
    """The token decoder of the composed run's first trained policy (as scripts/relay.py's)."""
    from tokenizers import Tokenizer

    cfg = compose("train", overrides)
    model = cfg.policy_model(cfg.trainable_policies()[0])
    tok = Tokenizer.from_file(str(Path(resolve_model(model.name, model.path)) / "tokenizer.json"))
    return lambda ids: tok.decode(ids, skip_special_tokens=True)


def records(traces: list[Trace], decode) -> list[dict]:
    """relay.item() of each trace, in task order. A majority vote's answer is the voted one and its
    samples' answers are kept (item() reads the last sample)."""
    recs = []
    for t in traces:
        rec = relay.item(t, decode)
        if "votes" in t.info:  # harnesses/programs/majority_vote.py
            answers = t.info["answers"]
            rec.update(answer=answers[majority(answers)], answers=answers, votes=t.info["votes"])
        recs.append(rec)
    return sorted(recs, key=relay.task_number)


def write_condition(folder: Path, name: str, recs: list[dict], meta: dict) -> None:
    """<name>.items.jsonl.gz, then <name>.meta.json: a meta file means the items are whole."""
    folder.mkdir(parents=True, exist_ok=True)
    relay.write_items(folder / f"{name}.items.jsonl.gz", recs)
    write_atomic(folder / f"{name}.meta.json", json.dumps(meta, indent=2, allow_nan=False))


def eval_steps(overrides: list[str]) -> list[int]:
    """The steps a run of these overrides evaluates at (trainer/loop.py: the start, every
    eval_every, the last)."""
    t = compose("train", overrides).trainer
    return sorted({0, t.steps} | (set(range(t.eval_every, t.steps + 1, t.eval_every)) if t.eval_every else set()))


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
        a = {"n": n, "phase": phase, "kind": kind, **provenance()}
        a |= {"started": datetime.now(UTC).isoformat(timespec="seconds"), "outcome": "running", "wall_s": None}
        a["log"] = rel(log_path)
        status["attempts"].append(a)
        status["state"] = "running"
        self.save(status)
        log(f"{self.label}: attempt {n} ({kind}) into {rel(self.dir)} (output: {rel(log_path)})")
        t0 = time.time()
        try:
            a["outcome"], a["wall_s"] = run_script(["scripts/train.py", *self.overrides()], log_path, self.timeout_s)
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
    per story of C's and A's last evaluations; (k_s, T_C, T_A)."""
    t_c, t_a = (statistics.fmean(r["tokens"] for r in recs) for recs in (team_lora, single))
    if t_a == 0:
        raise ValueError("the single agent's last evaluation generated no tokens: k_s = T_C / T_A is undefined")
    return max(1, math.floor(t_c / t_a + 0.5)), t_c, t_a


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
        return done

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
        prov = provenance()
        log(f"seed {self.seed} {name}: evaluating {rel(run.dir)} (output: {rel(log_path)})")
        cmd = ["scripts/evaluate.py", *overrides, "--model", rel(run.dir), "--out", str(report)]
        for tries in range(1, START_TRIES + 1):  # seeded: a retry evaluates the same (Ray's start times out at times)
            outcome, wall = run_script(cmd, log_path, self.timeout_s)
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
    a = relay_analysis.analyze(results)
    write_atomic(results / "analysis.json", json.dumps(a, indent=2, allow_nan=False))
    write_atomic(results / "analysis.md", relay_analysis.markdown(a))
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
