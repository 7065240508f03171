"""What a harness and a task are, and how the rollout side loads and runs a harness.

A harness is a plain async function (or an object with an async `__call__`):

    async def my_harness(task: Task, agents: dict[str, Agent], **options) -> Reward

It calls models only through `agents` (see rollout/client.py), and returns the
reward of the whole run: a float, a dict role -> reward (per-agent rewards,
e.g. zero-sum games), or a `HarnessResult` carrying extra info for logs.

A `Task` is what a harness is given: a prompt and a verifier (`score`). A
`TaskSource` makes them: training task `i` for any index `i`, deterministically,
and a fixed held-out set. Sources plug in by class path (`task._target_`) and
all take the constructor of `TaskSource`.

Harnesses and tasks import no Ray, torch or vLLM.
"""

from __future__ import annotations

import importlib
import inspect
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol, Union


# ---- tasks ---------------------------------------------------------------------------

class Task(Protocol):
    """One task instance. Travels to Ray actors, so it must pickle."""

    id: str  # unique within its source: "<name>/<train|eval>/<index>"
    question: str  # the bare question
    prompt: str  # the question plus the answer-format instruction: what a model is sent
    answer: str | None  # the gold answer, when there is one

    def score(self, text: str) -> float:
        """Reward in [0, 1] for a model's final output text."""
        ...


class TaskSource(ABC):
    """Deterministic training tasks by index, and a fixed held-out set.

    Training task `i` depends only on the constructor arguments and `i` (so a
    resumed or restarted run sees the same tasks); `eval_tasks()` is the same
    list every time. `instruction` is appended to each question; None picks the
    source's default.
    """

    def __init__(self, name: str, params: dict | None = None, instruction: str | None = None,
                 size: int = 100000, eval_size: int = 64, eval_seed: int = 1000003, seed: int = 0):
        if size < 1:
            raise ValueError(f"task.size must be >= 1, got {size}")
        if eval_size < 0:
            raise ValueError(f"task.eval_size must be >= 0, got {eval_size}")
        self.name = name
        self.params = dict(params or {})
        self.instruction = instruction if instruction is not None else self.default_instruction()
        self.size = size
        self.eval_size = eval_size
        self.eval_seed = eval_seed
        self.seed = seed

    def default_instruction(self) -> str | None:
        """The answer-format line appended to questions when `instruction` is None."""
        return None

    def __len__(self) -> int:
        """Number of training indices before `train_task` wraps around."""
        return self.size

    @abstractmethod
    def train_task(self, index: int) -> Task:
        """Training task `index` (wrapped modulo `size`)."""

    @abstractmethod
    def eval_tasks(self) -> list[Task]:
        """The `eval_size` held-out tasks, in a fixed order."""


# ---- harnesses -------------------------------------------------------------------------

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


def load_object(target: str, key: str) -> Any:
    """Import `package.module.name` named by the config key `key`; a clear error if it cannot be."""
    module, _, name = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"{key}={target!r} cannot be imported: {e}") from None


def load_harness(target: str) -> Harness:
    """Import `package.module.name`; instantiate it if it is a class."""
    obj = load_object(target, "harness._target_")
    if inspect.isclass(obj):
        obj = obj()
    fn = obj if inspect.iscoroutinefunction(obj) else getattr(obj, "__call__", None)
    if not inspect.iscoroutinefunction(fn):
        raise ValueError(f"harness {target!r} must be an async function (or have an async __call__)")
    return obj


def load_task_source(target: str) -> type[TaskSource]:
    """Import the task source class named by `task._target_`."""
    cls = load_object(target, "task._target_")
    if not (inspect.isclass(cls) and issubclass(cls, TaskSource)):
        raise ValueError(f"task._target_={target!r} is not a TaskSource subclass (harnesses/base.py)")
    return cls
