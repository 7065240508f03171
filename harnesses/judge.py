"""The LLM-judge verifier: `task.params.verifier=judge`, a frozen model reads the answer and rules.

    python scripts/train.py experiment=smollm2_single_turn task=file task.params.verifier=judge \
        +agents.judge=frozen

A judge is an agent: its call runs inside the episode, on the engines of the policy its role
(`verifier_options.agent`, default `judge`) is mapped to, and is recorded in the trace like
any other sequence. The config refuses a judge role mapped to a trained policy (a judge trained
on the rewards it hands out learns to please itself), so its sequences carry no loss.

The judge's prompt is `verifier_options.template`, with `{question}`, `{answer}` (the model's
whole output) and `{gold}` (the item's gold answer) filled in; other braces stay as written.
Its reply is hostile input too: only the last `<answer>...</answer>` is read (linear scan, no
evaluation), at most `max_verdict_chars` long (with `verdict=yes_no` and `first_word`, a reply
without the tag may start with its verdict: "No, ..."); `verdict=yes_no` scores `yes` 1 and `no` 0,
`verdict=score` a plain number S in [0, max_score] as S / max_score. Anything else, and an
answer over `max_chars` (not sent to the judge), scores 0, and the trace's info["scoring"]
says why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from harnesses.answers import extract_answer, is_plain_number
from harnesses.base import note_scoring
from harnesses.scoring import defer_score, scoring_agent
from harnesses.verifiers import KEY, Verifier

TEMPLATE = (
    "Question: {question}\nReference answer: {gold}\nProposed answer: {answer}\n\n"
    "Does the proposed answer give the same final answer as the reference answer? "
    "Reply with <answer>yes</answer> or <answer>no</answer>."
)
VERDICTS = ("yes_no", "score")
_PLACEHOLDER = re.compile(r"\{(question|answer|gold)\}")
_FIRST_WORD = re.compile(r"\s{0,100}([A-Za-z]{1,10})")  # anchored and bounded: a hostile reply costs nothing


@dataclass
class Judge(Verifier):
    name = "judge"
    agent: str = "judge"  # the role that judges; map it to a frozen policy (+agents.judge=frozen)
    template: str = TEMPLATE  # the judge's prompt: {question}, {answer} (the whole output), {gold}
    system: str | None = None  # the judge's system prompt
    verdict: str = "yes_no"  # yes_no: <answer>yes</answer> 1, no 0; score: <answer>S</answer> -> S / max_score
    max_score: float = 10.0  # verdict=score: the top of the scale
    max_chars: int = 4000  # a longer answer is not judged: it scores 0
    max_verdict_chars: int = 20  # a longer <answer> in the judge's reply is refused: 0
    max_tokens: int = 64  # the judge's reply budget
    temperature: float = 0.0  # the judge's sampling temperature (0: greedy, one verdict per answer)
    first_word: bool = True  # verdict=yes_no: a reply with no <answer> tag that starts with yes or no says so

    @property
    def needs_answer(self) -> bool:
        return "{gold}" in self.template

    def check(self) -> None:
        super().check()
        o = f"{KEY}_options"
        checks = [
            (self.verdict in VERDICTS, f"{o}.verdict={self.verdict!r}: one of {', '.join(VERDICTS)}"),
            ("{answer}" in self.template, f"{o}.template has no {{answer}} placeholder: the judge must see the answer"),
            (bool(self.agent), f"{o}.agent is empty: name the judging role, e.g. judge"),
            (self.max_score > 0, f"{o}.max_score={self.max_score} must be > 0"),
            (self.max_verdict_chars >= 1, f"{o}.max_verdict_chars must be >= 1"),
            (self.max_tokens >= 1, f"{o}.max_tokens={self.max_tokens} must be >= 1"),
            (self.temperature >= 0, f"{o}.temperature={self.temperature} must be >= 0"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)

    def roles(self) -> list[str]:
        return [self.agent]

    def score(self, text: str, gold: str | None, metadata: dict[str, Any], question: str | None = None):
        """The judge's verdict on `text`, as an awaitable started now (a float 0.0 for an answer
        refused unsent)."""
        agent = scoring_agent(self.agent, f"{KEY}=judge")
        if len(text) > self.max_chars:
            note_scoring(f"answer not judged: {len(text)} characters (the limit is {self.max_chars})")
            return 0.0
        values = {"question": question or "", "answer": text, "gold": gold or ""}
        # one pass over the template: an answer that contains "{gold}" is not filled in again
        prompt = _PLACEHOLDER.sub(lambda m: values[m[1]], self.template)
        return defer_score(self._ask(agent, prompt))

    async def _ask(self, agent, prompt: str) -> float:
        reply = await agent.chat(prompt, system=self.system, max_tokens=self.max_tokens, temperature=self.temperature)
        return self.read_verdict(reply)

    def read_verdict(self, reply: str) -> float:
        """The reward the judge's `reply` gives; 0.0 with a scoring note when it gives none."""
        content = extract_answer(reply, numeric_fallback=False)
        if content is None and self.verdict == "yes_no" and self.first_word:
            word = _FIRST_WORD.match(reply)
            content = word[1] if word and word[1].casefold() in ("yes", "no") else None
        if content is None:
            note_scoring(f"judge verdict refused: no <answer> tag in its reply ({len(reply)} characters)")
            return 0.0
        if len(content) > self.max_verdict_chars:
            note_scoring(f"judge verdict refused: {len(content)} characters (the limit is {self.max_verdict_chars})")
            return 0.0
        word = content.strip().casefold().removesuffix(".")
        if self.verdict == "yes_no":
            if word in ("yes", "no"):
                return float(word == "yes")
            note_scoring(f"judge verdict refused: {content!r} is neither yes nor no")
            return 0.0
        number = word.replace(",", "")
        if is_plain_number(number) and 0 <= (value := Decimal(number)) <= Decimal(repr(self.max_score)):
            return float(value / Decimal(repr(self.max_score)))
        note_scoring(f"judge verdict refused: {content!r} is not a number in [0, {self.max_score}]")
        return 0.0
