"""Engine: one vLLM AsyncLLM behind a token-in, token-out interface (a Ray actor).

    engine = ray.remote(num_cpus=1)(Engine).remote(model_path, EngineConfig(), policy="main")
    [c] = await engine.generate.remote(prompt_ids, SamplingConfig(max_tokens=32))
    c.completion_ids, c.logprobs, c.finish_reason, c.version

`update_weights(version, buckets)` loads new weights in place (no restart),
resets the prefix cache, and tags every later output with `version`. The same
class runs vLLM's CPU build and the CUDA build; only EngineConfig differs.

An engine that dies is restarted by Ray (`engine.max_restarts`) with the same
arguments; before its first request it loads its policy's newest weights and
version from the policy's `WeightStore`, so nothing it serves is older than
what the run had pushed. `health()` is the watchdog's probe (rollout/fleet.py).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections import Counter
from dataclasses import dataclass

from rollout.config import EngineConfig, SamplingConfig


@dataclass
class Completion:
    """One generated stream of a request."""

    completion_ids: list[int]
    logprobs: list[float]  # behaviour log-prob of each generated token
    finish_reason: str  # stop | length | abort
    version: int  # weight version that produced every token of it


def _vllm_env() -> None:
    # Must be set before vLLM is imported in this process. (Not VLLM_CPU_KVCACHE_SPACE:
    # it overrides kv_cache_memory_bytes with whole GiB.)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def engine_args(model_path: str, cfg: EngineConfig, dtype: str = "float32",
                max_model_len: int = 2048, seed: int = 0):
    """vLLM engine arguments for one engine; CPU and GPU differ only in KV-cache sizing and prefill chunking."""
    _vllm_env()
    from vllm import AsyncEngineArgs

    on_gpu = cfg.num_gpus > 0
    return AsyncEngineArgs(
        model=model_path,
        dtype=dtype,
        max_model_len=max_model_len,
        seed=seed,
        enforce_eager=cfg.enforce_eager,
        max_num_seqs=cfg.max_num_seqs,
        tensor_parallel_size=cfg.tensor_parallel_size,
        # Log-probs of the distribution actually sampled from (after temperature),
        # which is the behaviour policy the learner's importance ratio needs.
        logprobs_mode="processed_logprobs",
        worker_extension_cls="rollout.vllm_ext.WeightSyncExtension",
        enable_prefix_caching=True,
        # One engine-core process; the worker runs inside it (no extra process).
        distributed_executor_backend="uni" if cfg.tensor_parallel_size == 1 else None,
        disable_log_stats=True,
        **({"gpu_memory_utilization": cfg.gpu_memory_utilization} if on_gpu
           else {"kv_cache_memory_bytes": int(cfg.kv_cache_gb * 2**30),
                 # A chunked prefill discards its sampled token and rewinds the request's
                 # seeded generator, which CPU generators cannot do ("CPU Generator does not
                 # use offset"): seeded sampling on CPU needs whole prefills.
                 "enable_chunked_prefill": False,
                 "max_num_batched_tokens": max(max_model_len, 8192)}),
    )


def sampling_params(s: SamplingConfig, seed: int | None = None):
    """vLLM SamplingParams for a SamplingConfig, with per-token behaviour log-probs."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        n=s.n, temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens,
        stop=list(s.stop) or None, ignore_eos=s.ignore_eos, seed=seed, logprobs=0,
        detokenize=bool(s.stop),
        # With n > 1 the last streamed output can miss completions (docs/cpu_notes.md).
        output_kind=RequestOutputKind.FINAL_ONLY)


class Engine:
    """Owns one vLLM AsyncLLM. All methods are async: Ray runs it as an async actor."""

    def __init__(self, model_path: str, cfg: EngineConfig, policy: str = "main",
                 dtype: str = "float32", max_model_len: int = 2048, seed: int = 0,
                 store=None, index: int = 0):
        """`store`: the policy's WeightStore actor (None: always the weights in `model_path`);
        `index`: this engine's place in the policy's pool (the store counts its starts)."""
        _vllm_env()
        from vllm.v1.engine.async_llm import AsyncLLM

        self.policy = policy
        self.version = 0
        self.cfg = cfg
        t0 = time.perf_counter()
        self._llm = AsyncLLM.from_engine_args(engine_args(model_path, cfg, dtype, max_model_len, seed))
        self.vocab_size = self._llm.model_config.get_vocab_size()
        self.start_s = time.perf_counter() - t0
        self._active = 0  # requests in flight
        self._busy_s = 0.0  # seconds with at least one request in flight
        self._busy_since = 0.0
        self._store, self._index = store, index
        self._caught_up: asyncio.Task | None = None  # loading the store's newest weights, once

    async def _current(self) -> None:
        """Before anything else this process does: check in with the store and load the policy's
        newest weights if the run has pushed any (this engine was restarted after a crash)."""
        if self._store is None:
            return
        if self._caught_up is None:
            self._caught_up = asyncio.ensure_future(self._catch_up())
        await asyncio.shield(self._caught_up)

    async def _catch_up(self) -> None:
        version, refs = await self._store.checkout.remote(self._index)
        if refs:
            await self._load(version, await refs[0])

    # ------------------------------------------------------------ generation
    async def generate(self, prompt_ids: list[int], sampling: SamplingConfig,
                       seed: int | None = None) -> list[Completion]:
        """Sample `sampling.n` completions of `prompt_ids`; each carries its behaviour log-probs."""
        await self._current()
        if len(prompt_ids) + sampling.max_tokens > self._llm.model_config.max_model_len:
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens + max_tokens {sampling.max_tokens} exceeds "
                f"model.max_model_len {self._llm.model_config.max_model_len}")
        version = self.version
        final = None
        if self._active == 0:
            self._busy_since = time.perf_counter()
        self._active += 1
        try:
            async for out in self._llm.generate({"prompt_token_ids": list(prompt_ids)},
                                                sampling_params(sampling, seed), uuid.uuid4().hex):
                final = out
        finally:
            self._active -= 1
            if self._active == 0:
                self._busy_s += time.perf_counter() - self._busy_since
        assert final is not None, "vLLM returned no output"
        return [Completion(
            completion_ids=list(o.token_ids),
            logprobs=[lp[t].logprob for t, lp in zip(o.token_ids, o.logprobs)],
            finish_reason=o.finish_reason or "abort",
            version=version) for o in final.outputs]

    async def score(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """Log-probs the current weights give `completion_ids` after `prompt_ids` (no sampling)."""
        await self._current()
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        ids = list(prompt_ids) + list(completion_ids)
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        final = None
        async for out in self._llm.generate({"prompt_token_ids": ids}, params, uuid.uuid4().hex):
            final = out
        plp = final.prompt_logprobs  # one dict per prompt position; None at position 0
        return [plp[i][ids[i]].logprob for i in range(len(prompt_ids), len(ids))]

    # ---------------------------------------------------------- weight sync
    async def update_weights(self, version: int, buckets: list[bytes]) -> dict[str, float]:
        """Load safetensors-serialised weights in place and tag later outputs with `version`.

        Generation is paused around the load: with `sync_pause_mode=wait` the
        requests in flight finish on the old weights first, so every completion
        comes from exactly one version.
        """
        await self._current()
        t0 = time.perf_counter()
        loaded = await self._load(version, buckets)
        return {"seconds": time.perf_counter() - t0, "tensors": float(loaded),
                "bytes": float(sum(len(b) for b in buckets))}

    async def _load(self, version: int, buckets: list[bytes]) -> int:
        from rollout.vllm_ext import WeightSyncExtension

        await self._llm.pause_generation(mode=self.cfg.sync_pause_mode, clear_cache=True)
        try:
            loaded = await self._llm.collective_rpc(
                WeightSyncExtension.tracerl_load_weights.__name__, args=(buckets,))
            await self._llm.reset_prefix_cache()
            self.version = version
        finally:
            await self._llm.resume_generation()
        return loaded[0]

    async def health(self) -> int:
        """A one-token generation: answers only if the engine core is alive and scheduling."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        await self._current()
        params = SamplingParams(max_tokens=1, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY)
        async for _ in self._llm.generate({"prompt_token_ids": [0]}, params, uuid.uuid4().hex):
            pass
        return self.version

    # ------------------------------------------------------------ metadata
    async def info(self) -> dict:
        import ray

        await self._current()

        busy = self._busy_s + (time.perf_counter() - self._busy_since if self._active else 0.0)
        return {"policy": self.policy, "version": self.version, "vocab_size": self.vocab_size,
                "start_s": self.start_s, "max_model_len": self._llm.model_config.max_model_len,
                "busy_s": busy, "active": self._active, "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id() if ray.is_initialized() else None}

    async def shutdown(self) -> None:
        self._llm.shutdown()


class WeightStore:
    """The newest weights pushed to one policy's engines, for an engine that (re)starts (a Ray
    actor, no CPU). Holds the ObjectRef of the pushed buckets, which keeps them in Ray's object
    store; counts each engine's starts (restarts = starts - 1)."""

    def __init__(self):
        self.version = 0
        self.buckets = None  # ObjectRef of the newest pushed buckets
        self.starts: Counter[int] = Counter()

    def publish(self, version: int, buckets: list) -> None:
        """`buckets`: [ObjectRef] (in a list, so Ray hands over the reference, not the bytes)."""
        self.version, self.buckets = version, buckets[0]

    def checkout(self, index: int) -> tuple[int, list]:
        """Engine `index` (re)started: the version to serve and [ObjectRef] of its weights ([] for
        the model's own)."""
        self.starts[index] += 1
        return self.version, [self.buckets] if self.buckets is not None else []

    def restarts(self) -> int:
        return sum(n - 1 for n in self.starts.values())
