"""majority_vote: k samples of one agent, the most common answer scored.

The inference-time control of a team (docs/results.md, issue 31's team study): as many model
calls as the team makes, spent on independent samples instead of roles.

Trace shape: 1 agent (`solver`), k sequences, each a fresh context on the task prompt, sampled at
`temperature` whatever the run's sampling (so a greedy evaluation still votes over k different
samples; each call has its own seed).
Reward: the task's verifier on the first sample whose answer is the most common one (ties go to
the answer seen first); with no answer in any sample, on the first sample.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter

from harnesses.base import Agents, HarnessResult, Task
from harnesses.verifiers.answers import extract_answer


def majority(answers: list[str | None]) -> int:
    """The index of the first sample holding the most common answer (None never wins unless
    every answer is None: then 0)."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return 0
    best = max(counts.values())
    return next(i for i, a in enumerate(answers) if a is not None and counts[a] == best)


async def majority_vote(
    task: Task, agents: Agents, k: int = 3, temperature: float = 0.7, system: str | None = None
) -> HarnessResult:
    if k < 1 or temperature <= 0:
        raise ValueError(f"majority_vote needs k >= 1 and temperature > 0; got k={k}, temperature={temperature}")
    solver = agents["solver"]
    samples = await asyncio.gather(
        *(solver.chat(task.prompt, system=system, temperature=temperature) for _ in range(k))
    )
    read = getattr(task, "extract_answer", extract_answer)
    answers = [read(s) for s in samples]
    pick = majority(answers)
    reward = task.score(samples[pick])
    if inspect.isawaitable(reward):  # a judged task (harnesses/verifiers/judge.py)
        reward = await reward
    votes = sum(a == answers[pick] for a in answers) if answers[pick] is not None else 0
    return HarnessResult(reward=reward, info={"answers": answers, "votes": votes, "answer": task.answer})
