"""solver_verifier: a solver answers, a verifier critiques, the solver revises.

Trace shape: 2 agents, 3 sequences —
  [0] solver: task prompt -> draft
  [1] verifier: fresh context (problem + draft) -> critique
  [2] solver: [0]'s prompt + draft + reviewer turn -> final   (parent 0; merges with [0])
Reward: the task's verifier on the solver's final answer (shared by both roles).

With `verdicts=True` the verifier is also asked to end its critique with a verdict
("VERDICT: CORRECT" or "VERDICT: WRONG"), and the roles get rewards of their own in
agent_rewards: the solver the final answer's score, the verifier 1.0 when its verdict is
right about the draft (0.0 when wrong or missing). The trace reward stays the final answer's.
Two jobs, two reward streams of different means and spreads: the team study's credit
arms (`algorithm.advantage.per_agent_rewards`, docs/results.md) train on them.
"""

from __future__ import annotations

import inspect
import re

from harnesses.base import Agents, HarnessResult, Task

SOLVER_SYSTEM = "You are a careful solver. Think briefly, then answer."
VERIFIER_PROMPT = (
    "Problem: {problem}\n\nProposed solution: {draft}\n\n"
    "Is the proposed solution correct? Check it and say why in one or two sentences."
)
VERDICT_LINE = " Then end with VERDICT: CORRECT or VERDICT: WRONG."
REVISE_PROMPT = "A reviewer wrote: {critique}\n\nGive your final answer."
# The last verdict word of a critique; "not correct" and "incorrect" count as WRONG.
_VERDICT = re.compile(r"\b(not correct|incorrect|wrong|correct)\b", re.IGNORECASE)


def verdict(critique: str) -> bool | None:
    """True if the critique's last verdict word says the draft is correct, False if wrong, None if
    it says neither. Linear in the text (one pass of a fixed pattern)."""
    last = None
    for m in _VERDICT.finditer(critique):
        last = m.group(1).lower()
    return None if last is None else last == "correct"


async def solver_verifier(
    task: Task, agents: Agents, system: str = SOLVER_SYSTEM, verdicts: bool = False
) -> HarnessResult:
    solver = agents["solver"].conversation(system=system)
    draft = await solver.reply(task.prompt)
    ask = VERIFIER_PROMPT + (VERDICT_LINE if verdicts else "")
    critique = await agents["verifier"].chat(ask.format(problem=task.question, draft=draft))
    final = await solver.reply(REVISE_PROMPT.format(critique=critique))
    reward, draft_score = task.score(final), task.score(draft)
    info = {"draft_score": draft_score, "answer": task.answer}
    if not verdicts:
        return HarnessResult(reward=reward, info=info)
    if inspect.isawaitable(draft_score):  # an LLM judge's score (harnesses/verifiers/judge.py): its value is needed now
        draft_score = info["draft_score"] = await draft_score
    said = verdict(critique)
    right = said is not None and said == (draft_score >= 1.0)
    info["verdict"] = said
    return HarnessResult(reward=reward, agent_rewards={"solver": reward, "verifier": float(right)}, info=info)
