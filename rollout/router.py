"""Router: spreads one policy's requests over its engines, sticky per trace.

All model calls of one trace go to the same engine, so later turns of a
conversation hit the prefix cache their earlier turns filled. A request that
takes longer than `timeout_s` is cancelled (vLLM aborts it) and raises
EngineError naming the engine, as does a request whose engine died: the
worker runs that episode again (rollout.retries) instead of hanging it.
"""

from __future__ import annotations

import asyncio
import time
import zlib

import ray

from rollout.config import SamplingConfig
from rollout.engine import Completion


class EngineError(RuntimeError):
    """A request that an engine did not answer: it died (Ray restarts it) or ran past the deadline.
    The worker runs such an episode again (rollout.retries) instead of blaming the harness."""


class Router:
    def __init__(self, engines: list, policy: str = "main", timeout_s: float = 600.0, restart_timeout_s: float = 300.0):
        """`timeout_s`: engine.request_timeout_s; `restart_timeout_s`: how long to wait for a dead
        engine to come back before its episode is retried (engine.start_timeout_s)."""
        if not engines:
            raise ValueError("a policy needs at least one engine (engine.num_engines >= 1)")
        self.engines = list(engines)  # Ray actor handles of `Engine`
        self.policy, self.timeout_s, self.restart_timeout_s = policy, timeout_s, restart_timeout_s

    def index(self, key: str) -> int:
        return zlib.crc32(key.encode()) % len(self.engines)

    def pick(self, key: str):
        return self.engines[self.index(key)]

    async def generate(self, key: str, prompt_ids: list[int], sampling: SamplingConfig,
                       seed: int | None = None) -> list[Completion]:
        """Send one request to the engine `key` (the trace id) is pinned to."""
        ref = self.pick(key).generate.remote(prompt_ids, sampling, seed, self.policy)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(ref.future()), self.timeout_s)
        except asyncio.TimeoutError:
            ray.cancel(ref)
            raise EngineError(f"engine {self.index(key)} of policy {self.policy!r} did not answer a request "
                              f"within engine.request_timeout_s={self.timeout_s}") from None
        except ray.exceptions.RayActorError as e:
            await self.wait_until_back(self.pick(key))
            raise EngineError(f"engine {self.index(key)} of policy {self.policy!r} died during a request "
                              f"({type(e).__name__})") from None

    async def wait_until_back(self, engine) -> None:
        """Wait (up to restart_timeout_s) until Ray has restarted a dead engine, so that the retried
        episode finds it up."""
        await asyncio.to_thread(wait_until_restarted, engine.info, self.restart_timeout_s)


def wait_until_restarted(method, timeout_s: float) -> bool:
    """Call an actor's `method` until it answers, up to `timeout_s`: while Ray restarts a dead actor,
    calls to it fail at once (ActorUnavailableError). False if it is dead for good or never answers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(method.remote(), timeout=max(deadline - time.monotonic(), 0.1))
            return True
        except ray.exceptions.ActorUnavailableError:
            time.sleep(1.0)
        except Exception:
            return False
    return False
