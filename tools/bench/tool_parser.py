"""Bench: the gateway's tool-call parser on degenerate model output (issue 26, review H2).

Times `rollout.gateway.tool_calls.parse_tool_calls` on `<tool_call>` + 100,000 spaces, 100,000 newlines,
a call padded with 100,000 spaces, 10,000 unclosed `<tool_call>` tags and a normal reply, and the regex it replaced
(`<tool_call>\\s*(.*?)\\s*</tool_call>`, cubic in the whitespace) on 1,000 and 2,000 spaces.
Goal: 100k spaces in < 50 ms. The last line is one JSON object.

    python -m tools.bench.tool_parser [--quick]  # --quick: seconds, for the test suite
"""

from __future__ import annotations

import argparse
import json
import re
import time

from rollout.gateway.tool_calls import parse_tool_calls
from rollout.log import setup_logging

_OLD = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
NORMAL = (
    'Let me compute that.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 * 23"}}\n</tool_call>'
)


def best_ms(fn, repeats: int) -> float:
    """The fastest of `repeats` runs, in ms (the least disturbed by the rest of the machine)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(min(times) * 1000, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats; the old regex on 1,000 spaces only")
    args = parser.parse_args()
    repeats = 3 if args.quick else 10
    inputs = {
        "spaces_100k": "<tool_call>" + " " * 100_000,
        "newlines_100k": "<tool_call>" + "\n" * 100_000,
        "padded_call_100k": "<tool_call>" + " " * 50_000 + NORMAL.split("\n")[2] + " " * 50_000 + "</tool_call>",
        "unclosed_10k": "<tool_call>" * 10_000,
        "normal": NORMAL,
    }
    result = {
        "new_ms": {name: best_ms(lambda t=text: parse_tool_calls(t, "s", 0), repeats) for name, text in inputs.items()}
    }
    assert parse_tool_calls(NORMAL, "s", 0)[1][0]["name"] == "calculator"
    result["old_regex_ms"] = {
        f"spaces_{n}": best_ms(lambda n=n: list(_OLD.finditer("<tool_call>" + " " * n)), 1)
        for n in ((1000,) if args.quick else (1000, 2000))
    }
    result["goal_met"] = result["new_ms"]["spaces_100k"] < 50
    for name, ms in result["new_ms"].items():
        print(f"new parser   {name:>14}: {ms:10.3f} ms")
    for name, ms in result["old_regex_ms"].items():
        print(f"old regex    {name:>14}: {ms:10.3f} ms")
    print(json.dumps({"bench": "tool_parser", "quick": args.quick, **result}))


if __name__ == "__main__":
    setup_logging()  # tracerl's lines on stderr, one format (TRACERL_LOG_LEVEL)
    main()
