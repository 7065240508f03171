"""Fault points: places in tracerl's own code where a test or the chaos soak makes a rare
interleaving common, in the manner of FoundationDB's BUGGIFY. Each is a no-op unless armed.

    if fires("worker_call_unavailable"):   # at the point in the code
        ...                                # behave as if the rare event had happened

Armed in the process that runs the point, either by `arm(name, prob, times)` (a test) or by the
environment before the process starts (the soak; Ray actors inherit the driver's environment
only through their runtime_env):

    TRACERL_FAULTS="worker_call_unavailable:0.2:3,buffer_put_twice:1"   # name:probability[:times]
    TRACERL_FAULTS_SEED=7                                             # the draws' seed (default 0)

The draws are seeded, so a schedule replays. The points (grep `fires(`):
- `worker_call_unavailable` (rollout/orchestration/fleet.py): a worker's run call in flight is
  taken for failed with Ray's "actor unavailable" while it keeps running: the fleet reruns its
  groups, which the buffer's epochs must keep from being taken twice;
- `buffer_put_twice` (rollout/orchestration/worker.py): a trace is put twice, as a retried RPC
  would: the buffer's put must be idempotent;
- `harness_hang` (rollout/orchestration/worker.py): an episode stalls for `arg` seconds inside its
  deadline before the harness runs, as a harness waiting on a slow tool would;
- `driver_dies_after_save` (trainer/run_dir.py): the driver fails (FaultPointFired) right after a
  checkpoint is complete, where a kill once lost the step's metrics row.
"""

from __future__ import annotations

import os
import random
import threading
from collections import Counter

ENV, SEED_ENV = "TRACERL_FAULTS", "TRACERL_FAULTS_SEED"


class FaultPointFired(RuntimeError):
    """Raised by a fault point that stands for a process dying there."""


_lock = threading.Lock()
_armed: dict[str, tuple[float, int | None]] = {}  # name -> (probability, firings left; None: unbounded)
_args: dict[str, float] = {}  # name -> the number a point that takes one was armed with (a delay's seconds)
_rng = random.Random(0)
hits: Counter[str] = Counter()  # firings so far, by point


def parse(spec: str) -> dict[str, tuple[float, int | None]]:
    """`name:probability[:times],...` -> {name: (probability, times)}; ValueError naming the bad item."""
    out: dict[str, tuple[float, int | None]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        parts = item.split(":")
        try:
            if not 1 <= len(parts) <= 3:
                raise ValueError
            prob = float(parts[1]) if len(parts) > 1 else 1.0
            times = int(parts[2]) if len(parts) > 2 else None
            if not 0.0 <= prob <= 1.0 or (times is not None and times < 0):
                raise ValueError
        except ValueError:
            raise ValueError(f"{ENV}: {item!r} is not name:probability[:times] (probability in [0, 1])") from None
        out[parts[0]] = (prob, times)
    return out


def arm(name: str, prob: float = 1.0, times: int | None = None, arg: float = 0.0) -> None:
    """Make point `name` fire with probability `prob` each time it is reached, at most `times` times;
    `arg`: its number, for a point that takes one (`arg(name)`)."""
    with _lock:
        _armed[name] = (prob, times)
        _args[name] = arg


def arg(name: str) -> float:
    """The number point `name` was armed with (0.0 if none)."""
    return _args.get(name, 0.0)


def disarm(name: str | None = None) -> None:
    """Disarm point `name` (None: every point)."""
    with _lock:
        if name is None:
            _armed.clear()
        else:
            _armed.pop(name, None)


def armed(name: str) -> bool:
    """Whether point `name` may fire (for a point whose setup costs something)."""
    return name in _armed


def fires(name: str) -> bool:
    """Whether point `name` fires this time (False unless armed)."""
    if name not in _armed:
        return False
    with _lock:
        prob, times = _armed.get(name, (0.0, 0))
        if times == 0 or _rng.random() >= prob:
            return False
        _armed[name] = (prob, None if times is None else times - 1)
        hits[name] += 1
        return True


def _from_env() -> None:
    global _rng
    _rng = random.Random(int(os.environ.get(SEED_ENV, "0")))
    for name, (prob, times) in parse(os.environ.get(ENV, "")).items():
        arm(name, prob, times)


_from_env()
