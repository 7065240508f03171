"""Task sources and verifiers: reasoning-gym tasks (harnesses/reasoning_gym_tasks.py), answer
extraction (harnesses/answers.py), the synthetic digit task, and the TaskSource protocol."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from harnesses import reasoning_gym_tasks
from harnesses.answers import extract_answer
from harnesses.base import TaskSource, load_task_source, normalize_question
from harnesses.reasoning_gym_tasks import DEFAULT_INSTRUCTION, ReasoningGymTask, ReasoningGymTasks
from harnesses.synthetic import DigitTasks
from tests.conftest import EASY_CHAIN_SUM

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DATASETS = ["chain_sum", "basic_arithmetic", "countdown", "gsm_symbolic"]
NUMERIC = ["chain_sum", "basic_arithmetic", "gsm_symbolic"]


def _tasks(name: str, n: int = 4) -> list[ReasoningGymTask]:
    src = ReasoningGymTasks(name, eval_size=2)
    return [src.train_task(i) for i in range(n)] + src.eval_tasks()


def _wrong(answer: str) -> str:
    """A numeric answer that differs from ``answer`` and does not contain it."""
    return str(int(answer) + 7) if abs(int(answer)) > 10 else "123457"


@pytest.mark.parametrize("name", DATASETS)
def test_gold_answer_in_tags_scores_one(name):
    for task in _tasks(name):
        assert task.answer is not None
        assert task.score(f"Let me think.\n<answer>{task.answer}</answer>") == 1.0, task.id


@pytest.mark.parametrize("name", NUMERIC)
def test_wrong_answer_scores_below_one(name):
    for task in _tasks(name):
        assert task.score(f"<answer>{_wrong(task.answer)}</answer>") < 1.0, task.id


def test_countdown_wrong_expression_scores_below_one():
    for task in _tasks("countdown"):
        numbers = task.entry["metadata"]["numbers"]
        # Uses every number once but sums them: different value from the target for these items.
        wrong = " + ".join(map(str, numbers))
        assert eval(wrong) != task.entry["metadata"]["target"]
        assert task.score(f"<answer>{wrong}</answer>") < 1.0
        assert task.score("<answer>1 + 1</answer>") < 1.0


@pytest.mark.parametrize("name", NUMERIC)
def test_untagged_gold_number_last_scores_one(name):
    for task in _tasks(name):
        assert task.score(f"First I got 3, then 17.\nSo the result is {task.answer}.") == 1.0, task.id


def test_untagged_number_with_thousands_commas():
    task = next(t for t in _tasks("gsm_symbolic", 40) if int(t.answer) >= 1000)
    with_commas = f"{int(task.answer):,}"
    assert "," in with_commas
    assert task.score(f"The total is {with_commas} dollars") == 1.0


@pytest.mark.parametrize("name", DATASETS)
def test_garbage_scores_zero(name):
    for task in _tasks(name, 2):
        assert task.score("I have no idea, sorry.") == 0.0
        assert task.score("") == 0.0
        assert task.score("<answer></answer>") == 0.0


def test_countdown_has_no_number_fallback_and_expression_instruction():
    src = ReasoningGymTasks("countdown", eval_size=0)
    task = src.train_task(0)
    assert "EXPRESSION" in src.instruction and "EXPRESSION" in task.prompt
    assert not task.numeric
    # The gold expression untagged: its last number is not an answer to a countdown task.
    assert task.extract_answer(f"maybe {task.answer}") is None
    assert task.score(f"maybe {task.answer}") == 0.0
    assert task.score(f"<answer>{task.answer}</answer>") == 1.0


def test_instruction_defaults_and_override():
    assert ReasoningGymTasks("chain_sum", eval_size=0).instruction == DEFAULT_INSTRUCTION
    src = ReasoningGymTasks("chain_sum", instruction="Answer in tags.", eval_size=0)
    task = src.train_task(3)
    assert task.prompt == task.question + "\nAnswer in tags."
    assert task.question == task.entry["question"]
    assert task.answer == task.entry["answer"]
    assert task.dataset == "chain_sum" and task.id == "chain_sum/train/3"


def test_last_answer_tag_wins():
    task = ReasoningGymTasks("chain_sum", eval_size=0).train_task(0)
    wrong = _wrong(task.answer)
    assert task.score(f"<answer>{wrong}</answer> no wait <answer>{task.answer}</answer>") == 1.0
    assert task.score(f"<answer>{task.answer}</answer> no wait <answer>{wrong}</answer>") < 1.0
    # A tag beats a later untagged number.
    assert task.score(f"<answer>{task.answer}</answer> and also {wrong}") == 1.0


def test_extract_answer_rules():
    assert extract_answer("a <answer> 12 </answer> b <ANSWER>\n-3\n</ANSWER> c") == "-3"
    assert extract_answer("sum is 1,234,567.5 ok") == "1234567.5"
    assert extract_answer("10 - 3 = 7") == "7"
    assert extract_answer("x = -7") == "-7"
    assert extract_answer("5-3") == "3"
    assert extract_answer("no numbers here") is None
    assert extract_answer("the value is 42", numeric_fallback=False) is None
    assert extract_answer("<answer>(1 + 2) * 3</answer>", numeric_fallback=False) == "(1 + 2) * 3"


def test_train_tasks_deterministic_and_wrap():
    a = ReasoningGymTasks("gsm_symbolic", seed=5, eval_size=0)
    b = ReasoningGymTasks("gsm_symbolic", seed=5, eval_size=0)
    for i in (0, 1, 7, 99, 4321):
        assert a.train_task(i) == b.train_task(i)
    assert len(a) == 100000
    assert a.train_task(100000 + 7) == a.train_task(7)
    assert a.train_task(7).id == "gsm_symbolic/train/7"


@pytest.mark.parametrize("name", ["chain_sum", "gsm_symbolic"])
def test_different_seeds_differ(name):
    a = ReasoningGymTasks(name, seed=0, eval_size=0)
    b = ReasoningGymTasks(name, seed=12345, eval_size=0)
    questions_a = [a.train_task(i).question for i in range(10)]
    questions_b = [b.train_task(i).question for i in range(10)]
    assert questions_a != questions_b
    assert len(set(questions_a) & set(questions_b)) < 3


def test_eval_tasks_held_out():
    src = ReasoningGymTasks("chain_sum")
    evals = src.eval_tasks()
    assert len(evals) == 64
    assert [t.id for t in evals] == [f"chain_sum/eval/{i}" for i in range(64)]
    assert evals == ReasoningGymTasks("chain_sum").eval_tasks()
    train_questions = {src.train_task(i).question for i in range(200)}
    assert not train_questions & {t.question for t in evals}


def test_easy_params_held_out_by_content():
    # 2 one-digit terms: only 200 distinct questions. The held-out set takes 64 of them, all
    # different, and training never sees one of those (it skips to other items).
    src = ReasoningGymTasks(
        "chain_sum", params={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}, eval_size=64
    )
    evals = src.eval_tasks()
    questions = {normalize_question(t.question) for t in evals}
    assert len(questions) == 64
    train = [src.train_task(i) for i in range(3000)]
    assert not questions & {normalize_question(t.question) for t in train}
    assert len({normalize_question(t.question) for t in train}) == 200 - 64, "every other question is trained on"
    assert [t.id for t in train[:3]] == ["chain_sum/train/0", "chain_sum/train/1", "chain_sum/train/2"]
    assert all(t.score(f"<answer>{t.answer}</answer>") == 1.0 for t in evals)


def test_an_eval_set_larger_than_the_question_space_is_refused():
    src = ReasoningGymTasks(
        "chain_sum", params={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}, eval_size=250
    )
    with pytest.raises(
        ValueError,
        match=r"only 200 distinct questions in 12500 held-out draws, fewer than "
        r"task.eval_size=250; lower task.eval_size",
    ):
        src.eval_tasks()


def test_normalize_question():
    assert normalize_question("  What is\n 3 +  4? ") == normalize_question("what is 3 + 4?") == "what is 3 + 4?"


def test_overlapping_train_and_eval_seeds_rejected():
    with pytest.raises(ValueError, match="overlap"):
        ReasoningGymTasks("chain_sum", seed=1000000, size=100, eval_seed=1000050)


def test_params_are_used():
    src = ReasoningGymTasks("chain_sum", params=EASY_CHAIN_SUM, eval_size=0)
    for i in range(20):
        meta = src.train_task(i).entry["metadata"]
        assert 2 <= meta["num_terms"] <= 3 and meta["num_digits"] == 1


def test_entries_json_serialisable():
    for name in DATASETS:
        for task in _tasks(name, 3):
            json.dumps(task.entry)


def test_task_pickles_and_scores_after_cache_clear():
    task = ReasoningGymTasks("countdown", eval_size=0).train_task(11)
    good, bad = f"<answer>{task.answer}</answer>", "<answer>1 + 2</answer>"
    expected = (task.score(good), task.score(bad))
    clone = pickle.loads(pickle.dumps(task))
    assert clone == task
    reasoning_gym_tasks._SCORERS.clear()
    assert (clone.score(good), clone.score(bad)) == expected == (1.0, expected[1])


def test_task_scores_in_another_process():
    task = ReasoningGymTasks("chain_sum", params=EASY_CHAIN_SUM, eval_size=0).train_task(5)
    code = (
        "import pickle, sys\n"
        "task = pickle.loads(sys.stdin.buffer.read())\n"
        "print(task.score('<answer>' + task.answer + '</answer>'), task.score('nothing'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps(task), capture_output=True, cwd=ROOT, timeout=60, check=True
    )
    assert out.stdout.decode().split() == ["1.0", "0.0"]


def test_source_pickles():
    src = ReasoningGymTasks("gsm_symbolic", eval_size=2)
    clone = pickle.loads(pickle.dumps(src))
    assert clone.train_task(3) == src.train_task(3)
    assert clone.eval_tasks() == src.eval_tasks()


def test_unknown_dataset_name():
    with pytest.raises(ValueError, match="chain_summ") as info:
        ReasoningGymTasks("chain_summ")
    assert "chain_sum" in str(info.value).replace("'chain_summ'", "")


def test_bad_params():
    with pytest.raises(ValueError, match="chain_sum.*no_such_param"):
        ReasoningGymTasks("chain_sum", params={"no_such_param": 1})
    with pytest.raises(ValueError, match="chain_sum.*max_terms"):
        ReasoningGymTasks("chain_sum", params={"min_terms": 5, "max_terms": 2})
    with pytest.raises(ValueError, match="seed"):
        ReasoningGymTasks("chain_sum", params={"seed": 3})


@pytest.mark.parametrize("cls", [ReasoningGymTasks, DigitTasks])
def test_sources_share_the_task_source_constructor(cls):
    """Every source plugs in as task._target_ with TaskSource's keyword arguments."""
    assert issubclass(cls, TaskSource)
    assert load_task_source(f"{cls.__module__}.{cls.__name__}") is cls
    src = cls(
        name="chain_sum", params=dict(EASY_CHAIN_SUM), instruction=None, size=50, eval_size=3, eval_seed=1000003, seed=0
    )
    assert len(src) == 50 and len(src.eval_tasks()) == 3
    assert src.train_task(51).id == src.train_task(1).id, "training indices wrap at size"
    task = src.train_task(7)
    assert task.prompt.endswith(src.instruction) and task.question in task.prompt
    assert 0.0 <= task.score("<answer>12</answer>") <= 1.0


def test_task_source_errors_name_the_key():
    with pytest.raises(ValueError, match="task.size must be >= 1"):
        DigitTasks("digits", size=0)
    with pytest.raises(ValueError, match=r"task._target_='harnesses.synthetic.DigitTask' is not a TaskSource"):
        load_task_source("harnesses.synthetic.DigitTask")
    with pytest.raises(ValueError, match="task._target_='harnesses.nope.Tasks' cannot be imported"):
        load_task_source("harnesses.nope.Tasks")


@pytest.mark.parametrize("name", ["n_queens", "binary_matrix", "polynomial_multiplication", "composite"])
def test_a_dataset_whose_verifier_evaluates_answers_without_our_grammar_is_refused(name):
    """n_queens' verifier eval()s the answer; with no grammar of ours the source is not built."""
    with pytest.raises(ValueError, match=f"{name!r} scores answers by evaluating them .* use another task.name"):
        ReasoningGymTasks(name, size=10, eval_size=0)


def test_an_operator_outside_the_expression_grammar_is_refused():
    with pytest.raises(ValueError, match=r"task.params.operators for 'puzzle24' has \['\*\*'\]"):
        ReasoningGymTasks("puzzle24", params={"operators": ["+", "**"]}, eval_size=0)


def test_countdown_answers_reach_the_verifier_re_printed():
    """The verifier sees the expression rebuilt from its parse tree; an operator the task does not
    allow is refused."""
    assert reasoning_gym_tasks.check_answer("countdown", {}, " 3*(4 + 5) - -2 ") == "((3 * (4 + 5)) - (-2))"
    src = ReasoningGymTasks("puzzle24", params={"operators": ["+", "-"]}, eval_size=0)
    with pytest.raises(reasoning_gym_tasks.RejectedAnswer, match=r"operator '\*' is not allowed"):
        reasoning_gym_tasks.check_answer("puzzle24", src.params, "3 * 8")
