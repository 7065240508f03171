"""Hostile model output against every shipped task's own `score()` (real reasoning-gym verifiers,
real sandbox process): code, huge and pathological answers score 0.0, run nothing, raise nothing,
and say why in the scoring notes; honest gold answers still score 1.0."""

from __future__ import annotations

import sys

import pytest

from examples.calculator_agent import calculator
from harnesses.base import collect_scoring_notes
from harnesses.tasks.reasoning_gym import ReasoningGymTasks
from tools.corpora.hostile_answers import SHIPPED, TASKS, payloads

pytestmark = pytest.mark.unit


def test_every_shipped_task_is_covered():
    assert {"basic_arithmetic", "chain_sum", "countdown", "gsm_symbolic"} <= set(SHIPPED)


@pytest.mark.parametrize("name", TASKS)
def test_hostile_answers_score_zero_run_nothing_and_say_why(name, tmp_path):
    task = ReasoningGymTasks(name, eval_size=0).train_task(0)
    target = tmp_path / "F"
    for label, payload in payloads(target).items():
        with collect_scoring_notes() as notes:
            score = task.score(f"<answer>{payload}</answer>")  # a SandboxError here: the 2 s limit was hit
        assert score == 0.0, (name, label)
        assert not target.exists(), f"{name}: the {label} payload ran"
        assert len(notes) == 1 and notes[0].startswith("answer rejected: "), (name, label, notes)


@pytest.mark.parametrize("name", TASKS)
def test_unclosed_answer_tags_do_not_stall_extraction(name):
    """50,000 unclosed tags (400 kB): a lazy `<answer>(.*?)</answer>` scan is quadratic in them."""
    task = ReasoningGymTasks(name, eval_size=0).train_task(0)
    assert task.score("<answer>" * 50000) == 0.0


@pytest.mark.parametrize("name", TASKS)
def test_gold_answers_still_score_one(name):
    src = ReasoningGymTasks(name, eval_size=3)
    for task in [src.train_task(i) for i in range(5)] + src.eval_tasks():
        with collect_scoring_notes() as notes:
            assert task.score(f"<answer>{task.answer}</answer>") == 1.0, task.id
        assert notes == []


def test_correct_expressions_in_another_shape_score_one():
    """Not the dataset's gold string: the same numbers, the same value, in another shape."""
    for name in ("countdown", "puzzle24"):
        task = ReasoningGymTasks(name, eval_size=0).train_task(3)
        assert task.score(f"<answer> -(-( {task.answer} )) </answer>") == 1.0, task.answer
        assert task.score(f"<answer>({task.answer}) * 1</answer>") < 1.0, "an extra number is not allowed"


def test_scoring_notes_are_empty_outside_and_separate_per_block():
    task = ReasoningGymTasks("chain_sum", eval_size=0).train_task(0)
    task.score("<answer>__import__('os')</answer>")  # no active collector: a no-op
    with collect_scoring_notes() as outer:
        task.score("<answer>1 apple</answer>")
        with collect_scoring_notes() as inner:
            task.score("<answer>2 apples</answer>")
    assert len(outer) == 1 and "'1 apple'" in outer[0]
    assert len(inner) == 1 and "'2 apples'" in inner[0]


@pytest.mark.parametrize(
    "expression, reply",
    [
        ("9" * 310, "9" * 310),  # an int too large for a float: OverflowError
        ("+".join(["1"] * 5000), "error: 9999 characters (the limit is 1000)"),  # RecursionError
        ("-" * 999 + "1", "error: maximum recursion depth exceeded"),
        ("1e400/3", "error: the result is too large"),  # inf
        ("1e308 * 10", "error: the result is too large"),
        ("17 * 23", "391"),
        ("10 / 4", "2.5"),
        ("1 / 0", "error: division by zero"),
    ],
)
def test_the_example_calculator_answers_model_written_arguments_without_raising(expression, reply):
    """rewards review #16: examples/calculator_agent.py raised on a 310-digit literal (OverflowError) and a
    5,000-term sum (RecursionError), which crashed the agent and failed its trace. At Python's default
    recursion limit: torch's inductor raises it to 2000 when a test before this one compiles, and the
    999 nested minus signs then evaluate."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        assert calculator(expression).startswith(reply)
    finally:
        sys.setrecursionlimit(limit)
