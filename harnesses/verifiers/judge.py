"""The LLM-judge verifier: `task.params.verifier=judge`, a frozen model reads the answer and rules.

    python scripts/train.py experiment=smollm2_single_turn task=file task.params.verifier=judge \
        +agents.judge=frozen

A judge is an agent: its call runs inside the episode, on the engines of the policy its role
(`verifier_options.agent`, default `judge`) is mapped to, and is recorded in the trace like
any other sequence. The config refuses a judge role mapped to a trained policy (a judge trained
on the rewards it hands out learns to please itself), so its sequences carry no loss.

The judge's prompt is `verdict_options.template`, with `{question}`, `{answer}` (the model's
whole output) and `{gold}` (the item's gold answer) filled in; other braces stay as written.

The judged text cannot supply the verdict (rewards review #5). The verdict has a tag of its own,
`<verdict>...</verdict>`, which the template must ask for; in the judged answer every verdict tag is
made inert (`<verdict>` reads `[verdict]`) before it is sent, so a judge that quotes the answer
quotes no verdict. The judge's reply is hostile input too (linear scan, no evaluation): its first
verdict counts, and a reply whose verdicts disagree (a quoted one among them) is refused, as is a
reply whose first word (yes or no) contradicts its tag. Without a tag, with `verdict=yes_no` and
`first_word`, a reply may start with its verdict ("No, ..."). A verdict is at most
`max_verdict_chars` long; `verdict=yes_no` scores `yes` 1 and `no` 0, `verdict=score` a plain number
S in [0, max_score] as S / max_score. Anything else, and an answer over `max_chars` (not sent to the
judge), scores 0, and the trace's info["scoring"] says why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from harnesses.base import note_scoring
from harnesses.verifiers.answers import is_plain_number
from harnesses.verifiers.base import KEY, Verifier
from harnesses.verifiers.scoring import defer_score, scoring_agent

TEMPLATE = (
    "Question: {question}\nReference answer: {gold}\nProposed answer: {answer}\n\n"
    "Does the proposed answer give the same final answer as the reference answer? "
    "Reply with <verdict>yes</verdict> or <verdict>no</verdict>."
)
VERDICTS = ("yes_no", "score")
_PLACEHOLDER = re.compile(r"\{(question|answer|gold)\}")
_VERDICT_TAG = re.compile(r"<(/?)verdict>", re.IGNORECASE)
# what makes a verdict tag in the judged text inert: any spelling the judge might read as one
_QUOTED_TAG = re.compile(r"<(\s{0,20}/?\s{0,20})verdict(\s{0,20})>", re.IGNORECASE)
MAX_VERDICTS = 50  # a reply with more verdict tags than this is refused unread
_FIRST_WORD = re.compile(r"\s{0,100}([A-Za-z]{1,10})")  # anchored and bounded: a hostile reply costs nothing


@dataclass
class Judge(Verifier):
    name = "judge"
    agent: str = "judge"  # the role that judges; map it to a frozen policy (+agents.judge=frozen)
    template: str = TEMPLATE  # the judge's prompt: {question}, {answer} (the whole output), {gold}
    system: str | None = None  # the judge's system prompt
    verdict: str = "yes_no"  # yes_no: <verdict>yes</verdict> 1, no 0; score: <verdict>S</verdict> -> S / max_score
    max_score: float = 10.0  # verdict=score: the top of the scale
    max_chars: int = 4000  # a longer answer is not judged: it scores 0
    max_verdict_chars: int = 20  # a longer <verdict> in the judge's reply is refused: 0
    max_tokens: int = 64  # the judge's reply budget
    temperature: float = 0.0  # the judge's sampling temperature (0: greedy, one verdict per answer)
    first_word: bool = True  # verdict=yes_no: a reply with no <verdict> tag that starts with yes or no says so

    @property
    def needs_answer(self) -> bool:
        return "{gold}" in self.template

    def check(self) -> None:
        super().check()
        o = f"{KEY}_options"
        checks = [
            (self.verdict in VERDICTS, f"{o}.verdict={self.verdict!r}: one of {', '.join(VERDICTS)}"),
            ("{answer}" in self.template, f"{o}.template has no {{answer}} placeholder: the judge must see the answer"),
            (
                "<verdict>" in self.template,
                f"{o}.template never asks for <verdict>...</verdict>: the judge's verdict is read from that tag "
                f"only (the judged answer's own tags cannot supply it); see harnesses/verifiers/judge.py TEMPLATE",
            ),
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
        values = {"question": question or "", "answer": inert_verdicts(text), "gold": gold or ""}
        # one pass over the template: an answer that contains "{gold}" is not filled in again
        prompt = _PLACEHOLDER.sub(lambda m: values[m[1]], self.template)
        return defer_score(self._ask(agent, prompt))

    async def _ask(self, agent, prompt: str) -> float:
        reply = await agent.chat(prompt, system=self.system, max_tokens=self.max_tokens, temperature=self.temperature)
        return self.read_verdict(reply)

    def read_verdict(self, reply: str) -> float:
        """The reward the judge's `reply` gives; 0.0 with a scoring note when it gives none."""
        tags = _verdict_tags(reply)
        if tags is None:
            note_scoring(f"judge verdict refused: more than {MAX_VERDICTS} <verdict> tags in its reply")
            return 0.0
        word = _FIRST_WORD.match(reply)
        said = word[1].casefold() if word and word[1].casefold() in ("yes", "no") else None
        if not tags:
            if said is None or self.verdict != "yes_no" or not self.first_word:
                note_scoring(f"judge verdict refused: no <verdict> tag in its reply ({len(reply)} characters)")
                return 0.0
            tags = [said]
        values = [self._value(content) for content in tags]
        if any(v is None for v in values):
            return 0.0
        if len(set(values)) > 1:
            note_scoring(f"judge verdict refused: its verdicts disagree ({', '.join(map(repr, tags[:4]))})")
            return 0.0
        if self.verdict == "yes_no" and said is not None and float(said == "yes") != values[0]:
            note_scoring(f"judge verdict refused: its first word {said!r} contradicts its verdict {tags[0]!r}")
            return 0.0
        return values[0]

    def _value(self, content: str) -> float | None:
        """The reward one verdict's text gives; None (with a scoring note) when it is no verdict."""
        if len(content) > self.max_verdict_chars:
            note_scoring(f"judge verdict refused: {len(content)} characters (the limit is {self.max_verdict_chars})")
            return None
        word = content.strip().casefold().removesuffix(".")
        if self.verdict == "yes_no":
            if word in ("yes", "no"):
                return float(word == "yes")
            note_scoring(f"judge verdict refused: {content!r} is neither yes nor no")
            return None
        number = word.replace(",", "")
        if is_plain_number(number) and 0 <= (value := Decimal(number)) <= Decimal(repr(self.max_score)):
            return float(value / Decimal(repr(self.max_score)))
        note_scoring(f"judge verdict refused: {content!r} is not a number in [0, {self.max_score}]")
        return None


def inert_verdicts(text: str) -> str:
    """`text` with every verdict tag (any case, spaced) written `[verdict]` / `[/verdict]`: what a
    judged answer is sent as, so that quoting it quotes no verdict."""
    return _QUOTED_TAG.sub(lambda m: f"[{m[1].strip()}verdict]", text)


def _verdict_tags(reply: str) -> list[str] | None:
    """The contents of the reply's closed `<verdict>` tags in order (an opening tag pairs with the
    next closing one); None when there are more than MAX_VERDICTS. One linear scan."""
    tags: list[str] = []
    start = None
    for tag in _VERDICT_TAG.finditer(reply):
        if not tag[1]:
            start = tag.end()
        elif start is not None:
            tags.append(reply[start : tag.start()])
            start = None
            if len(tags) > MAX_VERDICTS:
                return None
    return tags
