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
    def __init__(self, learners: LearnerGroup, engines: list, bucket_bytes: int = 64 << 20):
        self.learners = learners
        self.engines = list(engines)  # Engine actor handles of this policy
        self.bucket_bytes = bucket_bytes

    def push(self, version: int) -> dict[str, float]:
        """Send the learners' current weights to every engine as `version`; returns timings."""
        t0 = time.perf_counter()
        buckets = self.learners.export_weights(self.bucket_bytes)  # ObjectRef: stays in the store
        ray.wait([buckets], fetch_local=False)  # rank 0 has finished serialising
        t_export = time.perf_counter() - t0
        results = ray.get([e.update_weights.remote(version, buckets) for e in self.engines])
        seconds = time.perf_counter() - t0
        nbytes = results[0]["bytes"] if results else 0.0
        return {"seconds": seconds, "export_seconds": t_export,
                "load_seconds": max(r["seconds"] for r in results) if results else 0.0,
                "bytes": nbytes, "bytes_per_s": nbytes / seconds if seconds > 0 else 0.0,
                "engines": float(len(self.engines))}
