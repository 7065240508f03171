"""Verifiers by name: how a file task (harnesses/file_tasks.py) scores a model's output.

`task.params.verifier` names one, `task.params.verifier_options` sets its fields:

* `exact`: the answer equals the gold answer, case and white space aside.
* `numeric`: a plain number (harnesses/answers.py's grammar) within `abs_tol` or
  `rel_tol` of the gold number; without an `<answer>` tag, the last number in the text.
* `math`: arithmetic equivalence: answer and gold parse as expressions over
  + - * / and parentheses (harnesses/expressions.py, exact fractions; `\\frac{a}{b}`,
  `\\cdot`, `\\times`, `\\div`, `$` and `\\boxed{...}` are read too) and have the same value.
* `regex`: the answer fully matches the item's gold answer taken as a pattern
  (the `regex` engine, whose matching stops at `timeout_s`).
* `choice`: multiple choice, one letter of `letters` (`B`, `(B)`, `B.` and `B)` read as B).
* `judge`: an LLM judge, a frozen model asked in the episode (harnesses/judge.py).
* `package.module:function`: a user function `function(completion, answer, metadata)`
  returning a reward in [0, 1], imported at start and run in a sandbox process
  (harnesses/user_verifier.py).

Model output is hostile input (the rules of harnesses/reasoning_gym_tasks.py): a
built-in verifier reads only the last `<answer>` tag (or a number / `\\boxed{}`
where said), refuses an answer longer than `max_chars` unread, and evaluates
nothing: a refused answer scores 0 and says why through `note_scoring`.
Why not math-verify: its default extraction hands model text to SymPy's
`parse_expr` (Python's `eval`) and bounds its time with `signal.alarm`, which
works only on a process's main thread; latex2sympy2 then runs `simplify`,
whose time has no bound.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any, ClassVar

import regex

from harnesses.answers import extract_answer, is_plain_number
from harnesses.base import note_scoring
from harnesses.expressions import ExpressionError, parse_expression

KEY = "task.params.verifier"


@dataclass
class Verifier:
    """Scores `text` (a model's whole output) against one item's gold answer and metadata. A
    built-in one declares `max_chars`: longer answers are refused unread."""

    name: ClassVar[str]
    instruction: ClassVar[str] = "Give the final answer as <answer>ANSWER</answer>."  # the default task.instruction
    numeric_fallback: ClassVar[bool] = False  # without a tag, read the last number in the text
    needs_answer: ClassVar[bool] = True  # items must have a gold answer (task.params.answer_field)
    max_chars: ClassVar[int]

    def check(self) -> None:
        """Raise ValueError naming the option whose value is bad."""
        if self.max_chars < 1:
            raise ValueError(f"{KEY}_options.max_chars={self.max_chars} must be >= 1")

    def check_gold(self, gold: str) -> None:
        """Raise ValueError saying why `gold` cannot be scored against (a data error, found at start)."""

    def roles(self) -> list[str]:
        """Agent roles its scoring asks (the LLM judge's); none for a function of the text."""
        return []

    def score(self, text: str, gold: str | None, metadata: dict[str, Any], question: str | None = None) -> float:
        answer = self.read(text)
        if answer is None:
            return 0.0
        if len(answer) > self.max_chars:
            note_scoring(f"answer rejected: {len(answer)} characters (the limit is {self.max_chars})")
            return 0.0
        return self.compare(answer, gold, metadata)

    def read(self, text: str) -> str | None:
        return extract_answer(text, numeric_fallback=self.numeric_fallback)

    def compare(self, answer: str, gold: str | None, metadata: dict[str, Any]) -> float:
        raise NotImplementedError


def normalize_answer(text: str) -> str:
    """Case, white space and a final full stop do not count."""
    return " ".join(text.casefold().split()).removesuffix(".")


@dataclass
class Exact(Verifier):
    name = "exact"
    max_chars: int = 10000

    def compare(self, answer: str, gold: str | None, metadata: dict[str, Any]) -> float:
        return float(normalize_answer(answer) == normalize_answer(gold))


@dataclass
class Numeric(Verifier):
    name = "numeric"
    instruction = "Give the final answer as <answer>NUMBER</answer>."
    numeric_fallback = True
    abs_tol: float = 1e-6  # |answer - gold| <= max(abs_tol, rel_tol * |gold|) scores 1
    rel_tol: float = 0.0
    max_chars: int = 100

    def check(self) -> None:
        super().check()
        if not (self.abs_tol >= 0 and self.rel_tol >= 0):
            raise ValueError(f"{KEY}_options.abs_tol and rel_tol must be >= 0, got {self.abs_tol}, {self.rel_tol}")

    def check_gold(self, gold: str) -> None:
        _number(gold)

    def compare(self, answer: str, gold: str | None, metadata: dict[str, Any]) -> float:
        if not is_plain_number(answer):
            note_scoring(f"answer rejected: not a plain number ({len(answer)} characters: {answer[:40]!r})")
            return 0.0
        a, b = _number(answer), _number(gold)
        return float(abs(a - b) <= max(Decimal(repr(self.abs_tol)), Decimal(repr(self.rel_tol)) * abs(b)))


def _number(text: str) -> Decimal:
    try:
        value = Decimal(text.strip().replace(",", ""))
    except InvalidOperation:
        raise ValueError(f"{text[:40]!r} is not a number") from None
    if not value.is_finite():
        raise ValueError(f"{text[:40]!r} is not a finite number")
    return value


@dataclass
class Math(Verifier):
    name = "math"
    instruction = "Give the final answer as <answer>EXPRESSION</answer>."
    numeric_fallback = True
    max_chars: int = 1000

    def read(self, text: str) -> str | None:
        tagged = extract_answer(text, numeric_fallback=False)
        if tagged is not None:
            return tagged
        return _last_boxed(text) or extract_answer(text, numeric_fallback=True)

    def check_gold(self, gold: str) -> None:
        if _value(gold) is None:
            raise ValueError(f"{gold[:40]!r} divides by zero")

    def compare(self, answer: str, gold: str | None, metadata: dict[str, Any]) -> float:
        try:
            value = _value(answer)
        except ValueError as e:
            note_scoring(f"answer rejected: not an arithmetic expression: {e}")
            return 0.0
        if value is None:
            note_scoring("answer rejected: it divides by zero")
            return 0.0
        return float(value == _value(gold))


# LaTeX spellings read as the grammar's: a plain text substitution (linear), never evaluation.
_LATEX = (
    ("$", ""),
    ("\\left", ""),
    ("\\right", ""),
    ("\\,", ""),
    ("\\!", ""),
    ("\\ ", ""),
    ("\\cdot", "*"),
    ("\\times", "*"),
    ("\\div", "/"),
    ("\\dfrac{", "\\frac{"),
    ("\\tfrac{", "\\frac{"),
    ("\\frac{", "(("),
    ("}{", ")/("),
    ("}", "))"),
)


def _value(text: str) -> Fraction | None:
    """The exact value of an arithmetic expression (None: it divides by zero); ValueError if it is none."""
    for old, new in _LATEX:
        text = text.replace(old, new)
    try:
        return parse_expression(text).value
    except ExpressionError as e:
        raise ValueError(str(e)) from None


def _last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (braces matched; one scan from it)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for i in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth < 0:
            return text[begin:i].strip() or None
    return None


@dataclass
class Regex(Verifier):
    name = "regex"
    max_chars: int = 1000
    ignore_case: bool = False
    timeout_s: float = 0.1  # a match still running then is stopped (catastrophic backtracking) and scores 0

    def check(self) -> None:
        super().check()
        if not self.timeout_s > 0:
            raise ValueError(f"{KEY}_options.timeout_s={self.timeout_s} must be > 0")

    def check_gold(self, gold: str) -> None:
        try:
            _pattern(gold, self.ignore_case)
        except regex.error as e:
            raise ValueError(f"{gold[:60]!r} is not a regular expression: {e}") from None

    def compare(self, answer: str, gold: str | None, metadata: dict[str, Any]) -> float:
        try:
            return float(_pattern(gold, self.ignore_case).fullmatch(answer, timeout=self.timeout_s) is not None)
        except TimeoutError:
            note_scoring(f"answer rejected: matching it ran past {KEY}_options.timeout_s={self.timeout_s}")
            return 0.0


@functools.lru_cache(maxsize=4096)
def _pattern(pattern: str, ignore_case: bool) -> regex.Pattern:
    return regex.compile(pattern, regex.IGNORECASE if ignore_case else 0)


@dataclass
class Choice(Verifier):
    name = "choice"
    instruction = "Give the letter of your choice as <answer>LETTER</answer>."
    letters: str = "ABCD"  # the choices' letters
    max_chars: int = 10

    def check(self) -> None:
        super().check()
        if not (self.letters.isalpha() and self.letters.isupper() and len(set(self.letters)) == len(self.letters)):
            raise ValueError(f"{KEY}_options.letters={self.letters!r} must be distinct capital letters, e.g. ABCD")

    def check_gold(self, gold: str) -> None:
        if _letter(gold) not in self.letters:
            raise ValueError(f"{gold[:40]!r} is not one of the letters {self.letters} (set {KEY}_options.letters)")

    def compare(self, answer: str, gold: str | None, metadata: dict[str, Any]) -> float:
        letter = _letter(answer)
        if letter not in self.letters:
            note_scoring(f"answer rejected: not one of the letters {self.letters} ({answer[:40]!r})")
            return 0.0
        return float(letter == _letter(gold))


def _letter(text: str) -> str:
    """`B`, `(B)`, `B.`, `B)` and `b` as "B"; anything else as itself (never a letter)."""
    text = text.strip()
    if len(text) == 3 and text[0] == "(" and text[2] == ")":
        text = text[1]
    elif len(text) == 2 and text[1] in ".)":
        text = text[0]
    return text.upper() if len(text) == 1 else text


BUILT_IN: dict[str, type[Verifier]] = {cls.name: cls for cls in (Exact, Numeric, Math, Regex, Choice)}


def make_verifier(spec: str, options: dict[str, Any]) -> Verifier:
    """The verifier `spec` names (a built-in name or `package.module:function`) with `options`;
    ValueError naming the key if either is bad (a user function is imported here)."""
    if spec in BUILT_IN:
        cls, fields = BUILT_IN[spec], dict(options)
    elif spec == "judge":
        from harnesses.judge import Judge  # it imports this module

        cls, fields = Judge, dict(options)
    elif ":" in spec:
        from harnesses.user_verifier import UserFunction  # it imports this module

        cls, fields = UserFunction, {**options, "target": spec}
    else:
        raise ValueError(
            f"{KEY}={spec!r}: one of {', '.join(BUILT_IN)}, judge (an LLM judge: harnesses/judge.py), "
            f"or a function as package.module:function"
        )
    known = {f.name for f in dataclasses.fields(cls)} - {"target"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(
            f"{KEY}_options.{unknown[0]} is not an option of verifier {spec!r} "
            f"(its options: {', '.join(sorted(known))})"
        )
    verifier = cls(**fields)
    verifier.check()
    return verifier
