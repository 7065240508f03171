"""Task sources and verifiers: reasoning-gym tasks (harnesses/tasks/reasoning_gym.py), answer
extraction (harnesses/verifiers/answers.py), the synthetic digit task, and the TaskSource protocol."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from harnesses.base import TaskSource, collect_scoring_notes, load_task_source, normalize_question
from harnesses.tasks import reasoning_gym as reasoning_gym_tasks
from harnesses.tasks.reasoning_gym import DEFAULT_INSTRUCTION, ReasoningGymTask, ReasoningGymTasks
from harnesses.tasks.synthetic import DigitTasks
from harnesses.verifiers.answers import extract_answer
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
def test_wrong_answer_scores_zero(name):
    for task in _tasks(name):
        assert task.score(f"<answer>{_wrong(task.answer)}</answer>") == 0.0, task.id


def test_countdown_wrong_expression_scores_zero():
    for task in _tasks("countdown"):
        numbers = task.entry["metadata"]["numbers"]
        # Uses every number once but sums them: different value from the target for these items.
        wrong = " + ".join(map(str, numbers))
        assert eval(wrong) != task.entry["metadata"]["target"]
        assert task.score(f"<answer>{wrong}</answer>") == 0.0
        assert task.score("<answer>1 + 1</answer>") == 0.0


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
    params = dict(EASY_CHAIN_SUM) if cls is ReasoningGymTasks else {}  # DigitTasks takes none
    src = cls(name="chain_sum", params=params, instruction=None, size=50, eval_size=3, eval_seed=1000003, seed=0)
    assert len(src) == 50 and len(src.eval_tasks()) == 3
    assert src.train_task(51).id == src.train_task(1).id, "training indices wrap at size"
    task = src.train_task(7)
    assert task.prompt.endswith(src.instruction) and task.question in task.prompt
    assert 0.0 <= task.score("<answer>12</answer>") <= 1.0


def test_task_source_errors_name_the_key():
    with pytest.raises(ValueError, match="task.size must be >= 1"):
        DigitTasks("digits", size=0)
    with pytest.raises(ValueError, match=r"task._target_='harnesses.tasks.synthetic.DigitTask' is not a TaskSource"):
        load_task_source("harnesses.tasks.synthetic.DigitTask")
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


def test_an_operator_the_task_does_not_allow_is_refused_saying_so():
    task = ReasoningGymTasks("puzzle24", params={"operators": ["+", "-"]}, eval_size=0).train_task(0)
    with collect_scoring_notes() as notes:
        assert task.score("<answer>3 * 8</answer>") == 0.0
    assert len(notes) == 1 and "operator '*' is not allowed" in notes[0]


# ---- the shipped datasets: scored by checks of ours (rewards review #1, #2, #10) -------------------


def _score(task, answer: str) -> tuple[float, list[str]]:
    with collect_scoring_notes() as notes:
        return task.score(f"<answer>{answer}</answer>"), notes


def _subset_solution(numbers: list[int], target: int) -> tuple[int, str, int, list[int]] | None:
    """(a, op, b, the other numbers) with `a op b == target`, two of `numbers`, when there is one."""
    for i, a in enumerate(numbers):
        for j, b in enumerate(numbers):
            for op, value in (("+", a + b), ("-", a - b), ("*", a * b)):
                if i != j and value == target:
                    return a, op, b, [n for k, n in enumerate(numbers) if k not in (i, j)]
    return None


def test_countdown_decimal_literals_cannot_hide_numbers():
    """rewards review #1: `81.0000000005` counted as 81 and 5 (a `\\b\\d+\\b` count), and the value's error
    hid under reasoning-gym's float tolerance; a solution from 2 of the numbers scored 1.0."""
    src, hacked = ReasoningGymTasks("countdown", eval_size=0), 0
    for i in range(200):
        task = src.train_task(i)
        meta = task.entry["metadata"]
        found = _subset_solution(meta["numbers"], meta["target"])
        if found is None or len(found[3]) != 2:
            continue
        a, op, b, (c, d) = found
        score, notes = _score(task, f"{a}.0000000000{c} {op} {b}.0000000000{d}")
        assert score == 0.0 and len(notes) == 1 and "the decimal" in notes[0], (task.id, notes)
        assert _score(task, f"{a} {op} {b}")[0] == 0.0, "two of the numbers do not solve it"
        hacked += 1
    assert hacked >= 3, "items with a two-number solution and two numbers to hide"


def test_countdown_pays_nothing_for_a_wrong_or_partial_answer():
    """rewards review #1: reasoning-gym pays 0.05 for an expression with the wrong numbers or value."""
    for task in _tasks("countdown"):
        numbers = task.entry["metadata"]["numbers"]
        assert _score(task, " + ".join(map(str, numbers))) == (0.0, []), "every number once, another value: wrong"
        score, notes = _score(task, "1 + 1")
        assert score == 0.0 and "the puzzle's are" in notes[0]
        score, notes = _score(task, f"{task.answer} + {numbers[0]} - {numbers[0]}")
        assert score == 0.0 and "each exactly once" in notes[0], "a number used twice"


def test_puzzle24_checks_its_numbers_and_the_exact_value():
    """rewards review #2: reasoning-gym's puzzle24 scorer checks only that 4 numbers are in range and
    truncates the value with int(): `4*6*1*1` and `4*6 + 2/3` scored 1.0 on every item."""
    src = ReasoningGymTasks("puzzle24", eval_size=0)
    tasks = [src.train_task(i) for i in range(10)]
    for task in tasks:
        if sorted(task.entry["metadata"]["numbers"]) != [1, 1, 4, 6]:
            assert _score(task, "4*6*1*1")[0] == 0.0, task.id
        assert _score(task, "4*6 + 2/3")[0] == 0.0, task.id
        assert _score(task, task.answer) == (1.0, [])
    # the puzzle's own numbers, each once, worth 24.x: int() made it 24
    task = next(t for t in tasks if sorted(t.entry["metadata"]["numbers"]) == [3, 8, 9, 9])
    near = "((9 * 9) - 8) / 3"
    assert 24 < eval(near) < 25 and int(eval(near)) == 24
    assert _score(task, near) == (0.0, []), "the right numbers, a wrong value"


@pytest.mark.parametrize("name", NUMERIC)
def test_number_tasks_pay_only_the_exact_value(name):
    """rewards review #10: basic_arithmetic and chain_sum paid len(gold)/len(answer) to a number that
    contains the gold (`-106475279601` for 106475279601: 0.923); gsm_symbolic read `-44` as 44."""
    for task in _tasks(name, 8):
        gold = task.answer
        if gold != "0":
            assert _score(task, f"{gold}0") == (0.0, []), task.id
        if not gold.startswith("-") and gold != "0":
            assert _score(task, f"-{gold}") == (0.0, []), task.id
            assert _score(task, f"+{gold}.0") == (1.0, []), "the same value"
        assert _score(task, f"{gold}.0000000001") == (0.0, [])


def test_shipped_tasks_score_without_reasoning_gyms_scorer(monkeypatch):
    """Every shipped dataset scores in this process, from our own parse: with the sandbox (where
    reasoning-gym's score_answer runs) gone, gold, wrong and refused answers still score."""
    tasks = {name: _tasks(name, 2) for name in [*DATASETS, "puzzle24"]}
    monkeypatch.setattr(reasoning_gym_tasks, "_SANDBOX", None)
    for name, items in tasks.items():
        for task in items:
            assert _score(task, task.answer)[0] == 1.0, name
            assert _score(task, "1 + 1")[0] == 0.0 and _score(task, "12345678")[0] == 0.0, name


def test_a_long_answer_to_a_slow_reasoning_gym_verifier_is_refused_unread():
    """rewards review #14: propositional_logic's verifier is quadratic; 8 kB of `P ∧ P ∧ ...` ran past the
    sandbox's 2 s limit (a failed trace and a 3 s stall of the worker's event loop). It is refused
    unread now; other datasets' answers are bounded by their gold's length."""
    task = ReasoningGymTasks("propositional_logic", size=10, eval_size=0).train_task(0)
    answer = " ∧ ".join(["P"] * 1999)
    score, notes = _score(task, answer)  # a SandboxError here: the answer reached the verifier
    assert score == 0.0 and notes == [f"answer rejected: {len(answer)} characters (the limit is 256)"]
    assert reasoning_gym_tasks.answer_limit("spell_backward", "abc") == reasoning_gym_tasks.MIN_ANSWER_CHARS
    assert reasoning_gym_tasks.answer_limit("sudoku", "1 " * 80) == 640
    assert reasoning_gym_tasks.answer_limit("boxnet", None) == reasoning_gym_tasks.MAX_ANSWER_CHARS
    spelled = ReasoningGymTasks("spell_backward", size=10, eval_size=0).train_task(0)
    assert _score(spelled, spelled.answer) == (1.0, [])
    assert _score(spelled, spelled.answer * 100)[1][0].startswith("answer rejected: ")
