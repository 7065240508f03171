"""Weights from the learners back into the running engines (`sync.method`).

`CollectiveSync` (the default for full-weight policies): learner rank 0 and
every engine worker of the policy form one weight group, and rank 0 sends the
parameters straight from its module into the engines, which load them in place
with vLLM's layerwise reload. Each worker's transport comes from its device and
rank 0's (trainer/weight_transport.py): CUDA IPC on the same GPU, NCCL on
another GPU, gloo on CPU. No serialisation, no object store on the way.

`ObjectStoreSync` works everywhere and carries LoRA adapters: learner rank 0
gathers the weights (under ZeRO-3 every rank takes part), serialises them into
safetensors buckets and puts them in Ray's object store; every engine fetches
the same object and loads it in place. It is also CollectiveSync's fallback for
a push the group cannot carry (an engine died), and what the policy's
WeightStore holds for an engine that restarts.

Either way an engine tags its later outputs with the pushed version.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import ray

from rollout.engine.weight_group import OPEN_TIMEOUT_S, GroupPlan, Layout, dtype_of
from rollout.orchestration.router import answer
from trainer.weight_transport import choose_transports

if TYPE_CHECKING:  # a sync drives one policy's learners: its LearnerGroup, or an adapter's view of one
    from trainer.learner_group import AdapterLearners, LearnerGroup

log = logging.getLogger(__name__)


class ObjectStoreSync:
    def __init__(
        self,
        learners: LearnerGroup | AdapterLearners,
        engines: list,
        bucket_bytes: int = 64 << 20,
        timeout_s: float = 600.0,
        store=None,
    ):
        self.learners = learners
        self.engines = list(engines)  # Engine actor handles of this policy
        self.store = store  # the policy's WeightStore: what a restarted engine loads
        self.bucket_bytes = bucket_bytes
        self.timeout_s = timeout_s  # engine.sync_timeout_s

    def push(self, version: int) -> dict[str, float]:
        """Send the learners' current weights to every engine as `version`; returns timings."""
        t0 = time.perf_counter()
        buckets = self.learners.export_weights(self.bucket_bytes)  # ObjectRef: stays in the store
        limit = self.learners.cfg.call_timeout_s
        if not ray.wait([buckets], timeout=limit, fetch_local=False)[0]:  # rank 0 has finished serialising
            raise TimeoutError(
                f"weight sync of version {version} of policy {self.learners.name!r}: learner "
                f"rank 0 did not export the weights within learner.call_timeout_s={limit}"
            )
        t_export = time.perf_counter() - t0
        if self.store is not None:  # first, so an engine that restarts from now on loads this version
            answer(
                self.store.publish.remote(version, [buckets]),
                60,
                f"the WeightStore of {self.learners.name!r} (publish)",
            )
        loads = [e.update_weights.remote(version, buckets, self.learners.name) for e in self.engines]
        ready, late = ray.wait(loads, num_returns=len(loads), timeout=self.timeout_s)
        if late:
            late_ids = [i for i, ref in enumerate(loads) if ref in late]
            raise TimeoutError(
                f"weight sync of version {version} of policy {self.learners.name!r}: engines "
                f"{late_ids} did not load it within engine.sync_timeout_s={self.timeout_s}"
            )
        results = []
        for i, ref in enumerate(loads):
            try:
                results.append(ray.get(ref))
            except ray.exceptions.RayActorError:
                if self.store is None:
                    raise
                # It died during the load: Ray restarts it, and it loads this version from the store.
                log.warning(
                    f"[sync] engine {i} of policy {self.learners.name!r} died while loading version {version}; "
                    f"it restarts with it"
                )
        seconds = time.perf_counter() - t0
        nbytes = results[0]["bytes"] if results else 0.0
        return {
            "seconds": seconds,
            "export_seconds": t_export,
            "load_seconds": max(r["seconds"] for r in results) if results else 0.0,
            "bytes": nbytes,
            "bytes_per_s": nbytes / seconds if seconds > 0 else 0.0,
            "engines": float(len(self.engines)),
        }


class CollectiveSync:
    """Send from learner rank 0 straight into the engines' parameters over one weight group per
    policy (rollout/engine/weight_group.py): each engine worker's transport (ipc on rank 0's GPU,
    nccl on another GPU, gloo on CPU) is chosen when the group opens, and logged. The group opens
    at start and again whenever an engine restarted (a new process is not in it); a push it cannot
    carry goes through the object store, and after the n-th failure in a row the group rests for
    2**n - 1 pushes (at most MAX_REST - 1: 1, 3, 7, ...), unless an engine restarts meanwhile."""

    MAX_REST = 64

    def __init__(
        self,
        learners: LearnerGroup | AdapterLearners,
        engines: list,
        transport: str = "auto",
        bucket_bytes: int = 64 << 20,
        timeout_s: float = 600.0,
        store=None,
        snapshot_every: int = 1,
    ):
        """`transport`: `sync.transport` (auto: from the devices); `store`: the policy's WeightStore,
        given a snapshot of every `snapshot_every`-th pushed version in the object store (what a
        restarted engine loads; the object-store fallback puts each version it carries there too)."""
        if snapshot_every < 1:
            raise ValueError(f"sync.snapshot_every={snapshot_every}: expected 1 (every push) or more")
        self.learners, self.engines, self.transport = learners, list(engines), transport
        self.store, self.timeout_s, self.bucket_bytes = store, timeout_s, bucket_bytes
        self.snapshot_every, self.pushed = snapshot_every, 0  # collective pushes carried so far
        self.fallback = ObjectStoreSync(learners, engines, bucket_bytes, timeout_s, store)
        self.layout: Layout = learners.weight_layout(bucket_bytes)
        self.bytes = float(sum(_nbytes(shape, dtype) for bucket in self.layout for _, shape, dtype in bucket))
        self.members: list[int] | None = None  # the engines' pids when the group was opened
        self.transports: list[list[str]] = []  # each engine's workers' transports, as last opened
        self.failures = 0  # pushes in a row the group could not carry
        self.rest, self.rest_members = 0, None  # pushes left to send around the group, and by whom
        self.snapshot: ray.ObjectRef | None = None  # the newest pushed version in the object store
        self._open()

    def _pids(self) -> list[int]:
        return [i["pid"] for i in ray.get([e.info.remote() for e in self.engines], timeout=self.timeout_s)]

    def _open(self) -> None:
        """Open the group: choose each engine worker's transport from its device and rank 0's, then
        learner rank 0 (hosting its store) and every engine worker join at once."""
        sender = self.learners.weight_identity()
        workers = ray.get([e.weight_identities.remote() for e in self.engines], timeout=self.timeout_s)
        transports = choose_transports(sender, workers, self.transport)
        host, port = self.learners.weight_address()
        plan = self.learners.prepare_weight_group(GroupPlan(host, port, transports), self.layout, self.timeout_s)
        firsts = [1 + sum(map(len, workers[:i])) for i in range(len(workers))]
        joins = [self.learners.open_weight_group()]
        joins += [e.open_weight_group.remote(plan, first, self.timeout_s) for e, first in zip(self.engines, firsts)]
        limit = OPEN_TIMEOUT_S + 30  # the members' own deadline, and their start-up
        if len(ray.wait(joins, num_returns=len(joins), timeout=limit)[0]) < len(joins):
            raise TimeoutError(
                f"the weight group of policy {self.learners.name!r} ({len(transports) + 1} members "
                f"at {host}:{port}) did not form within {limit} s"
            )
        opened = ray.get(joins)[1:]
        self.members = self._pids()
        if opened != self.transports:
            for i, (ts, ws) in enumerate(zip(opened, workers)):
                log.info(
                    f"[sync] policy {self.learners.name!r}: engine {i} takes weights over {'+'.join(ts)} "
                    f"(learner rank 0 on {sender}; its workers on {', '.join(ws)})"
                )
        self.transports = opened

    def _resting(self) -> bool:
        """Whether this push goes around a group that failed (see the class); an engine restart
        ends the rest at once."""
        if self.rest == 0:
            return False
        try:
            restarted = self._pids() != self.rest_members
        except (ray.exceptions.RayError, TimeoutError):
            restarted = False
        self.rest = 0 if restarted else self.rest - 1
        return not restarted

    def push(self, version: int) -> dict[str, float]:
        """Send the learners' current weights to every engine as `version`; returns timings."""
        if self._resting():
            return {**self.fallback.push(version), "fallbacks": 1.0}
        t0 = time.perf_counter()
        try:
            if self.members is None or self._pids() != self.members:
                self._open()  # an engine restarted since: its new process joins
            t_open = time.perf_counter() - t0
            sends = self.learners.broadcast_weights(version, self.layout)
            loads = [e.receive_weights.remote(version, self.layout) for e in self.engines]
            late = ray.wait(sends + loads, num_returns=len(sends) + len(loads), timeout=self.timeout_s)[1]
            if late:
                raise TimeoutError(
                    f"weight push of version {version} of policy {self.learners.name!r} "
                    f"not done within engine.sync_timeout_s={self.timeout_s}"
                )
            results, sent = ray.get(loads), ray.get(sends)
        except (ray.exceptions.RayError, RuntimeError, TimeoutError) as e:
            return self._around_the_group(version, e)
        self.failures, self.pushed = 0, self.pushed + 1
        seconds = time.perf_counter() - t0
        if self.store is not None and self.pushed % self.snapshot_every == 0:
            # what an engine that restarts from now on loads (rank 0 exports it next, while the engines
            # already serve this version): a full copy of the weights, so not necessarily every push
            self.snapshot = self.learners.export_weights(self.bucket_bytes)
            answer(
                self.store.publish.remote(version, [self.snapshot]),
                60,
                f"the WeightStore of {self.learners.name!r} (publish)",
            )
        return {
            "seconds": seconds,
            "open_seconds": t_open,
            "send_seconds": max(sent),
            "load_seconds": max(r["seconds"] for r in results),
            "receive_seconds": max(r["receive_seconds"] for r in results),
            "bytes": self.bytes,
            "bytes_per_s": self.bytes / seconds,
            "engines": float(len(self.engines)),
            "fallbacks": 0.0,
        }

    def _around_the_group(self, version: int, error: Exception) -> dict[str, float]:
        """A push the group could not carry (an engine died or restarted mid-push, a transport
        failed): every engine takes this version through the object store (a restarted one from
        its WeightStore), and the group rests before it is opened anew."""
        self.members, self.failures = None, self.failures + 1
        self.rest = min(2**self.failures, self.MAX_REST) - 1
        try:
            self.rest_members = self._pids()
        except (ray.exceptions.RayError, TimeoutError):
            self.rest_members, self.rest = None, 0  # an engine is down: its restart reopens the group
        log.warning(
            f"[sync] the weight group of policy {self.learners.name!r} could not carry version {version} "
            f"({type(error).__name__}: {str(error)[:200]}); sending it through the object store, and the next "
            f"{self.rest} pushes too unless an engine restarts"
        )
        return {**self.fallback.push(version), "fallbacks": 1.0}


def _nbytes(shape: list[int], dtype: str) -> int:
    import math

    return math.prod(shape) * dtype_of(dtype).itemsize
