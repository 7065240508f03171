"""Router: spreads one policy's requests over its engines, sticky per trace.

All model calls of one trace go to the same engine, so later turns of a
conversation hit the prefix cache their earlier turns filled. A request whose
engine died waits until Ray has restarted it (the restarted engine loads the
run's newest weights before it serves) and is sent again, once: an engine
keeps no state a request depends on, so nothing of the episode is lost. A
request that takes longer than `timeout_s` is cancelled (vLLM aborts it) and
raises EngineError naming the engine, as does one whose engine does not come
back or dies again: the worker runs that episode again (rollout.retries)
instead of hanging it. A caller that is cancelled (its episode ran past its
deadline, a gateway client left) cancels the engine's request with it.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections import Counter

import ray

from rollout.config import SamplingConfig
from rollout.engine.engine import Completion, EngineError


class Router:
    def __init__(self, engines: list, policy: str = "main", timeout_s: float = 600.0, restart_timeout_s: float = 300.0):
        """`timeout_s`: engine.request_timeout_s; `restart_timeout_s`: how long to wait for a dead
        engine to come back before its episode is retried (engine.start_timeout_s)."""
        if not engines:
            raise ValueError("a policy needs at least one engine (engine.num_engines >= 1)")
        self.engines = list(engines)  # Ray actor handles of `Engine`
        self.policy, self.timeout_s, self.restart_timeout_s = policy, timeout_s, restart_timeout_s
        self._restarts: dict[int, asyncio.Future] = {}  # engine index -> the wait for it to come back
        self.resent: Counter[str] = Counter()  # key -> its requests sent again to a restarted engine

    def index(self, key: str) -> int:
        return zlib.crc32(key.encode()) % len(self.engines)

    def pick(self, key: str):
        return self.engines[self.index(key)]

    async def generate(
        self, key: str, prompt_ids: list[int], sampling: SamplingConfig, seed: int | None = None
    ) -> list[Completion]:
        """Send one request to the engine `key` (the trace id) is pinned to."""
        index = self.index(key)
        for resend in (False, True):
            restarting = self._restarts.get(index)
            if restarting is not None and not restarting.done():  # known dead: wait, do not meet it
                await asyncio.shield(restarting)
            ref = self.engines[index].generate.remote(prompt_ids, sampling, seed, self.policy)
            try:
                return await asyncio.wait_for(asyncio.wrap_future(ref.future()), self.timeout_s)
            except asyncio.CancelledError:  # the caller gave up (its episode's deadline, a client that left)
                ray.cancel(ref)  # so does the engine: vLLM aborts the request
                raise
            except TimeoutError:
                ray.cancel(ref)
                raise EngineError(
                    f"engine {index} of policy {self.policy!r} did not answer a request "
                    f"within engine.request_timeout_s={self.timeout_s}"
                ) from None
            except ray.exceptions.RayActorError as e:
                if not await self.wait_until_back(index):
                    raise EngineError(
                        f"engine {index} of policy {self.policy!r} died during a request "
                        f"({type(e).__name__}) and was not back within engine.start_timeout_s="
                        f"{self.restart_timeout_s}"
                    ) from None
                if resend:
                    raise EngineError(
                        f"engine {index} of policy {self.policy!r} died during a request, "
                        f"and again when it was sent to the restarted engine "
                        f"({type(e).__name__})"
                    ) from None
                self.resent[key] += 1
        raise AssertionError("unreachable")

    async def wait_until_back(self, index: int) -> bool:
        """Wait (up to restart_timeout_s) until Ray has restarted dead engine `index`, so that the
        retried episode finds it up. The requests that met the dead engine share one wait."""
        wait = self._restarts.get(index)
        if wait is None or wait.done():
            wait = self._restarts[index] = asyncio.ensure_future(
                asyncio.to_thread(wait_until_restarted, self.engines[index], "info", self.restart_timeout_s)
            )
        return await asyncio.shield(wait)


def wait_until_restarted(actor, method: str, timeout_s: float) -> bool:
    """Call `actor.method()` until it answers, up to `timeout_s`: True once it does. While Ray
    restarts a dead actor, calls to it fail (ActorUnavailableError, or ActorDiedError for a call
    that met the old process): those are waited out. False at once if Ray says the actor is dead
    for good (killed, or out of restarts); False if it has not answered by the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(getattr(actor, method).remote(), timeout=max(deadline - time.monotonic(), 0.1))
            return True
        except ray.exceptions.GetTimeoutError:
            return False
        except ray.exceptions.RayActorError:
            if actor_state(actor) == "DEAD":
                return False
            time.sleep(1.0)
        except Exception:  # the method itself raised: the actor is up and answering
            return True
    return False


def answer(ref, timeout_s: float, what: str):
    """`ray.get(ref)` (a ref or a list of them) within `timeout_s`: a call to a helper actor (the trace
    buffer, a weight store) that is gone or stopped fails naming `what` (the actor and the call),
    never a silent hang or an anonymous GetTimeoutError."""
    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise TimeoutError(f"{what} did not answer within {timeout_s} s") from None
    except ray.exceptions.RayActorError as e:
        raise RuntimeError(f"{what}: the actor died ({type(e).__name__}: {str(e)[:300]})") from e


def actor_state(actor) -> str:
    """Ray's state of an actor (ALIVE, RESTARTING, DEAD, ...); ALIVE when Ray cannot say. (Ray
    has no public call for it without its dashboard.)"""
    from ray._private import state

    try:
        return state.actors(actor_id=actor._actor_id.hex())["State"]
    except Exception:
        return "ALIVE"
