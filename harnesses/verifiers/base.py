"""The verifier's interface (`Verifier`) and its config key: what harnesses/verifiers/registry.py's
built-in verifiers, the LLM judge (judge.py) and a user's function (user.py) are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from harnesses.base import note_scoring
from harnesses.verifiers.answers import extract_answer

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
