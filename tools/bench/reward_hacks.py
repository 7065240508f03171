"""Bench: the reward-hack corpus (tools/corpora/reward_hacks.py) through each task's real `score()`.

Every hack is scored on the items it fits among each target's first training items (the first
one with `--quick`, up to 20 otherwise), and every item's gold answer too: a hack must score 0
(its reason, the scoring note or WRONG / NO_ANSWER / FORFEIT, is printed), a gold answer 1.
DESIGN invariant 9; tests/tools/test_reward_hacks.py asserts the same on fewer items.

    .venv/bin/python -m tools.bench.reward_hacks [--quick]

A row per target, then a line per hack that paid or gold that failed; the last line is one JSON
object: {"bench": "reward_hacks", "hacks": N, "paid": <hacks scoring > 0 on some item>,
"raised": <hacks whose scoring raised>, "gold_failed": <gold answers scoring < 1>, "unfit": <hacks that
fit no item>, ...}. Exits 1 if any of those is not 0.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

from rollout.log import setup_logging
from tools.corpora import reward_hacks as rh


def target_row(target: str, items: list, per_hack: int) -> tuple[dict, list[str]]:
    """One target's counts, and a line for each hack that paid, raised, fit no item or scored 0 for
    another reason than its own, and for each gold answer that failed."""
    row = dict.fromkeys(("hacks", "unfit", "scored", "paid", "raised", "other_reason", "gold_failed"), 0)
    row["golds"], lines = len(items), []
    for hack in (h for h in rh.HACKS if h.target == target):
        row["hacks"] += 1
        fitting = list(itertools.islice(rh.fits(hack, items), per_hack))
        row["unfit"] += not fitting
        outcomes = [(task.id, text, *_outcome(target, task, text)) for task, text in fitting]
        row["scored"] += len(outcomes)
        paid = [o for o in outcomes if o[2] is not None and o[2] > 0]
        raised = [o for o in outcomes if o[2] is None]
        other = [o for o in outcomes if o[2] == 0 and hack.reason not in o[3]]
        for key, found, what in (("paid", paid, "PAID"), ("raised", raised, "RAISED"), ("other_reason", other, "0")):
            row[key] += bool(found)
            if found:
                i, text, score, why = found[0]
                lines.append(f"  {what} {target}: {hack.label!r} on {len(found)} items, e.g. {i}: {score} ({why[:80]})")
        if not fitting:
            lines.append(f"  {target}: {hack.label!r} fits none of {len(items)} items ({hack.pick})")
    for task in items:
        score, why = _outcome(target, task, rh.gold_text(target, task))
        if score != 1.0:
            row["gold_failed"] += 1
            lines.append(f"  GOLD FAILED {target} {task.id}: {score} ({why[:100]})")
    return row, lines


def _outcome(target: str, task, text: str) -> tuple[float | None, str]:
    """rh.outcome, with a score that raises (a failed trace: rewards review #15's escape) as None."""
    try:
        return rh.outcome(target, task, text)
    except Exception as e:  # reported, not raised: a bench row
        return None, f"{type(e).__name__}: {e}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="20 items a target, each hack on one (else 200, 20)")
    args = parser.parse_args()
    n_items, per_hack = (20, 1) if args.quick else (200, 20)
    t0 = time.perf_counter()
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as workdir:
        for target in rh.TASKS + rh.VERIFIERS:
            rows[target], lines = target_row(target, rh.items(target, n_items, Path(workdir)), per_hack)
            r = rows[target]
            print(
                f"{target:18} hacks {r['hacks']:3}  paid {r['paid']}  golds {r['golds']:3}  failed {r['gold_failed']}"
            )
            for line in lines:
                print(line, flush=True)
    judged = [rh.judge_outcome(h) for h in rh.JUDGE_HACKS]
    rows["verifier=judge"] = {"hacks": len(judged), "paid": sum(score > 0 for score, _ in judged)}
    total = {
        key: sum(r.get(key, 0) for r in rows.values()) for key in ("hacks", "paid", "raised", "gold_failed", "unfit")
    }
    result = {
        "bench": "reward_hacks",
        "quick": args.quick,
        **total,
        "own": sum(h.source == "own" for h in rh.HACKS + rh.JUDGE_HACKS),
        "golds": sum(r.get("golds", 0) for r in rows.values()),
        "other_reason": sum(r.get("other_reason", 0) for r in rows.values()),
        "targets": rows,
        "s": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(result))
    return 1 if any(total[key] for key in ("paid", "raised", "gold_failed", "unfit")) else 0


if __name__ == "__main__":
    setup_logging()  # tracerl's lines on stderr, one format (TRACERL_LOG_LEVEL)
    sys.exit(main())
