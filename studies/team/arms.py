"""The team study's arms (conf/experiment/study_*.yaml), the study seed's run seed, and the job
that trains one arm x seed and writes its per-item files (studies/team/__main__.py says how the
study runs)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from rollout.trace import read_jsonl
from studies.items import decoder, read_condition, write_condition
from studies.study import CODE, ROOT, Seeded, logger, pick_arms as pick, provenance, run
from studies.team.records import study_records
from trainer.config import compose

log = logger("team_study")


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


def pick_arms(spec: str) -> list[Arm]:
    """`all`, a question (team, credit, selfplay) or arm names, comma-separated."""
    questions = {a.question for a in ARMS.values()}
    choices = {"all": list(ARMS)} | {q: [n for n, a in ARMS.items() if a.question == q] for q in questions}
    refused = f"not all, a question (team, credit, selfplay) or an arm ({list(ARMS)})"
    return [ARMS[n] for n in pick(spec, choices | {n: [n] for n in ARMS}, refused)]


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


# ---- the runs -----------------------------------------------------------------------------


@dataclass
class Job(Seeded):
    """One arm x seed of the study: its training run and its evaluations' per-item files."""

    arm: Arm
    seed: int  # the study's seed
    out: Path
    results: Path
    quick: bool
    timeout_s: float

    @property
    def arm_name(self) -> str:
        return self.arm.name

    @property
    def run_seed(self) -> int:
        return run_seed(self.seed, self.arm.preset)

    def overrides(self) -> list[str]:
        return [f"experiment={self.arm.preset}", f"seed={self.run_seed}", *(QUICK if self.quick else [])]

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
