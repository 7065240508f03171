"""single_turn: one model call on the task prompt, scored by the task's verifier.

Trace shape: 1 agent (`solver`), 1 sequence.
"""

from __future__ import annotations

from harnesses.base import Agents, Score, Task


async def single_turn(task: Task, agents: Agents, system: str | None = None) -> Score:
    answer = await agents["solver"].chat(task.prompt, system=system)
    return task.score(answer)
