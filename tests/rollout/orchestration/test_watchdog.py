"""The watchdog's schedule (rollout/orchestration/watchdog.py), with the engine probe handed in: it
outlives its own errors, and probes every engine at once, so a sweep does not grow with their number.
(The probe itself, on real engines: tests/rollout/engine/test_engine.py; restarts: test_fleet.py.)"""

import threading
import time

import pytest

from rollout.config import EngineConfig
from rollout.orchestration.watchdog import Watchdog

pytestmark = pytest.mark.unit


def test_a_probe_that_raises_is_counted_and_the_watchdog_goes_on():
    """Before: one exception in a probe ended the thread for the rest of the run, silently."""
    calls = []

    def probe(engine, cfg):
        calls.append(engine)
        if engine == "bad":
            raise RuntimeError("the GCS did not answer")
        return "ok"

    cfg = EngineConfig(health_check_s=0.05)
    dog = Watchdog([("main", 0, "bad", cfg), ("main", 1, "good", cfg)], [], 0.0, 1.0, probe)
    try:
        time.sleep(0.6)
        assert dog.alive and dog.errors >= 2, (dog.errors, calls)
        assert calls.count("good") >= 2 and calls.count("bad") >= 2, "both kept being probed"
    finally:
        dog.stop()
    assert not dog.alive


def test_engines_are_probed_at_once_and_a_slow_verdict_holds_up_no_other():
    """Eight engines whose probes take 0.5 s each (an unanswered probe waits engine.health_timeout_s,
    a restart it ordered up to engine.start_timeout_s): all eight start together, and an engine
    whose probe still runs is not probed twice. (Before: one at a time, 8 x 0.5 s a sweep.)"""
    started, lock = {}, threading.Lock()

    def probe(engine, cfg):
        with lock:
            started.setdefault(engine, []).append(time.monotonic())
        time.sleep(0.5)
        return "ok"

    cfg = EngineConfig(health_check_s=0.05)
    dog = Watchdog([("main", i, i, cfg) for i in range(8)], [], 0.0, 1.0, probe)
    try:
        time.sleep(0.4)
    finally:
        dog.stop()
    firsts = [times[0] for times in started.values()]
    assert len(firsts) == 8 and max(firsts) - min(firsts) < 0.2, firsts
    assert all(len(times) == 1 for times in started.values()), "no engine probed again while its probe ran"
    assert dog.sweeps >= 4
