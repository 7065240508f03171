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
    """Questions "<word> <number>"; `params` and the dataset name are unused."""

    def default_instruction(self) -> str:
        return "Reply with digits only."

    def _task(self, split: str, index: int, seed: int) -> DigitTask:
        question = f"{_WORDS[(seed + index) % len(_WORDS)]} {(seed * 31 + index * 17) % 1000}"
        return DigitTask(f"{self.name}/{split}/{index}", question, f"{question}\n{self.instruction}")

    def train_task(self, index: int) -> DigitTask:
        return self._task("train", index % self.size, self.seed)

    def eval_tasks(self) -> list[DigitTask]:
        return [self._task("eval", i, self.eval_seed) for i in range(self.eval_size)]
