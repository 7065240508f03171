"""Synthetic tasks with a dense, learnable reward: for checking that the training loop closes.

`DigitTasks`: reward = the fraction of the generated text's non-space
characters that are digits. A random-init tiny model starts near zero and can
learn it within minutes on a CPU — but only if the engines really receive the
trained weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from harnesses.base import TaskSource

_WORDS = ("apple", "river", "stone", "cloud", "green", "seven", "table", "light")


@dataclass
class DigitTask:
    id: str
    question: str
    prompt: str
    answer: str | None = None

    def score(self, text: str) -> float:
        chars = [c for c in text if not c.isspace()]
        return sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0


class DigitTasks(TaskSource):
    """Questions "<word> <number>"; the dataset name is unused, and it takes no `params`."""

    def default_instruction(self) -> str:
        return "Reply with digits only."

    def draw(self, split: str, index: int, task_id: str) -> DigitTask:
        seed = self.seed if split == "train" else self.eval_seed
        question = f"{_WORDS[(seed + index) % len(_WORDS)]} {(seed * 31 + index * 17) % 1000}"
        return DigitTask(task_id, question, f"{question}\n{self.instruction}")
