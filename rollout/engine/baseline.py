"""vLLM alone: what the rollout path is measured against (scripts/bench/rollout_path.py, bf16.py).

Generates with vLLM in this process, every prompt submitted at once, with the engine args,
sampling and engine core (`engine.core`: vLLM's AsyncLLM, or its LLMEngine on a thread) the
Engine actor uses, so the difference to the path is the path's own cost."""

from __future__ import annotations

import asyncio
import gc
import time
import uuid

from rollout.config import EngineConfig, SamplingConfig
from rollout.engine.args import (
    _vllm_env,
    bind_cpu_cores,
    core_kind,
    eager_sampler_on_cpu,
    engine_args,
    sampling_params,
)


def bench_vllm(
    model_path: str,
    prompts: list[list[int]],
    sampling: SamplingConfig,
    engine: EngineConfig,
    rounds: int,
    dtype: str = "float32",
) -> list[dict]:
    """After a warm-up on 4 prompts, `rounds` times: {"tokens": generated, "seconds": wall} of
    every prompt at once."""
    _vllm_env(engine.vllm_log_level)  # the engines' quiet start
    eager_sampler_on_cpu(engine)  # as the engines run it
    bind_cpu_cores(engine)  # the cores the fleets' engines take (engine.cpu_cores)
    args = engine_args(model_path, engine, dtype)
    if core_kind(engine) == "thread":
        from rollout.engine.thread import ThreadedLLM

        llm = ThreadedLLM(args, start_timeout_s=engine.start_timeout_s)
    else:
        from vllm.v1.engine.async_llm import AsyncLLM

        llm = AsyncLLM.from_engine_args(args)
    params = sampling_params(sampling)

    async def one(ids: list[int]) -> int:
        final = None
        async for out in llm.generate({"prompt_token_ids": ids}, params, uuid.uuid4().hex):
            final = out
        return sum(len(o.token_ids) for o in final.outputs)

    async def timed(batch):
        t0 = time.perf_counter()
        tokens = sum(await asyncio.gather(*map(one, batch)))
        return {"tokens": tokens, "seconds": time.perf_counter() - t0}

    async def rounds_of_all():
        await timed(prompts[:4])  # warm-up
        return [await timed(prompts) for _ in range(rounds)]

    try:
        return asyncio.run(rounds_of_all())
    finally:
        llm.shutdown()
        llm = None  # let __del__ run now, not at interpreter exit where it raises
        gc.collect()
