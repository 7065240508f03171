"""Bench: how long a task's score() takes on hostile answers (issue 26), per task and payload.

Each payload is scored through the task's own `score()` (the shipped tasks: our own parse and
checks, in process; another dataset's answer goes on to its sandboxed verifier); the median of a
few calls is reported in milliseconds, with the gold answer's time beside it for scale.
tools/bench/reward_hacks.py is its companion: answers built to be paid, not to run code.

    .venv/bin/python -m tools.bench.hostile [--quick]

The last line printed is one JSON object: {"hostile_ms": {task: {payload: ms}}, ...}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from harnesses.tasks.reasoning_gym import ReasoningGymTasks
from harnesses.verifiers.sandbox import SandboxError
from rollout.log import setup_logging
from tools.corpora.hostile_answers import TASKS, payloads


def median_ms(score, text: str, repeats: int) -> float | str:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        try:
            score(text)
        except SandboxError as e:  # reported, not raised: a bench row, not a test
            return f"SandboxError: {e}"
        times.append((time.perf_counter() - t0) * 1e3)
    return round(statistics.median(times), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 calls per payload instead of 15")
    args = parser.parse_args()
    repeats = 3 if args.quick else 15
    target = Path(tempfile.mkdtemp()) / "F"
    texts = {label: f"<answer>{p}</answer>" for label, p in payloads(target).items()}
    texts["unclosed tags"] = "<answer>" * 50000
    rows: dict[str, dict[str, float | str]] = {}
    for name in TASKS:
        task = ReasoningGymTasks(name, eval_size=0).train_task(0)
        gold = f"<answer>{task.answer}</answer>"
        task.score(gold)  # the sandbox process is up
        rows[name] = {"gold": median_ms(task.score, gold, repeats)}
        rows[name].update({label: median_ms(task.score, text, repeats) for label, text in texts.items()})
        print(name, rows[name], flush=True)
    worst = max(v for row in rows.values() for k, v in row.items() if k != "gold" and isinstance(v, float))
    print(
        json.dumps(
            {
                "bench": "hostile",
                "quick": args.quick,
                "repeats": repeats,
                "file_created": target.exists(),
                "worst_hostile_ms": worst,
                "hostile_ms": rows,
            }
        )
    )


if __name__ == "__main__":
    setup_logging()  # tracerl's lines on stderr, one format (TRACERL_LOG_LEVEL)
    main()
