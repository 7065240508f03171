"""RolloutFleet on the real stack (tiny model, its own vLLM engine, two rollout workers): what
`take` and `evaluate` return, and that every wait ends with a named error.

The fleet runs tests/rollout/orchestration/flaky_harnesses.py's `flaky`: one model call, then it raises on
task 1, hangs on task 2 and tasks 100+ (until rollout.timeout_s) and behaves on tasks 0 and 5-7.
"""

import asyncio
import time

import pytest
import ray

from rollout.config import SamplingConfig
from rollout.orchestration.fleet import RolloutFleet
from rollout.orchestration.router import Router
from trainer.config import compose

pytestmark = pytest.mark.e2e  # a fleet of its own (~30 s to start) whose engines and workers die

FLEET = [
    "model=tiny",
    "engine.kv_cache_gb=0.25",
    "engine.num_cpus=0.5",
    "sampling.max_tokens=8",
    "rollout.num_workers=2",
    "rollout.group_size=2",
]
FLAKY = [
    "harness._target_=tests.rollout.orchestration.flaky_harnesses.flaky",
    "harness.name=flaky",
    "rollout.timeout_s=5",
    "rollout.health_check_s=1",  # the worker watchdog: a blocked event loop is found in seconds
    "rollout.health_timeout_s=3",
    "rollout.buffer_timeout_s=3",
]


@pytest.fixture(scope="module")
def fleet(ray_cluster):
    with RolloutFleet(compose("generate", [*FLEET, *FLAKY])) as f:
        yield f


def test_take_returns_complete_groups_of_the_submitted_tasks(fleet):
    fleet.submit([0, 1, 5])
    groups = fleet.take(3, timeout_s=120)
    assert sorted(g[0].info["task"] for g in groups) == ["chain_sum/train/0", "chain_sum/train/1", "chain_sum/train/5"]
    for g in groups:
        assert len(g) == 2 and len({t.group for t in g}) == 1 and len({t.id for t in g}) == 2
    assert {t.info["worker"] for g in groups for t in g} == {0, 1}, "tasks are spread over both workers"
    assert [t.status for g in groups for t in g if t.info["task"].endswith("/1")] == ["failed", "failed"]


def test_evaluate_returns_held_out_traces_in_task_order(fleet):
    sampling = SamplingConfig(temperature=0.0, max_tokens=8)
    traces = fleet.evaluate(4, sampling, timeout_s=120)
    assert [t.info["task"] for t in traces] == [f"chain_sum/eval/{i}" for i in range(4)]
    assert [t.status == "failed" for t in traces] == [False, True, True, True], "1 raises, 2 hangs, 3 is NaN"
    again = fleet.evaluate(4, sampling, timeout_s=120)
    assert again[0].sequences[0].completion_ids == traces[0].sequences[0].completion_ids, (
        "greedy eval of the same weights is reproducible"
    )
    with pytest.raises(TimeoutError, match="evaluation of 4 held-out tasks took longer than eval.timeout_s=1.0"):
        fleet.evaluate(4, sampling, timeout_s=1.0)  # task 2 hangs for rollout.timeout_s=5


def test_take_of_more_than_was_submitted_fails_at_once(fleet):
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="every submitted episode finished with 0/1 complete groups"):
        fleet.take(1, timeout_s=600)  # nothing submitted
    fleet.submit([7])
    with pytest.raises(RuntimeError, match="every submitted episode finished with 1/2 complete groups"):
        fleet.take(2, timeout_s=600)
    assert time.monotonic() - t0 < 60, "no wait for the deadline when nothing more can come"


def _break_the_next_step(engine) -> None:
    """Run inside the engine actor (`__ray_call__`): its vLLM engine core's next step raises."""

    def step():
        raise RuntimeError("injected: the engine core's step failed")

    engine._llm._engine.step = step


def test_a_dead_engine_core_is_an_engine_death_and_heals(fleet):
    """vLLM's engine core stops (here its step raises, as a CUDA fault would; the core runs on a
    thread of the actor, engine.core=thread), not the engine actor: the call that meets the dead
    core ends the actor, Ray restarts it, and the router sends the request again: every trace
    comes back, one engine restart counted. (Before, the actor lived on with every request
    failing: ~1/n of all traces failed for the rest of the run.) The same for a core process that
    is killed: tests/rollout/engine/test_engine.py."""
    [engine] = fleet.engines["main"]
    pid = ray.get(engine.info.remote(), timeout=60)["pid"]
    restarts = fleet.engine_restarts()
    ray.get(engine.__ray_call__.remote(_break_the_next_step), timeout=60)
    router = Router([engine], "main", timeout_s=300, restart_timeout_s=300)
    [c] = asyncio.run(router.generate("trace-0", [5, 6, 7], SamplingConfig(max_tokens=4)))
    assert len(c.completion_ids) > 0 and router.resent["trace-0"] == 1, "sent again to the restarted engine"
    fleet.submit([0, 5])
    groups = fleet.take(2, timeout_s=120)
    assert [t.error for g in groups for t in g if t.status == "failed"] == []
    assert fleet.engine_restarts() == restarts + 1
    assert ray.get(engine.info.remote(), timeout=60)["pid"] != pid, "a new engine process serves"


def test_engine_infos_wait_for_an_engine_that_is_restarting(fleet):
    """A run's summary reads every engine's info at its end: an engine the watchdog has just killed
    (Ray restarting it) is waited for, not an error that ends a finished run (the faults bench's
    hung-engine run failed so once its restart took under a step)."""
    import psutil

    [engine] = fleet.engines["main"]
    process = psutil.Process(ray.get(engine.info.remote(), timeout=60)["pid"])
    process.kill()  # (ray.kill returns before the process is gone: the old one could still answer)
    psutil.wait_procs([process], timeout=30)
    [info] = fleet.engine_infos()
    assert info["pid"] != process.pid


def test_a_worker_that_dies_holding_two_calls_is_one_restart_and_both_run_again(fleet):
    """An async run has the next step's groups sent before this step's are taken, so a worker can
    die holding two run calls: both fail, both go to the restarted worker, and the run counts one
    restart (before, one per call: CI once saw 2 for the one worker the fault test kills)."""
    restarts = fleet.worker_restarts
    fleet.submit([2, 102])
    fleet.submit([104, 103])  # each worker holds two calls, each of a group that hangs for 5 s
    time.sleep(1.0)
    ray.kill(fleet.workers[0], no_restart=False)
    groups = fleet.take(4, timeout_s=120)
    workers = {g[0].info["task"].rsplit("/", 1)[1]: g[0].info["worker"] for g in groups}
    assert workers == {"2": 0, "104": 0, "102": 1, "103": 1}, workers
    assert fleet.worker_restarts == restarts + 1


def test_a_call_taken_for_failed_while_it_still_runs_is_rerun_and_no_group_comes_twice(fleet):
    """Ray's "actor unavailable" means the call may or may not have run: here (the fault point
    worker_call_unavailable) the fleet takes worker 0's call for failed while it runs on, and reruns
    its group on the same worker. Both calls finish their episodes, but the buffer fences off the
    old call's puts (its epoch is older than the rerun's): each group comes once, with two distinct
    traces, none left over; the worker was not restarted (same process), so no restart is counted.
    (Before: the group completed from both calls' traces and a second copy of it was released.)"""
    from rollout import faultpoints

    restarts, unavailable = fleet.worker_restarts, fleet.unavailable_calls
    before = ray.get(fleet.buffer.stats.remote(), timeout=60)
    faultpoints.arm("worker_call_unavailable", times=1)
    try:
        fleet.submit([50, 51])  # each call's two episodes take a second more than the rerun needs to start
        groups = fleet.take(2, timeout_s=120)
    finally:
        faultpoints.disarm()
    deadline = time.monotonic() + 60  # the old call's episodes end a second later: their puts refused
    while True:
        stats = ray.get(fleet.buffer.stats.remote(), timeout=60)
        refused = stats.get("fenced", 0) + stats.get("late", 0) - before.get("fenced", 0) - before.get("late", 0)
        if refused >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert refused == 2, stats
    assert sorted(g[0].info["slot"] for g in groups) == [50, 51]
    assert all(len({t.id for t in g}) == 2 for g in groups)
    assert stats["groups_waiting"] == 0 and stats["groups_partial"] == 0, "no second copy, nothing left over"
    assert fleet.unavailable_calls == unavailable + 1 and fleet.worker_restarts == restarts


def test_a_worker_whose_event_loop_is_blocked_is_restarted_and_its_groups_run_again(fleet):
    """A harness that blocks its worker's event loop (a synchronous call that does not return: here
    90 s, once) leaves the worker alive but deaf: the watchdog's stats() probe is not answered within
    rollout.health_timeout_s, so it kills the worker, Ray restarts it and the fleet reruns its groups.
    (Before: no worker was probed; the step waited out rollout_timeout_s, here 60 s, and failed.)"""
    from tests.rollout.orchestration.flaky_harnesses import block_marker

    restarts, hung = fleet.worker_restarts, fleet.watchdog.hung_workers
    block_marker(210).touch()
    fleet.submit([210, 5])  # task 210 to worker 0
    groups = fleet.take(2, timeout_s=60)
    assert not block_marker(210).exists(), "the harness blocked"
    assert sorted(g[0].info["slot"] for g in groups) == [5, 210]
    assert [t.status for g in groups for t in g if t.status == "failed"] == []
    assert fleet.watchdog.hung_workers == hung + 1 and fleet.worker_restarts == restarts + 1


def test_evaluation_survives_a_worker_that_dies(fleet):
    """A rollout worker killed during evaluation (Ray restarts it) evaluates its share again: the
    evaluation comes back whole and in order (before, the run stopped with the worker's error)."""
    import threading

    restarts, out = fleet.worker_restarts, {}
    sampling = SamplingConfig(temperature=0.0, max_tokens=8)
    run = threading.Thread(target=lambda: out.update(traces=fleet.evaluate(4, sampling, timeout_s=300)))
    run.start()
    time.sleep(1.0)  # worker 0 is inside task 2's 5 s hang
    ray.kill(fleet.workers[0], no_restart=False)
    run.join(timeout=320)
    assert [t.info["task"] for t in out["traces"]] == [f"chain_sum/eval/{i}" for i in range(4)]
    assert fleet.worker_restarts == restarts + 1


def test_a_stopped_trace_buffer_fails_the_take_naming_it_and_the_fleet_goes_on(fleet):
    """The trace buffer SIGSTOPped (alive, answering nothing): a worker's put has a deadline
    (rollout.buffer_timeout_s), so the take fails within seconds naming the buffer, instead of
    waiting out rollout_timeout_s (before: no deadline, a silent wait). Answering again, the buffer
    serves the next take."""
    import psutil

    buffer = psutil.Process(ray.get(fleet.buffer.stats.remote(), timeout=60)["pid"])
    buffer.suspend()
    t0 = time.monotonic()
    try:
        fleet.submit([6])
        with pytest.raises(
            RuntimeError, match=r"the trace buffer did not answer a put within rollout.buffer_timeout_s=3"
        ):
            fleet.take(1, timeout_s=120)
    finally:
        buffer.resume()
    assert time.monotonic() - t0 < 60
    time.sleep(1.0)  # the stopped worker call's queued puts land (group 6 may complete): drop it
    ray.get(fleet.buffer.get.remote(8, timeout_s=1.0), timeout=60)
    fleet.submit([7])
    [group] = fleet.take(1, timeout_s=120)
    assert group[0].info["slot"] == 7


def test_a_hung_rollout_times_out_and_a_dead_worker_surfaces(fleet):
    """Last in this module: it kills one of the shared fleet's workers."""
    fleet.submit([2, 2])  # both workers run a group that hangs for rollout.timeout_s=5
    with pytest.raises(TimeoutError, match=r"waited rollout_timeout_s=1.0 with 0/1 complete groups"):
        fleet.take(1, timeout_s=1.0)
    ray.kill(fleet.workers[1])
    with pytest.raises(RuntimeError, match="rollout worker 1 failed"):
        fleet.take(2, timeout_s=120)


def test_a_failed_start_kills_what_it_made(ray_cluster):
    def free_cpus() -> float:
        return ray.available_resources().get("CPU", 0.0)

    before = free_cpus()
    with pytest.raises(ray.exceptions.RayActorError, match="harness._target_='harnesses.nope.run' cannot be imported"):
        RolloutFleet(compose("generate", [*FLEET, "harness._target_=harnesses.nope.run"]))
    # its engine (engine.num_cpus=0.5) was up before the workers failed: it must be gone again
    deadline = time.monotonic() + 30
    while free_cpus() < before and time.monotonic() < deadline:
        time.sleep(0.5)  # ray.kill is asynchronous: the resources come back shortly after
    assert free_cpus() == before
