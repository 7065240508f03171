"""ThreadedLLM (rollout/engine/thread.py): vLLM's engine core on a thread, in a Ray actor of its own
(the engine binds its process's OpenMP threads and memory, so not in the test process).

Each scenario runs inside the actor against a real vLLM CPU engine on the tiny model and returns
what it observed; the tests assert on that."""

import asyncio

import pytest
import ray

pytestmark = pytest.mark.e2e

LONG = 48  # tokens of a "long" request: many engine steps


class ThreadProbe:
    def __init__(self, model_path: str):
        from rollout.config import EngineConfig
        from rollout.engine.args import engine_args
        from rollout.engine.thread import ThreadedLLM

        self.llm = ThreadedLLM(engine_args(model_path, EngineConfig(kv_cache_gb=0.25, max_num_seqs=8)))

    def _params(self, max_tokens: int):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            max_tokens=max_tokens, ignore_eos=True, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY
        )

    async def _final(self, request_id: str, max_tokens: int = LONG):
        async for out in self.llm.generate({"prompt_token_ids": [5, 6, 7]}, self._params(max_tokens), request_id):
            return out

    async def _unfinished(self) -> int:
        return await self.llm._call(lambda: self.llm._engine.get_num_unfinished_requests())

    async def _started(self, n: int) -> None:
        while await self._unfinished() < n:
            await asyncio.sleep(0.01)

    async def pause_wait(self) -> dict:
        first = [asyncio.ensure_future(self._final(f"w{i}")) for i in range(2)]
        await self._started(2)
        await self.llm.pause_generation(mode="wait")
        drained = all(f.done() for f in first)
        held = asyncio.ensure_future(self._final("w-held", 4))
        await asyncio.sleep(0.5)
        held_while_paused = not held.done()
        await self.llm.resume_generation()
        out = await asyncio.wait_for(held, 60)
        return {
            "drained": drained,
            "held": held_while_paused,
            "held_tokens": len(out.outputs[0].token_ids),
            "first_tokens": [len(f.result().outputs[0].token_ids) for f in first],
        }

    async def pause_keep(self) -> dict:
        task = asyncio.ensure_future(self._final("k0", 200))
        await self._started(1)
        await self.llm.pause_generation(mode="keep")
        in_flight = await self._unfinished()
        await asyncio.sleep(0.5)
        frozen = not task.done()
        await self.llm.resume_generation()
        out = await asyncio.wait_for(task, 120)
        return {"in_flight": in_flight, "frozen": frozen, "tokens": len(out.outputs[0].token_ids)}

    async def cancel(self) -> int:
        task = asyncio.ensure_future(self._final("c0", 400))
        await self._started(1)
        task.cancel()
        for _ in range(500):
            if await self._unfinished() == 0:
                break
            await asyncio.sleep(0.01)
        return await self._unfinished()

    async def bad_call_then_serve(self) -> tuple[str, int]:
        try:
            await self.llm.collective_rpc("tracerl_no_such_method")
            error = ""
        except Exception as e:  # noqa: BLE001 - what the caller gets is the observation
            error = type(e).__name__
        out = await self._final("b0", 4)
        return error, len(out.outputs[0].token_ids)

    async def step_fails(self) -> dict:
        from rollout.engine.thread import EngineThreadDied

        def step():
            raise RuntimeError("injected: step failed")

        self.llm._engine.step = step
        waiting = []
        for rid in ("d0", "d1"):
            try:
                await asyncio.wait_for(self._final(rid), 60)
            except EngineThreadDied as e:
                waiting.append(str(e))
        return {"errored": self.llm.errored, "errors": waiting}


@pytest.fixture(scope="module")
def probe(ray_cluster, tiny_path):
    actor = ray.remote(num_cpus=0.5)(ThreadProbe).remote(tiny_path)
    yield actor
    ray.kill(actor)


def test_a_wait_pause_returns_once_the_requests_in_flight_finished_and_holds_new_ones(probe):
    seen = ray.get(probe.pause_wait.remote(), timeout=300)
    assert seen["drained"], "pause(wait) returned before the requests in flight finished"
    assert seen["first_tokens"] == [LONG, LONG]
    assert seen["held"], "a request that came during the pause was served before the resume"
    assert seen["held_tokens"] == 4


def test_a_keep_pause_freezes_the_request_in_flight_and_it_finishes_after_the_resume(probe):
    seen = ray.get(probe.pause_keep.remote(), timeout=300)
    assert seen == {"in_flight": 1, "frozen": True, "tokens": 200}


def test_a_cancelled_caller_aborts_its_request(probe):
    assert ray.get(probe.cancel.remote(), timeout=300) == 0


def test_a_failing_call_fails_alone_and_the_engine_serves_on(probe):
    error, tokens = ray.get(probe.bad_call_then_serve.remote(), timeout=300)
    assert error and tokens == 4


def test_a_failing_step_ends_the_thread_and_every_caller_is_told(probe):
    """Last in this module: the probe's engine is dead after it."""
    seen = ray.get(probe.step_fails.remote(), timeout=300)
    assert seen["errored"]
    assert "engine thread stopped: RuntimeError('injected: step failed')" in seen["errors"][0]
    assert "engine thread is gone" in seen["errors"][1], "a later call fails at once, naming the cause"
