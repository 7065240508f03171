"""Two OpenAI-SDK agents that make single_turn's one chat call, for the openai_agent harness
(`harness.options.agent=tools.corpora.one_call_agents.one_call`): tools/bench/rollout_path.py times
the gateway path with them against the plain client path."""

from __future__ import annotations

import asyncio

_http = {}  # event loop -> the HTTP client this worker's agents share


async def one_call(task, base_url: str, api_key: str) -> str:
    """The gateway side's agent: single_turn's one call, made with the openai SDK over one HTTP
    client per worker process (as a long-running agent service holds one)."""
    import httpx
    from openai import AsyncOpenAI

    http = _http.setdefault(asyncio.get_running_loop(), httpx.AsyncClient(timeout=600))
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, http_client=http)
    r = await client.chat.completions.create(model="main", messages=[{"role": "user", "content": task.prompt}])
    return r.choices[0].message.content


async def one_call_own_client(task, base_url: str, api_key: str) -> str:
    """The same call from an agent that builds its own SDK client per episode (as
    examples/calculator_agent.py does): ~30 ms of the worker's CPU per client (its TLS context)."""
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        r = await client.chat.completions.create(model="main", messages=[{"role": "user", "content": task.prompt}])
        return r.choices[0].message.content
