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
serves; a watchdog (rollout/orchestration/watchdog.py) probes every engine and
worker at once and has Ray restart one that does not answer (a hung engine
core, a worker whose event loop a harness blocks). The episodes such a failure
cut short run again (rollout.retries), so no group comes up short.

Every group submitted ends once. Each worker call carries an epoch (the
fleet's call number); a call that fails is rerun in a new epoch, and the buffer
refuses the puts of the failed one, which may still be running (Ray's "actor
unavailable" means exactly that): no group is completed from two calls' traces.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import ray

from rollout.config import RolloutJobConfig, SamplingConfig
from rollout.faultpoints import armed, fires
from rollout.models import resolve_model
from rollout.orchestration.cluster import spawn_buffer, spawn_engines, spawn_stores, spawn_workers
from rollout.orchestration.router import actor_state, answer, wait_until_restarted
from rollout.orchestration.watchdog import Watchdog
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
        self.watchdog: Watchdog | None = None
        self.workers: list = []
        # RolloutWorker.run call -> (worker, tasks, the worker's life it was sent to)
        self._inflight: dict[ray.ObjectRef, tuple[int, list[int], int]] = {}
        self._lives: list[int] = []  # per worker: the restarts seen so far (one death fails all its calls)
        self._pids: list[int] = []  # per worker: its process (a failed call whose worker kept it was no death)
        self.worker_restarts = 0  # rollout workers that died and were restarted
        self.unavailable_calls = 0  # worker calls that failed while their worker lived on (rerun, fenced)
        self._epoch = 0  # worker calls so far: each call's epoch (the buffer fences off older ones)
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
            self._pids = [s["pid"] for s in ray.get([w.stats.remote() for w in self.workers], timeout=60)]
            self.watchdog = Watchdog(
                [(n, i, e, cfg.pool_engine(pools[n])) for n, ps in self.pools.items() for i, e in enumerate(ps)],
                self.workers,
                cfg.rollout.health_check_s,
                cfg.rollout.health_timeout_s,
                lambda engine, c: probe_engine(engine, c.health_timeout_s, c.sync_timeout_s),
            )
        except BaseException:
            self.shutdown()
            raise

    @property
    def hung_restarts(self) -> int:
        """Engines the watchdog had restarted (a probe not answered, or answered with an error)."""
        return self.watchdog.hung_engines if self.watchdog else 0

    def __enter__(self) -> RolloutFleet:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ---------------------------------------------------------------- rollout
    def submit(self, task_indices: list[int]) -> None:
        """Start one group of `rollout.group_size` traces per task index, spread over the workers."""
        n = len(self.workers)
        for i in range(n):
            if task_indices[i::n]:
                self._send(i, task_indices[i::n])

    def _send(self, worker: int, tasks: list[int], rerun: bool = False) -> None:
        self._epoch += 1
        ref = self.workers[worker].run.remote(tasks, rerun=rerun, epoch=self._epoch)
        self._inflight[ref] = (worker, tasks, self._lives[worker])

    def take(self, num_groups: int, timeout_s: float) -> list[list[Trace]]:
        """Block until `num_groups` complete groups are buffered and take them, oldest first.

        Raises a rollout worker's error as soon as it dies; RuntimeError if every
        submitted episode has finished and the groups are still short (rejected
        traces); TimeoutError past `timeout_s`.
        """
        self._takes += 1
        get = self.buffer.get.remote(num_groups, timeout_s=timeout_s, call=self._takes)
        try:
            ready = self._wait(get, timeout_s)
        except BaseException:  # the take fails: its get must not linger and swallow later groups
            self.buffer.interrupt.remote(self._takes)
            raise
        if not ready:  # timed out, or every submitted episode is in the buffer: end its wait
            answer(self.buffer.interrupt.remote(self._takes), 60, "the trace buffer (interrupt)")
        groups = answer(get, 60, "the trace buffer (get)")
        if len(groups) < num_groups:
            if not self._inflight:
                raise RuntimeError(self._short("every submitted episode finished", groups, num_groups))
            raise TimeoutError(self._short(f"waited rollout_timeout_s={timeout_s}", groups, num_groups))
        return groups

    def _wait(self, get: ray.ObjectRef, timeout_s: float) -> bool:
        """Collect finished worker calls until the buffer's `get` is ready (True), or every call has
        finished or `timeout_s` passed (False); a call whose worker died is rerun meanwhile."""
        deadline = time.monotonic() + timeout_s
        while self._inflight:
            if armed("worker_call_unavailable"):  # a call still running is taken for failed (rollout/faultpoints.py)
                running = ray.wait(list(self._inflight), num_returns=len(self._inflight), timeout=0)[1]
                for ref in [r for r in running if fires("worker_call_unavailable")]:
                    self._rerun(ref, ray.exceptions.ActorUnavailableError("fault point worker_call_unavailable", None))
            done, _ = ray.wait([get, *self._inflight], num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not done or get in done:
                return bool(done)
            self._collect(done[0])
        return False

    def _collect(self, ref: ray.ObjectRef) -> None:
        """A finished RolloutWorker.run call. If it failed with its worker (dead: Ray restarts it,
        rollout.max_worker_restarts; or out of Ray's sight, maybe still running), its groups go to
        the worker again with `rerun`: the groups it had not completed start over (their partial
        traces are dropped, the failed call's later puts refused), the complete ones are not run
        twice. Any other error, or a worker out of restarts, is raised with context."""
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError as e:
            self._rerun(ref, e)
            return
        except Exception as e:
            raise RuntimeError(f"rollout worker {self._inflight.pop(ref)[0]} failed: {e}") from e
        del self._inflight[ref]

    def _rerun(self, ref: ray.ObjectRef, error: Exception) -> None:
        worker, tasks, life = self._inflight.pop(ref)
        self._await_restart(worker, life, error, "running its unfinished groups again")
        self._send(worker, tasks, rerun=True)

    def _await_restart(self, worker: int, life: int, error: Exception, then: str) -> None:
        """Wait until dead rollout worker `worker` answers again (Ray restarts it); RuntimeError if it
        does not come back. `life`: the worker's restarts when the failed call was sent; a call that
        dies with a life already restarted (the worker held two calls when it died) goes to the
        restarted worker at once. A worker that answers from the same process did not die (Ray
        lost sight of the call: "actor unavailable"): not counted as a restart."""
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
        pid = answer(self.workers[worker].stats.remote(), limit, f"rollout worker {worker} (stats)")["pid"]
        if pid == self._pids[worker]:
            self.unavailable_calls += 1
            log.warning(
                f"[rollout] a call to rollout worker {worker} failed ({type(error).__name__}) while it lives; {then}"
            )
            return
        self._pids[worker] = pid
        self._lives[worker] += 1
        self.worker_restarts += 1
        log.warning(f"[rollout] worker {worker} died ({type(error).__name__}); {then}")

    def reset(self) -> None:
        """Drop every rollout in flight and every buffered group (the driver rolled back to a
        checkpoint and submits those groups again): the calls are cancelled, and the buffer refuses
        their puts however late they come."""
        for ref in self._inflight:
            ray.cancel(ref)
        self._inflight = {}
        self._epoch += 1
        answer(self.buffer.reset.remote(self._epoch), 60, "the trace buffer (reset)")

    def _short(self, why: str, groups: list, num_groups: int) -> str:
        return (
            f"rollout: {why} with {len(groups)}/{num_groups} complete groups; buffer: "
            f"{answer(self.buffer.stats.remote(), 60, 'the trace buffer (stats)')}"
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
        asked = [self.stores[ps[0]].restarts.remote() for ps in self.pool_members.values()]
        return sum(answer(asked, 60, f"the WeightStores of {sorted(self.pool_members)} (restarts)"))

    # ---------------------------------------------------------------- shutdown
    def shutdown(self) -> None:
        """Kill every actor the fleet made (also those of a start that failed half-way)."""
        if self.watchdog is not None:
            self.watchdog.stop()
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
