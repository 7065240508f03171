"""Starting positions of two-player games, as tasks: what `harness=selfplay` plays from.

`NimPositions` (task=nim): positions of the subtraction game the selfplay harness plays, a pile
of `stones` from which a move takes 1 to `max_take`. The question is the position in words, so
TaskSource's held-out-by-content logic holds out positions: no held-out position is ever a
training start, and no two held-out items are the same position. With the defaults, 36 pile
sizes x 3 move limits = 108 positions; task.eval_size=32 leaves 76 to train on.

The game, not a text, decides the outcome (harnesses/programs/selfplay.py gives the per-agent rewards),
so a position's `score` is 0.0 for any text and it has no `answer`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from harnesses.base import TaskSource

DEFAULT_PARAMS = {"min_stones": 5, "max_stones": 40, "min_take": 2, "max_take": 4}


@dataclass
class NimPosition:
    id: str
    question: str
    prompt: str
    stones: int  # the starting pile
    max_take: int  # a move takes 1..max_take stones
    answer: str | None = None

    def score(self, text: str) -> float:
        return 0.0  # the game decides (per-agent rewards from the harness), not a text


def nim_question(stones: int, max_take: int) -> str:
    return f"Nim: {stones} stones, take 1 to {max_take} per move"


class NimPositions(TaskSource):
    """Nim starting positions drawn uniformly from `task.params` (DEFAULT_PARAMS for any key not
    given): pile min_stones..max_stones, move limit min_take..max_take."""

    def setup(self) -> None:
        unknown = sorted(set(self.params) - set(DEFAULT_PARAMS))
        if unknown:
            raise ValueError(f"task.params.{unknown[0]} is not a nim parameter; known: {sorted(DEFAULT_PARAMS)}")
        p = {**DEFAULT_PARAMS, **self.params}
        self.stones = (int(p["min_stones"]), int(p["max_stones"]))
        self.takes = (int(p["min_take"]), int(p["max_take"]))
        for key, (lo, hi) in (("stones", self.stones), ("take", self.takes)):
            if not 1 <= lo <= hi:
                raise ValueError(f"task.params: need 1 <= min_{key} <= max_{key}, got {lo} and {hi}")
        positions = (self.stones[1] - self.stones[0] + 1) * (self.takes[1] - self.takes[0] + 1)
        if self.eval_size >= positions:  # the held-out set would leave nothing to train on
            raise ValueError(
                f"task {self.name!r} with params {p}: {positions} positions, and task.eval_size={self.eval_size} "
                f"holds out all of them; lower task.eval_size (and eval.size) or widen the task (task.params)"
            )

    def draw(self, split: str, index: int, task_id: str) -> NimPosition:
        seed = self.seed if split == "train" else self.eval_seed
        rng = random.Random(f"nim/{seed}/{index}")  # str seeds hash the same in every process
        stones, max_take = rng.randint(*self.stones), rng.randint(*self.takes)
        question = nim_question(stones, max_take)
        prompt = f"{question}\n{self.instruction}" if self.instruction else question
        return NimPosition(task_id, question, prompt, stones, max_take)
