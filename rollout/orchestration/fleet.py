"""RolloutFleet: the rollout side of a run, as one driver-side object every entry point shares.

    with RolloutFleet(cfg) as fleet:                 # engines per policy, a buffer, the workers
        fleet.submit(task_indices)                   # one group of traces per task index
        groups = fleet.take(num_groups, timeout_s)   # blocks until that many groups are complete
        traces = fleet.evaluate(size, sampling, timeout_s)   # held-out tasks, in order

The training loop, scripts/generate.py and the benches drive the same fleet.
Every wait has a deadline and names what it waited for; a rollout worker
that dies surfaces here with its error; a failed start kills what it made.

Engines heal: Ray restarts a dead engine (`engine.max_restarts`), which then
loads its policy's newest weights from the policy's WeightStore before it
serves; a watchdog thread probes every engine each `engine.health_check_s`
and has Ray restart one that does not answer within `engine.health_timeout_s`
(a hung engine core). The episodes such a failure cut short run again
(rollout.retries), so no group comes up short.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import ray

from rollout.config import RolloutJobConfig, SamplingConfig
from rollout.models import resolve_model
from rollout.orchestration.cluster import spawn_buffer, spawn_engines, spawn_stores, spawn_workers
from rollout.orchestration.router import actor_state, wait_until_restarted
from rollout.trace import Trace

log = logging.getLogger(__name__)


class RolloutFleet:
    """One engine pool per policy the agents use (its own model and engine settings) — LoRA
    adapters and frozen policies of one base model share one (cfg.engine_pools()) — one
    TraceBuffer, `rollout.num_workers` workers."""

    def __init__(self, cfg: RolloutJobConfig):
        self.cfg = cfg
        self.pools: dict[str, list] = {}  # pool -> Engine actor handles
        self.engines: dict[str, list] = {}  # policy -> its pool's Engine actor handles
        self.stores: dict = {}  # policy -> WeightStore actor (a restarted engine's newest weights)
        self.buffer = None
        self.hung_restarts = 0  # engines the watchdog had restarted (a probe not answered, or failed)
        self._stop_watch = threading.Event()
        self._watchdog: threading.Thread | None = None
        self.workers: list = []
        # RolloutWorker.run call -> (worker, tasks, the worker's life it was sent to)
        self._inflight: dict[ray.ObjectRef, tuple[int, list[int], int]] = {}
        self._lives: list[int] = []  # per worker: the restarts seen so far (one death fails all its calls)
        self.worker_restarts = 0  # rollout workers that died and were restarted
        self._takes = 0  # buffer.get calls so far (numbers them, for buffer.interrupt)
        try:
            models = {p: cfg.policy_model(p) for p in cfg.used_policies()}
            self.model_paths = {p: resolve_model(m.name, m.path) for p, m in models.items()}  # HF folders
            self.stores = spawn_stores(list(models))
            self.pool_members = pools = cfg.engine_pools()  # pool -> its policies
            self.pools = spawn_engines(
                {name: (self.model_paths[ps[0]], models[ps[0]], cfg.pool_engine(ps)) for name, ps in pools.items()},
                seed=cfg.seed,
                stores={name: {p: self.stores[p] for p in ps} for name, ps in pools.items()},
                adapters={
                    name: {p: cfg.policy_lora(p) for p in ps if cfg.policy_lora(p)} for name, ps in pools.items()
                },
            )
            self.engines = {p: self.pools[name] for name, ps in pools.items() for p in ps}
            infos = ray.get([pool[0].info.remote() for pool in self.engines.values()], timeout=60)
            self.vocab_sizes = {p: info["vocab_size"] for p, info in zip(self.engines, infos)}
            tokenizers = {p: (self.model_paths[p], info["tokenizer_class"]) for p, info in zip(self.engines, infos)}
            self.buffer = spawn_buffer(cfg.rollout.group_size, self.vocab_sizes)
            self.workers = spawn_workers(cfg, self.engines, tokenizers, self.buffer)
            self._lives = [0] * len(self.workers)
            if any(cfg.policy_engine(p).health_check_s > 0 for p in self.engines):
                self._watchdog = threading.Thread(target=self._watch, name="engine-watchdog", daemon=True)
                self._watchdog.start()
        except BaseException:
            self.shutdown()
            raise

    def __enter__(self) -> RolloutFleet:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ---------------------------------------------------------------- rollout
    def submit(self, task_indices: list[int]) -> None:
        """Start one group of `rollout.group_size` traces per task index, spread over the workers."""
        n = len(self.workers)
        for i, w in enumerate(self.workers):
            if task_indices[i::n]:
                self._inflight[w.run.remote(task_indices[i::n])] = (i, task_indices[i::n], self._lives[i])

    def take(self, num_groups: int, timeout_s: float) -> list[list[Trace]]:
        """Block until `num_groups` complete groups are buffered and take them, oldest first.

        Raises a rollout worker's error as soon as it dies; RuntimeError if every
        submitted episode has finished and the groups are still short (rejected
        traces); TimeoutError past `timeout_s`.
        """
        self._takes += 1
        get = self.buffer.get.remote(num_groups, timeout_s=timeout_s, call=self._takes)
        deadline = time.monotonic() + timeout_s
        ready = False
        while self._inflight:
            done, _ = ray.wait([get, *self._inflight], num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not done or get in done:
                ready = bool(done)
                break
            self._collect(done[0])
        if not ready:  # timed out, or every submitted episode is in the buffer: end its wait
            ray.get(self.buffer.interrupt.remote(self._takes), timeout=60)
        groups = ray.get(get, timeout=60)
        if len(groups) < num_groups:
            if not self._inflight:
                raise RuntimeError(self._short("every submitted episode finished", groups, num_groups))
            raise TimeoutError(self._short(f"waited rollout_timeout_s={timeout_s}", groups, num_groups))
        return groups

    def _collect(self, ref: ray.ObjectRef) -> None:
        """A finished RolloutWorker.run call. If its worker died, Ray restarts it
        (rollout.max_worker_restarts) and the call goes to it again with `rerun`: the groups it had
        not completed start over (their partial traces are dropped), the complete ones are not run
        twice. Any other error, or a worker out of restarts, is raised with context."""
        worker, tasks, life = self._inflight.pop(ref)
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError as e:
            self._await_restart(worker, life, e, "running its unfinished groups again")
            self._inflight[self.workers[worker].run.remote(tasks, rerun=True)] = (worker, tasks, self._lives[worker])
        except Exception as e:
            raise RuntimeError(f"rollout worker {worker} failed: {e}") from e

    def _await_restart(self, worker: int, life: int, error: Exception, then: str) -> None:
        """Wait until Ray has restarted dead rollout worker `worker`; RuntimeError if it does not come back.
        `life`: the worker's restarts when the failed call was sent; a call that dies with a life already
        restarted (the worker held two calls when it died) goes to the restarted worker at once."""
        if life < self._lives[worker]:
            return
        limit = self.cfg.rollout.worker_restart_timeout_s
        if not wait_until_restarted(self.workers[worker], "stats", limit):
            raise RuntimeError(
                f"rollout worker {worker} failed: it died and Ray did not restart it within "
                f"rollout.worker_restart_timeout_s={limit} (killed for good, or past "
                f"rollout.max_worker_restarts={self.cfg.rollout.max_worker_restarts}): "
                f"{error}"
            ) from error
        self._lives[worker] += 1
        self.worker_restarts += 1
        log.warning(f"[rollout] worker {worker} died ({type(error).__name__}); {then}")

    def _short(self, why: str, groups: list, num_groups: int) -> str:
        return (
            f"rollout: {why} with {len(groups)}/{num_groups} complete groups; buffer: "
            f"{ray.get(self.buffer.stats.remote(), timeout=60)}"
        )

    # ---------------------------------------------------------------- evaluation
    def evaluate(
        self,
        size: int,
        sampling: SamplingConfig,
        timeout_s: float,
        samples: int = 1,
        progress: Callable[[int], None] | None = None,
        progress_s: float = 10.0,
    ) -> list[Trace]:
        """`samples` harness runs on each of the first `size` held-out tasks with `sampling` (not
        buffered, not trained on); traces in task order, a task's samples together. A worker that
        dies meanwhile is waited for (Ray restarts it) and runs its share again. `progress`, if
        given, hears how many runs have finished, every `progress_s` seconds until all have."""
        n = len(self.workers)
        shares = {i: list(range(i, size, n)) for i in range(n)}
        lives = list(self._lives)  # each worker's life its share was sent to
        pending = {w.evaluate.remote(shares[i], sampling, samples): i for i, w in enumerate(self.workers) if shares[i]}
        deadline = time.monotonic() + timeout_s
        traces: list = [None] * (size * samples)
        start = self._episodes_run() if progress else 0
        while pending:
            left = max(0.0, deadline - time.monotonic())
            done, _ = ray.wait(list(pending), num_returns=1, timeout=min(left, progress_s) if progress else left)
            if not done and progress and time.monotonic() < deadline:
                progress(self._episodes_run() - start)
                continue
            if not done:
                for ref in pending:
                    ray.cancel(ref)
                raise TimeoutError(f"evaluation of {size} held-out tasks took longer than eval.timeout_s={timeout_s}")
            i = pending.pop(done[0])
            try:
                part = ray.get(done[0])
            except ray.exceptions.RayActorError as e:
                self._await_restart(i, lives[i], e, "evaluating its share of the held-out tasks again")
                lives[i] = self._lives[i]
                pending[self.workers[i].evaluate.remote(shares[i], sampling, samples)] = i
                continue
            for j, trace in enumerate(part):
                traces[shares[i][j // samples] * samples + j % samples] = trace
        if progress:
            progress(len(traces))
        return traces

    def _episodes_run(self) -> int:
        """Episodes the workers have finished so far (every kind, training's included)."""
        stats = ray.get([w.stats.remote() for w in self.workers], timeout=60)
        return sum(s.get(f"traces_{k}", 0) for s in stats for k in ("ok", "failed", "truncated"))

    def engine_infos(self) -> list[dict]:
        """Every engine's `info()`; one that Ray is restarting (the watchdog's kill, a crash) is
        waited for, up to its pool's engine.start_timeout_s; one dead for good is left out."""
        asked = [
            (engine, engine.info.remote(), self.cfg.policy_engine(self.pool_members[pool][0]).start_timeout_s)
            for pool, engines in self.pools.items()
            for engine in engines
        ]  # all at once
        infos = []
        for engine, ref, limit in asked:
            try:
                infos.append(ray.get(ref, timeout=60))
            except ray.exceptions.RayActorError:
                if wait_until_restarted(engine, "info", limit):
                    infos.append(ray.get(engine.info.remote(), timeout=60))
        return infos

    def engine_clocks(self, timeout_s: float = 5.0) -> list[dict]:
        """`engine_infos()` of the engines that answer within `timeout_s` (a restarting or dead
        engine is left out, never waited for): what the per-step rollout split reads."""
        refs = [e.info.remote() for pool in self.pools.values() for e in pool]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        infos = []
        for ref in ready:
            try:
                infos.append(ray.get(ref))
            except ray.exceptions.RayError:
                pass
        return infos

    def engine_restarts(self) -> int:
        """Engine restarts so far, every pool (a restarted engine checks in with each of its
        pool's stores: the first one counts)."""
        return sum(ray.get([self.stores[ps[0]].restarts.remote() for ps in self.pool_members.values()], timeout=60))

    # ---------------------------------------------------------------- health
    def _watch(self) -> None:
        """The watchdog thread: probe each engine in turn, every health_check_s."""
        period = min(c for c in (self.cfg.policy_engine(p).health_check_s for p in self.engines) if c > 0)
        while not self._stop_watch.wait(period):
            for name, pool in list(self.pools.items()):
                for i, engine in enumerate(pool):
                    if self._stop_watch.is_set():
                        return
                    self._probe(name, i, engine)

    def _probe(self, pool: str, index: int, engine) -> None:
        """One health probe; an engine that does not answer in time and has not finished a request
        meanwhile is killed for Ray to restart (then waited for, so a slow start is not taken for a
        hang). One that finished requests is busy, not hung: the probe queued behind its requests."""
        cfg = self.cfg.pool_engine(self.pool_members[pool])
        if cfg.health_check_s <= 0:
            return
        verdict = probe_engine(engine, cfg.health_timeout_s, cfg.sync_timeout_s)
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
        self.hung_restarts += 1
        ray.kill(engine, no_restart=False)
        time.sleep(1.0)  # let Ray see it die before asking for it
        wait_until_restarted(engine, "info", cfg.start_timeout_s)  # a slow start is not a hang

    # ---------------------------------------------------------------- shutdown
    def shutdown(self) -> None:
        """Kill every actor the fleet made (also those of a start that failed half-way)."""
        self._stop_watch.set()
        if self._watchdog is not None:
            self._watchdog.join(timeout=5)
        for actor in [
            *self.workers,
            self.buffer,
            *(e for pool in self.pools.values() for e in pool),
            *self.stores.values(),
        ]:
            if actor is not None:
                ray.kill(actor)
        self.workers, self.buffer, self.pools, self.engines, self.stores, self._inflight = [], None, {}, {}, {}, {}
        self._lives = []


def probe_engine(engine, timeout_s: float, load_timeout_s: float = float("inf")) -> str:
    """One health probe of an engine: "ok" (answered within `timeout_s`, or died: Ray restarts
    it), "restarting" (Ray is restarting it: a start, not a hang), "loading" (no answer, but a
    weight load is in progress, which pauses generation, for less than `load_timeout_s`:
    engine.sync_timeout_s), "busy" (no answer, but it finished requests meanwhile: the probe
    queued behind them), "broken" (it answered with an error: it cannot serve) or "hung"."""
    start = engine.info.remote()  # answered at once by a live actor, however busy its engine core
    probe = engine.health.remote()
    if ray.wait([probe], timeout=timeout_s)[0]:
        try:
            ray.get(probe)
        except ray.exceptions.RayActorError:  # it died: Ray restarts it
            return "ok"
        except ray.exceptions.RayError:
            return "broken"
        return "ok"
    if actor_state(engine) != "ALIVE":
        return "restarting"
    info = engine_info(start, 0.0)  # not answered in all that time: the actor is stuck
    if info is not None and info.get("loading_s") is not None and info["loading_s"] < load_timeout_s:
        return "loading"
    before = info["finished"] if info is not None else None
    after = finished_requests(engine.info.remote(), min(timeout_s, 30.0)) if before is not None else None
    return "busy" if after is not None and after > before else "hung"


def engine_info(info_ref, timeout_s: float) -> dict | None:
    """An engine's `info()` answer; None if not answered in time (or it failed)."""
    try:
        return ray.get(info_ref, timeout=timeout_s)
    except Exception:
        return None


def finished_requests(info_ref, timeout_s: float) -> int | None:
    """The requests an engine had answered, from its `info()` call; None if not answered in time."""
    info = engine_info(info_ref, timeout_s)
    return None if info is None else info["finished"]
