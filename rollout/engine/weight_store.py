"""WeightStore: the newest weights pushed to one policy's engines (a Ray actor, no CPU), which an engine
that (re)starts loads before its first request (rollout/engine/engine.py)."""

from __future__ import annotations

from collections import Counter


class WeightStore:
    """The newest weights pushed to one policy's engines, for an engine that (re)starts (a Ray
    actor, no CPU). Holds the ObjectRef of the pushed buckets, which keeps them in Ray's object
    store; counts each engine's starts (restarts = starts - 1)."""

    def __init__(self):
        self.version = 0
        self.buckets = None  # ObjectRef of the newest pushed buckets
        self.starts: Counter[int] = Counter()

    def publish(self, version: int, buckets: list) -> None:
        """`buckets`: [ObjectRef] (in a list, so Ray hands over the reference, not the bytes)."""
        self.version, self.buckets = version, buckets[0]

    def checkout(self, index: int) -> tuple[int, list]:
        """Engine `index` (re)started: the version to serve and [ObjectRef] of its weights ([] for
        the model's own)."""
        self.starts[index] += 1
        return self.version, [self.buckets] if self.buckets is not None else []

    def info(self) -> dict:
        """The version held, and this actor's process (what a fault test strikes)."""
        import os

        return {"version": self.version, "pid": os.getpid()}

    def restarts(self) -> int:
        return sum(n - 1 for n in self.starts.values())
