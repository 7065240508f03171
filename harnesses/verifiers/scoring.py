"""Scores that ask a model (the LLM judge, harnesses/verifiers/judge.py), inside the episode being run.

The rollout worker opens a `ScoringScope` with the episode's agents around each harness run. A
verifier that asks a model takes its agent from there (`scoring_agent`) and starts the call as an
asyncio task (`defer_score`), which the task's `score()` returns: a harness may await it, or
return it as (part of) its reward, and `ScoringScope.settle` awaits every one before the trace is
built, so the trace holds the judge's sequences and the reward its verdict.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable
from typing import Any

from harnesses.base import HarnessResult

# The episode being run. A ContextVar, as harnesses/base.py's scoring notes: concurrent episodes
# on one event loop (each its own asyncio task) keep their own.
_SCOPE: contextvars.ContextVar[ScoringScope | None] = contextvars.ContextVar("scoring_scope", default=None)


class ScoringScope:
    """One episode's agents and the model-asking scores started in it (asyncio tasks). `settle`
    waits for every one and puts their values where the harness's result holds them; leaving
    the scope cancels any still running (a failed or timed-out episode)."""

    def __init__(self, agents: dict):
        self.agents = agents
        self.pending: list[asyncio.Task] = []

    def __enter__(self) -> ScoringScope:
        self._token = _SCOPE.set(self)
        return self

    def __exit__(self, *exc) -> None:
        _SCOPE.reset(self._token)
        for task in self.pending:
            task.cancel()

    async def settle(self, value: Any) -> Any:
        """`value` (what the harness returned) with every score it holds awaited, once all the
        episode's scores are done (so the trace holds all their sequences)."""
        await asyncio.gather(*self.pending)
        return _settled(value)


def _settled(value: Any) -> Any:
    if isinstance(value, asyncio.Future):
        return value.result()
    if isinstance(value, HarnessResult):
        return HarnessResult(_settled(value.reward), _settled(value.agent_rewards), _settled(value.info))
    if isinstance(value, dict):
        return {k: _settled(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_settled(v) for v in value]
    return value


def scoring_agent(role: str, key: str):
    """The episode's agent for `role`, for the verifier configured at `key`; ValueError when no
    episode is running or no agent plays `role`."""
    scope = _SCOPE.get()
    if scope is None:
        raise ValueError(
            f"{key} asks a model, so it scores only inside a rollout episode (a RolloutWorker "
            f"running a harness), where the agents are"
        )
    if role not in scope.agents:
        raise ValueError(
            f"{key}: no agent plays role {role!r} in this episode (agents: {sorted(scope.agents)}); "
            f"map it to a frozen policy, e.g. +agents.{role}=frozen"
        )
    return scope.agents[role]


def defer_score(score: Awaitable[float]) -> asyncio.Task:
    """Start `score` (a coroutine) in the running episode; the awaitable a task's score() returns."""
    scope = _SCOPE.get()
    assert scope is not None, "defer_score outside a ScoringScope: call scoring_agent first"
    task = asyncio.get_running_loop().create_task(score)
    scope.pending.append(task)
    return task
