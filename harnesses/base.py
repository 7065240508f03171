"""What a harness is, and how the rollout side loads and runs one.

A harness is a plain async function (or an object with an async `__call__`):

    async def my_harness(task: Task, agents: dict[str, Agent], **options) -> Reward

It calls models only through `agents` (see rollout/client.py), and returns the
reward of the whole run: a float, a dict role -> reward (per-agent rewards,
e.g. zero-sum games), or a `HarnessResult` carrying extra info for logs.
Harnesses import no Ray, torch or vLLM.
"""

from __future__ import annotations

import importlib
import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Union


@dataclass
class HarnessResult:
    reward: float  # reward of the whole trace
    agent_rewards: dict[str, float] | None = None  # optional role -> reward
    info: dict[str, Any] = field(default_factory=dict)  # anything worth seeing in the trace viewer


Reward = Union[float, int, bool, dict, HarnessResult]
Harness = Callable[..., Awaitable[Reward]]


def as_result(value: Reward) -> HarnessResult:
    """Normalise what a harness returned; raise ValueError saying what was wrong."""
    if isinstance(value, HarnessResult):
        result = value
    elif isinstance(value, dict):
        if not value:
            raise ValueError("harness returned an empty per-agent reward dict")
        rewards = {str(k): float(v) for k, v in value.items()}
        result = HarnessResult(reward=sum(rewards.values()) / len(rewards), agent_rewards=rewards)
    elif isinstance(value, (int, float)):  # bool is an int
        result = HarnessResult(reward=float(value))
    else:
        raise ValueError(f"harness returned {type(value).__name__}; expected a float reward, "
                         f"a dict role -> reward, or a HarnessResult")
    values = [result.reward, *(result.agent_rewards or {}).values()]
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"harness returned a non-finite reward: {values}")
    return result


def load_harness(target: str) -> Harness:
    """Import `package.module.name`; instantiate it if it is a class."""
    module, _, name = target.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"harness._target_={target!r} cannot be imported: {e}") from None
    if inspect.isclass(obj):
        obj = obj()
    fn = obj if inspect.iscoroutinefunction(obj) else getattr(obj, "__call__", None)
    if not inspect.iscoroutinefunction(fn):
        raise ValueError(f"harness {target!r} must be an async function (or have an async __call__)")
    return obj
