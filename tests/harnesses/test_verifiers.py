"""Verifiers by name (harnesses/verifiers.py): each scores its gold answer 1 and honest variants
as it should, and hostile answers (code, huge, deeply nested, regex bombs) score 0 without
running anything, in bounded time (refused unread, or stopped at a deadline), saying why."""

from __future__ import annotations

import os

import pytest

from harnesses.base import collect_scoring_notes
from harnesses.sandbox import SandboxError
from harnesses.verifiers import BUILT_IN, make_verifier

pytestmark = pytest.mark.unit

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
        ("math", "$\\dfrac{2}{4}$"),
        ("math", "(3 - 2) / (1 + 1)"),
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
    assert score(make_verifier("math", {}), "<answer>\\frac{1}{\\frac{2}{3}}</answer>", "3/2")[0] == 1.0
    loose = make_verifier("numeric", {"abs_tol": 0.01})
    assert score(loose, "<answer>3.005</answer>", "3")[0] == 1.0 and score(loose, "<answer>3.02</answer>", "3")[0] == 0
    rel = make_verifier("numeric", {"abs_tol": 0, "rel_tol": 0.1})
    assert score(rel, "<answer>1090</answer>", "1000")[0] == 1.0 and score(rel, "<answer>1110</answer>", "1000")[0] == 0


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
