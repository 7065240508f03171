"""Router: spreads one policy's requests over its engines, sticky per trace.

All model calls of one trace go to the same engine, so later turns of a
conversation hit the prefix cache their earlier turns filled.
"""

from __future__ import annotations

import zlib

from rollout.config import SamplingConfig
from rollout.engine import Completion


class Router:
    def __init__(self, engines: list):
        if not engines:
            raise ValueError("a policy needs at least one engine (engine.num_engines >= 1)")
        self.engines = list(engines)  # Ray actor handles of `Engine`

    def pick(self, key: str):
        return self.engines[zlib.crc32(key.encode()) % len(self.engines)]

    async def generate(self, key: str, prompt_ids: list[int], sampling: SamplingConfig,
                       seed: int | None = None) -> list[Completion]:
        """Send one request to the engine `key` (the trace id) is pinned to."""
        return await self.pick(key).generate.remote(prompt_ids, sampling, seed)
