"""The relay experiment's main runs (docs/preregistration/relay.md): the three arms per seed, the
evaluation-only controls 2-5, their per-item results, and the pre-registered analysis.

    python -m studies.relay train --lr single_agent=2e-5,team_shared=2e-5,team_lora=2e-4
    python -m studies.relay controls                     # the seeds whose arms are trained
    python -m studies.relay analyze                      # reads docs/results/relay/ only
    python -m studies.relay all --lr ...                 # per seed its arms, then its controls
    python -m studies.relay all --quick --out /tmp/rr/runs --results /tmp/rr/results  # tests

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
every planned seed is in or dropped. The tests are studies/stats.py's (paired_t, bootstrap_ci,
holm, sign_test: the pilot script's at the pre-registration's commit, moved unchanged); the
contrasts, summaries and tables over them studies/contrasts.py's, the jobs' helpers studies/study.py's.
Here: runs.py (an arm x seed by the failure rule), controls.py, analysis.py, report.py (analysis.md).
The last output line of every command is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from studies.relay.analysis import analyze
from studies.relay.controls import Controls
from studies.relay.report import markdown
from studies.relay.runs import ARMS, SEEDS, Run, log, rel
from studies.study import ROOT, pick_arms as pick
from trainer.metrics import write_atomic


def pick_arms(spec: str) -> list[str]:
    """A/single_agent, B/team_shared, C/team_lora, comma-separated."""
    choices = {k: [v] for k, v in ARMS.items()} | {v: [v] for v in ARMS.values()}
    return pick(spec, choices, f"none of {', '.join(f'{k} {v}' for k, v in ARMS.items())}")


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
