"""What a harness and a task are, and how the rollout side loads and runs a harness.

A harness is a plain async function (or an object with an async `__call__`):

    async def my_harness(task: Task, agents: Agents, **options) -> Reward

It calls models only through `agents` (role -> `Agent`: `chat`, `conversation`, `generate`; the
protocols below, which rollout/agents/client.py's classes satisfy), and returns the reward of
the whole run: a float (or a task's `score`), a dict role -> reward (per-agent rewards, e.g.
zero-sum games), or a `HarnessResult` carrying extra info for logs.

A `Task` is what a harness is given: a prompt and a verifier (`score`). A
`TaskSource` makes them: training task `i` for any index `i`, deterministically,
and a fixed held-out set. Sources plug in by class path (`task._target_`) and
all take the constructor of `TaskSource`.

Harnesses and tasks import no Ray, torch or vLLM.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import importlib
import inspect
import json
import math
import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

# ---- tasks ---------------------------------------------------------------------------


class Task(Protocol):
    """One task instance. Travels to Ray actors, so it must pickle."""

    id: str  # unique within its source: "<name>/<train|eval>/<index>"
    question: str  # the bare question
    prompt: str  # the question plus the answer-format instruction: what a model is sent
    answer: str | None  # the gold answer, when there is one

    def score(self, text: str) -> float | Awaitable[float]:
        """Reward in [0, 1] for a model's final output text. A task whose verifier asks a model
        (the LLM judge: harnesses/verifiers/judge.py) returns an awaitable: a harness may await it or return
        it as (part of) its reward, and the rollout worker awaits it (harnesses/verifiers/scoring.py)."""
        ...


# Why a score was what it was (e.g. an answer refused unread), for the trace's info["scoring"]:
# the rollout worker collects around each episode; a task's score() notes. A ContextVar, so that
# concurrent episodes on one event loop (each its own asyncio task) keep separate lists.
_SCORING_NOTES: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("scoring_notes", default=None)


@contextlib.contextmanager
def collect_scoring_notes() -> Iterator[list[str]]:
    """Collect the notes `note_scoring` makes inside the block into the list it yields."""
    notes: list[str] = []
    token = _SCORING_NOTES.set(notes)
    try:
        yield notes
    finally:
        _SCORING_NOTES.reset(token)


def note_scoring(reason: str) -> None:
    """Record why a score was given, in the innermost active `collect_scoring_notes`; a no-op
    outside one."""
    notes = _SCORING_NOTES.get()
    if notes is not None:
        notes.append(reason)


def normalize_question(text: str) -> str:
    """The form two questions are compared in: case and white space do not count."""
    return " ".join(text.lower().split())


class TaskSource(ABC):
    """Deterministic training tasks by index, and a fixed held-out set, disjoint by content.

    Subclasses say how to `draw` raw item j of the training stream (from `seed`)
    or of the held-out stream (from `eval_seed`). From those, this class builds:

    * `eval_tasks()`: the first `eval_size` held-out draws with distinct questions
      (normalised text); if `eval_draws_per_item * eval_size` draws do not hold that
      many, the question space is too small and it says so.
    * `train_task(i)`: raw training item `i % size`, unless its question is in the
      held-out set: then the next candidate at a fixed stride, so no question the
      model is evaluated on is ever trained on, and the task still depends only on
      the constructor arguments and `i` (a resumed run sees the same tasks).

    `instruction` is appended to each question; None picks the source's default.

    The constructor is this class's alone (the keys of `task.*` and the run's `seed`): a
    subclass reads and checks its `params` (and loads its data) in `setup()`, which the
    constructor calls once the attributes are set and before `default_instruction()`.
    """

    eval_draws_per_item = 50  # held-out draws allowed per requested distinct question
    train_probes = 1000  # candidates tried for one training index before giving up
    _PROBE_STRIDE = 104729  # a prime: the candidates of index i are i + k * stride (mod size)

    def __init__(
        self,
        name: str,
        params: dict | None = None,
        instruction: str | None = None,
        size: int = 100000,
        eval_size: int = 64,
        eval_seed: int = 1000003,
        seed: int = 0,
    ):
        if size < 1:
            raise ValueError(f"task.size must be >= 1, got {size}")
        if eval_size < 0:
            raise ValueError(f"task.eval_size must be >= 0, got {eval_size}")
        self.name = name
        self.params = dict(params or {})
        self.size = size
        self.eval_size = eval_size
        self.eval_seed = eval_seed
        self.seed = seed
        self._eval: list | None = None  # the held-out tasks, built on first use
        self._eval_questions: set[str] = set()
        self.setup()
        self.instruction = instruction if instruction is not None else self.default_instruction()

    def setup(self) -> None:
        """The subclass's own start: check `self.params` (a ValueError naming `task.params.<key>`
        for one it does not take), build or load what `draw` needs; may set `self.size` lower."""
        if self.params:
            raise ValueError(f"task.params.{sorted(self.params)[0]}: task {self.name!r} takes no parameters")

    def default_instruction(self) -> str | None:
        """The answer-format line appended to questions when `instruction` is None."""
        return None

    def scoring_roles(self) -> list[str]:
        """Agent roles that the tasks' scoring asks (an LLM judge's); each must be mapped to a
        frozen policy (rollout/checks.py checks)."""
        return []

    @property
    def eval_draws(self) -> int:
        """How many held-out draws may be made to find `eval_size` distinct questions."""
        return max(1000, self.eval_draws_per_item * self.eval_size)

    def __len__(self) -> int:
        """Number of training indices before `train_task` wraps around."""
        return self.size

    def __getstate__(self) -> dict:
        # Caches are rebuilt in whichever process uses the source (deterministically).
        return {**self.__dict__, "_eval": None, "_eval_questions": set()}

    @abstractmethod
    def draw(self, split: str, index: int, task_id: str) -> Task:
        """Raw item `index` of the "train" (from `seed`) or "eval" (from `eval_seed`) stream,
        with the id `task_id`."""

    def eval_tasks(self) -> list[Task]:
        """The `eval_size` held-out tasks, in a fixed order, no two with the same question."""
        if self._eval is None:
            tasks: list[Task] = []
            seen: set[str] = set()
            for j in range(self.eval_draws):
                if len(tasks) == self.eval_size:
                    break
                task = self.draw("eval", j, f"{self.name}/eval/{len(tasks)}")
                question = normalize_question(task.question)
                if question not in seen:
                    seen.add(question)
                    tasks.append(task)
            if len(tasks) < self.eval_size:
                raise ValueError(
                    f"task {self.name!r} with params {self.params}: only {len(tasks)} distinct questions in "
                    f"{self.eval_draws} held-out draws, fewer than task.eval_size={self.eval_size}; lower "
                    f"task.eval_size (and eval.size) or widen the task (task.params)"
                )
            self._eval, self._eval_questions = tasks, seen
        # Copies: callers may mutate tasks (entries are dicts) without corrupting the cache.
        return copy.deepcopy(self._eval)

    def train_task(self, index: int) -> Task:
        """Training task `index` (wrapped modulo `size`); never a held-out question."""
        index = int(index) % self.size
        if self._eval is None:
            self.eval_tasks()
        for k in range(self.train_probes):
            task = self.draw("train", (index + k * self._PROBE_STRIDE) % self.size, f"{self.name}/train/{index}")
            if normalize_question(task.question) not in self._eval_questions:
                return task
        raise ValueError(
            f"task {self.name!r}: {self.train_probes} training candidates for index {index} are all "
            f"held-out questions; widen the task (task.params) or lower task.eval_size"
        )


# ---- agents ----------------------------------------------------------------------------
# What a harness may call on the agents it is given. The rollout worker hands in the classes of
# rollout/agents/client.py, which harnesses/ may not import (the layers contract): these protocols
# say the same structurally, so harness code type-checks (`make lint` runs mypy on harnesses/programs/),
# and tests/harnesses/test_protocols.py checks that the real classes satisfy them.

Message = dict[str, str]  # {"role": ..., "content": ...}


class Completion(Protocol):
    """One model turn that `Agent.generate` returns."""

    @property
    def completion_ids(self) -> list[int]: ...
    @property
    def logprobs(self) -> list[float]: ...  # behaviour log-prob of each generated token
    @property
    def finish_reason(self) -> str: ...  # stop | length | abort
    @property
    def version(self) -> int: ...  # the weight version that generated it


class SamplingSettings(Protocol):
    """The run's sampling settings (the config's `sampling`) an agent's calls start from; a call's
    keyword arguments (`max_tokens=64`, `temperature=0.7`, ...) override them for that call."""

    @property
    def temperature(self) -> float: ...
    @property
    def top_p(self) -> float: ...
    @property
    def max_tokens(self) -> int: ...  # new tokens per model call
    @property
    def stop(self) -> list[str]: ...


class ChatFormat(Protocol):
    """The policy's chat template, rendered to token ids (`Agent.format`)."""

    def render(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        """Ids of a fresh prompt: the messages plus the assistant generation header."""
        ...

    def continuation(self, last_ids: list[int], messages: list[Message]) -> list[int]:
        """Ids that follow a generated turn ending in `last_ids[-1]`: its close, `messages`, a new header."""
        ...

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...


class GatewaySession(Protocol):
    """One harness run's OpenAI-compatible endpoint (harnesses/programs/openai_agent.py)."""

    @property
    def api_key(self) -> str: ...  # every request must carry it as `Authorization: Bearer <api_key>`
    @property
    def reward_key(self) -> str | None: ...  # POST <base_url>/reward's own key; None: no agent reward
    @property
    def reward(self) -> float | None: ...  # what the agent reported, if it did

    def base_url(self, role: str | None = None) -> str: ...  # None: the session's, where `model` names the role
    def reward_url(self, role: str | None = None) -> str: ...
    def counts(self) -> dict[str, int]: ...  # calls by kind, for the trace's info

    def raise_failure(self) -> None:
        """Raise what failed a request of this session, if anything did (the agent may have
        swallowed it): an engine failure makes the worker run the episode again."""
        ...


class Gateway(Protocol):
    """The worker's OpenAI-compatible endpoint, shared by its episodes (`await agent.gateway()`)."""

    def session(
        self, agents: dict[str, Any], agent_reward: bool = False
    ) -> contextlib.AbstractContextManager[GatewaySession]:
        """A session for one harness run, with a base URL for each of `agents`' roles."""
        ...


class Agent(Protocol):
    """One harness role bound to one policy; every model call is recorded in the trace."""

    @property
    def role(self) -> str: ...
    @property
    def policy(self) -> str: ...  # the policy this role is played by (the config's agents.<role>)
    @property
    def trainable(self) -> bool: ...  # whether that policy is trained (else frozen)
    @property
    def max_model_len(self) -> int | None: ...  # the policy's context, tokens (None: unknown)
    @property
    def format(self) -> ChatFormat: ...
    @property
    def sampling(self) -> SamplingSettings: ...
    @property
    def gateway(self) -> Callable[[], Awaitable[Gateway]]: ...

    async def chat(self, messages: str | list[Message], system: str | None = None, **sampling: Any) -> str:
        """One stateless model call on a fresh context; returns the generated text."""
        ...

    def conversation(self, system: str | None = None) -> Conversation:
        """A multi-turn context kept as token ids (each reply extends the previous sequence exactly)."""
        ...

    async def generate(
        self, prompt_ids: list[int], parent: int | None = None, **sampling: Any
    ) -> tuple[Completion, int]:
        """Low level: one completion of raw prompt ids; returns it and its sequence index in the trace."""
        ...


class Conversation(Protocol):
    """A multi-turn context of one agent, kept as token ids across turns."""

    @property
    def agent(self) -> Agent: ...
    @property
    def messages(self) -> list[Message]: ...  # text view of the whole conversation
    @property
    def num_tokens(self) -> int: ...  # the prompt and completion of the last model turn

    def add(self, role: str, content: str) -> None:
        """Append a user / tool / system turn without calling the model."""
        ...

    def prompt_ids(self, content: str | None = None, role: str = "user") -> list[int]:
        """The ids the next model turn will be generated under (with one more turn, if given)."""
        ...

    async def reply(self, content: str | None = None, role: str = "user", **sampling: Any) -> str:
        """Optionally add a turn, then generate the model's next turn; returns its text."""
        ...


Agents = Mapping[str, Agent]  # what a harness is given: role -> agent


# ---- harnesses -------------------------------------------------------------------------


# A score: a number, or what a task's score() returns for a verifier that asks a model (an LLM
# judge's pending score), which the rollout worker awaits before the trace is built.
Score = float | Awaitable[float]
# Role -> reward. Both spellings, as a dict is invariant in its values: a dict[str, float] is no dict[str, Score].
AgentRewards = dict[str, float] | dict[str, Score]


@dataclass
class HarnessResult:
    reward: Score  # reward of the whole trace
    agent_rewards: AgentRewards | None = None  # optional role -> reward
    info: dict[str, Any] = field(default_factory=dict)  # anything worth seeing in the trace viewer


Reward = Score | AgentRewards | HarnessResult  # what a harness returns (a bool or an int is a float)
# The range every reward a harness returns must lie in, by default (the config key harness.reward_range):
# wide enough for any reward scale a task means; a reward past it is a bug or a hack (rloo and uniform
# advantages put it into the loss unscaled).
REWARD_RANGE = (-1e6, 1e6)
Harness = Callable[..., Awaitable[Reward]]


def as_result(value: Any, reward_range: tuple[float, float] = REWARD_RANGE) -> HarnessResult:
    """Normalise what a harness returned (a `Reward`, its scores settled: harnesses/verifiers/scoring.py),
    checking every field; raise ValueError saying what was wrong (the worker turns it into a failed
    trace). Every reward must lie in `reward_range` (`harness.reward_range`)."""
    reward: Any  # each field as the harness gave it, until checked below
    agent_rewards: Any
    info: Any
    if isinstance(value, HarnessResult):
        reward, agent_rewards, info = value.reward, value.agent_rewards, value.info
    elif isinstance(value, dict):
        if not value:
            raise ValueError("harness returned an empty per-agent reward dict")
        reward, agent_rewards, info = None, value, {}
    else:
        reward, agent_rewards, info = value, None, {}
    if agent_rewards is not None:
        if not isinstance(agent_rewards, dict):
            raise ValueError(
                f"harness returned agent_rewards of type {type(agent_rewards).__name__}; expected a dict role -> reward"
            )
        for role in agent_rewards:
            if type(role) is not str or not role:
                raise ValueError(f"harness returned agent_rewards with key {role!r}; roles are non-empty strings")
        agent_rewards = {
            role: _reward(r, f"agent_rewards[{role!r}]", reward_range) for role, r in agent_rewards.items()
        }
        if reward is None:  # a bare dict: the trace reward is the mean of the agents'
            reward = sum(agent_rewards.values()) / len(agent_rewards)
    reward = _reward(reward, "reward", reward_range)
    if not isinstance(info, dict) or any(type(k) is not str for k in info):
        raise ValueError(f"harness returned info of type {type(info).__name__}; expected a dict with string keys")
    try:
        json.dumps(info, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"harness returned info that is not plain JSON data ({e}); use str, int, float, "
            f"bool, None, lists and dicts (convert numpy numbers with float() / int())"
        ) from None
    return HarnessResult(reward=reward, agent_rewards=agent_rewards, info=dict(info))


def _reward(value: Any, what: str, reward_range: tuple[float, float]) -> float:
    """A harness's reward as a float within `reward_range`: bool, int or float (numpy's float64 is
    a float)."""
    if not isinstance(value, (bool, int, float)):
        raise ValueError(
            f"harness returned {what} = {value!r} of type {type(value).__name__}; expected a float "
            f"reward, a dict role -> reward, or a HarnessResult (convert numpy numbers with float())"
        )
    try:
        reward = float(value)
    except OverflowError:  # an int past the float range
        raise ValueError(f"harness returned a non-finite {what}: an integer past the float range") from None
    if not math.isfinite(reward):
        raise ValueError(f"harness returned a non-finite {what}: {value}")
    low, high = reward_range
    if not low <= reward <= high:
        raise ValueError(
            f"harness returned {what} = {reward:g}, outside harness.reward_range [{low:g}, {high:g}] (one such "
            f"reward swamps its group's advantages; widen the range if rewards this large are meant)"
        )
    return reward


def load_object(target: str, key: str) -> Any:
    """Import `package.module.name` named by the config key `key`; a clear error if it cannot be.
    Modules under the directory the job was launched from import too (Ray's workers have it on
    their path; a script's own process does not)."""
    module, _, name = target.rpartition(".")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"{key}={target!r} cannot be imported: {e}") from None


def load_harness(target: str) -> Harness:
    """Import `package.module.name`; instantiate it if it is a class."""
    obj = load_object(target, "harness._target_")
    if inspect.isclass(obj):
        obj = obj()
    fn = obj if inspect.iscoroutinefunction(obj) else getattr(obj, "__call__", None)  # noqa: B004 (the method itself)
    if not inspect.iscoroutinefunction(fn):
        raise ValueError(f"harness {target!r} must be an async function (or have an async __call__)")
    return obj


# A harness's own check of its options (the hook `register_options_check` fills): harness -> check.
_OPTION_CHECKS: dict[Any, Callable[[dict], None]] = {}


def register_options_check(harness: Any, check: Callable[[dict], None]) -> None:
    """Give `harness` (an async function, or a harness class) a check of its `harness.options`
    beyond what its signature says (one of two options set, a value's range, a path that must
    import). `check(options)` runs when the config is validated, before Ray starts, and raises
    ValueError naming `harness.options.<key>` and the fix. Call it once, below the harness."""
    _OPTION_CHECKS[harness] = check


def check_harness_options(harness: Any, options: dict, target: str) -> None:
    """`options` fit the harness `load_harness(target)` returned: its signature takes them, and
    its registered check (register_options_check), if any, passes."""
    try:
        inspect.signature(harness).bind(None, None, **options)
    except TypeError as e:
        raise ValueError(f"harness.options={options} do not fit harness {target!r}: {e}") from None
    check = _OPTION_CHECKS.get(harness if inspect.isfunction(harness) else type(harness))
    if check is not None:
        check(options)


def load_task_source(target: str) -> type[TaskSource]:
    """Import the task source class named by `task._target_`."""
    cls = load_object(target, "task._target_")
    if not (inspect.isclass(cls) and issubclass(cls, TaskSource)):
        raise ValueError(f"task._target_={target!r} is not a TaskSource subclass (harnesses/base.py)")
    return cls


def option_role(agents: Agents, role: str | None, which: str) -> str:
    """`harness.options.role`: the run's one role when unset (else an error asking for `which`, the
    role's job), or the named role if the run has it."""
    if role is None:
        if len(agents) != 1:
            raise ValueError(f"harness.options.role: the run has roles {sorted(agents)}; name the one {which}")
        return next(iter(agents))
    if role not in agents:
        raise ValueError(f"harness.options.role={role!r} is not a role of this run: {sorted(agents)}")
    return role
