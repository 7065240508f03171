"""story_sum: procedural word problems of one or two one-digit additions and subtractions.

    Ann has 3 apples. Ann finds 5 more apples. Then Ann gives away 2 apples.
    How many apples does Ann have now?

The task of the relay experiment (docs/preregistration/relay.md; harnesses/programs/relay.py splits it
between a reader and a calculator). `task.params.operations` (1 or 2) is how many changes a
story has; every operand is one digit (the start 1-9, a change 1-9) and no count goes below 0.
Names, objects and verbs come from the lists below: with the training lists there are over 10^5
distinct one-operation stories and far more two-operation ones. The held-out stream draws its
names and objects from lists of their own (`EVAL_NAMES`, `EVAL_OBJECTS`), so a held-out story
is unseen by content, not only by text: no held-out person or object is ever trained on.

Item j of a stream is drawn from `Random("story_sum/<split>/<seed>/<j>")`: a string seed, so two
run seeds give independent streams (reasoning-gym's `Random(seed + j)` makes seed 2's stream
seed 1's shifted by one item; docs/results.md).

Scored by our own exact check, no reasoning-gym: the answer (the last `<answer>` tag, else the
last number) must be one plain number equal to the gold count. No partial credit.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

from harnesses.base import TaskSource, note_scoring
from harnesses.verifiers.answers import extract_answer, is_plain_number

DEFAULT_INSTRUCTION = "Give the final answer as <answer>NUMBER</answer>."
DEFAULT_PARAMS = {"operations": 2}
OPERATIONS = (1, 2)  # the values task.params.operations may take

TRAIN_NAMES = (
    "Ann", "Ben", "Cara", "Dan", "Eva", "Finn", "Gina", "Hugo", "Ivy", "Jack", "Kate", "Leo",
    "Mia", "Ned", "Olga", "Paul", "Rosa", "Sam", "Tina", "Umar", "Vera", "Will", "Yara", "Zack",
)  # fmt: skip
EVAL_NAMES = (
    "Abel", "Bianca", "Cyrus", "Delia", "Emil", "Freya", "Gideon", "Hazel",
    "Igor", "Juno", "Kurt", "Lena", "Milo", "Nadia", "Otto", "Petra",
)  # fmt: skip
# (singular, plural)
TRAIN_OBJECTS = (
    ("apple", "apples"), ("book", "books"), ("marble", "marbles"), ("pencil", "pencils"),
    ("cookie", "cookies"), ("stamp", "stamps"), ("shell", "shells"), ("coin", "coins"),
    ("sticker", "stickers"), ("card", "cards"), ("balloon", "balloons"), ("toy car", "toy cars"),
    ("orange", "oranges"), ("button", "buttons"), ("ribbon", "ribbons"), ("candle", "candles"),
    ("feather", "feathers"), ("puzzle", "puzzles"), ("kite", "kites"), ("cup", "cups"),
)  # fmt: skip
EVAL_OBJECTS = (
    ("pear", "pears"), ("marker", "markers"), ("pebble", "pebbles"), ("badge", "badges"),
    ("muffin", "muffins"), ("ticket", "tickets"), ("acorn", "acorns"), ("bead", "beads"),
    ("postcard", "postcards"), ("plum", "plums"), ("sock", "socks"), ("spoon", "spoons"),
)  # fmt: skip
# "{name} <verb> {n} ..." : a gain says "more"
GAIN_VERBS = ("finds", "gets", "buys", "is given", "picks up")
LOSS_VERBS = ("gives away", "loses", "sells", "trades away", "lends out")


def read_number(text: str) -> Fraction | None:
    """The number a reply answers with (the last `<answer>` tag, else the last number), exactly;
    None if there is none or it is not one plain number (the reason goes to `note_scoring`)."""
    answer = extract_answer(text)
    if answer is None:
        return None
    if not is_plain_number(answer):
        note_scoring(f"answer rejected: not a plain number ({len(answer)} characters: {answer[:40]!r})")
        return None
    return Fraction(Decimal(answer.replace(",", "")))


@dataclass
class StorySum:
    """One story (a `harnesses.base.Task`). Plain data: it pickles to Ray actors."""

    id: str
    question: str
    prompt: str
    answer: str  # the gold count, e.g. "6"
    person: str
    objects: str  # the plural noun
    operands: list[int]  # the start, then each change's amount
    operators: list[str]  # "+" or "-", one per change

    def extract_answer(self, text: str) -> str | None:
        """The answer this task would score in `text` (majority_vote votes on it)."""
        return extract_answer(text)

    def score(self, text: str) -> float:
        value = read_number(text)
        return float(value is not None and value == int(self.answer))


def _count(n: int, noun: tuple[str, str]) -> str:
    return f"{n} {noun[0] if n == 1 else noun[1]}"


def story(person: str, noun: tuple[str, str], start: int, changes: list[tuple[str, int, str]]) -> str:
    """The question: `changes` are (operator, amount, verb)."""
    sentences = [f"{person} has {_count(start, noun)}."]
    for k, (op, n, verb) in enumerate(changes):
        more = " more" if op == "+" else ""
        sentences.append(f"{'Then ' if k else ''}{person} {verb} {n}{more} {noun[0] if n == 1 else noun[1]}.")
    sentences.append(f"How many {noun[1]} does {person} have now?")
    return " ".join(sentences)


class StorySums(TaskSource):
    """Stories of `task.params.operations` changes; the held-out stream uses its own names and
    objects (see the module docstring)."""

    def setup(self) -> None:
        unknown = sorted(set(self.params) - set(DEFAULT_PARAMS))
        if unknown:
            raise ValueError(f"task.params.{unknown[0]} is not a story_sum parameter; known: {sorted(DEFAULT_PARAMS)}")
        self.operations = {**DEFAULT_PARAMS, **self.params}["operations"]
        if self.operations not in OPERATIONS:
            raise ValueError(f"task.params.operations must be one of {OPERATIONS}, got {self.operations!r}")

    def default_instruction(self) -> str:
        return DEFAULT_INSTRUCTION

    def draw(self, split: str, index: int, task_id: str) -> StorySum:
        seed = self.seed if split == "train" else self.eval_seed
        rng = random.Random(f"story_sum/{split}/{seed}/{index}")  # str seeds hash the same in every process
        names, objects = (TRAIN_NAMES, TRAIN_OBJECTS) if split == "train" else (EVAL_NAMES, EVAL_OBJECTS)
        person, noun = rng.choice(names), rng.choice(objects)
        count = start = rng.randint(1, 9)
        changes = []
        for _ in range(self.operations):
            # every (operator, amount) that keeps the count >= 0, equally likely
            op, n = rng.choice([("+", n) for n in range(1, 10)] + [("-", n) for n in range(1, min(count, 9) + 1)])
            changes.append((op, n, rng.choice(GAIN_VERBS if op == "+" else LOSS_VERBS)))
            count += n if op == "+" else -n
        question = story(person, noun, start, changes)
        return StorySum(
            id=task_id,
            question=question,
            prompt=f"{question}\n{self.instruction}" if self.instruction else question,
            answer=str(count),
            person=person,
            objects=noun[1],
            operands=[start, *(n for _, n, _ in changes)],
            operators=[op for op, _, _ in changes],
        )
