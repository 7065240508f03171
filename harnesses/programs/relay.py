"""relay: a reader turns a story into an expression, a calculator works it out one step at a time.

The team of the relay experiment (docs/preregistration/relay.md), on task=story_sum
(harnesses/tasks/story_sum.py). Each role does one job that has a verifiable answer of its own.

Trace shape: 2 agents, 1 + k sequences (k = the story's operations), each a fresh context —
  [0] reader: the story -> only the expression, e.g. `3+5-2`
  [1..k] calculator: one binary step, `a op b` with a the running value (the calculator's own
      previous answer; the first operand at step 1) -> <answer>N</answer>
The calculator never sees the story. The reader's reply must be a chain `N op N ...` of + and -
with exactly the story's number of operations (one `<answer>` tag around it is allowed); it is
parsed by harnesses/verifiers/expressions.py's whitelist parser. A reply of another shape ends the relay
there: a bare number would skip the calculator (the team would be one agent), and a fixed number
of steps fixes the team's token budget. A calculator reply with no plain number ends it too.

Rewards (agent_rewards, for `algorithm.advantage.per_agent_rewards`):
  reader      1.0 if its expression evaluates to the gold answer, else 0.0
  calculator  the share of its calls whose number equals the value of the expression it was
              given (right for its own job even when the reader erred); absent when not called
  trace       1.0 if the last calculator answer equals the gold answer, else 0.0
With `oracle_calculator=True` exact arithmetic replaces the calculator (no calculator sequence):
the positive control, whose team accuracy is the reader's.
"""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction
from typing import Any

from harnesses.base import Agents, HarnessResult
from harnesses.tasks.story_sum import DEFAULT_INSTRUCTION, StorySum, read_number
from harnesses.verifiers.answers import extract_answer
from harnesses.verifiers.expressions import MAX_CHARS, ExpressionError, parse_expression

READER_SYSTEM = (
    "You translate word problems into arithmetic expressions. Reply with only the expression, e.g. {example}."
)
EXAMPLES = {1: "4+3", 2: "4+3-2"}  # an example chain of the story's length (not its numbers)
CALCULATOR_PROMPT = "What is {expression}? " + DEFAULT_INSTRUCTION
_CHAINS = re.compile(r"(?<![\d.])\d+(?:[ \t]*[+-][ \t]*\d+)*(?![\d.])")


def chain(reply: str, operations: int) -> tuple[str, Fraction, int, list[tuple[str, int]]] | None:
    """The first chain `N op N ...` of exactly `operations` + / - steps in the reader's reply (in
    its `<answer>` tag if it has one; within its first MAX_CHARS characters), as (the chain
    without spaces, its value, the first operand, the (operator, operand) steps); None if there
    is none. A 135M reader writes `9 + 2 = 11` or a sentence around the chain: the calculator
    sees only the chain either way."""
    text = (extract_answer(reply, numeric_fallback=False) or reply)[:MAX_CHARS]
    # whole chains only (no digit or '.' on either side), so that `4` of `7-2+4` is no chain of its own
    lengths = ((m, m.group(0).count("+") + m.group(0).count("-")) for m in _CHAINS.finditer(text))
    found = next((m for m, steps in lengths if steps == operations), None)
    if found is None:
        return None
    flat = "".join(found.group(0).split())
    try:
        value = parse_expression(flat, ("+", "-")).value  # the whitelist grammar, with its size limits
    except ExpressionError:  # e.g. a number of more digits than it allows
        return None
    assert value is not None, f"{flat!r} has no value: only a division by zero lacks one, and a chain has + and -"
    terms = re.findall(r"\d+|[+-]", flat)
    return flat, value, int(terms[0]), [(terms[i], int(terms[i + 1])) for i in range(1, len(terms), 2)]


def show(value: Fraction) -> str:
    """A running value as the calculator is shown it (a calculator may answer 7.5: a finite
    decimal, which Decimal division prints exactly)."""
    return str(value.numerator) if value.denominator == 1 else str(Decimal(value.numerator) / value.denominator)


async def relay(task: StorySum, agents: Agents, oracle_calculator: bool = False) -> HarnessResult:
    operations, gold = len(task.operators), Fraction(task.answer)
    reader_system = READER_SYSTEM.format(example=EXAMPLES[operations])
    reply = await agents["reader"].chat(task.question, system=reader_system)
    parsed = chain(reply, operations)
    info: dict[str, Any] = {
        "answer": task.answer,
        "expression": None,
        "steps": [],
        "calculator_right": [],
        "final": None,
    }
    info["oracle_calculator"] = oracle_calculator
    if parsed is None:
        return HarnessResult(reward=0.0, agent_rewards={"reader": 0.0}, info=info)
    info["expression"], value, first, steps = parsed
    running: Fraction | None = Fraction(first)
    for op, n in steps:
        if running is None:  # the calculator's last reply held no number: nothing to pass on
            break
        expression = f"{show(running)} {op} {n}"
        want = running + n if op == "+" else running - n
        info["steps"].append(expression)
        if oracle_calculator:
            running = want
            continue
        running = read_number(await agents["calculator"].chat(CALCULATOR_PROMPT.format(expression=expression)))
        info["calculator_right"].append(running == want)
    rewards = {"reader": float(value == gold)}
    if info["calculator_right"]:
        rewards["calculator"] = sum(info["calculator_right"]) / len(info["calculator_right"])
    info["final"] = None if running is None else show(running)
    return HarnessResult(reward=float(running == gold), agent_rewards=rewards, info=info)
