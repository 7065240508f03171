"""solver_verifier: a solver answers, a verifier critiques, the solver revises.

Trace shape: 2 agents, 3 sequences —
  [0] solver: task prompt -> draft
  [1] verifier: fresh context (problem + draft) -> critique
  [2] solver: [0]'s prompt + draft + reviewer turn -> final   (parent 0; merges with [0])
Reward: the task's verifier on the solver's final answer (shared by both roles).
"""

from __future__ import annotations

from harnesses.base import HarnessResult

SOLVER_SYSTEM = "You are a careful solver. Think briefly, then answer."
VERIFIER_PROMPT = (
    "Problem: {problem}\n\nProposed solution: {draft}\n\n"
    "Is the proposed solution correct? Check it and say why in one or two sentences."
)
REVISE_PROMPT = "A reviewer wrote: {critique}\n\nGive your final answer."


async def solver_verifier(task, agents, system: str = SOLVER_SYSTEM) -> HarnessResult:
    solver = agents["solver"].conversation(system=system)
    draft = await solver.reply(task.prompt)
    critique = await agents["verifier"].chat(VERIFIER_PROMPT.format(problem=task.question, draft=draft))
    final = await solver.reply(REVISE_PROMPT.format(critique=critique))
    return HarnessResult(reward=task.score(final), info={"draft_score": task.score(draft), "answer": task.answer})
