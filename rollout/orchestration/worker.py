"""RolloutWorker: runs many harness episodes at once and streams their traces (a Ray actor).

Each task instance is run `group_size` times (one group). Episodes run
concurrently on the actor's asyncio loop, at most `concurrency` at a time.
A harness that raises, returns a bad reward, or runs past `timeout_s` yields
a trace with status "failed" and the error — counted, never a crashed worker.
"""

from __future__ import annotations

import asyncio
import functools
import time
import traceback
from collections import Counter
from typing import Any

from harnesses.base import HarnessResult, as_result, collect_scoring_notes, load_harness
from harnesses.verifiers.scoring import ScoringScope
from rollout import faultpoints
from rollout.agents.chat_format import ChatFormat
from rollout.agents.client import Agent, TraceRecorder
from rollout.config import RolloutJobConfig, SamplingConfig, make_task_source
from rollout.engine.engine import EngineError
from rollout.faultpoints import fires
from rollout.gateway.server import Gateway
from rollout.gateway.sessions import GatewayLimits
from rollout.log import setup_logging
from rollout.orchestration.router import Router
from rollout.trace import Trace, TraceError


def _describe(e: BaseException) -> str:
    where = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
    at = f" (at {where[0].filename}:{where[0].lineno})" if where else ""
    return f"{type(e).__name__}: {e}{at}"


class RolloutWorker:
    def __init__(
        self,
        worker_id: int,
        cfg: RolloutJobConfig,
        engines: dict[str, list],
        tokenizers: dict[str, tuple[str, str | None]],
        buffer,
    ):
        """`engines` (Engine actor handles) and `tokenizers` are keyed by policy; a tokenizer is
        (the model's folder, the class AutoTokenizer picks for it: an engine's info gives it, and the
        worker then loads it without importing torch; None: AutoTokenizer); `cfg.agents` maps role -> policy."""
        setup_logging()  # this actor's process (harnesses log too)
        self.worker_id = worker_id
        self.harness = load_harness(cfg.harness._target_)
        self.harness_options = dict(cfg.harness.options)
        self.tasks = make_task_source(cfg.task, seed=cfg.seed)
        self.agents = dict(cfg.agents)
        self.trainable = {p: spec.trainable for p, spec in cfg.policy_table().items()}
        self.routers = {
            p: Router(e, p, cfg.policy_engine(p).request_timeout_s, cfg.policy_engine(p).start_timeout_s)
            for p, e in engines.items()
        }
        self.formats = {p: ChatFormat.from_pretrained(path, cls) for p, (path, cls) in tokenizers.items()}
        self.max_model_len = {p: cfg.policy_model(p).max_model_len for p in self.routers}  # the gateway's clamp
        unknown = {p for p in self.agents.values()} - set(self.routers)
        if unknown:
            raise ValueError(f"agents maps roles to policies {sorted(unknown)} that have no engines")
        self.sampling = cfg.sampling
        self.cfg = cfg.rollout
        self.seed = cfg.seed
        self.reward_range = tuple(cfg.harness.reward_range)
        # this process's gateway (harnesses/programs/openai_agent.py), refusing agent-reported rewards outside the range
        self.gateway = functools.partial(Gateway.shared, GatewayLimits(reward_range=self.reward_range))
        self.buffer = buffer  # TraceBuffer actor handle
        self.counts: Counter[str] = Counter(traces_ok=0, traces_failed=0, traces_truncated=0)
        self.generated_tokens = 0

    async def episode(self, task, group: str, sample: int, sampling: SamplingConfig | None = None) -> Trace:
        """Run the harness on `task`; always returns a Trace (failed on any error). An attempt that
        an engine failure ended (an engine that died did not come back, or died again, or one did
        not answer within engine.request_timeout_s; a request that met a dead engine is first sent
        again to the restarted one, counted in info["requests_resent"] over all attempts) is run
        again from the start, up to `rollout.retries` times, with the same trace id (so the same
        sampling seeds); the trace records its attempts in info["attempts"], and, when the last one
        failed so, info["engine_failed"]."""
        resent = 0
        for attempt in range(1, self.cfg.retries + 2):
            trace, engine_failed = await self.attempt(task, group, sample, sampling)
            resent += trace.info.get("requests_resent", 0)
            if not engine_failed or attempt > self.cfg.retries:
                break
            self.counts["episodes_retried"] += 1
        if attempt > 1:
            trace.info["attempts"] = attempt
        if resent:
            trace.info["requests_resent"] = resent
        if engine_failed:  # the infrastructure's failure, not the harness's: a kept group with it runs again
            trace.info["engine_failed"] = True
        self.counts[f"traces_{trace.status}"] += 1
        self.generated_tokens += trace.num_generated_tokens
        return trace

    async def attempt(
        self, task, group: str, sample: int, sampling: SamplingConfig | None = None
    ) -> tuple[Trace, bool]:
        """One run of the harness on `task`: the trace, and whether an engine failure ended it."""
        recorder = TraceRecorder(f"{group}#{sample}")
        agents = self._agents(recorder, sampling or self.sampling)
        start = time.time()
        status, error, result, engine_failed = "ok", None, None, False
        deadline = asyncio.timeout(self.cfg.timeout_s)
        try:
            with collect_scoring_notes() as notes, ScoringScope(agents) as scoring:
                async with deadline:  # a judge's scores (harnesses/verifiers/judge.py) are awaited within it
                    if fires("harness_hang"):  # rollout/faultpoints.py: a harness stalled on a slow tool
                        await asyncio.sleep(faultpoints.arg("harness_hang"))
                    result = as_result(
                        await scoring.settle(await self.harness(task, agents, **self.harness_options)),
                        self.reward_range,
                    )
        except TimeoutError as e:  # the run's deadline, or a timeout the harness itself raised
            status, error = (
                "failed",
                (
                    f"timeout: harness ran past rollout.timeout_s={self.cfg.timeout_s}"
                    if deadline.expired()
                    else _describe(e)
                ),
            )
        except EngineError as e:
            status, error, engine_failed = "failed", _describe(e), True
        except Exception as e:  # a harness bug must not take the worker down
            status, error = "failed", _describe(e)
        resent = sum(router.resent.pop(recorder.trace_id, 0) for router in self.routers.values())
        if status == "ok" and any(s.finish_reason == "length" for s in recorder.sequences):
            status = "truncated"
        info = {**({"requests_resent": resent} if resent else {}), **({"scoring": notes[-5:]} if notes else {})}
        return self._trace(task, group, recorder, result, status, error, info, start), engine_failed

    def _agents(self, recorder: TraceRecorder, sampling: SamplingConfig) -> dict[str, Agent]:
        """One run's agents, a role each, recording into `recorder`."""
        return {
            role: Agent(
                role,
                policy,
                self.routers[policy],
                self.formats[policy],
                recorder,
                sampling,
                seed=self.seed,
                trainable=self.trainable[policy],
                max_model_len=self.max_model_len[policy],
                gateway=self.gateway,
            )
            for role, policy in self.agents.items()
        }

    def _trace(
        self,
        task,
        group: str,
        recorder: TraceRecorder,
        result: HarnessResult | None,
        status: str,
        error: str | None,
        info: dict[str, Any],
        start: float,
    ) -> Trace:
        """The run's trace; a failed one, naming why, if the harness's result makes no valid trace.
        `info`: the worker's own notes (requests resent, scoring notes), after the harness's."""
        end = time.time()
        fields = dict(
            id=recorder.trace_id,
            group=group,
            sequences=recorder.sequences,
            reward=result.reward if result else 0.0,
            agent_rewards=result.agent_rewards if result else None,
            status=status,
            error=error,
            info={**(result.info if result else {}), **self._task_info(task), **info},
            timings={"start": start, "end": end, "duration_s": end - start},
        )
        try:
            return Trace(**fields)
        except TraceError as e:  # e.g. agent_rewards naming a role that never spoke
            return Trace(
                **{
                    **fields,
                    "status": "failed",
                    "error": f"bad harness result: {e}",
                    "agent_rewards": None,
                    "info": self._task_info(task),
                }
            )

    def _task_info(self, task) -> dict[str, Any]:
        """What every trace's info says of its task (a harness's own info cannot overwrite it: the
        paired evaluation matches items by their question)."""
        return {"task": task.id, "question": task.question, "worker": self.worker_id}

    async def run(self, task_indices: list[int], rerun: bool = False, epoch: int = 0) -> dict[str, Any]:
        """Run one group per task index, streaming each trace to the buffer as it finishes.
        `rerun`: these groups were given to a call that failed (its worker died, or Ray lost sight
        of it while it may still run); the buffer drops their partial traces and fences off that
        call's later puts, and only the groups it has not completed run (again, with the same seeds).
        `epoch`: this call's number (the fleet's, increasing), carried by every put."""
        sem = asyncio.Semaphore(self.cfg.concurrency)
        if rerun:
            complete = set(await self._to_buffer("reopen", self.buffer.reopen.remote(list(task_indices), epoch)))
            task_indices = [i for i in task_indices if i not in complete]
        tasks = {i: self.tasks.train_task(i) for i in task_indices}  # the buffer's slot: the index

        async def one(slot: int, task, sample: int) -> None:
            async with sem:
                trace = await self.episode(task, task.id, sample)
            trace.info["slot"] = slot  # the driver's ledger names the group by it
            rejected = await self._to_buffer("put", self.buffer.put.remote(trace, epoch, slot))
            if rejected is None and fires("buffer_put_twice"):
                await self._to_buffer("put", self.buffer.put.remote(trace, epoch, slot))
            if rejected is not None:  # its group still completes: with a failed trace in its place
                self.counts["traces_rejected"] += 1
                failed = Trace(
                    id=trace.id,
                    group=trace.group,
                    sequences=[],
                    status="failed",
                    error=f"rejected by the trace buffer: {rejected}"[:2000],
                    info={**self._task_info(task), "slot": slot},
                )
                await self._to_buffer("put", self.buffer.put.remote(failed, epoch, slot))

        jobs = [one(i, task, k) for i, task in tasks.items() for k in range(self.cfg.group_size)]
        await asyncio.gather(*jobs)
        return await self.stats()

    async def _to_buffer(self, what: str, call):
        """A call to the trace buffer, bounded by rollout.buffer_timeout_s: a buffer that is gone or
        stopped fails this worker's run call with an error naming it, never a silent hang."""
        limit = self.cfg.buffer_timeout_s
        try:
            return await asyncio.wait_for(call, limit)
        except TimeoutError:
            raise RuntimeError(
                f"rollout worker {self.worker_id}: the trace buffer did not answer a {what} within "
                f"rollout.buffer_timeout_s={limit}"
            ) from None

    async def evaluate(self, indices: list[int], sampling: SamplingConfig, samples: int = 1) -> list[Trace]:
        """Run the harness `samples` times on each held-out task in `indices` with `sampling` (not
        buffered); the traces task by task, sample by sample (trace ids <task>#<sample>)."""
        tasks = self.tasks.eval_tasks()
        sem = asyncio.Semaphore(self.cfg.concurrency)

        async def one(task, sample: int) -> Trace:
            async with sem:
                return await self.episode(task, task.id, sample, sampling)

        return list(await asyncio.gather(*(one(tasks[i], k) for i in indices for k in range(samples))))

    async def stats(self) -> dict[str, Any]:
        import os

        return {"worker": self.worker_id, **self.counts, "generated_tokens": self.generated_tokens, "pid": os.getpid()}
