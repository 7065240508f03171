"""Test-only harnesses: misbehave on chosen task indices, behave on the rest."""

import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np

from harnesses.base import HarnessResult


def _index(task) -> int:
    return int(task.id.rsplit("/", 1)[1])


def block_marker(index: int) -> Path:
    """While this file exists, task `index` (200-299) of `flaky` blocks its worker's event loop, once."""
    return Path(tempfile.gettempdir()) / f"tracerl-test-block-{index}"


async def flaky(task, agents, raise_on: int = 1, hang_on: int = 2, nan_on: int = 3, hang_from: int = 100):
    """One model call; then raises / hangs / returns NaN on the chosen task indices (hangs from
    `hang_from` on too); tasks 50-99 take a second more; tasks 200-299 block the event loop for 90 s
    (a synchronous call: the worker answers nothing) if their `block_marker` exists, which they remove."""
    text = await agents["solver"].chat(task.prompt, max_tokens=8)
    i = _index(task)
    if 50 <= i < 100:
        await asyncio.sleep(1.0)
    if 200 <= i < 300 and block_marker(i).exists():
        block_marker(i).unlink()
        time.sleep(90)
    if i == raise_on:
        raise RuntimeError(f"harness bug on task {i}")
    if i == hang_on or hang_from <= i < 200:
        await asyncio.sleep(3600)
    if i == nan_on:
        return float("nan")
    return {"solver": task.score(text), "judge": 0.5} if i == 4 else task.score(text)


async def judged(task, agents):
    """Solver then a judge that never spoke before: per-agent rewards."""
    a = await agents["solver"].chat(task.prompt, max_tokens=6)
    await agents["judge"].chat(f"Is this right? {a}", max_tokens=4)
    return {"solver": 1.0, "judge": -1.0}


BAD_RESULTS = [
    HarnessResult(reward=0.5, info=["not", "a", "dict"]),  # 0: info not a dict
    HarnessResult(reward=0.5, info={"score": np.int64(3)}),  # 1: numpy number in info
    np.float32(0.5),  # 2: a numpy reward that is not a Python float
    HarnessResult(reward="0.5"),  # 3: a string reward
    HarnessResult(reward=0.5, agent_rewards={"solver": None}),  # 4: a per-agent reward that is no number
    HarnessResult(reward=0.5, info={"note": "fine"}),  # 5: a good result
]


async def bad_results(task, agents):
    """One model call, then the bad (or, for task 5, good) result BAD_RESULTS[task index]."""
    await agents["solver"].chat(task.prompt, max_tokens=4)
    return BAD_RESULTS[_index(task)]


async def hostile_answer(task, agents):
    """One model call, then on task 0 a countdown verifier fed an expression that would never
    finish evaluating if a library evaluated it (SymPy's parse_expr did); the other tasks score
    normally."""
    text = await agents["solver"].chat(task.prompt, max_tokens=4)
    if _index(task) == 0:
        from harnesses.tasks.reasoning_gym import ReasoningGymTasks

        return ReasoningGymTasks("countdown", eval_size=0).train_task(0).score("<answer>9**9**9**9</answer>")
    return task.score(text)


async def broken(task, agents):
    """One model call, then always fails, as a harness whose tool server is down would."""
    await agents["solver"].chat(task.prompt, max_tokens=4)
    raise ConnectionError("tool server at localhost:9 refused the connection")
