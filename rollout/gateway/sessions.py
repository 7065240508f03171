"""The gateway's state: one `Session` per harness run (its roles and their calls, its keys, the reward
its agent reported, the first failure, the Responses history), and the limits a worker's gateway
keeps (`GatewayLimits`). What a request may do to a session is here; how it arrives is server.py's,
what it asks of the model is the wire protocol's (chat.py, responses.py)."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from harnesses.base import REWARD_RANGE
from rollout.engine.engine import EngineError
from rollout.gateway.messages import RequestError

if TYPE_CHECKING:
    from rollout.agents.client import Agent
    from rollout.gateway.prompts import Call


@dataclass(frozen=True)
class GatewayLimits:
    """What one worker's gateway lets its callers use; no agent that works as meant reaches a default.
    The rollout worker sets `reward_range` from harness.reward_range; the rest are fixed here."""

    max_body_bytes: int = 8 * 2**20  # a larger request body is a 413, read no further
    max_header_bytes: int = 32 * 2**10  # request line + headers (h11): past it a 400, the connection closed
    head_timeout_s: float = 30.0  # a connection that sends no whole request head within this is closed
    body_timeout_s: float = 60.0  # a request body that does not arrive whole within this is a 408
    keep_alive_s: float = 30.0  # an idle connection between requests is closed after this
    max_connections: int = 1024  # connections at once; one more is answered 503 and closed
    max_in_flight: int = 32  # requests of one session at once (each up to n=16); one more is a 429
    render_threads: int = 2  # threads that render and tokenize prompts off the event loop
    reward_range: tuple[float, float] = REWARD_RANGE  # an agent-reported reward outside it is a 400


class RewardRefused(ValueError):
    """The reward an agent reported was refused: its trace fails with this (see Session.raise_failure)."""


@dataclass
class Role:
    """One role of a session: its Agent and the calls made through it (what a later request extends)."""

    agent: Agent
    calls: list[Call] = field(default_factory=list)


@dataclass
class Session:
    """One harness run's endpoint: a base URL per role; what the agent reported as its reward."""

    id: str
    base: str  # http://host:port/s/<id>
    roles: dict[str, Role]
    api_key: str  # every request must carry it as `Authorization: Bearer <api_key>`
    reward_key: str | None = None  # what POST .../reward must carry instead; None: the run takes no agent reward
    reward_range: tuple[float, float] = REWARD_RANGE  # an agent-reported reward outside it is refused
    max_in_flight: int = GatewayLimits.max_in_flight
    reward: float | None = None
    failure: Exception | None = None  # the first engine failure (EngineError), refused reward or gateway bug
    in_flight: int = 0  # requests being answered now
    # response id -> (its role, its conversation in the chat request's form, the reply last): what
    # a Responses request's previous_response_id continues
    responses: dict[str, tuple[str, list[dict]]] = field(default_factory=dict)
    extended: int = 0  # calls whose prompt continued an earlier call's ids
    fresh: int = 0  # calls rendered from their messages
    tool_calls: int = 0

    def base_url(self, role: str | None = None) -> str:
        """`role`'s own base URL; None: the session's, where each request's `model` names its role."""
        return f"{self.base}/v1" if role is None else f"{self.base}/{role}/v1"

    def reward_url(self, role: str | None = None) -> str:
        return f"{self.base_url(role)}/reward"

    def counts(self) -> dict[str, int]:
        return {"gateway_extended": self.extended, "gateway_fresh": self.fresh, "gateway_tool_calls": self.tool_calls}

    def fail(self, e: Exception) -> None:
        """Keep the first failure of a request, for the harness to raise when its agent is done."""
        if self.failure is None:
            self.failure = e

    def raise_failure(self) -> None:
        """Raise what failed a request of this session, if anything did, once the agent is done
        (it may have swallowed the error): an EngineError as itself, so that the worker runs the
        episode again (rollout.retries); a refused reward as itself (RewardRefused); a gateway bug
        as a RuntimeError that names it."""
        if isinstance(self.failure, (EngineError, RewardRefused)):
            raise self.failure
        if self.failure is not None:
            raise RuntimeError(
                f"the gateway failed a request of this run: {type(self.failure).__name__}: {self.failure}"
            ) from self.failure

    @contextlib.contextmanager
    def admitted(self):
        """A request in flight, refused (429) past the session's limit before its body is read."""
        if self.in_flight >= self.max_in_flight:
            raise RequestError(
                f"this session already has {self.max_in_flight} requests in flight, the gateway's limit "
                f"(GatewayLimits.max_in_flight); wait for one to finish",
                status=429,
                code="rate_limit_exceeded",
            )
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    def role_of(self, model) -> str:
        """The role a request to the session's own URL names as its `model`; else a 404 naming the roles."""
        if isinstance(model, str) and model in self.roles:
            return model
        shown = repr(model[:80]) if isinstance(model, str) else "none"
        raise RequestError(
            f"model {shown} is not a role of this run: on the session's URL a request's model names its role, "
            f"one of {sorted(self.roles)} (GET /v1/models lists them)",
            "model",
            status=404,
            code="model_not_found",
        )

    def history(self, role: str, previous) -> list[dict] | None:
        """The conversation `previous` (a response id of this session and role) ended with; None for none."""
        if previous is None:
            return None
        kept = self.responses.get(previous) if isinstance(previous, str) else None
        if kept is None or kept[0] != role:
            raise RequestError(
                f"previous_response_id {str(previous)[:80]!r} is not a response of role {role!r} in this run",
                "previous_response_id",
                status=404,
            )
        return kept[1]

    def check_takes_reward(self) -> None:
        """A 403 (and the trace fails, RewardRefused) where the run takes no agent reward; before
        the request's body is read."""
        if self.reward_key is None:
            raise self._refuse(
                "the agent reported a reward, but this run takes none (harness.options.agent_reward is "
                "false); set it true to train on the agent's reward",
                status=403,
                code="agent_reward_off",
            )

    def take_reward(self, reward) -> float:
        """The agent's reported `reward`, kept; refused (a RequestError, and the trace fails with
        RewardRefused: it is never replaced by the verifier's) unless a finite number in
        `reward_range`."""
        self.check_takes_reward()
        low, high = self.reward_range
        try:
            value = float(reward) if type(reward) in (int, float) else math.nan
        except OverflowError:  # an integer past the float range
            value = math.nan
        if not low <= value <= high:  # NaN included
            raise self._refuse(
                f"reward must be a number in harness.reward_range [{low:g}, {high:g}]; got {str(reward)[:40]}"
            )
        self.reward = value
        return value

    def _refuse(self, reason: str, status: int = 400, code: str | None = None) -> RequestError:
        """The error a refused reward answers, kept on the session to fail its trace."""
        self.fail(RewardRefused(f"the gateway refused the agent's reward: {reason}"))
        return RequestError(reason, "reward", status=status, code=code)
