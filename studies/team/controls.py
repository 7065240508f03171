"""The team study's evaluation-only controls of one seed, on its trained runs' weights: the
transplant, the token-matched votes, the swapped roles and a game's seats (studies/team/__main__.py
says what each is)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from rollout.trace import read_jsonl
from studies.contrasts import token_matched_k
from studies.items import decoder, read_condition, write_condition
from studies.study import CODE, ROOT, controls_dirs, provenance, run, try_control
from studies.team.arms import ARMS, QUICK, QUICK_VOTE_K, SINGLE, TRANSPLANT, Job, log
from studies.team.records import study_records
from trainer.metrics import write_atomic


@dataclass
class Controls:
    """The evaluation-only controls of one study seed, on its trained runs' weights."""

    seed: int
    jobs: dict[str, Job]  # arm -> its trained job of this seed
    quick: bool
    timeout_s: float

    @property
    def work(self) -> Path:
        job = next(iter(self.jobs.values()))
        return controls_dirs(job.out, job.results, self.seed)[0]

    @property
    def docs(self) -> Path:
        job = next(iter(self.jobs.values()))
        return controls_dirs(job.out, job.results, self.seed)[1]

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
            done[name] = try_control(name, self.seed, partial(fn, what), log)
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
