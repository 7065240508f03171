"""single_turn: one model call on the task prompt, scored by the task's verifier.

Trace shape: 1 agent (`solver`), 1 sequence.
"""

from __future__ import annotations


async def single_turn(task, agents, system: str | None = None) -> float:
    answer = await agents["solver"].chat(task.prompt, system=system)
    return task.score(answer)
