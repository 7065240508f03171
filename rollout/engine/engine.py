"""Engine: one vLLM engine behind a token-in, token-out interface (a Ray actor).

    engine = ray.remote(num_cpus=1)(Engine).remote(model_path, EngineConfig(), pool="main")
    [c] = await engine.generate.remote(prompt_ids, SamplingConfig(max_tokens=32))
    c.completion_ids, c.logprobs, c.finish_reason, c.version

`update_weights(version, buckets)` loads new weights in place (no restart),
resets the prefix cache, and tags every later output with `version`. The same
class runs vLLM's CPU build and the CUDA build; only EngineConfig differs.
`engine.core` says where vLLM's engine core runs: on a thread of this actor
(rollout/engine/thread.py: one vLLM import per engine, the CPU default) or in
a child process (vLLM's AsyncLLM, the GPU default); both offer the same calls.

An engine that dies is restarted by Ray (`engine.max_restarts`) with the same
arguments; before its first request it loads its policies' newest weights and
versions from their `WeightStore`s, so nothing it serves is older than what the
run had pushed. `health()` is the watchdog's probe (rollout/orchestration/fleet.py). When
vLLM's engine-core process dies (the OOM killer, a CUDA fault) the actor would
stay alive with every call failing, and a vLLM utility call in flight (the first
request's task query, pause, weight load, prefix reset, adapter load) would wait
forever: vLLM never fails a utility future whose core died (vllm-project/vllm
PR #56416). Instead a watch task on the actor's loop (`watch_core`) ends the
actor's process within CORE_WATCH_S of the death, whatever is waiting, so Ray
restarts it like any dead engine and the router sends its requests again.

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
import logging
import os
import pickle
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from rollout.config import EngineConfig, LoraConfig, SamplingConfig
from rollout.engine.args import (
    _vllm_env,
    bind_cpu_cores,
    core_kind,
    eager_sampler_on_cpu,
    engine_args,
    sampling_params,
)
from rollout.engine.core_watch import CORE_WATCH_S, dies_with_core, watch_core
from rollout.log import setup_logging
from rollout.models import tokenizer_class

log = logging.getLogger(__name__)


@dataclass
class Completion:
    """One generated stream of a request."""

    completion_ids: list[int]
    logprobs: list[float]  # behaviour log-prob of each generated token
    finish_reason: str  # stop | length | abort
    version: int  # weight version that produced every token of it


class EngineError(RuntimeError):
    """A request that an engine did not answer: it died (Ray restarts it) or ran past the deadline.
    The worker runs such an episode again (rollout.retries) instead of blaming the harness."""


class Engine:
    """Owns one vLLM AsyncLLM. All methods are async: Ray runs it as an async actor."""

    def __init__(
        self,
        model_path: str,
        cfg: EngineConfig,
        pool: str = "main",
        dtype: str = "float32",
        max_model_len: int = 2048,
        seed: int = 0,
        stores: dict | None = None,
        index: int = 0,
        adapters: dict[str, LoraConfig] | None = None,
    ):
        """`pool`: the engine pool's name (its policies joined by "+" when it serves adapters);
        `stores`: policy -> its WeightStore actor, for each policy whose weights this engine takes
        pushes of (none: always the weights in `model_path`); `index`: this engine's place in the
        pool (the stores count its starts); `adapters`: LoRA policy -> its adapter settings."""
        since = time.perf_counter()
        setup_logging()  # this actor's process: its lines reach the driver's terminal (Ray forwards stderr)
        _vllm_env(cfg.vllm_log_level)
        eager_sampler_on_cpu(cfg)
        from vllm.v1.engine.async_llm import AsyncLLM

        from rollout.engine.clock import StepClock
        from rollout.engine.thread import ThreadedLLM

        self.pool = pool
        self.version = 0  # of the base weights
        self.cfg = cfg
        self.model_path = model_path
        self.adapters = dict(adapters or {})
        self.adapter_versions = {p: 0 for p in self.adapters}
        self._lora: dict = {}  # adapter policy -> its vLLM LoRARequest, once a version was pushed
        self._adapter_dir = Path(tempfile.mkdtemp(prefix="tracerl-lora-")) if self.adapters else None
        bind_cpu_cores(cfg)
        self._clock = StepClock()  # the engine-core steps' time (rollout/engine/clock.py)
        t0 = time.perf_counter()
        args = engine_args(model_path, cfg, dtype, max_model_len, seed, self.adapters)
        loggers = [lambda vllm_config, index: self._clock]
        if core_kind(cfg) == "thread":
            self._llm = ThreadedLLM(args, stat_loggers=loggers, start_timeout_s=cfg.start_timeout_s)
        else:
            self._llm = AsyncLLM.from_engine_args(args, stat_loggers=loggers)
        self.vocab_size = self._llm.model_config.get_vocab_size()
        self.tokenizer_class = tokenizer_class(model_path)  # vLLM imported transformers: ~0.3 s here
        self.start_s = time.perf_counter() - t0
        log.info(
            f"[engine] pool {pool!r} engine {index}: ready in {time.perf_counter() - since:.1f} s "
            f"(vLLM imported in {t0 - since:.1f} s, core on a {core_kind(cfg)}: weights and KV cache "
            f"{self.start_s:.1f} s)"
        )
        self._init_state(stores, index)

    def _init_state(self, stores: dict | None, index: int) -> None:
        """The engine's own bookkeeping: requests, loads, the catch-up, the core watch."""
        self._active = 0  # requests in flight
        self._finished = 0  # requests answered (the watchdog's sign of progress)
        self._busy_s = 0.0  # seconds with at least one request in flight
        self._busy_since = 0.0
        self._stores, self._index = dict(stores or {}), index
        self._caught_up: asyncio.Task | None = None  # loading the store's newest weights, once
        self._catching_up_since: float | None = None  # monotonic start of the catch-up in progress
        self._load_lock = asyncio.Lock()  # one weight load at a time
        self._loading_since: float | None = None  # monotonic start of the load holding the lock
        self._loads_waiting = 0  # loads queued behind it
        self._unloaded_since: float | None = None  # a base load failed then: paused until a full one succeeds
        self._admitting = asyncio.Event()  # clear while a load holds generation paused: new requests wait
        self._admitting.set()
        self._shut_down = False  # shutdown() stopped vLLM on purpose
        self._watch: asyncio.Task | None = None  # watch_core on this actor's loop
        self._watch_core()  # Ray runs an async actor's __init__ on its loop; else the first call starts it

    def _watch_core(self) -> None:
        """Start the core watch on the running loop, once (a no-op without one)."""
        if self._watch is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._watch = loop.create_task(
            watch_core(lambda: self._llm.errored, self._exit_if_core_died, lambda: self._shut_down, CORE_WATCH_S)
        )

    def _exit_if_core_died(self) -> None:
        """vLLM's engine-core process is gone (its monitor thread marks the client dead): this actor
        can never serve again, so it exits with an error and Ray restarts it (engine.max_restarts).
        os._exit, not ray.actor.exit_actor: Ray does not restart an actor that exits on purpose."""
        if self._llm.errored and not self._shut_down:
            log.error(
                f"[engine] pool {self.pool!r} engine {self._index}: vLLM's engine core died; exiting so Ray "
                f"restarts this engine"
            )
            os._exit(1)

    async def _current(self) -> None:
        """Before anything else this process does: check in with the stores and load each policy's
        newest weights if the run has pushed any (this engine was restarted after a crash)."""
        caught_up = self._start_catch_up()
        if caught_up is None:
            return
        try:
            await asyncio.shield(caught_up)
        except Exception:
            if caught_up.done() and self._caught_up is caught_up:  # failed (a lost store ref): the next call retries
                self._caught_up = None
            raise

    def _start_catch_up(self) -> asyncio.Task | None:
        """The catch-up with the stores (started once; again after a failed one), or None without stores."""
        self._watch_core()
        if not self._stores:
            return None
        if self._caught_up is None:
            self._catching_up_since = time.monotonic()
            self._caught_up = asyncio.ensure_future(self._catch_up())
            self._caught_up.add_done_callback(self._caught_up_done)
        return self._caught_up

    def _caught_up_done(self, task: asyncio.Task) -> None:
        self._catching_up_since = None
        if not task.cancelled() and task.exception() is not None:
            log.warning(f"[engine] pool {self.pool!r} engine {self._index}: catching up failed: {task.exception()}")

    async def _catch_up(self) -> None:
        """Each store's newest version, loaded; every wait bounded (engine.sync_timeout_s) and named."""
        limit = self.cfg.sync_timeout_s
        for policy, store in self._stores.items():
            what = f"engine {self._index} of pool {self.pool!r}: the WeightStore of policy {policy!r}"
            try:
                version, refs = await asyncio.wait_for(store.checkout.remote(self._index), limit)
                buckets = await asyncio.wait_for(refs[0], limit) if refs else None
            except TimeoutError:
                raise RuntimeError(
                    f"{what} did not hand its weights over within engine.sync_timeout_s={limit}"
                ) from None
            except Exception as e:
                raise RuntimeError(f"{what} failed: {type(e).__name__}: {e}") from e
            if buckets is not None:
                await self._load(version, buckets, policy)

    # ------------------------------------------------------------ generation
    @dies_with_core
    async def generate(
        self, prompt_ids: list[int], sampling: SamplingConfig, seed: int | None = None, policy: str | None = None
    ) -> list[Completion]:
        """Sample `sampling.n` completions of `prompt_ids` with `policy`'s weights (an adapter
        policy's adapter; else the base); each carries its behaviour log-probs."""
        await self._current()
        if len(prompt_ids) + sampling.max_tokens > self._llm.model_config.max_model_len:
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens + max_tokens {sampling.max_tokens} exceeds "
                f"model.max_model_len {self._llm.model_config.max_model_len}"
            )
        await self._admitting.wait()  # a load in progress: its version, not the one before it, samples this
        version, lora = self._serving(policy)
        final = None
        with self._in_flight():
            async for out in self._llm.generate(
                {"prompt_token_ids": list(prompt_ids)},
                sampling_params(sampling, seed),
                uuid.uuid4().hex,
                lora_request=lora,
            ):
                final = out
        self._finished += final is not None
        assert final is not None, "vLLM returned no output"
        return [
            Completion(
                completion_ids=list(o.token_ids),
                logprobs=[lp[t].logprob for t, lp in zip(o.token_ids, o.logprobs)],
                finish_reason=o.finish_reason or "abort",
                version=version,
            )
            for o in final.outputs
        ]

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

    @dies_with_core
    async def score(self, prompt_ids: list[int], completion_ids: list[int], policy: str | None = None) -> list[float]:
        """Log-probs `policy`'s current weights give `completion_ids` after `prompt_ids` (no sampling)."""
        await self._current()
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        ids = list(prompt_ids) + list(completion_ids)
        params = SamplingParams(
            max_tokens=1, prompt_logprobs=0, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY
        )
        final = None
        with self._in_flight():
            async for out in self._llm.generate(
                {"prompt_token_ids": ids}, params, uuid.uuid4().hex, lora_request=self._serving(policy)[1]
            ):
                final = out
        plp = final.prompt_logprobs  # one dict per prompt position; None at position 0
        return [plp[i][ids[i]].logprob for i in range(len(prompt_ids), len(ids))]

    # ---------------------------------------------------------- weight sync
    @dies_with_core
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
        return {
            "seconds": time.perf_counter() - t0,
            "tensors": float(loaded),
            "bytes": float(sum(len(b) for b in buckets)),
        }

    async def _load(self, version: int, buckets: list[bytes], policy: str | None = None) -> int:
        from rollout.engine.worker_ext import WeightSyncExtension

        if policy in self.adapters:
            return await self._load_adapter(policy, version, buckets)
        return await self._swap_base(version, WeightSyncExtension.tracerl_load_weights.__name__, buckets)

    @contextlib.asynccontextmanager
    async def _loading(self):
        """Hold the engine's one weight-load slot (later loads queue), marked as loading for `info()`;
        new requests wait until it is over (and, after a failed base load, until a full one succeeds),
        so each is tagged with the version it is sampled from."""
        self._loads_waiting += 1
        try:
            await self._load_lock.acquire()
        finally:
            self._loads_waiting -= 1
        self._loading_since = time.monotonic()
        self._admitting.clear()
        try:
            yield
        finally:
            self._loading_since = None
            if self._unloaded_since is None:
                self._admitting.set()
            self._load_lock.release()

    async def _swap_base(self, version: int, method: str, *args) -> int:
        """Run the worker's load `method` with generation paused; the prefix cache (computed
        with the old weights) is reset and later outputs carry `version`. A load that fails leaves
        generation paused: vLLM reloads layer by layer in place, so a load that broke off halfway
        (a collective push another engine's death cut short) leaves a model of neither version,
        which must not serve. Requests wait until a full load succeeds (the push's object-store
        fallback; past engine.sync_timeout_s the watchdog restarts the engine, which loads the
        store's newest weights)."""
        async with self._loading():
            await self._llm.pause_generation(mode=self.cfg.sync_pause_mode, clear_cache=True)
            try:
                loaded = await self._llm.collective_rpc(method, args=args)
                await self._llm.reset_prefix_cache()
            except BaseException as e:
                if self._unloaded_since is None:
                    self._unloaded_since = time.monotonic()
                log.error(
                    f"[engine] pool {self.pool!r} engine {self._index}: loading version {version} failed "
                    f"({type(e).__name__}: {str(e)[:200]}); generation stays paused until a full load succeeds"
                )
                raise
            self.version, self._unloaded_since = version, None
            await self._llm.resume_generation()
        return loaded[0]

    @dies_with_core
    async def weight_identities(self) -> list[str]:
        """Each worker's device (rollout/engine/weight_group.py::device_identity), in tensor-parallel
        rank order: what the weight group's transport for it is chosen from."""
        from rollout.engine.worker_ext import WeightSyncExtension

        return await self._llm.collective_rpc(WeightSyncExtension.tracerl_device_identity.__name__)

    @dies_with_core
    async def open_weight_group(self, plan, first_member: int, timeout_s: float) -> list[str]:
        """Join the base policy's weight group (trainer/weight_sync.py::CollectiveSync) as members
        `first_member`.. (one per worker); learner rank 0 and the policy's other engines join at the
        same time. Returns each worker's transport."""
        from rollout.engine.worker_ext import WeightSyncExtension

        await self._current()
        # pickled here: vLLM's RPC would turn the plan into a dict and cannot carry a CUDA IPC handle's types
        return await self._llm.collective_rpc(
            WeightSyncExtension.tracerl_open_weight_group.__name__, args=(pickle.dumps(plan), first_member, timeout_s)
        )

    @dies_with_core
    async def receive_weights(self, version: int, layout: list) -> dict[str, float]:
        """Take the base weights learner rank 0 sends over the weight group as `version`, in
        `layout` order, and load them in place (paused as in `update_weights`)."""
        from rollout.engine.worker_ext import WeightSyncExtension

        await self._current()
        t0 = time.perf_counter()
        loaded, receive_s = await self._swap_base(
            version, WeightSyncExtension.tracerl_receive_weights.__name__, version, layout
        )
        return {"seconds": time.perf_counter() - t0, "receive_seconds": receive_s, "tensors": float(loaded)}

    async def _load_adapter(self, policy: str, version: int, buckets: list[bytes]) -> int:
        """Replace adapter `policy` (written to its PEFT folder, loaded in place under its fixed
        LoRA id); the base and the other adapters are untouched. The prefix cache is reset, as
        its entries for this adapter's id came from the old weights."""
        from vllm.lora.request import LoRARequest

        from rollout.engine.lora_names import write_adapter

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

    @dies_with_core
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
        progress, or since a failed one left generation paused (None: none); `loads_waiting`: loads
        queued behind it; `catching_up`: a restarted engine is loading its stores' newest weights
        (its version is the one it had before then). Answers at once, also during the catch-up,
        which it starts."""
        import ray

        self._exit_if_core_died()
        self._start_catch_up()  # not awaited: a restarted engine answers while it loads (the watchdog reads it)
        since = next(
            (t for t in (self._loading_since, self._catching_up_since, self._unloaded_since) if t is not None), None
        )
        busy = self._busy_s + (time.perf_counter() - self._busy_since if self._active else 0.0)
        return {
            "pool": self.pool,
            "version": self.version,
            "adapter_versions": dict(self.adapter_versions),
            "vocab_size": self.vocab_size,
            "tokenizer_class": self.tokenizer_class,  # what the workers load the model's tokenizer as
            "start_s": self.start_s,
            "max_model_len": self._llm.model_config.max_model_len,
            "busy_s": busy,
            "steps": self._clock.totals(),
            "active": self._active,
            "finished": self._finished,
            "pid": os.getpid(),
            "core_pids": self._core_pids(),
            "loading_s": None if since is None else time.monotonic() - since,
            "catching_up": self._catching_up_since is not None,
            "loads_waiting": self._loads_waiting,
            "node_id": ray.get_runtime_context().get_node_id() if ray.is_initialized() else None,
        }

    def _core_pids(self) -> list[int]:
        """The pids of vLLM's engine-core processes (engine.core=process; none on the thread core)."""
        client = getattr(self._llm, "engine_core", None)
        manager = getattr(getattr(client, "resources", None), "engine_manager", None)
        return [p.pid for p in getattr(manager, "processes", None) or [] if p.pid is not None]

    async def shutdown(self) -> None:
        self._shut_down = True
        self._llm.shutdown()
        if self._adapter_dir is not None:
            shutil.rmtree(self._adapter_dir, ignore_errors=True)
