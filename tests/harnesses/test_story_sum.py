"""task=story_sum (harnesses/tasks/story_sum.py): deterministic draws, a held-out set unseen by content
(its own names and objects), enough distinct stories, and our own exact scorer: gold scores 1,
near misses and hostile answers 0."""

from __future__ import annotations

import pickle
import re

import pytest

from harnesses.base import collect_scoring_notes, normalize_question
from harnesses.tasks.story_sum import (
    EVAL_NAMES,
    EVAL_OBJECTS,
    TRAIN_NAMES,
    TRAIN_OBJECTS,
    StorySums,
)
from rollout.config import TaskConfig, make_task_source
from tools.corpora.hostile_answers import payloads

pytestmark = pytest.mark.unit


def source(operations: int = 2, seed: int = 1, eval_size: int = 512) -> StorySums:
    return StorySums("story_sum", {"operations": operations}, eval_size=eval_size, seed=seed)


def value(task) -> int:
    """The story's count, recomputed from its operands and operators."""
    count = task.operands[0]
    for op, n in zip(task.operators, task.operands[1:]):
        count += n if op == "+" else -n
    return count


def test_the_shipped_config_builds_the_source_with_512_held_out_stories():
    from trainer.config import compose

    cfg = compose("train", ["task=story_sum"])
    src = make_task_source(cfg.task, seed=1)
    assert isinstance(src, StorySums) and src.operations == 2
    assert len(src.eval_tasks()) == cfg.task.eval_size == 512


@pytest.mark.parametrize("operations", [1, 2])
def test_stories_are_one_digit_changes_that_never_go_below_zero(operations):
    src = source(operations)
    for task in [src.train_task(i) for i in range(2000)] + src.eval_tasks():
        assert len(task.operators) == operations and len(task.operands) == operations + 1
        assert all(1 <= n <= 9 for n in task.operands), task.question
        count = task.operands[0]
        for op, n in zip(task.operators, task.operands[1:]):
            count += n if op == "+" else -n
            assert count >= 0, task.question
        assert task.answer == str(value(task))
        # the question says every number, in order, and asks for the count
        assert [int(n) for n in re.findall(r"\d+", task.question)] == task.operands
        assert task.question.endswith(f"How many {task.objects} does {task.person} have now?")
        assert task.prompt == f"{task.question}\nGive the final answer as <answer>NUMBER</answer>."


def test_draws_are_deterministic_and_independent_of_the_process():
    a, b = source(seed=3), pickle.loads(pickle.dumps(source(seed=3)))
    assert [a.train_task(i) for i in range(50)] == [b.train_task(i) for i in range(50)]
    assert a.eval_tasks() == b.eval_tasks()


def test_run_seeds_give_independent_streams_not_shifted_ones():
    """reasoning-gym's Random(seed + i) makes seed 2's stream seed 1's shifted by one item (results
    review section 2.5); a string seed does not."""
    one, two = source(seed=1), source(seed=2)
    first = [one.train_task(i).question for i in range(200)]
    second = [two.train_task(i).question for i in range(200)]
    assert len(set(first) & set(second)) < 5
    assert first[1:] != second[:-1]
    assert one.eval_tasks() == two.eval_tasks(), "the held-out set depends on eval_seed only"


@pytest.mark.parametrize("operations", [1, 2])
def test_at_least_ten_thousand_distinct_training_stories(operations):
    src = source(operations, eval_size=0)
    assert len({normalize_question(src.draw("train", i, "t").question) for i in range(12000)}) >= 10**4


@pytest.mark.parametrize("operations", [1, 2])
def test_the_held_out_set_is_unseen_by_content_names_and_objects(operations):
    src = source(operations)
    held = src.eval_tasks()
    assert len({normalize_question(t.question) for t in held}) == 512
    assert not set(TRAIN_NAMES) & set(EVAL_NAMES)
    assert not {p for _, p in TRAIN_OBJECTS} & {p for _, p in EVAL_OBJECTS}
    assert {t.person for t in held} <= set(EVAL_NAMES) and {t.objects for t in held} <= {p for _, p in EVAL_OBJECTS}
    trained = [src.train_task(i) for i in range(5000)]
    assert {t.person for t in trained} <= set(TRAIN_NAMES)
    assert {t.objects for t in trained} <= {p for _, p in TRAIN_OBJECTS}
    # no held-out name or object word appears in any training story at all
    words = {w for t in trained for w in re.findall(r"[a-z]+", t.question.lower())}
    held_words = {n.lower() for n in EVAL_NAMES} | {w for s, p in EVAL_OBJECTS for w in (s, p)}
    assert not words & held_words


def test_gold_scores_one_in_any_plain_form():
    src = source()
    for task in [src.train_task(i) for i in range(20)] + src.eval_tasks()[:20]:
        for text in (
            f"<answer>{task.answer}</answer>",
            f"So {task.operands[0]} ... the count is {task.answer}.",  # untagged: the last number
            f"<answer> {task.answer}.0 </answer>",
            f"<answer>+{task.answer}</answer>",
        ):
            with collect_scoring_notes() as notes:
                assert task.score(text) == 1.0, (task.question, text)
            assert notes == []


def test_near_misses_score_zero():
    task = next(t for t in (source().train_task(i) for i in range(100)) if int(t.answer) > 1)
    gold = int(task.answer)
    for text in (
        f"<answer>{gold + 1}</answer>",
        f"<answer>{gold - 1}</answer>",
        f"<answer>{gold}.5</answer>",
        f"<answer>{gold} {task.objects}</answer>",  # not one plain number
        f"<answer>{task.operands[0]}{task.operators[0]}{task.operands[1]}</answer>",  # an expression
        f"<answer>{gold}</answer> no, <answer>{gold + 1}</answer>",  # the last tag counts
        f"{gold} ... so {gold + 2}",  # untagged: the last number counts
        "<answer></answer>",
        "",
        f"<answer>{gold:e}</answer>",  # no exponents
    ):
        assert task.score(text) == 0.0, text


def test_hostile_answers_score_zero_and_say_why(tmp_path):
    task = source().train_task(0)
    target = tmp_path / "F"
    for label, payload in payloads(target).items():
        with collect_scoring_notes() as notes:
            assert task.score(f"<answer>{payload}</answer>") == 0.0, label
        assert not target.exists()
        assert len(notes) == 1 and notes[0].startswith("answer rejected: "), (label, notes)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"operations": 3}, r"task.params.operations must be one of \(1, 2\), got 3"),
        ({"operation": 1}, r"task.params.operation is not a story_sum parameter"),
    ],
)
def test_bad_params_fail_naming_the_key(params, message):
    with pytest.raises(ValueError, match=message):
        make_task_source(TaskConfig(_target_="harnesses.tasks.story_sum.StorySums", name="story_sum", params=params), 0)
