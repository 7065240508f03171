"""Benchmark: generated tokens/s through the full rollout path vs vLLM's own generate.

    python scripts/bench/rollout.py [--model smollm2_135m] [--prompts 32] [--max-tokens 64]

Same prompts (single_turn on chain_sum, chat-templated), same engine args and
sampling, one run, one after the other:
  vllm:  vLLM's AsyncLLM.generate in this process, all prompts submitted at once.
  path:  RolloutWorker -> Agent client -> Router -> Engine actor (Ray), the
         single_turn harness, traces streamed to a TraceBuffer.
Each side is warmed up, then timed `--rounds` times; the best round counts.
The last output line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import time
import uuid

# This script shares its name with the `rollout` package: keep its folder off sys.path.
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import ray  # noqa: E402

from harnesses.tasks import ReasoningGymTasks  # noqa: E402
from rollout.client import ChatFormat  # noqa: E402
from rollout.cluster import spawn_buffer, spawn_engines, spawn_workers, start_ray  # noqa: E402
from rollout.config import (EngineConfig, HarnessConfig, ModelConfig, RayConfig,  # noqa: E402
                            RolloutConfig, SamplingConfig, TaskConfig)
from rollout.engine import engine_args, sampling_params  # noqa: E402
from rollout.models import resolve_model  # noqa: E402

TASK = TaskConfig(name="chain_sum", params={"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1})


def bench_vllm(model_path: str, prompts: list[list[int]], sampling: SamplingConfig,
               engine: EngineConfig, rounds: int) -> list[dict]:
    from vllm.v1.engine.async_llm import AsyncLLM

    llm = AsyncLLM.from_engine_args(engine_args(model_path, engine))
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

    async def main():
        await timed(prompts[:4])  # warm-up
        return [await timed(prompts) for _ in range(rounds)]

    try:
        return asyncio.run(main())
    finally:
        llm.shutdown()
        del llm  # let __del__ run now, not at interpreter exit where it raises
        gc.collect()


def bench_path(model_path: str, n: int, sampling: SamplingConfig, engine: EngineConfig,
               rounds: int) -> list[dict]:
    start_ray(RayConfig(num_cpus=4))
    engines = {"main": spawn_engines(model_path, ModelConfig(), engine, "main")}
    buffer = spawn_buffer("main", 1, {})
    harness = HarnessConfig(_target_="harnesses.single_turn.single_turn", name="single_turn", roles=["solver"])
    [worker] = spawn_workers(RolloutConfig(concurrency=n, group_size=1), harness, TASK,
                             {"solver": "main"}, engines, {"main": model_path}, sampling, buffer)

    def timed(indices):
        t0 = time.perf_counter()
        stats = ray.get(worker.run.remote(indices))
        groups = ray.get(buffer.get.remote(len(indices), timeout_s=60))
        seconds = time.perf_counter() - t0
        assert stats["traces_failed"] == 0 and len(groups) == len(indices), stats
        return {"tokens": sum(t.num_generated_tokens for g in groups for t in g), "seconds": seconds}

    timed(list(range(4)))  # warm-up
    results = []
    for _ in range(rounds):
        before = ray.get(worker.stats.remote())
        results.append(timed(list(range(n))))
        assert ray.get(worker.stats.remote())["traces_ok"] >= before["traces_ok"]
    ray.shutdown()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2_135m")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    model_path = resolve_model(args.model)
    fmt = ChatFormat.from_pretrained(model_path)
    tasks = ReasoningGymTasks(TASK.name, dict(TASK.params))
    prompts = [fmt.render([{"role": "user", "content": tasks.train_task(i).prompt}])
               for i in range(args.prompts)]
    # ignore_eos: every completion is max_tokens long on both sides, so tok/s compare like for like.
    sampling = SamplingConfig(max_tokens=args.max_tokens, temperature=args.temperature, ignore_eos=True)
    engine = EngineConfig(num_cpus=1, kv_cache_gb=1.0, max_num_seqs=max(args.prompts, 8))

    vllm_rounds = bench_vllm(model_path, prompts, sampling, engine, args.rounds)
    path_rounds = bench_path(model_path, args.prompts, sampling, engine, args.rounds)

    def best(rounds):
        return max(r["tokens"] / r["seconds"] for r in rounds)

    vllm_tps, path_tps = best(vllm_rounds), best(path_rounds)
    print(f"vLLM generate:    {vllm_tps:8.1f} generated tok/s  rounds={vllm_rounds}")
    print(f"worker->client->engine: {path_tps:8.1f} generated tok/s  rounds={path_rounds}")
    print(f"ratio path/vllm: {path_tps / vllm_tps:.3f}")
    print(json.dumps({"bench": "rollout", "model": args.model, "prompts": args.prompts,
                      "max_tokens": args.max_tokens, "vllm_tok_s": round(vllm_tps, 1),
                      "path_tok_s": round(path_tps, 1), "ratio": round(path_tps / vllm_tps, 3),
                      "vllm_rounds": vllm_rounds, "path_rounds": path_rounds}))


if __name__ == "__main__":
    main()
