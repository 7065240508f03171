"""vLLM's engine core, watched from the engine actor: a call that waits on a dead core is never
answered by vLLM (a utility call in flight when a process core dies), so the engine cannot rely on a
call to notice the death. `watch_core` runs on the actor's loop and notices it whatever is waiting;
`dies_with_core` makes every failing call check the core too. Either ends the actor, and Ray
restarts it (rollout/engine/engine.py: `Engine._exit_if_core_died`)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

CORE_WATCH_S = 0.5  # how often the watch reads whether vLLM's engine core died


def dies_with_core(method):
    """`method`, except that a failure that finds vLLM's engine core dead ends this process
    (Engine._exit_if_core_died) instead of answering: Ray restarts the engine. BaseException: a
    call cancelled by its caller (the router's deadline, an episode's) checks the core too."""

    @functools.wraps(method)
    async def wrapper(self, *args, **kwargs):
        try:
            return await method(self, *args, **kwargs)
        except BaseException:
            self._exit_if_core_died()
            raise

    return wrapper


async def watch_core(
    errored: Callable[[], bool], on_dead: Callable[[], None], stopped: Callable[[], bool], period_s: float
) -> None:
    """Every `period_s` until `stopped()`: once `errored()` (vLLM's engine core is dead), call
    `on_dead()` and return. A call that waits on the dead core is never answered by vLLM, so the
    engine cannot rely on a call to notice the death: this watch does, whatever is waiting."""
    while not stopped():
        if errored():
            on_dead()
            return
        await asyncio.sleep(period_s)
