"""A whitelist parser for the arithmetic expressions models answer with (countdown, puzzle24).

Some reasoning-gym verifiers hand the answer to SymPy's `parse_expr`, which is
Python's `eval`: `__import__('os').system(...)` runs, `9**9**9**9` never
finishes. An answer therefore goes to such a verifier only if it parses here —
numbers, the four operators the task allows, unary minus and parentheses,
nothing else — and then only as `Expression.text`, re-printed from the parse
tree, never the model's raw text.

The parser is a recursive descent over a regex tokenizer: linear in the
input, with hard limits on length, digits per number and nesting depth, so a
400 kB answer is refused before it is tokenized. Values are exact
(`fractions.Fraction`); there is no power operator, so a value's size is
bounded by the answer's length.

`integers=True` refuses decimal literals: a puzzle's numbers are integers, and a
decimal such as `81.0000000005` can hide a second number in its digits
(rewards review #1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

OPERATORS = ("+", "-", "*", "/")
MAX_CHARS = 1000  # an answer longer than this is refused unread
MAX_DIGITS = 30  # per number literal
MAX_DEPTH = 50  # nested parentheses and unary minus signs

_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|([-+*/()]))")


class ExpressionError(ValueError):
    """The text is not an expression of the allowed grammar (the message says why)."""


@dataclass(frozen=True)
class Expression:
    text: str  # canonical form: fully parenthesised, built from the parse tree
    value: Fraction | None  # exact value; None when it divides by zero
    numbers: tuple[str, ...]  # the number literals, in order, as re-printed
    operators: tuple[str, ...]  # the binary operators, in order (unary minus is not one)


def parse_expression(text: str, operators: tuple[str, ...] = OPERATORS, integers: bool = False) -> Expression:
    """Parse `text` as `expr := term (('+'|'-') term)*; term := unary (('*'|'/') unary)*;
    unary := '-' unary | '(' expr ')' | number`, using only the binary `operators` given
    (unary minus is always allowed: SymPy prints gold answers such as `-37 + 98`), and only
    integer literals if `integers`. Raises ExpressionError saying what was wrong."""
    if len(text) > MAX_CHARS:
        raise ExpressionError(f"expression of {len(text)} characters (the limit is {MAX_CHARS})")
    bad = set(operators) - set(OPERATORS)
    assert not bad, f"operators {sorted(bad)} are not in the whitelist grammar {OPERATORS}"
    tokens = _tokens(text)
    if integers:
        decimal = next((t for t in tokens if "." in t), None)
        if decimal is not None:
            raise ExpressionError(f"the decimal {decimal[:40]!r}: this task's numbers are integers")
    parser = _Parser(tokens, frozenset(operators))
    text_out, value = parser.expr(0)
    if parser.pos != len(parser.tokens):
        raise ExpressionError(f"unexpected {parser.tokens[parser.pos]!r} after a complete expression")
    return Expression(text_out, value, tuple(parser.numbers), tuple(parser.binary_operators))


def _tokens(text: str) -> list[str]:
    tokens, pos, end = [], 0, len(text.rstrip())
    while pos < end:
        match = _TOKEN.match(text, pos)
        if match is None:
            raise ExpressionError(
                f"character {text[pos:].lstrip()[:1]!r} at offset {pos} is not allowed "
                "(numbers, + - * / and parentheses only)"
            )
        number, symbol = match.groups()
        if number is not None and len(number) > MAX_DIGITS + 1:
            raise ExpressionError(f"a number of {len(number)} characters (the limit is {MAX_DIGITS} digits)")
        tokens.append(number if number is not None else symbol)
        pos = match.end()
    if not tokens:
        raise ExpressionError("empty expression")
    return tokens


class _Parser:
    def __init__(self, tokens: list[str], operators: frozenset[str]):
        self.tokens, self.operators, self.pos = tokens, operators, 0
        self.numbers: list[str] = []
        self.binary_operators: list[str] = []

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def expr(self, depth: int) -> tuple[str, Fraction | None]:
        text, value = self.term(depth)
        while self.peek() in ("+", "-"):
            text, value = self.binary(text, value, self.term, depth)
        return text, value

    def term(self, depth: int) -> tuple[str, Fraction | None]:
        text, value = self.unary(depth)
        while self.peek() in ("*", "/"):
            text, value = self.binary(text, value, self.unary, depth)
        return text, value

    def binary(self, left: str, lvalue: Fraction | None, operand, depth: int) -> tuple[str, Fraction | None]:
        op = self.tokens[self.pos]
        if op not in self.operators:
            raise ExpressionError(f"operator {op!r} is not allowed here (allowed: {' '.join(sorted(self.operators))})")
        self.pos += 1
        self.binary_operators.append(op)
        right, rvalue = operand(depth)
        return f"({left} {op} {right})", _apply(op, lvalue, rvalue)

    def unary(self, depth: int) -> tuple[str, Fraction | None]:
        if depth >= MAX_DEPTH:
            raise ExpressionError(f"nested deeper than {MAX_DEPTH} levels")
        token = self.peek()
        if token is None:
            raise ExpressionError("the expression ends where a number was expected")
        self.pos += 1
        if token == "-":
            text, value = self.unary(depth + 1)
            return f"(-{text})", None if value is None else -value
        if token == "(":
            text, value = self.expr(depth + 1)
            if self.peek() != ")":
                raise ExpressionError("a '(' is not closed")
            self.pos += 1
            return text, value
        if token[0].isdigit():
            # Leading zeros dropped: "007" is not a Python literal, "7" is the same number.
            literal = str(int(token)) if "." not in token else token
            self.numbers.append(literal)
            return literal, Fraction(token)
        raise ExpressionError(f"unexpected {token!r} where a number was expected")


def _apply(op: str, a: Fraction | None, b: Fraction | None) -> Fraction | None:
    if a is None or b is None:
        return None
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return None if b == 0 else a / b
