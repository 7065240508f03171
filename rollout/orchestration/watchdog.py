"""Watchdog: a thread of the driver that probes every engine and every rollout worker, all at once.

Each `period_s` it starts a probe of every engine and worker that is not still being probed, each
on a thread of its own, so that one slow verdict (a probe waits up to engine.health_timeout_s, and a
restart it ordered up to engine.start_timeout_s) never holds up the others: a sweep costs the
time of one probe, whatever the number of engines.

- An engine that does not answer a one-token generation within engine.health_timeout_s and has
  not finished a request meanwhile (busy), nor is loading weights (within engine.sync_timeout_s),
  is killed for Ray to restart (rollout/orchestration/fleet.py: probe_engine).
- A rollout worker whose event loop does not answer `stats()` within rollout.health_timeout_s (a
  harness that blocks it: a synchronous call, a deadlock) is killed for Ray to restart; the fleet
  then runs its unfinished groups again, as for any dead worker.

The thread survives its own errors: a probe that raises is logged and counted (`errors`), and
`alive` says whether the thread still runs (the run's metrics report both).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import ray

from rollout.config import EngineConfig
from rollout.orchestration.router import actor_state, wait_until_restarted

log = logging.getLogger(__name__)


class Watchdog:
    def __init__(
        self,
        engines: list[tuple[str, int, object, EngineConfig]],
        workers: list,
        worker_check_s: float,
        worker_timeout_s: float,
        probe: Callable[[object, EngineConfig], str],
    ):
        """`engines`: (pool, index, handle, its pool's engine settings) of every engine; `workers`:
        the RolloutWorker handles; `probe(engine, cfg)`: one engine probe's verdict (probe_engine)."""
        self.engines, self.workers, self._probe_engine = engines, workers, probe
        self.worker_timeout_s = worker_timeout_s
        periods = [c.health_check_s for *_, c in engines if c.health_check_s > 0]
        periods += [worker_check_s] if worker_check_s > 0 and workers else []
        self.period_s = min(periods) if periods else 0.0
        self.worker_check_s = worker_check_s
        self.hung_engines = 0  # engines it had restarted (a probe not answered, or answered with an error)
        self.hung_workers = 0  # rollout workers it had restarted (their event loop did not answer)
        self.errors = 0  # probes that raised (logged; the thread goes on)
        self.sweeps = 0
        self._stop = threading.Event()
        self._busy: set[tuple[str, str, int]] = set()  # what is being probed now
        self._last: dict[tuple[str, str, int], float] = {}  # when each one's last probe began
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
        if self.period_s > 0:
            self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the thread runs (False once stopped, or if it had been off from the start)."""
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.sweep()
            except Exception as e:  # noqa: BLE001 - the watchdog outlives its own bugs; counted
                self._failed("a sweep", e)

    def sweep(self) -> None:
        """Start a probe of every engine (and every worker, when their checks are on) that is not
        being probed already; returns at once."""
        self.sweeps += 1
        for pool, index, engine, cfg in self.engines:
            if cfg.health_check_s > 0:
                probe = lambda e=engine, c=cfg, p=pool, i=index: self._engine(p, i, e, c)  # noqa: E731
                self._start(("engine", pool, index), cfg.health_check_s, probe)
        if self.worker_check_s > 0:
            for i, worker in enumerate(self.workers):
                self._start(("worker", "", i), self.worker_check_s, lambda w=worker, i=i: self._worker(i, w))

    def _start(self, key, period_s: float, probe: Callable[[], None]) -> None:
        """Start `probe` unless the last probe of `key` runs still or began less than `period_s` ago."""
        now = time.monotonic()
        with self._lock:
            if key in self._busy or self._stop.is_set() or now - self._last.get(key, -period_s) < period_s * 0.99:
                return
            self._busy.add(key)
            self._last[key] = now

        def run() -> None:
            try:
                probe()
            except Exception as e:  # noqa: BLE001 - one probe's failure, not the watchdog's
                self._failed(f"the probe of {key[0]} {key[2]}" + (f" of {key[1]!r}" if key[1] else ""), e)
            finally:
                with self._lock:
                    self._busy.discard(key)

        # a daemon thread per probe: one waiting out a restart never holds up the process's exit
        threading.Thread(target=run, name=f"watchdog-probe-{key[0]}-{key[2]}", daemon=True).start()

    def _failed(self, what: str, error: Exception) -> None:
        self.errors += 1
        log.error(f"[watchdog] {what} failed ({type(error).__name__}: {error}); the watchdog goes on")

    def _engine(self, pool: str, index: int, engine, cfg: EngineConfig) -> None:
        verdict = self._probe_engine(engine, cfg)
        if verdict in ("busy", "loading"):
            why = (
                "it finished requests meanwhile"
                if verdict == "busy"
                else f"it is loading weights (within engine.sync_timeout_s={cfg.sync_timeout_s})"
            )
            log.info(
                f"[rollout] engine {index} of {pool!r}: a health probe waited over engine.health_timeout_s="
                f"{cfg.health_timeout_s}, but {why}: {verdict}, not hung"
            )
        if verdict not in ("hung", "broken"):
            return
        log.warning(
            f"[rollout] engine {index} of {pool!r} "
            + (
                f"did not answer a health probe within engine.health_timeout_s={cfg.health_timeout_s}"
                if verdict == "hung"
                else "answered a health probe with an error"
            )
            + ": restarting it"
        )
        self.hung_engines += 1
        ray.kill(engine, no_restart=False)
        time.sleep(1.0)  # let Ray see it die before asking for it
        wait_until_restarted(engine, "info", cfg.start_timeout_s)  # a slow start is not a hang

    def _worker(self, index: int, worker) -> None:
        """A worker's event loop answers `stats()` between two awaits of its episodes: one that does
        not within rollout.health_timeout_s is blocked, and is killed (the fleet reruns its groups)."""
        ref = worker.stats.remote()
        if ray.wait([ref], timeout=self.worker_timeout_s)[0]:
            return  # answered (or died: the fleet sees its calls fail)
        if actor_state(worker) != "ALIVE":
            return  # Ray is restarting it
        log.warning(
            f"[rollout] rollout worker {index} did not answer within rollout.health_timeout_s="
            f"{self.worker_timeout_s} (a harness blocks its event loop?): restarting it; its unfinished "
            f"groups run again"
        )
        self.hung_workers += 1
        ray.kill(worker, no_restart=False)
