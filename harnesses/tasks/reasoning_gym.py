"""Tasks from reasoning-gym datasets: the shipped ones scored by checks of ours, the rest by each
dataset's own verifier in a sandbox.

`ReasoningGymTasks` is a deterministic source of training tasks (by index) and
of a held-out evaluation set for one reasoning-gym dataset. A
`ReasoningGymTask` is a plain picklable dataclass (it travels to Ray actors);
it holds only the dataset name, the dataset params and the reasoning-gym
entry, and any scorer is rebuilt lazily in whichever process scores it.

Model output is hostile input, and an RL run finds every way a scorer pays for
less than the task (docs/harnesses.md, "Model output is untrusted"). The shipped
datasets are therefore scored here, from our own parse of the answer and the
item, never by reasoning-gym's `score_answer` (whose puzzle24 scorer truncates
the value with int() and never checks which numbers were used, and whose others
pay partial credit to any number containing the gold; rewards review #1, #2, #10):

* countdown and puzzle24 (`EXPRESSION_DATASETS`): an arithmetic expression
  (harnesses/verifiers/expressions.py) of integer literals over the operators the task
  allows, using each of the item's numbers exactly once (as a multiset: every
  question says "using all of these numbers" and "each number once"), whose exact
  `Fraction` value is the target. 1 or 0: no credit for a near value or a wrong set
  of numbers (reasoning-gym gave 0.05 for those).
* basic_arithmetic, chain_sum and gsm_symbolic (`NUMBER_DATASETS`): one plain
  number whose exact value (`Decimal`) is the gold's. 1 or 0.

An answer that breaks a task's rules (not its grammar, the wrong numbers, a
division by zero) scores 0 and says why through `note_scoring`; a well-formed
answer of another value scores 0 silently: it is just wrong.

Other datasets keep reasoning-gym's verifier, and several of those evaluate the
answer as code (`EVALUATING_DATASETS`): one with no grammar here is refused. The
rest get bounded length (`answer_limit`) and then run their verifier in a sandbox
process (harnesses/verifiers/sandbox.py), the second wall. That call is synchronous, as
`Task.score` is for every harness that compares a score with a number; the length
bound keeps a verifier that is slow on long answers (propositional_logic:
quadratic) far from the sandbox's 2 s limit (rewards review #14).
"""

from __future__ import annotations

import difflib
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any

from harnesses.base import TaskSource, note_scoring
from harnesses.verifiers.answers import extract_answer, is_number, is_plain_number
from harnesses.verifiers.expressions import OPERATORS, ExpressionError, parse_expression
from harnesses.verifiers.sandbox import Sandbox

DEFAULT_INSTRUCTION = "Give the final answer as <answer>NUMBER</answer>."

# Datasets whose gold answer is not a number; every other dataset gets DEFAULT_INSTRUCTION.
DATASET_INSTRUCTIONS: dict[str, str] = {
    "countdown": "Give the final answer as <answer>EXPRESSION</answer>.",
    "puzzle24": "Give the final answer as <answer>EXPRESSION</answer>.",
}

# reasoning-gym 0.1.25 datasets whose score_answer evaluates the answer text (SymPy parse_expr or
# eval; found by grepping the package and confirmed by scoring a file-creating payload with each),
# and composite, which delegates to any of them.
EVALUATING_DATASETS = frozenset(
    {
        "binary_matrix",
        "composite",
        "countdown",
        "intermediate_integration",
        "n_queens",
        "polynomial_multiplication",
        "puzzle24",
        "simple_integration",
        "spiral_matrix",
        "string_insertion",
    }
)
EXPRESSION_DATASETS = frozenset({"countdown", "puzzle24"})  # answers: arithmetic over + - * /
# Answers compared as numbers (Decimal): anything else in the tag is not an answer.
NUMBER_DATASETS = frozenset({"basic_arithmetic", "chain_sum", "gsm_symbolic"})
PUZZLE24_TARGET = 24  # reasoning-gym's puzzle24 always asks for 24 ("Make 24 using ..."); no metadata says so
# Answer length for the datasets scored by reasoning-gym: at most ANSWER_CHARS_PER_GOLD_CHAR times the
# gold answer's length (at least MIN_ANSWER_CHARS), at most MAX_ANSWER_CHARS (sudoku and ARC grids are
# a few hundred characters, tower_of_hanoi's moves up to 4,000); ANSWER_CHARS names datasets with no
# gold answer whose verifier is slow on long answers.
MAX_ANSWER_CHARS = 10000
MIN_ANSWER_CHARS = 256
ANSWER_CHARS_PER_GOLD_CHAR = 4
# propositional_logic: its verifier is quadratic in the formula (1 kB: 0.36 s, 4 kB: past the sandbox's
# 2 s limit); its example answers are a few dozen characters.
ANSWER_CHARS = {"propositional_logic": 256}


class RejectedAnswer(ValueError):
    """An answer that breaks the task's rules: it scores 0, and the message says why."""


def score_expression(dataset: str, params: Mapping[str, Any], metadata: Mapping[str, Any], answer: str) -> float:
    """countdown / puzzle24: 1.0 if `answer` is an expression of integers over the task's operators that
    uses each of the item's numbers exactly once and equals the target exactly, else 0.0; RejectedAnswer
    when it breaks those rules (0.0 for a well-formed expression of another value)."""
    try:
        expression = parse_expression(answer, _operators(dataset, params), integers=True)
    except ExpressionError as e:
        raise RejectedAnswer(f"not an arithmetic expression: {e}") from None
    allowed = Counter(int(n) for n in metadata["numbers"])
    used = Counter(int(n) for n in expression.numbers)
    if used != allowed:
        raise RejectedAnswer(f"it uses the numbers {_few(used)}; the puzzle's are {_few(allowed)}, each exactly once")
    if expression.value is None:
        raise RejectedAnswer("it divides by zero")
    target = metadata["target"] if dataset == "countdown" else PUZZLE24_TARGET
    return float(expression.value == Fraction(int(target)))


def _few(numbers: Counter) -> str:
    listed = sorted(numbers.elements())
    return str(listed) if len(listed) <= 12 else f"[{', '.join(map(str, listed[:12]))}, ... ({len(listed)} numbers)]"


def score_number(answer: str, gold: str) -> float:
    """basic_arithmetic / chain_sum / gsm_symbolic: 1.0 if `answer` is one plain number of exactly the
    gold's value, else 0.0; RejectedAnswer when it is not a plain number."""
    if not is_plain_number(answer):
        raise RejectedAnswer(f"not a plain number ({len(answer)} characters: {answer[:40]!r})")
    return float(Decimal(answer.replace(",", "")) == Decimal(gold.replace(",", "")))


def answer_limit(dataset: str, gold: str | None) -> int:
    """The longest answer that goes to `dataset`'s reasoning-gym verifier (see ANSWER_CHARS)."""
    if dataset in ANSWER_CHARS:
        return ANSWER_CHARS[dataset]
    if gold is None:
        return MAX_ANSWER_CHARS
    return min(MAX_ANSWER_CHARS, max(MIN_ANSWER_CHARS, ANSWER_CHARS_PER_GOLD_CHAR * len(gold)))


def _operators(dataset: str, params: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(params.get("operators", OPERATORS))


def _check_answers_are_guarded(name: str, params: Mapping[str, Any]) -> None:
    """Refuse a dataset whose verifier would evaluate model text that no grammar of ours checks."""
    if name in EVALUATING_DATASETS and name not in EXPRESSION_DATASETS:
        raise ValueError(
            f"reasoning-gym dataset {name!r} scores answers by evaluating them as Python/SymPy code, and "
            f"tracerl has no answer grammar for it (model output would run as code); use another "
            f"task.name, or add a scorer of ours for it to ReasoningGymTask.score in harnesses/tasks/reasoning_gym.py"
        )
    if name in EXPRESSION_DATASETS:
        bad = sorted(set(_operators(name, params)) - set(OPERATORS))
        if bad:
            raise ValueError(
                f"task.params.operators for {name!r} has {bad}: answers are checked against a "
                f"grammar of {' '.join(OPERATORS)} only"
            )


# Scorers are dataset objects rebuilt per process, keyed by (name, canonical params).
_SCORERS: dict[tuple[str, str], Any] = {}


def _reasoning_gym() -> Any:
    # Imported lazily: importing reasoning_gym loads every dataset (and sympy),
    # about a second, which modules that only handle Task objects need not pay.
    import reasoning_gym

    return reasoning_gym


def _registered_datasets() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def _plain(obj: Any) -> Any:
    """Deep-copy params into plain Python containers (e.g. from an OmegaConf config)."""
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return tuple(_plain(v) for v in obj)
    if isinstance(obj, Sequence) and not isinstance(obj, (str, bytes)):
        return [_plain(v) for v in obj]
    return obj


def _jsonable(obj: Any) -> Any:
    """Convert an entry to values ``json.dumps`` accepts (gsm_symbolic metadata holds Fractions)."""
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    # Tuples stay tuples: some verifiers compare metadata to tuples (arc_agi/rearc boards).
    if isinstance(obj, tuple):
        return tuple(_jsonable(v) for v in obj)
    if isinstance(obj, (list, set, frozenset)):
        return [_jsonable(v) for v in obj]
    if obj is None or isinstance(obj, (str, bool, int)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if isinstance(obj, Fraction):
        return str(obj)
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        try:
            return _jsonable(obj.item())
        except (TypeError, ValueError):
            pass
    return str(obj)


def _params_key(params: Mapping[str, Any]) -> str:
    return json.dumps(_jsonable(params), sort_keys=True)


def _check_name(name: str) -> None:
    valid = _registered_datasets()
    if name not in valid:
        close = difflib.get_close_matches(name, valid, n=5)
        examples = close or ["chain_sum", "basic_arithmetic", "countdown", "gsm_symbolic"]
        raise ValueError(
            f"unknown reasoning-gym dataset {name!r}; e.g. {', '.join(examples)} ({len(valid)} datasets registered)"
        )


def _create_dataset(name: str, params: Mapping[str, Any], seed: int, size: int) -> Any:
    """Build a reasoning-gym dataset, turning any failure into a ValueError."""
    _check_name(name)
    _check_answers_are_guarded(name, params)
    for reserved in ("seed", "size"):
        if reserved in params:
            raise ValueError(
                f"reasoning-gym dataset {name!r}: pass {reserved!r} as a ReasoningGymTasks argument, not in params"
            )
    try:
        return _reasoning_gym().create_dataset(name, seed=seed, size=size, **params)
    except Exception as exc:  # TypeError (unknown param), AssertionError (validate), ValueError, ...
        raise ValueError(
            f"bad params for reasoning-gym dataset {name!r} {dict(params)!r}: {type(exc).__name__}: {exc}"
        ) from exc


def _scorer(name: str, params: Mapping[str, Any]) -> Any:
    """The (cached) dataset object whose ``score_answer`` verifies answers for (name, params)."""
    key = (name, _params_key(params))
    scorer = _SCORERS.get(key)
    if scorer is None:
        # size=1: some datasets pre-generate all items in their constructor.
        scorer = _create_dataset(name, params, seed=0, size=1)
        _SCORERS[key] = scorer
    return scorer


@dataclass
class ReasoningGymTask:
    """One reasoning-gym item: what a harness sends to a model, and how to score the result
    (a `harnesses.base.Task`).

    ``params`` are the reasoning-gym dataset params, kept so that any process can
    rebuild the verifier.
    """

    id: str
    question: str
    prompt: str
    answer: str | None
    dataset: str
    entry: dict
    params: dict = field(default_factory=dict)

    @property
    def numeric(self) -> bool:
        """Whether the gold answer is a number (enables the untagged-number fallback)."""
        return is_number(self.answer)

    def extract_answer(self, text: str) -> str | None:
        """The answer this task would score in ``text`` (see module-level :func:`extract_answer`)."""
        return extract_answer(text, numeric_fallback=self.numeric)

    def score(self, text: str) -> float:
        """Score a model's output text: 0.0..1.0 (1.0 or 0.0 for the datasets scored here). An answer
        that breaks the task's rules scores 0.0 (the reason goes to `note_scoring`). Another dataset's
        answer goes to its verifier in a sandbox process, where one that runs out of time or memory
        raises SandboxError, which fails this trace only."""
        answer = self.extract_answer(text)
        if answer is None:
            return 0.0
        try:
            if self.dataset in EXPRESSION_DATASETS:
                return score_expression(self.dataset, self.params, self.entry["metadata"], answer)
            if self.dataset in NUMBER_DATASETS:
                return score_number(answer, self.answer)
            limit = answer_limit(self.dataset, self.answer)
            if len(answer) > limit:
                raise RejectedAnswer(f"{len(answer)} characters (the limit is {limit})")
        except RejectedAnswer as e:
            note_scoring(f"answer rejected: {e}")
            return 0.0
        return _SANDBOX.call(_score_answer, self.dataset, self.params, answer, self.entry)


def _score_answer(dataset: str, params: dict, answer: str, entry: dict) -> float:
    """The dataset's own verifier on `answer` (runs in the sandbox process), clamped to [0, 1]."""
    try:
        reward = float(_scorer(dataset, params).score_answer(answer=answer, entry=entry))
    except Exception:
        # Model output is arbitrary text: a verifier that chokes on it means "wrong",
        # not a crashed rollout.
        return 0.0
    if not math.isfinite(reward):
        return 0.0
    return min(1.0, max(0.0, reward))


def _import_reasoning_gym() -> None:
    _reasoning_gym()


# One per process, started on the first score: the verifiers of every task run there.
_SANDBOX = Sandbox(warmup=_import_reasoning_gym)


class ReasoningGymTasks(TaskSource):
    """Deterministic task source over one reasoning-gym dataset.

    Raw training item ``j`` is item ``j`` of the reasoning-gym dataset built with
    ``seed`` and ``size``; raw held-out item ``j`` is item ``j`` of the dataset built
    with ``eval_seed`` and ``eval_draws`` (TaskSource makes the held-out set distinct
    and keeps its questions out of training). Most reasoning-gym datasets derive
    item ``j`` from ``Random(seed + j)``, so seeds closer than ``size`` share
    (shifted) items; the train and eval seed ranges must therefore not overlap.
    A few datasets pre-generate all items when built (acre takes ~16 s at the
    default size) or cap the size (word_ladder: 20000): pass a smaller ``size``.

    ``instruction`` None picks the per-dataset default (``DATASET_INSTRUCTIONS``,
    else ``DEFAULT_INSTRUCTION``).
    """

    def setup(self) -> None:
        self.params = _plain(self.params)
        seed, size, eval_seed = self.seed, self.size, self.eval_seed
        if self.eval_size and seed < eval_seed + self.eval_draws and eval_seed < seed + size:
            raise ValueError(
                f"train seeds [{seed}, {seed + size}) overlap eval seeds "
                f"[{eval_seed}, {eval_seed + self.eval_draws}) "
                f"for dataset {self.name!r}: the held-out stream would repeat the training stream"
            )
        # Built eagerly so that unknown names and bad params fail here, not mid-training.
        # reasoning-gym item i can depend on the dataset's seed *and* size (gsm_symbolic draws
        # its templates up front, acre pre-generates everything), so index the real dataset
        # rather than building per-item windows.
        self._train_ds: Any = _create_dataset(self.name, self.params, seed=seed, size=size)
        self._eval_ds: Any = None

    def default_instruction(self) -> str:
        return DATASET_INSTRUCTIONS.get(self.name, DEFAULT_INSTRUCTION)

    def __repr__(self) -> str:
        return (
            f"ReasoningGymTasks({self.name!r}, params={self.params!r}, size={self.size}, "
            f"eval_size={self.eval_size}, eval_seed={self.eval_seed}, seed={self.seed})"
        )

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_train_ds": None, "_eval_ds": None}

    def draw(self, split: str, index: int, task_id: str) -> ReasoningGymTask:
        if split == "train":
            if self._train_ds is None:
                self._train_ds = _create_dataset(self.name, self.params, seed=self.seed, size=self.size)
            return self._make_task(task_id, self._train_ds[index])
        if self._eval_ds is None:
            self._eval_ds = _create_dataset(self.name, self.params, seed=self.eval_seed, size=self.eval_draws)
        return self._make_task(task_id, self._eval_ds[index])

    def _make_task(self, task_id: str, entry: Mapping[str, Any]) -> ReasoningGymTask:
        entry = _jsonable(entry)
        question = str(entry["question"])
        gold = entry.get("answer")
        return ReasoningGymTask(
            id=task_id,
            question=question,
            prompt=f"{question}\n{self.instruction}" if self.instruction else question,
            answer=None if gold is None else str(gold),
            dataset=self.name,
            entry=entry,
            params=_plain(self.params),
        )
