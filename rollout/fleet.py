"""RolloutFleet: the rollout side of a run, as one driver-side object every entry point shares.

    with RolloutFleet(cfg) as fleet:                 # engines per policy, a buffer, the workers
        fleet.submit(task_indices)                   # one group of traces per task index
        groups = fleet.take(num_groups, timeout_s)   # blocks until that many groups are complete
        traces = fleet.evaluate(size, sampling, timeout_s)   # held-out tasks, in order

The training loop, scripts/generate.py and the benches drive the same fleet.
Every wait has a deadline and names what it waited for; a rollout worker
that dies surfaces here with its error; a failed start kills what it made.
"""

from __future__ import annotations

import time

import ray

from rollout.cluster import spawn_buffer, spawn_engines, spawn_workers
from rollout.config import RolloutJobConfig, SamplingConfig
from rollout.models import resolve_model
from rollout.trace import Trace


class RolloutFleet:
    """One engine pool per policy the agents use (its own model and engine settings), one
    TraceBuffer, `rollout.num_workers` workers."""

    def __init__(self, cfg: RolloutJobConfig):
        self.cfg = cfg
        self.engines: dict[str, list] = {}  # policy -> Engine actor handles
        self.buffer = None
        self.workers: list = []
        self._inflight: dict[ray.ObjectRef, int] = {}  # RolloutWorker.run call -> worker index
        self._takes = 0  # buffer.get calls so far (numbers them, for buffer.interrupt)
        try:
            models = {p: cfg.policy_model(p) for p in cfg.used_policies()}
            self.model_paths = {p: resolve_model(m.name, m.path) for p, m in models.items()}  # HF folders
            self.engines = spawn_engines({p: (self.model_paths[p], m, cfg.policy_engine(p)) for p, m in models.items()},
                                         seed=cfg.seed)
            infos = ray.get([pool[0].info.remote() for pool in self.engines.values()], timeout=60)
            self.vocab_sizes = {p: info["vocab_size"] for p, info in zip(self.engines, infos)}
            self.buffer = spawn_buffer(cfg.rollout.group_size, self.vocab_sizes)
            self.workers = spawn_workers(cfg, self.engines, self.model_paths, self.buffer)
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
                self._inflight[w.run.remote(task_indices[i::n])] = i

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
            done, _ = ray.wait([get, *self._inflight], num_returns=1,
                               timeout=max(0.0, deadline - time.monotonic()))
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
        """A finished RolloutWorker.run call: re-raise its error (a dead worker) with context."""
        worker = self._inflight.pop(ref)
        try:
            ray.get(ref)
        except Exception as e:
            raise RuntimeError(f"rollout worker {worker} failed: {e}") from e

    def _short(self, why: str, groups: list, num_groups: int) -> str:
        return (f"rollout: {why} with {len(groups)}/{num_groups} complete groups; buffer: "
                f"{ray.get(self.buffer.stats.remote(), timeout=60)}")

    # ---------------------------------------------------------------- evaluation
    def evaluate(self, size: int, sampling: SamplingConfig, timeout_s: float) -> list[Trace]:
        """One harness run on each of the first `size` held-out tasks with `sampling` (not
        buffered, not trained on); traces in task order."""
        n = len(self.workers)
        refs = [w.evaluate.remote(list(range(i, size, n)), sampling) for i, w in enumerate(self.workers)]
        try:
            parts = ray.get(refs, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            for ref in refs:
                ray.cancel(ref)
            raise TimeoutError(f"evaluation of {size} held-out tasks took longer than "
                               f"eval.timeout_s={timeout_s}") from None
        traces: list = [None] * size
        for i, part in enumerate(parts):
            for index, trace in zip(range(i, size, n), part):
                traces[index] = trace
        return traces

    def engine_infos(self) -> list[dict]:
        return ray.get([e.info.remote() for pool in self.engines.values() for e in pool], timeout=60)

    # ---------------------------------------------------------------- shutdown
    def shutdown(self) -> None:
        """Kill every actor the fleet made (also those of a start that failed half-way)."""
        for actor in [*self.workers, self.buffer, *(e for pool in self.engines.values() for e in pool)]:
            if actor is not None:
                ray.kill(actor)
        self.workers, self.buffer, self.engines, self._inflight = [], None, {}, {}
