"""The suite's budget in a unit of the box it runs on. Boxes differ two-fold in speed (the same fresh
clone's suite took 19.3 minutes on one and 46.4 on another), so a budget in seconds holds on one box
only. The yardstick is the time of a fixed pure-Python loop, the sum of i*i for i below 20 million
(one core, no I/O: 1.3 to 2.7 s on this project's 2-core boxes; the best of three tries); a time divided by it is a
count of yardsticks, which moves much less from box to box. Budgets: `make test` 600, `.ci/run` 900.

    python -m tests.yardstick                          # the yardstick of this box, now
    python -m tests.yardstick "make test=T0:T1" ...    # each phase (epoch seconds) in yardsticks

`tests/conftest.py` prints the pytest session's time in yardsticks where `TRACERL_YARDSTICK=1`
(`make test`, `make test-studies`); `.ci/run` prints each of its steps' and its own."""

from __future__ import annotations

import sys
import time

LOOP_N = 20_000_000
BUDGETS = {"make test": 600, ".ci/run": 900}


def yardstick_s(tries: int = 3) -> float:
    """Seconds this process takes to sum i*i for i below LOOP_N: the best of `tries` (on a shared box
    one try reads 1.3 to 2.0 s within a minute)."""
    best = float("inf")
    for _ in range(tries):
        t0 = time.perf_counter()
        total = sum(i * i for i in range(LOOP_N))
        best = min(best, time.perf_counter() - t0)
    assert total == (LOOP_N - 1) * LOOP_N * (2 * LOOP_N - 1) // 6
    return best


def line(name: str, seconds: float, yardstick: float) -> str:
    """`name`'s time in seconds, minutes and yardsticks, against its budget if it has one."""
    count = seconds / yardstick
    text = f"{name}: {seconds:.0f} s ({seconds / 60:.1f} min) = {count:.0f} yardsticks"
    if name in BUDGETS:
        budget = BUDGETS[name]
        text += f" (budget {budget}: {'within' if count <= budget else 'OVER'})"
    return text


def main(phases: list[str]) -> None:
    y = yardstick_s()
    print(f"yardstick (sum of i*i for i < {LOOP_N:,}, pure Python, one core): {y:.2f} s")
    for phase in phases:
        name, _, span = phase.rpartition("=")
        start, _, end = span.partition(":")
        print(line(name, float(end) - float(start), y))


if __name__ == "__main__":
    main(sys.argv[1:])
