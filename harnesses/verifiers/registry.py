"""Verifiers by name: how a file task (harnesses/tasks/files.py) scores a model's output.

`task.params.verifier` names one, `task.params.verifier_options` sets its fields:

* `exact`: the answer equals the gold answer, case and white space aside.
* `numeric`: a plain number (harnesses/verifiers/answers.py's grammar) within `abs_tol` or
  `rel_tol` of the gold number; without an `<answer>` tag, the last number in the text.
* `math`: the same exact value: the answer is a number or a fraction in lowest terms
  (`-0.75`, `3/4`, `\\frac{3}{4}`), the gold any expression over + - * / and
  parentheses (harnesses/verifiers/expressions.py, exact fractions; `\\cdot`, `\\times`, `\\div`,
  `$` and `\\boxed{...}` are read too). An answer that is itself an expression
  (`3 - 4 + 7`, `12/4`) is refused unless `expressions: true`: otherwise restating the
  question's own arithmetic scores 1 without computing anything (rewards review #9).
* `regex`: the answer fully matches the item's gold answer taken as a pattern
  (the `regex` engine, whose matching stops at `timeout_s`); a gold whose counted
  repeats would unroll into more than MAX_UNROLLED atoms when compiled is refused.
* `choice`: multiple choice, one letter of `letters` (`B`, `(B)`, `B.` and `B)` read as B);
  a gold or an answer that is not exactly one of them (`AB`, `""`) is refused.
* `judge`: an LLM judge, a frozen model asked in the episode (harnesses/verifiers/judge.py).
* `package.module:function`: a user function `function(completion, answer, metadata)`
  returning a reward in [0, 1], imported at start and run in a sandbox process
  (harnesses/verifiers/user.py).

Model output is hostile input (the rules of harnesses/tasks/reasoning_gym.py): a
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
import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import regex

from harnesses.base import note_scoring
from harnesses.verifiers.answers import extract_answer, is_plain_number
from harnesses.verifiers.base import KEY, Verifier
from harnesses.verifiers.expressions import Expression, ExpressionError, parse_expression
from harnesses.verifiers.judge import Judge
from harnesses.verifiers.user import UserFunction


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
    numeric_fallback = True
    max_chars: int = 1000
    expressions: bool = False  # accept any expression of the gold's value, not only a number or a fraction

    @property
    def instruction(self) -> str:  # type: ignore[override]  (a ClassVar elsewhere)
        what = "EXPRESSION" if self.expressions else "NUMBER"
        return f"Give the final answer as <answer>{what}</answer>."

    def read(self, text: str) -> str | None:
        tagged = extract_answer(text, numeric_fallback=False)
        if tagged is not None:
            return tagged
        return _last_boxed(text) or extract_answer(text, numeric_fallback=True)

    def check_gold(self, gold: str) -> None:
        if _parse(gold).value is None:
            raise ValueError(f"{gold[:40]!r} divides by zero")

    def compare(self, answer: str, gold: str | None, metadata: dict[str, Any]) -> float:
        try:
            expression = _parse(answer)
        except ValueError as e:
            note_scoring(f"answer rejected: not an arithmetic expression: {e}")
            return 0.0
        if expression.value is None:
            note_scoring("answer rejected: it divides by zero")
            return 0.0
        why = None if self.expressions else _not_a_number(expression)
        if why is not None:
            note_scoring(f"answer rejected: {why} ({KEY}_options.expressions=true accepts expressions)")
            return 0.0
        return float(expression.value == _parse(gold).value)


def _not_a_number(expression: Expression) -> str | None:
    """Why `expression` is not a number (unary minus allowed) or a fraction of integers in lowest
    terms; None when it is one."""
    if not expression.operators:
        return None
    if expression.operators == ("/",) and not any("." in n for n in expression.numbers):
        numerator, denominator = (int(n) for n in expression.numbers)
        if denominator > 1 and math.gcd(numerator, denominator) == 1:
            return None
        return f"the fraction {numerator}/{denominator} is not in lowest terms"
    return f"an expression ({expression.text[:60]}), not a number or a fraction"


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


def _parse(text: str) -> Expression:
    """An arithmetic expression, LaTeX spellings read (its value None: it divides by zero); ValueError
    if it is none."""
    for old, new in _LATEX:
        text = text.replace(old, new)
    try:
        return parse_expression(text)
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
        size = unrolled_size(gold)
        if size > MAX_UNROLLED:
            raise ValueError(
                f"{gold[:60]!r}: its counted repeats ({{n}}, {{n,m}}) unroll into about {size} atoms when "
                f"compiled (the limit is {MAX_UNROLLED}; nested ones multiply): use + or * for long runs"
            )
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


# The `regex` engine copies a counted repeat's atom n times (its minimum) when it compiles a pattern, so
# nested counts multiply: (?:(?:a{100}){100}){100}, 25 characters, took 290 MiB and 0.5 s (rewards
# review #17); 10,000 atoms take about 2 MiB.
MAX_UNROLLED = 10000
_COUNTED = re.compile(r"\{(\d*)(?:,(\d*))?\}")


def unrolled_size(pattern: str) -> int:
    """About how many atoms `pattern` compiles into: each atom counts 1, a group the sum of its
    contents, and a counted repeat {n}, {n,} or {n,m} multiplies what it repeats by n. One scan."""
    frames = [[0, 0]]  # per open group: [atoms so far, atoms of its last item (what a repeat repeats)]
    i = 0
    while i < len(pattern):
        c, frame = pattern[i], frames[-1]
        counted = _COUNTED.match(pattern, i) if c == "{" else None
        if counted is not None and (counted[1] or counted[2]):
            n = int(counted[1] or 0)
            frame[0] += frame[1] * (n - 1)
            frame[1] *= n
            i = counted.end()
        elif c == "(":
            frames.append([0, 0])
            i += 1
        elif c == ")" and len(frames) > 1:
            inner = frames.pop()[0]
            frames[-1][0] += inner
            frames[-1][1] = inner
            i += 1
        elif c in "*+?|":  # a repeat of at least 0 or 1 copies nothing; an alternative starts afresh
            frame[1] = 0 if c == "|" else frame[1]
            i += 1
        else:  # an atom: a character, an escape, a character class
            i = _class_end(pattern, i) if c == "[" else i + (2 if c == "\\" else 1)
            frame[0] += 1
            frame[1] = 1
    return sum(frame[0] for frame in frames)


def _class_end(pattern: str, start: int) -> int:
    """The index after the `]` that closes the character class opened at `start`."""
    i = start + 1
    if pattern.startswith("^", i):
        i += 1
    if pattern.startswith("]", i):
        i += 1
    while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return i + 1


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
        if not self._is_choice(_letter(gold)):
            raise ValueError(f"{gold[:40]!r} is not one of the letters {self.letters} (set {KEY}_options.letters)")

    def compare(self, answer: str, gold: str | None, metadata: dict[str, Any]) -> float:
        letter = _letter(answer)
        if not self._is_choice(letter):
            note_scoring(f"answer rejected: not one of the letters {self.letters} ({answer[:40]!r})")
            return 0.0
        return float(letter == _letter(gold))

    def _is_choice(self, letter: str) -> bool:
        # One of the letters, not a substring of them: "", "AB" and "BCD" are in "ABCD" (rewards review #17).
        return len(letter) == 1 and letter in self.letters


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
        cls, fields = Judge, dict(options)
    elif ":" in spec:
        cls, fields = UserFunction, {**options, "target": spec}
    else:
        raise ValueError(
            f"{KEY}={spec!r}: one of {', '.join(BUILT_IN)}, judge (an LLM judge: harnesses/verifiers/judge.py), "
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
