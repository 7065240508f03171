"""The relay experiment's pilot gate (docs/preregistration/relay.md): untrained evaluations only.

    python -m studies.relay.pilot --operations 2 --out docs/results/relay_pilot/ops2   # ~10 min here
    python -m studies.relay.pilot --operations 1 --quick --out /tmp/pilot              # tiny model (tests)

Runs scripts/evaluate.py (greedy, on the held-out stories of task=story_sum) on the untrained
model three ways, one after another: `single` (experiment=relay_single_agent, max_tokens the
team's whole budget), `team` (experiment=relay_team_shared) and `oracle` (the team with
harness.options.oracle_calculator=true, the positive control). Each condition's per-item results
go to OUT/<condition>.items.jsonl.gz (id, reward, role rewards, generated tokens by role,
truncation, answer; the relay's expression and calculator steps); an evaluation already there is
reused. OUT/pilot.json holds the gate's three criteria (section 3.3 of the results review):

1. the untrained team is not below the untrained single agent by more than 5 points;
2. each role's sub-task accuracy (the reader's expression right; the calculator's calls right)
   lies in [0.15, 0.8];
3. the single agent's accuracy is at most 0.5;

the generated tokens per trace of each condition (arm A's and the majority vote's token matching),
and the seeds the main runs need (5, or 8 when 5 cannot detect 8 points). Its last output line is
a JSON summary. The items and their files are studies/items.py's, the sign test studies/stats.py's.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from fractions import Fraction
from pathlib import Path

from rollout.models import resolve_model
from rollout.trace import read_jsonl
from studies.items import head_commit, item, item_number, read_items, write_items
from studies.stats import mean, sign_test
from studies.study import ROOT, run
from trainer.config import compose
from trainer.metrics import write_atomic

CONDITIONS = {
    "single": ["experiment=relay_single_agent"],
    "team": ["experiment=relay_team_shared"],
    "oracle": ["experiment=relay_team_shared", "harness.options.oracle_calculator=true"],
}
QUICK = ["model=tiny", "logger=disabled", "eval.size=8", "task.eval_size=8", "engine.kv_cache_gb=0.25"]
ROLE_RANGE = (0.15, 0.8)  # criterion 2
MAX_SINGLE = 0.5  # criterion 3
MAX_TEAM_DEFICIT = Fraction(5, 100)  # criterion 1: points the team may lie below the single agent
# The sd of a per-seed C - A difference from training-seed noise alone: results review section 2.5
# (from the 2026-12-05 team study's ten team-minus-single differences; a rough estimate).
SEED_SD = 0.043
# Student t quantiles (0.975, 0.8) by degrees of freedom: a paired t-test over seeds at alpha 0.05,
# two-sided, with 80% power (5 and 8 seeds).
T_QUANTILES = {4: (2.776, 0.941), 7: (2.365, 0.896)}
TARGET_EFFECT = 0.08  # the smallest C - A difference the main runs must detect with 80% power


def gate(single: list[dict], team: list[dict]) -> dict:
    """The three criteria on the untrained single agent's and team's items (the same items)."""
    assert [r["id"] for r in single] == [r["id"] for r in team], "the conditions must hold the same items"
    n = len(team)
    right = {k: sum(r["reward"] >= 1.0 for r in recs) for k, recs in (("single", single), ("team", team))}
    calls = [c for r in team for c in r.get("calculator_right", [])]
    # a failed trace (no role rewards) counts as the reader's miss
    roles = {"reader": mean(r.get("roles", {}).get("reader", 0.0) for r in team), "calculator": mean(calls)}
    return {
        "team_not_below_single": {
            "team": round(right["team"] / n, 4),
            "single": round(right["single"] / n, 4),
            "pass": Fraction(right["team"] - right["single"], n) >= -MAX_TEAM_DEFICIT,
        },
        "roles_in_range": {
            **roles,
            "calculator_calls": len(calls),
            "pass": all(v is not None and ROLE_RANGE[0] <= v <= ROLE_RANGE[1] for v in roles.values()),
        },
        "single_at_most_half": {"single": round(right["single"] / n, 4), "pass": right["single"] / n <= MAX_SINGLE},
    }


def seeds_needed(single: list[dict], team: list[dict]) -> dict:
    """5 seeds, or 8 if 5 cannot detect TARGET_EFFECT: the item noise of a per-seed difference from
    the pilot's team-vs-single discordance on these items, the seed noise from SEED_SD."""
    n = len(team)
    diffs = [t["reward"] - s["reward"] for s, t in zip(single, team)]
    item_sd = math.sqrt(statistics.pvariance(diffs) / n)
    sd = math.hypot(item_sd, SEED_SD)
    mde = {seeds: round(sum(T_QUANTILES[seeds - 1]) * sd / math.sqrt(seeds), 4) for seeds in (5, 8)}
    return {
        "discordant": sum(d != 0 for d in diffs),
        "item_sd": round(item_sd, 4),
        "per_seed_sd": round(sd, 4),
        "mde": mde,
        "seeds": 5 if mde[5] <= TARGET_EFFECT else 8,
    }


def tokens(recs: list[dict]) -> dict:
    roles = sorted({r for rec in recs for r in rec["tokens_by_role"]})
    return {
        "per_trace": mean(r["tokens"] for r in recs),
        "by_role": {role: mean(r["tokens_by_role"].get(role, 0) for r in recs) for role in roles},
        "truncated": sum(r["truncated"] for r in recs),
        "failed": sum(r["failed"] for r in recs),
    }


# ---- running the evaluations -------------------------------------------------------------------


def run_condition(name: str, overrides: list[str], out: Path, work: Path, timeout_s: float) -> list[dict]:
    """scripts/evaluate.py on one condition, the traces' items in task order. The items file and
    OUT/<name>.meta.json (the commit evaluated, the overrides, the wall time) are kept in `out`
    and reused."""
    path, meta = out / f"{name}.items.jsonl.gz", out / f"{name}.meta.json"
    if path.exists() and meta.exists():
        print(f"[relay] {name}: evaluated already ({path})", flush=True)
        return read_items(path)
    commit = head_commit(ROOT)
    report, log = work / f"{name}.json", work / f"{name}.log"
    cmd = ["scripts/evaluate.py", *overrides, "--out", str(report)]
    print(f"[relay] {name}: {' '.join(cmd)} (output: {log})", flush=True)
    run(cmd, log, timeout_s)  # in its own process group, ended with it
    cfg = compose("train", overrides)
    model = cfg.policy_model(cfg.trainable_policies()[0])
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(resolve_model(model.name, model.path)) / "tokenizer.json"))
    traces = read_jsonl(json.loads(report.read_text())["model"]["traces"])
    recs = sorted((item(t, lambda ids: tok.decode(ids, skip_special_tokens=True)) for t in traces), key=item_number)
    write_items(path, recs)
    wall = json.loads(report.read_text())["model"]["wall_s"]
    write_atomic(meta, json.dumps({"commit": commit, "overrides": overrides, "wall_s": wall}, indent=2))
    return recs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--operations", type=int, choices=(1, 2), required=True, help="task.params.operations")
    parser.add_argument("--out", type=Path, required=True, help="where the items files and pilot.json go")
    parser.add_argument("--work", type=Path, help="the evaluations' reports and traces (default runs/relay_pilot/opsK)")
    parser.add_argument("--quick", action="store_true", help="the tiny model, 8 items: the code paths only")
    parser.add_argument("--timeout-s", type=float, default=3600, help="the deadline of each evaluation")
    args = parser.parse_args(argv)
    work = args.work or ROOT / "runs" / "relay_pilot" / f"ops{args.operations}"
    for d in (args.out, work):
        d.mkdir(parents=True, exist_ok=True)
    team_max = compose("train", CONDITIONS["team"]).sampling.max_tokens  # per call
    common = [f"task.params.operations={args.operations}", *(QUICK if args.quick else [])]
    overrides = {name: [*over, *common] for name, over in CONDITIONS.items()}
    overrides["single"].append(f"sampling.max_tokens={(args.operations + 1) * team_max}")  # the team's calls
    recs = {name: run_condition(name, over, args.out, work, args.timeout_s) for name, over in overrides.items()}
    criteria = gate(recs["single"], recs["team"])
    summary = {
        "operations": args.operations,
        "items": len(recs["team"]),
        # per condition: the commit evaluated (uncommitted changes aside), its overrides and wall time
        "evaluations": {name: json.loads((args.out / f"{name}.meta.json").read_text()) for name in recs},
        "accuracy": {name: mean(r["reward"] for r in rs) for name, rs in recs.items()},
        "gate": criteria,
        "passed": all(c["pass"] for c in criteria.values()),
        "tokens": {name: tokens(rs) for name, rs in recs.items()},
        "seeds": seeds_needed(recs["single"], recs["team"]),
        # the positive control's item-level check, and the harness effect (before training)
        "oracle_vs_team": sign_test(recs["team"], recs["oracle"]),
        "team_vs_single": sign_test(recs["single"], recs["team"]),
    }
    write_atomic(args.out / "pilot.json", json.dumps(summary, indent=2, allow_nan=False))
    print(f"[relay] wrote {args.out / 'pilot.json'}", flush=True)
    print(json.dumps({k: summary[k] for k in ("operations", "items", "accuracy", "passed")} | {"out": str(args.out)}))


if __name__ == "__main__":
    main()
