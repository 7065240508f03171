"""The relay experiment's pilot gate (docs/preregistration/relay.md): untrained evaluations only.

    python scripts/relay.py --operations 2 --out docs/results/relay_pilot/ops2   # ~10 min here
    python scripts/relay.py --operations 1 --quick --out /tmp/pilot              # tiny model (tests)

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
a JSON summary.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

from harnesses.verifiers.answers import extract_answer
from rollout.models import resolve_model
from rollout.trace import Trace, read_jsonl
from trainer.config import compose
from trainer.metrics import write_atomic

ROOT = Path(__file__).resolve().parents[1]

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


def item(trace: Trace, decode) -> dict:
    """One evaluated item in short."""
    rec = {
        "id": trace.info.get("task", trace.group),
        "reward": trace.reward,
        "tokens": trace.num_generated_tokens,
        "tokens_by_role": {
            r: sum(len(s.completion_ids) for s in trace.sequences if s.agent == r) for r in trace.agents
        },
        "truncated": trace.status == "truncated",
        "failed": trace.status == "failed",
    }
    if trace.agent_rewards:
        rec["roles"] = trace.agent_rewards
    if "expression" in trace.info:  # harnesses/programs/relay.py
        rec.update({k: trace.info[k] for k in ("expression", "steps", "calculator_right")})
        rec["answer"] = trace.info["final"]
    else:
        rec["answer"] = extract_answer(decode(trace.sequences[-1].completion_ids)) if trace.sequences else None
    return rec


def mean(xs) -> float | None:
    xs = list(xs)
    return round(statistics.fmean(xs), 4) if xs else None


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


# ---- the pre-registered analysis (docs/preregistration/relay.md) ---------------------------------


def sign_test(before: list[dict], after: list[dict]) -> dict:
    """Items that got better / worse from `before` to `after` (the same items), and the exact
    two-sided binomial p of that split (McNemar's exact test; ties dropped)."""
    assert [r["id"] for r in before] == [r["id"] for r in after], "the conditions must hold the same items"
    better = sum(a["reward"] > b["reward"] for b, a in zip(before, after))
    worse = sum(a["reward"] < b["reward"] for b, a in zip(before, after))
    n, k = better + worse, min(better, worse)
    p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n) if n else 1.0
    return {"better": better, "worse": worse, "p": p}


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (Lentz's method, as in
    Numerical Recipes' betacf)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with `df` degrees of freedom: I_x(df/2, 1/2), x = df/(df+t^2)."""
    x, a, b = df / (df + t * t), df / 2.0, 0.5
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def paired_t(diffs: list[float]) -> dict:
    """The paired t-test over seeds of per-seed differences: mean, t, two-sided p (n - 1 df)."""
    n, m = len(diffs), statistics.fmean(diffs)
    assert n >= 2, "a paired t-test needs at least 2 seeds"
    sd = statistics.stdev(diffs)
    if sd == 0.0:
        return {"seeds": n, "mean": m, "t": math.copysign(math.inf, m) if m else 0.0, "p": 0.0 if m else 1.0}
    t = m / (sd / math.sqrt(n))
    return {"seeds": n, "mean": m, "t": t, "p": t_two_sided_p(t, n - 1)}


def bootstrap_ci(a: list[list[float]], c: list[list[float]], resamples: int = 10000, seed: int = 0) -> tuple:
    """95% two-level bootstrap CI of mean over seeds of (mean c - mean a): resample seeds, then
    within each drawn seed its items (one item draw for both arms: they stay paired).
    a[s][i], c[s][i]: the reward of item i in seed s."""
    import numpy as np

    d = np.asarray(c, dtype=float) - np.asarray(a, dtype=float)  # (seeds, items)
    rng = np.random.default_rng(seed)
    seeds, items = d.shape
    stats = []
    for start in range(0, resamples, 500):  # in chunks: (500, seeds, items) indices at a time
        n = min(500, resamples - start)
        picks = rng.integers(0, seeds, size=(n, seeds))
        rows = rng.integers(0, items, size=(n, seeds, items))
        stats.append(d[picks[..., None], rows].mean(axis=(1, 2)))
    stats = np.concatenate(stats)
    return float(np.percentile(stats, 2.5)), float(np.percentile(stats, 97.5))


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm-adjusted p-values of a family (step-down, monotone, capped at 1)."""
    order = sorted(pvalues, key=pvalues.get)
    adjusted, running = {}, 0.0
    for rank, name in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * pvalues[name]))
        adjusted[name] = running
    return adjusted


# ---- running the evaluations -------------------------------------------------------------------


def task_number(rec: dict) -> int:
    return int(rec["id"].rsplit("/", 1)[1])  # "story_sum/eval/17"


def write_items(path: Path, recs: list[dict]) -> None:
    with path.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as out:  # the same bytes each time
        out.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in recs).encode())


def read_items(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def head_commit() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def run_condition(name: str, overrides: list[str], out: Path, work: Path, timeout_s: float) -> list[dict]:
    """scripts/evaluate.py on one condition, the traces' items in task order. The items file and
    OUT/<name>.meta.json (the commit evaluated, the overrides, the wall time) are kept in `out`
    and reused."""
    path, meta = out / f"{name}.items.jsonl.gz", out / f"{name}.meta.json"
    if path.exists() and meta.exists():
        print(f"[relay] {name}: evaluated already ({path})", flush=True)
        return read_items(path)
    commit = head_commit()
    report, log = work / f"{name}.json", work / f"{name}.log"
    cmd = [sys.executable, "scripts/evaluate.py", *overrides, "--out", str(report)]
    print(f"[relay] {name}: {' '.join(cmd[1:])} (output: {log})", flush=True)
    with log.open("w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s)
    if proc.returncode:
        raise RuntimeError(f"scripts/evaluate.py exited {proc.returncode} on {name}; its output: {log}")
    cfg = compose("train", overrides)
    model = cfg.policy_model(cfg.trainable_policies()[0])
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(resolve_model(model.name, model.path)) / "tokenizer.json"))
    traces = read_jsonl(json.loads(report.read_text())["model"]["traces"])
    recs = sorted((item(t, lambda ids: tok.decode(ids, skip_special_tokens=True)) for t in traces), key=task_number)
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
