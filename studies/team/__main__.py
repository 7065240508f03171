"""The multi-agent study with its controls: does training the team beat training one agent?

    python -m studies.team --seeds 1 2 3 4 5          # every arm (hours a seed on a 2-core box)
    python -m studies.team --arms team --seeds 1 2   # role specialisation and its controls
    python -m studies.team --arms credit_global,credit_per_agent --seeds 1
    python -m studies.team --quick --out /tmp/b      # every arm on the tiny model, 2 steps (tests)
    python -m studies.team --no-train                # the analysis of the runs finished so far

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
  generated tokens per question of their last evaluations (studies.contrasts.token_matched_k, the
  relay's rule); k = 1
  is the single agent's own greedy evaluation. controls/seed<s>/matched_votes.json says which vote
  each team arm is compared with. --quick votes over 2 samples whatever the rule says.
- `<arm>_swap` (team_lora, team_full): the trained roles' weights swapped (the verifier's weights
  solve, the solver's verify), on the same held-out questions.
- `<arm>_as_player_a` / `_as_player_b` (selfplay arms): the trained player against the untrained
  model in either seat, compared with the untrained model in both (the run's own step-0 evaluation:
  the same weights, greedy, on the same positions).

Per-item results (studies/items.py's write_condition: <name>.items.jsonl.gz + .meta.json) for
every evaluation, in RESULTS (--results, default OUT/results): RESULTS/<arm>/seed<s>/step_<n> for
each of a run's evaluations, RESULTS/controls/seed<s>/<control> for each control. A team item holds
the draft's score and answer, the verifier's verdict and the calls cut at max_tokens beside the
final answer's. The analysis reads those files (studies/contrasts.py) and writes OUT/team_study.md
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
import sys
import time
from pathlib import Path

from studies.study import ROOT
from studies.team.analysis import analyze
from studies.team.arms import Job, log, pick_arms, run_seed
from studies.team.controls import Controls
from studies.team.report import plot, read_run, report
from trainer.metrics import write_atomic


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
