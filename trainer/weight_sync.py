"""Weights from the learners back into the running engines.

`ObjectStoreSync` works everywhere (CPU, GPU, several nodes): learner rank 0
gathers the full weights (under ZeRO-3 every rank takes part), serialises them
into safetensors buckets and puts them in Ray's object store; every engine of
the policy fetches the same object and loads it in place, then tags its later
outputs with the new version. The driver never touches the bytes.

A GPU transport (NCCL broadcast or CUDA IPC from rank 0 into the engines)
would implement the same `push(version) -> stats` interface.
"""

from __future__ import annotations

import time
from typing import Protocol

import ray

from trainer.learner_group import LearnerGroup


class WeightSync(Protocol):
    def push(self, version: int) -> dict[str, float]: ...


class ObjectStoreSync:
    def __init__(self, learners: LearnerGroup, engines: list, bucket_bytes: int = 64 << 20,
                 timeout_s: float = 600.0, store=None):
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
            raise TimeoutError(f"weight sync of version {version} of policy {self.learners.name!r}: learner "
                               f"rank 0 did not export the weights within learner.call_timeout_s={limit}")
        t_export = time.perf_counter() - t0
        if self.store is not None:  # first, so an engine that restarts from now on loads this version
            ray.get(self.store.publish.remote(version, [buckets]), timeout=60)
        loads = [e.update_weights.remote(version, buckets, self.learners.name) for e in self.engines]
        ready, late = ray.wait(loads, num_returns=len(loads), timeout=self.timeout_s)
        if late:
            late_ids = [i for i, ref in enumerate(loads) if ref in late]
            raise TimeoutError(f"weight sync of version {version} of policy {self.learners.name!r}: engines "
                               f"{late_ids} did not load it within engine.sync_timeout_s={self.timeout_s}")
        results = []
        for i, ref in enumerate(loads):
            try:
                results.append(ray.get(ref))
            except ray.exceptions.RayActorError:
                if self.store is None:
                    raise
                # It died during the load: Ray restarts it, and it loads this version from the store.
                print(f"[sync] engine {i} of policy {self.learners.name!r} died while loading version {version}; "
                      f"it restarts with it", flush=True)
        seconds = time.perf_counter() - t0
        nbytes = results[0]["bytes"] if results else 0.0
        return {"seconds": seconds, "export_seconds": t_export,
                "load_seconds": max(r["seconds"] for r in results) if results else 0.0,
                "bytes": nbytes, "bytes_per_s": nbytes / seconds if seconds > 0 else 0.0,
                "engines": float(len(self.engines))}
