"""The relay experiment's main runs (docs/preregistration/relay.md): one arm x seed trained by the
failure rule (studies/relay/__main__.py says it), and its evaluations written as per-item files."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from rollout.trace import read_jsonl
from studies.items import decoder, records, write_condition
from studies.study import CODE, ROOT, Seeded, eval_steps, logger, provenance, run_script
from trainer import checkpoint
from trainer.config import compose
from trainer.metrics import write_atomic

ARMS = {"A": "single_agent", "B": "team_shared", "C": "team_lora"}
SEEDS = tuple(range(1, 9))
MAX_RESUMES = 3  # the failure rule: a failed run resumes up to 3 times (its rerun from scratch too)
# train.py attempts in a row that stop before the run begins (Ray's start timing out on a loaded box,
# a code error) before this script stops, not counted by the failure rule; tries of an evaluation
START_TRIES = 3
FAILED = ("failed", "timed out")  # outcomes the failure rule counts
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

log = logger("relay_runs")


def rel(p: Path) -> str:
    """A path as the commands and the committed files give it: relative to the root if inside it."""
    p = p.resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


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
class Run(Seeded):
    """One arm x seed of the relay's main runs."""

    arm: str  # preset suffix: single_agent, team_shared, team_lora
    seed: int
    out: Path  # where the run dirs go
    results: Path  # where the per-item files go
    quick: bool = False
    lr: float | None = None  # the arm's swept lr (None: the preset's; --quick only)
    timeout_s: float = 4 * 3600

    @property
    def arm_name(self) -> str:
        return self.arm

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
