"""solver_verifier_corrector: a solver answers; a verifier judges; a corrector revises on rejection.

Up to `rounds` verify/correct rounds; the run stops at the first ACCEPT.

Trace shape, with r = the rounds actually run (info["rounds"]), 3 agents:
  [0] solver: task prompt -> answer
  then per round k = 1..r:
    verifier: fresh context (problem + current answer) -> verdict ("ACCEPT" or "REJECT: why")
    corrector (only after a REJECT): a conversation of its own; round 1 opens it with the problem,
      the answer and the critique, later rounds continue it (parent = its previous turn), so all
      corrector turns merge into one training row.
  1 + r verifier/corrector pairs: 1 + 2r sequences if every verdict rejects; 1 + 2r - 1 if the
  last one accepts.
Reward: the task's verifier on the final answer (shared by every role).
"""

from __future__ import annotations

import re

from harnesses.base import Agents, HarnessResult, Task

VERIFY = (
    "Problem: {problem}\n\nProposed answer: {answer}\n\nIf the proposed answer is correct, reply "
    "ACCEPT. Otherwise reply REJECT and say in one sentence what is wrong."
)
CORRECT = (
    "Problem: {problem}\n\nA proposed answer: {answer}\n\nA reviewer rejected it: {critique}\n\n"
    "Write a corrected answer."
)
AGAIN = "The reviewer rejected your answer again: {critique}\n\nWrite a corrected answer."
_ACCEPT = re.compile(r"\bACCEPT\b")


def accepted(verdict: str) -> bool:
    """A verdict accepts when it says ACCEPT (upper case) and not REJECT."""
    return bool(_ACCEPT.search(verdict)) and "REJECT" not in verdict


async def solver_verifier_corrector(task: Task, agents: Agents, rounds: int = 2) -> HarnessResult:
    answer = await agents["solver"].chat(task.prompt)
    corrector = agents["corrector"].conversation()
    verdicts = []
    for k in range(rounds):
        verdict = await agents["verifier"].chat(VERIFY.format(problem=task.question, answer=answer))
        verdicts.append(accepted(verdict))
        if verdicts[-1]:
            break
        turn = CORRECT if k == 0 else AGAIN
        answer = await corrector.reply(turn.format(problem=task.prompt, answer=answer, critique=verdict))
    return HarnessResult(
        reward=task.score(answer), info={"rounds": len(verdicts), "accepted": verdicts, "answer": task.answer}
    )
