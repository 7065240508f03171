"""Engine: one vLLM AsyncLLM behind a token-in, token-out interface (a Ray actor).

    engine = ray.remote(num_cpus=1)(Engine).remote(model_path, EngineConfig(), policy="main")
    [c] = await engine.generate.remote(prompt_ids, SamplingConfig(max_tokens=32))
    c.completion_ids, c.logprobs, c.finish_reason, c.version

`update_weights(version, buckets)` loads new weights in place (no restart),
resets the prefix cache, and tags every later output with `version`. The same
class runs vLLM's CPU build and the CUDA build; only EngineConfig differs.

An engine that dies is restarted by Ray (`engine.max_restarts`) with the same
arguments; before its first request it loads its policies' newest weights and
versions from their `WeightStore`s, so nothing it serves is older than what the
run had pushed. `health()` is the watchdog's probe (rollout/fleet.py). When
vLLM's engine-core process dies (the OOM killer, a CUDA fault) the actor would
stay alive with every call failing: instead, the first call that meets the dead
core ends the actor's process, so Ray restarts it like any dead engine and the
router sends its requests again.

Weight loads on one engine run one at a time (a late collective load and the
object-store fallback that replaces it never interleave their pause, load and
resume); `info()["loading_s"]` tells the watchdog a load is in progress, which
is not a hang while it keeps within engine.sync_timeout_s.

LoRA: an engine started with `adapters` (policy -> LoraConfig) serves its base
model and each adapter side by side (vLLM multi-LoRA). A request names its
policy; an adapter policy's request carries that adapter and its own version.
`update_weights(version, buckets, policy)` of an adapter replaces only that
adapter; until its first push an adapter is its base (PEFT starts lora_B at 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import pickle
import re
import shutil
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rollout.config import EngineConfig, LoraConfig, SamplingConfig


@dataclass
class Completion:
    """One generated stream of a request."""

    completion_ids: list[int]
    logprobs: list[float]  # behaviour log-prob of each generated token
    finish_reason: str  # stop | length | abort
    version: int  # weight version that produced every token of it


def core_kind(cfg: EngineConfig) -> str:
    """Where this engine's vLLM engine core runs (`engine.core`): "thread" or "process"."""
    if cfg.core != "auto":
        return str(cfg.core)
    return "process" if cfg.num_gpus > 0 or cfg.tensor_parallel_size > 1 else "thread"


def _vllm_env(log_level: str = "ERROR") -> None:
    """vLLM's settings for this process, before vLLM is imported in it (a spawned engine core
    inherits them). (Not VLLM_CPU_KVCACHE_SPACE: it overrides kv_cache_memory_bytes with whole GiB.)"""
    os.environ["VLLM_LOGGING_LEVEL"] = log_level.upper()
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def bind_cpu_cores(cfg: EngineConfig) -> None:
    """Tell vLLM's CPU worker(s), before they start, which cores their OpenMP threads take
    (`engine.cpu_cores`); the CUDA build ignores it."""
    if cfg.num_gpus > 0 or cfg.cpu_cores == "auto":
        return
    share = re.fullmatch(r"(\d+)/(\d+)", "0/1" if cfg.cpu_cores == "all" else cfg.cpu_cores)
    if share is None:  # vLLM's own list
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cfg.cpu_cores
        return
    i, n = map(int, share.groups())
    cores = sorted(os.sched_getaffinity(0))
    mine = cores[i * len(cores) // n:(i + 1) * len(cores) // n]
    k = cfg.tensor_parallel_size
    if len(mine) < k:
        raise ValueError(f"engine.cpu_cores={cfg.cpu_cores}: {len(mine)} of this node's {len(cores)} cores for "
                         f"tensor_parallel_size={k}")
    per = len(mine) // k
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(
        ",".join(map(str, mine[r * per:(r + 1) * per])) for r in range(k))


def engine_args(model_path: str, cfg: EngineConfig, dtype: str = "float32",
                max_model_len: int = 2048, seed: int = 0, adapters: dict[str, LoraConfig] | None = None):
    """vLLM engine arguments for one engine (built, not started: nothing probes the device); CPU and
    GPU differ only in KV-cache sizing and prefill chunking (`_memory_args`). With `adapters`, LoRA
    slots for all of them at once (none is ever evicted)."""
    _vllm_env(cfg.vllm_log_level)
    from vllm import AsyncEngineArgs

    from rollout.lora import vllm_max_rank

    lora = ({"enable_lora": True, "max_loras": len(adapters), "max_cpu_loras": len(adapters),
             "max_lora_rank": vllm_max_rank([a.rank for a in adapters.values()])} if adapters else {})
    return AsyncEngineArgs(
        model=model_path,
        dtype=dtype,
        max_model_len=max_model_len,
        seed=seed,
        enforce_eager=cfg.enforce_eager,
        max_num_seqs=cfg.max_num_seqs,
        **({"block_size": cfg.block_size} if cfg.block_size else {}),
        tensor_parallel_size=cfg.tensor_parallel_size,
        # Log-probs of the distribution actually sampled from (after temperature),
        # which is the behaviour policy the learner's importance ratio needs.
        logprobs_mode="processed_logprobs",
        worker_extension_cls="rollout.vllm_ext.WeightSyncExtension",
        enable_prefix_caching=True,
        # TP 1: one engine-core process with the worker inside it. TP > 1: one worker process per
        # rank on this actor's own devices; left to itself (None), vLLM 0.32 picks its Ray executor
        # inside a placement group and asks Ray for more GPUs (config/parallel.py, __post_init__).
        distributed_executor_backend="uni" if cfg.tensor_parallel_size == 1 else "mp",
        disable_log_stats=True,
        use_tqdm_on_load=False,  # no progress bar per engine start: the Engine prints one line when ready
        **lora,
        **_memory_args(cfg, max_model_len),
    )


def _memory_args(cfg: EngineConfig, max_model_len: int) -> dict:
    """The KV-cache sizing: on GPU vLLM checks at start that gpu_memory_utilization of the device is
    free, then profiles what is left for the KV cache, unless `kv_cache_gb` sets it (vLLM 0.32
    v1/worker/gpu_worker.py, determine_available_memory; null: profiled). On CPU `kv_cache_gb` sets it."""
    if cfg.num_gpus > 0:
        explicit = {} if cfg.kv_cache_gb is None else {"kv_cache_memory_bytes": int(cfg.kv_cache_gb * 2**30)}
        return {"gpu_memory_utilization": cfg.gpu_memory_utilization, **explicit}
    assert cfg.kv_cache_gb is not None, "engine.kv_cache_gb: a size is needed on CPU (the config check says so)"
    return {"kv_cache_memory_bytes": int(cfg.kv_cache_gb * 2**30),
            # A chunked prefill discards its sampled token and rewinds the request's
            # seeded generator, which CPU generators cannot do ("CPU Generator does not
            # use offset"): seeded sampling on CPU needs whole prefills.
            "enable_chunked_prefill": False,
            "max_num_batched_tokens": max(max_model_len, 8192)}


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


def _dies_with_core(method):
    """`method`, except that a failure that finds vLLM's engine core dead ends this process
    (Engine._exit_for_restart) instead of answering: Ray restarts the engine."""
    @functools.wraps(method)
    async def wrapper(self, *args, **kwargs):
        try:
            return await method(self, *args, **kwargs)
        except Exception:
            self._exit_if_core_died()
            raise

    return wrapper


class Engine:
    """Owns one vLLM AsyncLLM. All methods are async: Ray runs it as an async actor."""

    def __init__(self, model_path: str, cfg: EngineConfig, policy: str = "main",
                 dtype: str = "float32", max_model_len: int = 2048, seed: int = 0,
                 stores: dict | None = None, index: int = 0, adapters: dict[str, LoraConfig] | None = None):
        """`policy`: the pool's name (its policies joined by "+" when it serves adapters);
        `stores`: policy -> its WeightStore actor, for each policy whose weights this engine takes
        pushes of (none: always the weights in `model_path`); `index`: this engine's place in the
        pool (the stores count its starts); `adapters`: LoRA policy -> its adapter settings."""
        since = time.perf_counter()
        _vllm_env(cfg.vllm_log_level)
        from vllm.v1.engine.async_llm import AsyncLLM

        from rollout.engine_thread import ThreadedLLM

        self.policy = policy
        self.version = 0  # of the base weights
        self.cfg = cfg
        self.model_path = model_path
        self.adapters = dict(adapters or {})
        self.adapter_versions = {p: 0 for p in self.adapters}
        self._lora: dict = {}  # adapter policy -> its vLLM LoRARequest, once a version was pushed
        self._adapter_dir = Path(tempfile.mkdtemp(prefix="tracerl-lora-")) if self.adapters else None
        bind_cpu_cores(cfg)
        from rollout.engine_clock import StepClock

        self._clock = StepClock()  # the engine-core steps' time (rollout/engine_clock.py)
        t0 = time.perf_counter()
        args = engine_args(model_path, cfg, dtype, max_model_len, seed, self.adapters)
        loggers = [lambda vllm_config, index: self._clock]
        if core_kind(cfg) == "thread":
            self._llm = ThreadedLLM(args, stat_loggers=loggers, start_timeout_s=cfg.start_timeout_s)
        else:
            self._llm = AsyncLLM.from_engine_args(args, stat_loggers=loggers)
        self.vocab_size = self._llm.model_config.get_vocab_size()
        self.start_s = time.perf_counter() - t0
        print(f"[engine] {policy!r} engine {index}: ready in {time.perf_counter() - since:.1f} s "
              f"(vLLM imported in {t0 - since:.1f} s, core on a {core_kind(cfg)}: weights and KV cache "
              f"{self.start_s:.1f} s)", flush=True)
        self._active = 0  # requests in flight
        self._finished = 0  # requests answered (the watchdog's sign of progress)
        self._busy_s = 0.0  # seconds with at least one request in flight
        self._busy_since = 0.0
        self._stores, self._index = dict(stores or {}), index
        self._caught_up: asyncio.Task | None = None  # loading the store's newest weights, once
        self._load_lock = asyncio.Lock()  # one weight load at a time
        self._loading_since: float | None = None  # monotonic start of the load holding the lock
        self._loads_waiting = 0  # loads queued behind it
        self._shut_down = False  # shutdown() stopped vLLM on purpose

    def _exit_if_core_died(self) -> None:
        """vLLM's engine-core process is gone (its monitor thread marks the client dead): this actor
        can never serve again, so it exits with an error and Ray restarts it (engine.max_restarts).
        os._exit, not ray.actor.exit_actor: Ray does not restart an actor that exits on purpose."""
        if self._llm.errored and not self._shut_down:
            print(f"[engine] {self.policy!r} engine {self._index}: vLLM's engine core died; exiting so Ray "
                  f"restarts this engine", flush=True)
            os._exit(1)

    async def _current(self) -> None:
        """Before anything else this process does: check in with the stores and load each policy's
        newest weights if the run has pushed any (this engine was restarted after a crash)."""
        if not self._stores:
            return
        if self._caught_up is None:
            self._caught_up = asyncio.ensure_future(self._catch_up())
        try:
            await asyncio.shield(self._caught_up)
        except Exception:
            if self._caught_up.done():  # failed (e.g. a lost store ref): the next call tries again
                self._caught_up = None
            raise

    async def _catch_up(self) -> None:
        for policy, store in self._stores.items():
            version, refs = await store.checkout.remote(self._index)
            if refs:
                await self._load(version, await refs[0], policy)

    # ------------------------------------------------------------ generation
    @_dies_with_core
    async def generate(self, prompt_ids: list[int], sampling: SamplingConfig,
                       seed: int | None = None, policy: str | None = None) -> list[Completion]:
        """Sample `sampling.n` completions of `prompt_ids` with `policy`'s weights (an adapter
        policy's adapter; else the base); each carries its behaviour log-probs."""
        await self._current()
        if len(prompt_ids) + sampling.max_tokens > self._llm.model_config.max_model_len:
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens + max_tokens {sampling.max_tokens} exceeds "
                f"model.max_model_len {self._llm.model_config.max_model_len}")
        version, lora = self._serving(policy)
        final = None
        with self._in_flight():
            async for out in self._llm.generate({"prompt_token_ids": list(prompt_ids)},
                                                sampling_params(sampling, seed), uuid.uuid4().hex,
                                                lora_request=lora):
                final = out
        self._finished += final is not None
        assert final is not None, "vLLM returned no output"
        return [Completion(
            completion_ids=list(o.token_ids),
            logprobs=[lp[t].logprob for t, lp in zip(o.token_ids, o.logprobs)],
            finish_reason=o.finish_reason or "abort",
            version=version) for o in final.outputs]

    @contextlib.contextmanager
    def _in_flight(self):
        """Count a request in flight for the busy time (`info()["busy_s"]`) and the step clock."""
        if self._active == 0:
            self._busy_since = time.perf_counter()
            self._clock.wake()
        self._active += 1
        try:
            yield
        finally:
            self._active -= 1
            if self._active == 0:
                self._busy_s += time.perf_counter() - self._busy_since
                self._clock.sleep()

    def _serving(self, policy: str | None) -> tuple[int, object]:
        """(version, LoRARequest or None) that serve a request of `policy`."""
        if policy in self.adapters:
            return self.adapter_versions[policy], self._lora.get(policy)
        return self.version, None

    @_dies_with_core
    async def score(self, prompt_ids: list[int], completion_ids: list[int],
                    policy: str | None = None) -> list[float]:
        """Log-probs `policy`'s current weights give `completion_ids` after `prompt_ids` (no sampling)."""
        await self._current()
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        ids = list(prompt_ids) + list(completion_ids)
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        final = None
        with self._in_flight():
            async for out in self._llm.generate({"prompt_token_ids": ids}, params, uuid.uuid4().hex,
                                                lora_request=self._serving(policy)[1]):
                final = out
        plp = final.prompt_logprobs  # one dict per prompt position; None at position 0
        return [plp[i][ids[i]].logprob for i in range(len(prompt_ids), len(ids))]

    # ---------------------------------------------------------- weight sync
    @_dies_with_core
    async def update_weights(self, version: int, buckets: list[bytes], policy: str | None = None) -> dict[str, float]:
        """Load safetensors-serialised weights in place and tag later outputs of `policy` with
        `version`: an adapter policy's adapter tensors (only that adapter changes), else the base's.

        Generation is paused around the load: with `sync_pause_mode=wait` the
        requests in flight finish on the old weights first, so every completion
        comes from exactly one version.
        """
        await self._current()
        t0 = time.perf_counter()
        loaded = await self._load(version, buckets, policy)
        return {"seconds": time.perf_counter() - t0, "tensors": float(loaded),
                "bytes": float(sum(len(b) for b in buckets))}

    async def _load(self, version: int, buckets: list[bytes], policy: str | None = None) -> int:
        from rollout.vllm_ext import WeightSyncExtension

        if policy in self.adapters:
            return await self._load_adapter(policy, version, buckets)
        return await self._swap_base(version, WeightSyncExtension.tracerl_load_weights.__name__, buckets)

    @contextlib.asynccontextmanager
    async def _loading(self):
        """Hold the engine's one weight-load slot (later loads queue), marked as loading for `info()`."""
        self._loads_waiting += 1
        try:
            await self._load_lock.acquire()
        finally:
            self._loads_waiting -= 1
        self._loading_since = time.monotonic()
        try:
            yield
        finally:
            self._loading_since = None
            self._load_lock.release()

    async def _swap_base(self, version: int, method: str, *args) -> int:
        """Run the worker's load `method` with generation paused; the prefix cache (computed
        with the old weights) is reset and later outputs carry `version`."""
        async with self._loading():
            await self._llm.pause_generation(mode=self.cfg.sync_pause_mode, clear_cache=True)
            try:
                loaded = await self._llm.collective_rpc(method, args=args)
                await self._llm.reset_prefix_cache()
                self.version = version
            finally:
                await self._llm.resume_generation()
        return loaded[0]

    @_dies_with_core
    async def weight_identities(self) -> list[str]:
        """Each worker's device (rollout/weight_transport.py::device_identity), in tensor-parallel
        rank order: what the weight group's transport for it is chosen from."""
        from rollout.vllm_ext import WeightSyncExtension

        return await self._llm.collective_rpc(WeightSyncExtension.tracerl_device_identity.__name__)

    @_dies_with_core
    async def open_weight_group(self, plan, first_member: int, timeout_s: float) -> list[str]:
        """Join the base policy's weight group (trainer/weight_sync.py::CollectiveSync) as members
        `first_member`.. (one per worker); learner rank 0 and the policy's other engines join at the
        same time. Returns each worker's transport."""
        from rollout.vllm_ext import WeightSyncExtension

        await self._current()
        # pickled here: vLLM's RPC would turn the plan into a dict and cannot carry a CUDA IPC handle's types
        return await self._llm.collective_rpc(WeightSyncExtension.tracerl_open_weight_group.__name__,
                                              args=(pickle.dumps(plan), first_member, timeout_s))

    @_dies_with_core
    async def receive_weights(self, version: int, layout: list) -> dict[str, float]:
        """Take the base weights learner rank 0 sends over the weight group as `version`, in
        `layout` order, and load them in place (paused as in `update_weights`)."""
        from rollout.vllm_ext import WeightSyncExtension

        await self._current()
        t0 = time.perf_counter()
        loaded, receive_s = await self._swap_base(version, WeightSyncExtension.tracerl_receive_weights.__name__,
                                                  version, layout)
        return {"seconds": time.perf_counter() - t0, "receive_seconds": receive_s, "tensors": float(loaded)}

    async def _load_adapter(self, policy: str, version: int, buckets: list[bytes]) -> int:
        """Replace adapter `policy` (written to its PEFT folder, loaded in place under its fixed
        LoRA id); the base and the other adapters are untouched. The prefix cache is reset, as
        its entries for this adapter's id came from the old weights."""
        from vllm.lora.request import LoRARequest

        from rollout.lora import write_adapter

        folder = self._adapter_dir / policy
        lora_id = sorted(self.adapters).index(policy) + 1
        async with self._loading():
            tensors = write_adapter(folder, self.adapters[policy], self.model_path, buckets)
            await self._llm.pause_generation(mode=self.cfg.sync_pause_mode, clear_cache=True)
            try:
                await self._llm.add_lora(LoRARequest(policy, lora_id, str(folder), load_inplace=True))
                await self._llm.reset_prefix_cache()
                # what requests carry: the same adapter, not reloaded per request
                self._lora[policy] = LoRARequest(policy, lora_id, str(folder))
                self.adapter_versions[policy] = version
            finally:
                await self._llm.resume_generation()
        return tensors

    @_dies_with_core
    async def health(self) -> int:
        """A one-token generation: answers only if the engine core is alive and scheduling."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        await self._current()
        params = SamplingParams(max_tokens=1, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY)
        with self._in_flight():
            async for _ in self._llm.generate({"prompt_token_ids": [0]}, params, uuid.uuid4().hex):
                pass
        return self.version

    # ------------------------------------------------------------ metadata
    async def info(self) -> dict:
        """What the engine serves and how busy it is; `loading_s`: seconds into the weight load in
        progress (None: none), `loads_waiting`: loads queued behind it."""
        import ray

        self._exit_if_core_died()
        await self._current()

        busy = self._busy_s + (time.perf_counter() - self._busy_since if self._active else 0.0)
        return {"policy": self.policy, "version": self.version, "adapter_versions": dict(self.adapter_versions),
                "vocab_size": self.vocab_size,
                "start_s": self.start_s, "max_model_len": self._llm.model_config.max_model_len,
                "busy_s": busy, "steps": self._clock.totals(), "active": self._active, "finished": self._finished, "pid": os.getpid(),
                "loading_s": None if self._loading_since is None else time.monotonic() - self._loading_since,
                "loads_waiting": self._loads_waiting,
                "node_id": ray.get_runtime_context().get_node_id() if ray.is_initialized() else None}

    async def shutdown(self) -> None:
        self._shut_down = True
        self._llm.shutdown()
        if self._adapter_dir is not None:
            shutil.rmtree(self._adapter_dir, ignore_errors=True)


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
