"""orchestrator: splits the task, runs parallel sub-agents, and aggregates their results.

The orchestrator's first turn writes sub-tasks, one per line starting with "- "; how many is
decided at run time (1 to `max_subagents`; none parsed means one sub-agent on the whole task).
Each sub-agent answers its sub-task in a fresh context, concurrently. The orchestrator's
second turn continues its conversation with their results and gives the final answer.

Trace shape, with k = info["subagents"], 2 agents:
  orchestrator: task -> plan;  orchestrator: plan + results -> answer (parent = the plan; the two
    merge into one training row)
  k subagent sequences, fresh contexts (no parent, no shared prefix with anything): k rows.
  k + 2 sequences.
Reward: the task's verifier on the orchestrator's final answer (shared).
"""

from __future__ import annotations

import asyncio
import re

from harnesses.base import Agents, HarnessResult, Task

PLAN = (
    "{prompt}\n\nYou lead a team of helpers. First split this problem into at most {n} small "
    "sub-questions, one per line, each line starting with '- '. Do not answer yet."
)
SUB = "Answer this briefly and exactly.\n{question}"
AGGREGATE = "Your helpers answered:\n{results}\n\nNow give the final answer to the original problem."
# A list item's marker at the start of a stripped line. Matched line by line, never over the whole
# plan: a MULTILINE pattern whose `\s` spans newlines retried from every line is quadratic, and a
# model can write 32k newlines (rewards review #13: 20 s on the event loop).
_BULLET = re.compile(r"(?:[-*•]|\d{1,6}[.)])[ \t]+")


def subtasks(plan: str, max_subagents: int) -> list[str]:
    """The plan's list items ("- ...", "* ...", "1. ..."), at most `max_subagents`. Linear in the plan."""
    items = []
    for line in plan.splitlines():
        line = line.strip()
        bullet = _BULLET.match(line)
        if bullet and (item := line[bullet.end() :].strip()):
            items.append(item)
            if len(items) == max_subagents:
                break
    return items


async def orchestrator(task: Task, agents: Agents, max_subagents: int = 3) -> HarnessResult:
    lead = agents["orchestrator"].conversation()
    plan = await lead.reply(PLAN.format(prompt=task.prompt, n=max_subagents))
    questions = subtasks(plan, max_subagents) or [task.question]
    answers = await asyncio.gather(*(agents["subagent"].chat(SUB.format(question=q)) for q in questions))
    results = "\n".join(f"{i + 1}. {q} -> {a.strip()}" for i, (q, a) in enumerate(zip(questions, answers)))
    final = await lead.reply(AGGREGATE.format(results=results))
    return HarnessResult(reward=task.score(final), info={"subagents": len(questions), "answer": task.answer})
