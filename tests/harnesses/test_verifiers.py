"""Verifiers by name (harnesses/verifiers/registry.py): each scores its gold answer 1 and honest variants
as it should, and hostile answers (code, huge, deeply nested, regex bombs) score 0 without
running anything, in bounded time (refused unread, or stopped at a deadline), saying why."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from harnesses.base import collect_scoring_notes
from harnesses.verifiers.registry import BUILT_IN, make_verifier, unrolled_size
from harnesses.verifiers.sandbox import SandboxError

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
GOLD = {"exact": "Paris", "numeric": "42", "math": "1/2", "regex": r"[0-9]+ apples?", "choice": "B"}
RIGHT = {**GOLD, "regex": "3 apples"}  # an answer that is right (a regex's gold is its pattern)


def score(verifier, text, gold, metadata=None):
    with collect_scoring_notes() as notes:
        return verifier.score(text, gold, metadata or {}), notes


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_gold_answers_score_one_and_wrong_ones_zero(name):
    v = make_verifier(name, {})
    assert score(v, f"I think <answer>{RIGHT[name]}</answer>", GOLD[name]) == (1.0, [])
    assert score(v, "<answer>C</answer>" if name != "choice" else "<answer>D</answer>", GOLD[name])[0] == 0.0
    assert score(v, "no answer here", GOLD[name]) == (0.0, [])


@pytest.mark.parametrize(
    "name, answer",
    [
        ("exact", "  paris. "),
        ("numeric", "42.0000001"),
        ("numeric", "so it is 42"),
        ("math", "0.5"),
        ("math", "\\frac{1}{2}"),
        ("math", "$\\dfrac{1}{2}$"),
        ("math", "--0.50"),
        ("regex", "12 apples"),
        ("choice", "(b)"),
        ("choice", "B."),
    ],
)
def test_equivalent_answers_score_one(name, answer):
    text = answer if answer.startswith("so") else f"<answer>{answer}</answer>"
    assert score(make_verifier(name, {}), text, GOLD[name]) == (1.0, [])


def test_math_reads_the_last_boxed_answer_and_numeric_tolerances():
    assert score(make_verifier("math", {}), "so \\boxed{1} then \\boxed{\\frac{1}{2}} done", "1/2")[0] == 1.0
    expressions = make_verifier("math", {"expressions": True})
    assert score(expressions, "<answer>\\frac{1}{\\frac{2}{3}}</answer>", "3/2")[0] == 1.0
    loose = make_verifier("numeric", {"abs_tol": 0.01})
    assert score(loose, "<answer>3.005</answer>", "3")[0] == 1.0 and score(loose, "<answer>3.02</answer>", "3")[0] == 0
    rel = make_verifier("numeric", {"abs_tol": 0, "rel_tol": 0.1})
    assert score(rel, "<answer>1090</answer>", "1000")[0] == 1.0 and score(rel, "<answer>1110</answer>", "1000")[0] == 0


def test_math_refuses_the_questions_own_arithmetic_unless_expressions_are_asked_for():
    """rewards review #9: with `verifier=math`, restating "What is 3 - 4 + 7?" as `3 - 4 + 7` scored 1.0 on
    every item of examples/arith.jsonl. An answer is a number or a fraction in lowest terms unless
    verifier_options.expressions is true."""
    items = [json.loads(line) for line in (ROOT / "examples" / "arith.jsonl").read_text().splitlines()]
    default, expressions = make_verifier("math", {}), make_verifier("math", {"expressions": True})
    for item in items:
        asked = re.fullmatch(r"What is (.+)\?", item["question"])[1]
        value, notes = score(default, f"<answer>{asked}</answer>", item["answer"])
        assert value == 0.0 and len(notes) == 1 and "an expression" in notes[0], (item, notes)
        assert score(default, f"<answer>{item['answer']}</answer>", item["answer"]) == (1.0, [])
        assert score(expressions, f"<answer>{asked}</answer>", item["answer"]) == (1.0, []), "opted in"
    assert default.instruction.endswith("<answer>NUMBER</answer>.") and "EXPRESSION" in expressions.instruction


@pytest.mark.parametrize(
    "answer, gold, value, note",
    [
        ("3/4", "0.75", 1.0, None),
        ("-3/4", "-0.75", 1.0, None),
        ("\\frac{3}{4}", "3/4", 1.0, None),
        ("6/8", "3/4", 0.0, "the fraction 6/8 is not in lowest terms"),
        ("12/4", "3", 0.0, "the fraction 12/4 is not in lowest terms"),
        ("3/1", "3", 0.0, "the fraction 3/1 is not in lowest terms"),
        ("1.5/2", "0.75", 0.0, "an expression"),
        ("3 + 0", "3", 0.0, "an expression"),
        ("3/0", "3", 0.0, "it divides by zero"),
    ],
)
def test_math_answers_are_numbers_or_fractions_in_lowest_terms(answer, gold, value, note):
    result, notes = score(make_verifier("math", {}), f"<answer>{answer}</answer>", gold)
    assert result == value and (notes == [] if note is None else note in notes[0]), notes


def test_choice_golds_and_answers_are_exactly_one_letter():
    """rewards review #17: `_letter(gold) not in "ABCD"` is a substring test, so the golds "", "AB" and
    "BCD" passed the start-up check (and the answer "BCD" then scored 1.0 against "BCD")."""
    v = make_verifier("choice", {})
    for gold in ("", "AB", "BCD", "ABCD"):
        with pytest.raises(ValueError, match="is not one of the letters ABCD"):
            v.check_gold(gold)
    for answer in ("AB", "BCD", "ABCD"):
        value, notes = score(v, f"<answer>{answer}</answer>", "B")
        assert value == 0.0 and notes == [f"answer rejected: not one of the letters ABCD ({answer!r})"]


def test_a_regex_gold_that_compiles_to_hundreds_of_mib_is_refused_at_start():
    """rewards review #17: `(?:(?:a{100}){100}){100}`, 25 characters, took 290 MiB and 0.5 s to compile in
    check_gold; a{1000} three deep would exhaust memory in every process that compiles it."""
    v = make_verifier("regex", {})
    for bomb in ("(?:(?:a{100}){100}){100}", "(?:(?:a{1000}){1000}){1000}", "(?:a{100,}){200}", "x{20000}"):
        with pytest.raises(ValueError, match=r"unroll into about \d+ atoms when compiled \(the limit is 10000"):
            v.check_gold(bomb)
    for fine in (r"[0-9]+ apples?", r"\d{1,3}(,\d{3})*", "(?:ab|cd){1000}", "a{0,100000}", r"[{}]{3}\{5\}"):
        v.check_gold(fine)
    assert unrolled_size("(?:(?:a{10}){10}){10}") == 1000 + 110  # 1000 a's; each (?: counts its colon
    assert unrolled_size("a{,5}b{0}c") == 1 and unrolled_size(r"\d{3}[a-z]{2}") == 5


def hostile(target) -> dict[str, str]:
    return {
        "code": f"__import__('os').system('touch {target}')",
        "power tower": "9**9**9**9",
        "400 kB": "1+" * 200000 + "1",
        "deep parentheses": "(" * 5000 + "1" + ")" * 5000,
        "deep, within the length cap": "(" * 400 + "1" + ")" * 400,
        "deep fractions": "\\frac{1}{" * 400 + "2" + "}" * 400,
        "huge literal": "9" * 5000,
    }


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_hostile_answers_score_zero_run_nothing_and_say_why(name, tmp_path):
    v = make_verifier(name, {})
    for label, payload in hostile(tmp_path / "F").items():
        value, notes = score(v, f"<answer>{payload}</answer>", GOLD[name])
        assert value == 0.0, (name, label)
        if name not in ("exact", "regex") or len(payload) > v.max_chars:  # a text that does not match is
            # a wrong answer, not a malformed one
            assert len(notes) == 1 and notes[0].startswith("answer rejected: "), (name, label, notes)
    assert not (tmp_path / "F").exists()
    assert score(v, "<answer>" * 50000, GOLD[name])[0] == 0.0  # unclosed tags: extraction stays linear


def test_huge_answers_are_refused_unread():
    for name in BUILT_IN:
        v = make_verifier(name, {})
        value, notes = score(v, f"<answer>{'a' * 400000}</answer>", GOLD[name])
        assert value == 0.0 and notes == [f"answer rejected: 400000 characters (the limit is {v.max_chars})"]


def test_a_regex_bomb_is_stopped_at_the_deadline():
    """(a|aa)+$ against 60 a's and a b backtracks through ~1.5e12 paths; the match is stopped."""
    v = make_verifier("regex", {"timeout_s": 0.05})
    value, notes = score(v, "<answer>" + "a" * 60 + "b</answer>", "(a|aa)+$")
    assert value == 0.0 and notes == [
        "answer rejected: matching it ran past task.params.verifier_options.timeout_s=0.05"
    ]
    assert score(v, "<answer>" + "a" * 60 + "</answer>", "(a|aa)+$")[0] == 1.0


def test_user_functions_run_in_a_sandbox_process_with_a_deadline():
    v = make_verifier("tests.harnesses.user_verifiers:digits_match", {})
    assert score(v, "the sum is 4 2", "42")[0] == 1.0 and score(v, "41", "42")[0] == 0.0
    away = make_verifier("tests.harnesses.user_verifiers:where_am_i", {})
    assert score(away, "x", None, {"parent": os.getpid()})[0] == 1.0, "not in this process"
    hung = make_verifier("tests.harnesses.user_verifiers:hang", {"timeout_s": 1})
    with pytest.raises(SandboxError, match="ran past its 1s limit and was killed"):
        hung.score("x", None, {})
    with pytest.raises(ValueError, match="out_of_range' returned 2.5; a reward is a number in"):
        make_verifier("tests.harnesses.user_verifiers:out_of_range", {}).score("x", None, {})


@pytest.mark.parametrize(
    "spec, options, message",
    [
        (
            "fuzzy",
            {},
            r"task.params.verifier='fuzzy': one of exact, numeric, math, regex, choice, judge \(an LLM judge",
        ),
        ("tests.harnesses.nowhere:f", {}, r"task.params.verifier='tests.harnesses.nowhere.f' cannot be imported"),
        ("tests.harnesses.user_verifiers:nothing", {}, r"cannot be imported: .* has no attribute 'nothing'"),
        ("tests.harnesses.user_verifiers:two_arguments", {}, r"must take \(completion, answer, metadata\)"),
        (
            "numeric",
            {"tolerance": 1},
            r"verifier_options.tolerance is not an option of verifier 'numeric' "
            r"\(its options: abs_tol, max_chars, rel_tol\)",
        ),
        ("numeric", {"abs_tol": -1}, r"abs_tol and rel_tol must be >= 0"),
        ("choice", {"letters": "AB1"}, r"letters='AB1' must be distinct capital letters"),
        ("regex", {"timeout_s": 0}, r"timeout_s=0 must be > 0"),
    ],
)
def test_bad_verifier_config_is_named(spec, options, message):
    with pytest.raises(ValueError, match=message):
        make_verifier(spec, options)


@pytest.mark.parametrize(
    "name, gold", [("numeric", "forty"), ("math", "x + 1"), ("math", "1/0"), ("regex", "(unclosed"), ("choice", "E")]
)
def test_gold_answers_a_verifier_cannot_read_are_refused(name, gold):
    with pytest.raises(ValueError):
        make_verifier(name, {}).check_gold(gold)
