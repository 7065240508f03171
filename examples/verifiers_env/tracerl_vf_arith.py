"""tracerl-vf-arith: a verifiers environment (verifiers 0.3.1's classic API) of arithmetic with feedback.

    import verifiers as vf
    env = vf.load_environment("tracerl-vf-arith", max_turns=2)

Each row asks for the value of a short integer expression ("What is 7 + 5 * 3?"); its answer is the
exact value. The rollout is a `vf.MultiTurnEnv`: the model answers; a wrong or unreadable answer
gets one line of feedback and another try, up to `max_turns` model turns; a right one ends it.
The rubric pays 1.0 when the last assistant turn's answer (the content of its last
`<answer>...</answer>`, else its last integer) is the row's answer, else 0.0.

The rows are built here from a seeded random generator: no download, the same rows on every machine.
"""

from __future__ import annotations

import random
import re

import verifiers as vf
from datasets import Dataset

SYSTEM_PROMPT = "Work out the value. Give the final answer as <answer>NUMBER</answer>."
FEEDBACK = "That is not the right value. Check the arithmetic and answer again as <answer>NUMBER</answer>."
_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_INTEGER = re.compile(r"-?\d+")


def make_rows(n: int, seed: int, terms: int = 3, max_operand: int = 9) -> list[dict]:
    """`n` rows {question, answer} of expressions over `terms` operands in [1, max_operand] with + - *."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        operands = [rng.randint(1, max_operand) for _ in range(terms)]
        operators = [rng.choice("+-*") for _ in range(terms - 1)]
        expression = " ".join([str(operands[0])] + [f"{o} {x}" for o, x in zip(operators, operands[1:])])
        rows.append({"question": f"What is {expression}?", "answer": str(_value(operands, operators))})
    return rows


def _value(operands: list[int], operators: list[str]) -> int:
    """The expression's value, * before + and - (no eval of text)."""
    terms, signs = [operands[0]], []
    for op, x in zip(operators, operands[1:]):
        if op == "*":
            terms[-1] *= x
        else:
            terms.append(x)
            signs.append(1 if op == "+" else -1)
    return terms[0] + sum(s * t for s, t in zip(signs, terms[1:]))


def parse_answer(text: str) -> str | None:
    """The answer in a model's text: the last <answer> tag's content, else the last integer."""
    tags = _TAG.findall(text)
    if tags:
        return tags[-1].strip()
    numbers = _INTEGER.findall(text)
    return numbers[-1] if numbers else None


class ArithFeedbackEnv(vf.MultiTurnEnv):
    """The model answers; wrong answers get feedback and another turn (up to max_turns)."""

    @vf.stop
    async def answered_correctly(self, state: vf.State) -> bool:
        if not state["trajectory"]:
            return False
        return self.parser.parse_answer(state["trajectory"][-1]["completion"]) == state["answer"]

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs) -> vf.Messages:
        return [vf.UserMessage(role="user", content=FEEDBACK)]


def correct_answer(completion: vf.Messages, answer: str, parser: vf.Parser) -> float:
    """1.0 when the last assistant turn's answer is the row's answer."""
    return 1.0 if parser.parse_answer(completion) == answer else 0.0


def load_environment(
    num_train: int = 2000,
    num_eval: int = 200,
    seed: int = 0,
    eval_seed: int = 1,
    terms: int = 3,
    max_operand: int = 9,
    max_turns: int = 2,
) -> vf.Environment:
    """The environment: `num_train` training rows and `num_eval` evaluation rows (distinct seeds),
    expressions of `terms` operands in [1, max_operand]; at most `max_turns` model turns."""
    if terms < 1 or max_operand < 1 or max_turns < 1:
        raise ValueError(f"terms, max_operand and max_turns must be >= 1, got {terms}, {max_operand}, {max_turns}")
    parser = vf.Parser(extract_fn=parse_answer)
    return ArithFeedbackEnv(
        dataset=Dataset.from_list(make_rows(num_train, seed, terms, max_operand)),
        eval_dataset=Dataset.from_list(make_rows(num_eval, eval_seed, terms, max_operand)),
        system_prompt=SYSTEM_PROMPT,
        parser=parser,
        rubric=vf.Rubric(funcs=[correct_answer], parser=parser),
        max_turns=max_turns,
    )
