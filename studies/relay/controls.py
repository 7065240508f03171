"""The relay's evaluation-only controls 2-5 of one seed, on its trained runs' weights: the
transplant, the swapped adapters, the token-matched vote and the oracle calculator
(studies/relay/__main__.py says what each is)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from rollout.trace import read_jsonl
from studies.contrasts import token_matched_k
from studies.items import decoder, read_condition, records, write_condition
from studies.relay.runs import ARMS, QUICK, START_TRIES, Run, log, rel
from studies.study import CODE, ROOT, controls_dirs, provenance, run_script, try_control
from trainer import checkpoint
from trainer.config import compose

# control -> (the arm whose trained weights it evaluates, its scripts/evaluate.py overrides); the analysis
# reads each of them
CONTROLS = {
    "transplant": ("single_agent", ["experiment=relay_team_shared"]),
    "swap": ("team_lora", ["experiment=relay_team_lora", "agents.reader=calculator", "agents.calculator=reader"]),
    "vote": ("single_agent", ["experiment=relay_single_agent", "harness=majority_vote"]),  # + harness.options.k
    "oracle": ("team_lora", ["experiment=relay_team_lora", "harness.options.oracle_calculator=true"]),
}
CONTROL_META = ("wall_s", "k", "k_rule", "tokens_team_lora", "tokens_single_agent", "source")  # reported per control
QUICK_MIN_K = 2  # --quick votes over at least 2 samples, so that the vote's evaluation runs (k_s is 1 there)


def vote_k(team_lora: list[dict], single: list[dict]) -> tuple[int, float, float]:
    """k_s = max(1, round(T_C / T_A)) (a half rounds up), with T_C and T_A the mean generated tokens
    per story of C's and A's last evaluations; (k_s, T_C, T_A): studies.contrasts.token_matched_k."""
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
        return controls_dirs(self.out, self.results, self.seed)[1]

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
                evaluate = (
                    partial(self.vote, overrides)
                    if name == "vote"
                    else partial(self.evaluate, name, overrides, runs[arm])
                )
                done[name] = try_control(name, self.seed, evaluate, log)
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
        work = controls_dirs(self.out, self.results, self.seed)[0]
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
