"""Test-only harnesses: misbehave on chosen task indices, behave on the rest."""

import asyncio


def _index(task) -> int:
    return int(task.id.rsplit("/", 1)[1])


async def flaky(task, agents, raise_on: int = 1, hang_on: int = 2, nan_on: int = 3):
    """One model call; then raises / hangs / returns NaN on the chosen task indices."""
    text = await agents["solver"].chat(task.prompt, max_tokens=8)
    i = _index(task)
    if i == raise_on:
        raise RuntimeError(f"harness bug on task {i}")
    if i == hang_on:
        await asyncio.sleep(3600)
    if i == nan_on:
        return float("nan")
    return {"solver": task.score(text), "judge": 0.5} if i == 4 else task.score(text)


async def judged(task, agents):
    """Solver then a judge that never spoke before: per-agent rewards."""
    a = await agents["solver"].chat(task.prompt, max_tokens=6)
    await agents["judge"].chat(f"Is this right? {a}", max_tokens=4)
    return {"solver": 1.0, "judge": -1.0}
