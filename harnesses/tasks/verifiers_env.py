"""Tasks from an installed verifiers environment: its dataset rows, held out by content.

    python scripts/train.py task=verifiers harness=verifiers_env task.params.env_id=tracerl-vf-arith

`verifiers` (the environment library prime-rl uses; 0.3.1's classic API: an `Environment` with a
dataset, a rubric and a rollout) loads an environment by id (`vf.load_environment(env_id, **env_args)`
imports the installed module `env_id` with `-` as `_` and calls its `load_environment`).
`VerifiersTasks` makes its rows tasks: training item `i` is row `i % size` of the environment's
dataset, in an order shuffled with the run's seed; the held-out set is drawn from its eval dataset
(or, when it has none, from the same rows) in an order shuffled with `task.eval_seed`, and, as for
every `TaskSource`, no row whose prompt text is held out is ever trained on (harnesses/base.py).

A `VerifiersTask` carries its row (prompt messages, answer, info) and the environment's id and
arguments, so any process can rebuild the environment (`load_env`, cached per process). The
harness harnesses/programs/verifiers_env.py runs the environment's rollout on the row through the
gateway and takes its rubric's reward; `score(text)` is that rubric on one assistant turn of `text`
(what another harness, e.g. single_turn, scores with), awaited in the episode like a judge's score.

verifiers 0.3.1 is installed beside openai 3 with `--no-deps` (docs/verifiers_env.md): without it,
this module imports but the source refuses to build, naming the install line.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import json
import math
import random
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from harnesses.base import TaskSource
from harnesses.verifiers import scoring

P = "task.params"
INSTALL = (
    "pip install --no-deps verifiers==0.3.1 (with its dependencies as docs/verifiers_env.md lists them), "
    "then the environment's own package"
)

# Environments by (env_id, canonical env_args), one per process.
_ENVS: dict[tuple[str, str], Any] = {}
_LOAD_LOCK = threading.Lock()


def _verifiers() -> Any:
    try:
        import verifiers
    except ImportError as e:
        raise ValueError(f"{P}.env_id: the verifiers package is not installed ({e}); {INSTALL}") from None
    return verifiers


@contextlib.contextmanager
def _own_signal_handlers() -> Iterator[None]:
    """Keep the process's SIGINT/SIGTERM handlers while an environment is built: verifiers' Environment
    installs its own at construction (they tear down its env-server processes, which tracerl does not
    start), which fails off the main thread (a rollout worker's event loop) and would replace the
    trainer's own handling. `signal.signal` is made a no-op for the build only, under a lock."""
    real = signal.signal

    def keep(signum, handler):
        return signal.getsignal(signum)

    with _LOAD_LOCK:
        signal.signal = keep  # type: ignore[assignment]
        try:
            yield
        finally:
            signal.signal = real


def env_key(env_id: str, env_args: dict) -> tuple[str, str]:
    return env_id, json.dumps(env_args, sort_keys=True, default=str)


def load_env(env_id: str, env_args: dict | None = None) -> Any:
    """The verifiers environment `env_id` built with `env_args` (cached per process); a ValueError
    naming `task.params.env_id` / `task.params.env_args` when it cannot be loaded or run here."""
    env_args = dict(env_args or {})
    key = env_key(env_id, env_args)
    env = _ENVS.get(key)
    if env is not None:
        return env
    if not isinstance(env_id, str) or not env_id:
        raise ValueError(f"{P}.env_id={env_id!r} must name an installed verifiers environment, e.g. tracerl-vf-arith")
    vf = _verifiers()
    try:
        with _own_signal_handlers():
            env = vf.load_environment(env_id, **env_args)
    except ValueError as e:  # verifiers: the module does not import
        raise ValueError(
            f"{P}.env_id={env_id!r}: {e} (verifiers imports the module {env_id.replace('-', '_')!r}: install "
            f"the environment's package, e.g. pip install --no-deps -e examples/verifiers_env)"
        ) from None
    except Exception as e:  # RuntimeError from verifiers: its load_environment(**env_args) failed
        raise ValueError(f"{P}.env_args={env_args}: environment {env_id!r} failed to load: {e}") from None
    if not isinstance(env, vf.Environment):
        raise ValueError(f"{P}.env_id={env_id!r}: load_environment returned {type(env).__name__}, not a vf.Environment")
    if env.rubric.has_group_rewards or env.rubric.has_advantages:
        raise ValueError(
            f"{P}.env_id={env_id!r}: its rubric has group reward functions (or computes advantages), which "
            f"score a whole group of rollouts at once; tracerl runs and scores each episode alone (the trainer "
            f"computes advantages over the group's trace rewards)"
        )
    _ENVS[key] = env
    return env


def _plain(value: Any) -> Any:
    """A dataset row's values as plain JSON data (the task travels to Ray actors and into traces)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    return str(value)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _messages(row: dict) -> list[dict]:
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list):
        return [m for m in prompt if isinstance(m, dict)]
    return []


@dataclass
class VerifiersTask:
    """One row of a verifiers environment (a `harnesses.base.Task`)."""

    id: str
    question: str  # the prompt messages' text, one per line: what held-out-by-content compares
    prompt: str  # the last user message (plus task.instruction, if set): what other harnesses send
    answer: str | None
    env_id: str
    env_args: dict = field(default_factory=dict)
    row: dict = field(default_factory=dict)  # the environment's row: its rollout's input

    def score(self, text: str) -> Any:
        """The environment's rubric on a completion of one assistant turn, `text`. In an episode (a
        rollout worker's) the rubric runs as the episode's pending score (an asyncio task, as the
        LLM judge's); elsewhere it is run to its end here."""
        coroutine = rubric_score(self, [{"role": "assistant", "content": text}])
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(coroutine)
        if scoring._SCOPE.get() is not None:
            return scoring.defer_score(coroutine)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a running loop but no episode
            return pool.submit(asyncio.run, coroutine).result()


async def rubric_score(task: VerifiersTask, completion: list[dict]) -> float:
    """The environment's rubric on `completion` (messages) after the task's row, as verifiers scores a
    rollout (its state built by the environment's own init_state; no model is called)."""
    vf = _verifiers()
    from openai import AsyncOpenAI
    from verifiers.legacy.utils.message_utils import normalize_messages

    env = load_env(task.env_id, task.env_args)
    # init_state wants a client for the rollout's model calls; scoring makes none.
    client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(api_key="unused", base_url="http://unused.invalid/v1"))
    try:
        state = await env.init_state(copy.deepcopy(task.row), client, "scoring")
        state["completion"] = normalize_messages(completion, field_name="completion")
        await env.rubric.score_rollout(state)
    finally:
        await client.close()
    return float(state["reward"])


class VerifiersTasks(TaskSource):
    """The rows of the verifiers environment `task.params.env_id` (built with `task.params.env_args`)."""

    def setup(self) -> None:
        params = dict(self.params)
        unknown = sorted(set(params) - {"env_id", "env_args"})
        if unknown:
            raise ValueError(f"{P}.{unknown[0]}: task {self.name!r} takes env_id and env_args")
        if "env_id" not in params:
            raise ValueError(
                f"{P}.env_id is required: the installed verifiers environment to run, e.g. tracerl-vf-arith"
            )
        env_args = params.get("env_args") or {}
        if not isinstance(env_args, dict):
            raise ValueError(f"{P}.env_args={env_args!r} must be a mapping of load_environment's keyword arguments")
        self.env_id: str = params["env_id"]
        self.env_args: dict = _plain(dict(env_args))
        self.params = {"env_id": self.env_id, "env_args": self.env_args}
        env = load_env(self.env_id, self.env_args)
        train = env.get_dataset() if env.dataset_source is not None or env.dataset is not None else None
        held = env.get_eval_dataset() if env.eval_dataset_source is not None or env.eval_dataset is not None else None
        if train is None:
            raise ValueError(f"{P}.env_id={self.env_id!r}: the environment has no training dataset")
        self._train_rows = [_plain(dict(r)) for r in train]
        self._eval_rows = [_plain(dict(r)) for r in (held if held is not None else train)]
        if not self._train_rows or not self._eval_rows:
            raise ValueError(f"{P}.env_id={self.env_id!r}: the environment's dataset has no rows")
        self.size = min(self.size, len(self._train_rows))
        self._train_order = list(range(len(self._train_rows)))
        random.Random(self.seed).shuffle(self._train_order)
        self._eval_order = list(range(len(self._eval_rows)))
        random.Random(self.eval_seed).shuffle(self._eval_order)

    @property
    def eval_draws(self) -> int:
        """Every held-out row once: more draws would only repeat them."""
        return len(self._eval_rows)

    def draw(self, split: str, index: int, task_id: str) -> VerifiersTask:
        rows, order = (self._train_rows, self._train_order) if split == "train" else (self._eval_rows, self._eval_order)
        row = copy.deepcopy(rows[order[index % len(rows)]])
        messages = _messages(row)
        users = [m for m in messages if m.get("role") == "user"]
        prompt = _text(users[-1].get("content")) if users else ""
        if self.instruction:
            prompt = f"{prompt}\n{self.instruction}"
        answer = row.get("answer")
        return VerifiersTask(
            id=task_id,
            question="\n".join(_text(m.get("content")) for m in messages),
            prompt=prompt,
            answer=None if answer is None else str(answer),
            env_id=self.env_id,
            env_args=self.env_args,
            row=row,
        )
