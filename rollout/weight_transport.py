"""The process group a policy's weights travel over: learner rank 0 -> every engine worker.

`trainer/weight_sync.py::CollectiveSync` opens one per trained policy. Rank 0 is the
learner's rank 0 (it hosts the TCPStore), ranks 1.. are the policy's engine workers.
The group is built directly on its own store, outside torch's default group, so
neither DeepSpeed's group in the learner nor vLLM's in the engine worker is touched.
gloo on CPU, NCCL on GPU: the same calls.

A push sends `layout` order: buckets of (name, shape, dtype), one broadcast per
tensor from rank 0. Both sides import this module (the engine side inside vLLM's
worker process), so it needs torch only.
"""

from __future__ import annotations

import datetime

Layout = list[list[tuple[str, list[int], str]]]  # buckets of (name, shape, dtype name)


class WeightGroup:
    """A process group and the store it rendezvoused on (which must outlive the group's use)."""

    def __init__(self, group, store):
        self.group, self.store = group, store


OPEN_TIMEOUT_S = 60.0  # all members must have joined by then (they start joining together)


def open_group(host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float) -> WeightGroup:
    """Join the weight group (all `world_size` members call it at once; rank 0 listens on
    `host:port`); a member missing after OPEN_TIMEOUT_S fails the join. Every later operation
    on the group fails after `timeout_s` rather than hang."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, is_master=rank == 0,
                          timeout=datetime.timedelta(seconds=OPEN_TIMEOUT_S),
                          wait_for_workers=True, use_libuv=True)
    store = dist.PrefixStore("tracerl-weights", store)
    if backend == "nccl":  # GPU: the same group, NCCL's transport
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        group = dist.ProcessGroupNCCL(store, rank, world_size, options)
    else:
        group = dist.ProcessGroupGloo(store, rank, world_size, timeout)
    return WeightGroup(group, store)


def broadcast(group: WeightGroup, tensors: list) -> list:
    """Start broadcasting `tensors` from rank 0 into the same-shaped tensors of every other rank;
    returns the works to `wait` on (gloo and NCCL move them on their own threads/streams)."""
    import torch.distributed as dist

    works = []
    for t in tensors:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        works.append(group.group.broadcast([t], opts))
    return works


def wait(works: list) -> None:
    for w in works:
        w.wait()


def dtype_of(name: str):
    import torch

    return getattr(torch, name.removeprefix("torch."))
