"""ThreadedLLM: vLLM's engine core on a thread of the engine actor's own process.

vLLM's AsyncLLM runs its engine core in a child process, and on CPU that child is spawned (vLLM's
CPU platform forces spawn), so it imports vLLM a second time: ~10 s of a 2-core box's CPU on
every engine start and restart, before any weight is loaded. Here the synchronous in-process
engine (vLLM's `LLMEngine` over its `InprocClient`) runs on one thread that owns it, and the
actor's asyncio side talks to that thread through a queue of calls: one vLLM import per engine,
and an engine that dies or is killed is one process, gone at once.

It offers the part of AsyncLLM's interface `rollout.engine.engine.Engine` uses, with the same meaning:
`generate` (the final output only: every request the Engine makes asks for FINAL_ONLY),
`pause_generation` / `resume_generation` (`wait`: requests in flight finish first; `keep`: they
are frozen and go on after; requests that arrive while paused wait for the resume),
`collective_rpc`, `reset_prefix_cache`, `add_lora`, `errored`, `model_config`, `shutdown`.

The thread steps the engine while any request is unfinished and sleeps on its queue otherwise.
An exception inside a step means the engine can no longer serve: `errored` turns true and every
waiting caller gets `EngineThreadDied` (the Engine then ends its process so that Ray restarts
it). An exception in one call (a bad request, a failing weight load) goes to that caller only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class EngineThreadDied(RuntimeError):
    """The engine thread stopped on an error: nothing on this engine can be served any more."""


@dataclass
class _Request:
    request_id: str
    prompt: Any
    params: Any
    lora_request: Any
    answer: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


class ThreadedLLM:
    """One vLLM LLMEngine, owned by its thread. Build it from vLLM engine args; it returns once the
    engine is up (weights loaded, KV cache allocated) or raises what stopped it."""

    def __init__(self, engine_args, stat_loggers: list | None = None, start_timeout_s: float = 900.0):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()  # (function, its future) for the thread
        self._requests: dict[str, _Request] = {}  # request id -> request, until answered
        self._held: list[_Request] = []  # arrived while paused: added on resume
        self._holding = False  # paused: new requests wait for the resume
        self._frozen = False  # paused with `keep`: no steps at all
        self._drained: concurrent.futures.Future | None = None  # a `wait` pause waiting for the drain
        self._stopping = False
        self._failing = threading.Lock()  # _fail_all may run on the dying thread and on a late caller's
        self.errored = False
        self.error: BaseException | None = None
        started: concurrent.futures.Future = concurrent.futures.Future()
        # The engine is built on its own thread: vLLM's CPU worker binds the OpenMP threads of the
        # thread that builds it, and the steps must run on that thread.
        self._thread = threading.Thread(
            target=self._run, args=(engine_args, stat_loggers, started), name="vllm-engine", daemon=True
        )
        self._thread.start()
        try:
            self._engine = started.result(timeout=start_timeout_s)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"vLLM's engine was not up after {start_timeout_s:.0f} s") from None
        self.model_config = self._engine.model_config

    # ------------------------------------------------------------------ the asyncio side
    async def generate(self, prompt, params, request_id: str, lora_request=None):
        """Yields the request's final output. A cancelled caller aborts the request."""
        request = _Request(request_id, prompt, params, lora_request)
        try:
            await asyncio.wrap_future(self._submit(lambda: self._add(request)))  # fails if the thread is gone
            yield await asyncio.wrap_future(request.answer)
        except asyncio.CancelledError:
            self._submit(lambda: self._abort(request_id))
            raise

    async def pause_generation(self, *, mode: str = "wait", clear_cache: bool = True) -> None:
        """Stop scheduling: `wait` returns once the requests in flight finished, `keep` at once,
        with them frozen. (`clear_cache`: the caller resets the prefix cache after its load.)"""
        drained = await self._call(lambda: self._pause(str(mode)))
        if drained is not None:
            await asyncio.wrap_future(drained)

    async def resume_generation(self) -> None:
        await self._call(self._resume)

    async def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None) -> list:
        return await self._call(lambda: self._engine.collective_rpc(method, args=args, kwargs=kwargs))

    async def reset_prefix_cache(self) -> bool:
        return await self._call(self._engine.reset_prefix_cache)

    async def add_lora(self, lora_request) -> bool:
        return await self._call(lambda: self._engine.add_lora(lora_request))

    def shutdown(self, timeout_s: float = 60.0) -> None:
        """Stop the thread (requests still waiting fail) and release the engine."""
        if self._thread.is_alive():
            self._calls.put((self._stop, concurrent.futures.Future()))
            self._thread.join(timeout_s)
        self._engine.engine_core.shutdown()

    async def _call(self, fn: Callable[[], Any]):
        """`fn()` run on the engine thread between two steps; its result or its error."""
        return await asyncio.wrap_future(self._submit(fn))

    def _submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        if self.errored or not self._thread.is_alive():
            future.set_exception(EngineThreadDied(f"vLLM's engine thread is gone: {self.error!r}"))
            return future
        self._calls.put((fn, future))
        if self.errored:  # the thread died between the check and the put: no one else will answer it
            self._fail_all(EngineThreadDied(f"vLLM's engine thread is gone: {self.error!r}"))
        return future

    # ------------------------------------------------------------------ the engine thread
    def _run(self, engine_args, stat_loggers, started: concurrent.futures.Future) -> None:
        try:
            engine = _build(engine_args, stat_loggers)
        except BaseException as e:  # noqa: BLE001 - handed to the constructor, which raises it
            started.set_exception(e)
            return
        started.set_result(engine)
        try:
            while not self._stopping:
                self._take_calls(block=self._frozen or not engine.has_unfinished_requests())
                if not self._frozen and engine.has_unfinished_requests():
                    for out in engine.step():
                        if out.finished:
                            self._answer(out.request_id, out)
                self._check_drained()
        except BaseException as e:  # noqa: BLE001 - the engine is unusable: every caller is told
            self.error, self.errored = e, True
            self._fail_all(EngineThreadDied(f"vLLM's engine thread stopped: {e!r}"))

    def _take_calls(self, block: bool) -> None:
        """Run every queued call; when idle, first wait for one (the thread sleeps here)."""
        try:
            fn, future = self._calls.get(block=block)
        except queue.Empty:
            return
        while True:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except Exception as e:  # noqa: BLE001 - this call's error, for its caller
                    future.set_exception(e)
            try:
                fn, future = self._calls.get_nowait()
            except queue.Empty:
                return

    def _add(self, request: _Request) -> None:
        if self._holding:
            self._held.append(request)
            return
        self._requests[request.request_id] = request
        try:
            self._engine.add_request(
                request.request_id, request.prompt, request.params, lora_request=request.lora_request
            )
        except Exception as e:  # noqa: BLE001 - a request vLLM refuses fails alone
            self._requests.pop(request.request_id)
            request.answer.set_exception(e)

    def _abort(self, request_id: str) -> None:
        self._held = [r for r in self._held if r.request_id != request_id]
        if self._requests.pop(request_id, None) is not None:
            self._engine.abort_request([request_id])

    def _answer(self, request_id: str, output) -> None:
        request = self._requests.pop(request_id, None)
        if request is not None:
            request.answer.set_result(output)

    def _pause(self, mode: str) -> concurrent.futures.Future | None:
        if mode not in ("wait", "keep"):
            raise ValueError(f"pause mode {mode!r}: wait or keep")
        self._holding, self._frozen = True, mode == "keep"
        if self._frozen or not self._engine.has_unfinished_requests():
            return None
        self._drained = concurrent.futures.Future()  # set once the requests in flight finished
        return self._drained

    def _check_drained(self) -> None:
        if self._drained is not None and not self._engine.has_unfinished_requests():
            drained, self._drained = self._drained, None
            drained.set_result(None)

    def _resume(self) -> None:
        self._holding = self._frozen = False
        held, self._held = self._held, []
        for request in held:
            self._add(request)

    def _stop(self) -> None:
        self._stopping = True
        self._fail_all(EngineThreadDied("the engine was shut down"))

    def _fail_all(self, error: BaseException) -> None:
        """Every waiting caller gets `error` (from the dying thread, or a caller that came too late)."""
        with self._failing:
            for request in [*self._requests.values(), *self._held]:
                if not request.answer.done():
                    request.answer.set_exception(error)
            self._requests, self._held = {}, []
            if self._drained is not None and not self._drained.done():
                self._drained.set_exception(error)
            while True:
                try:
                    _, future = self._calls.get_nowait()
                except queue.Empty:
                    return
                if future.set_running_or_notify_cancel():
                    future.set_exception(error)


def _build(engine_args, stat_loggers):
    """vLLM's in-process engine for `engine_args`: its engine core and (uni-process executor)
    worker run in this process, on the calling thread."""
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.executor import Executor

    # Read by vLLM's CPU platform while it builds the config: left at 1, it swaps the uni-process
    # executor for the multiprocess one, whose spawned worker imports vLLM again (and in-process
    # engines are what this process is for).
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # What the imports made stays for the process's life: out of the collector's sight, the five
    # gc.collect() calls of vLLM's start stop walking it (~0.9 s of an engine start).
    gc.freeze()
    vllm_config = engine_args.create_engine_config(UsageContext.ENGINE_CONTEXT)
    # log_stats on when someone listens (as AsyncLLM does with custom loggers); vLLM's own
    # periodic stats logger only logs at INFO, below the level the Engine sets.
    return LLMEngine(
        vllm_config,
        Executor.get_class(vllm_config),
        log_stats=bool(stat_loggers),
        stat_loggers=stat_loggers,
        multiprocess_mode=False,
    )
