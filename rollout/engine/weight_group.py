"""A policy's weight group, joined by both ends of the weight push: learner rank 0 sends, engine workers receive.

Member 0, learner rank 0, hosts the TCPStore and `send`s; every engine worker `receive`s (in vLLM's
worker process: rollout/engine/worker_ext.py). Which transport each member takes, and rank 0's
staging buffers, are the sender's business (trainer/weight_transport.py); the plan it hands every
member, the bucket layout and the buffers' addresses are here. The process group (nccl or gloo
members) carries one broadcast per tensor; the ipc members read each bucket from one of rank 0's two
staging buffers, announced and acknowledged through the store, so rank 0 fills one buffer while the
members clone the other. Every wait ends at the group's `timeout_s` with an error that names what did
not arrive. Needs torch only.
"""

from __future__ import annotations

import datetime
import math
import os
import socket
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

Layout = list[list[tuple[str, list[int], str]]]  # buckets of (name, shape, dtype name)

OPEN_TIMEOUT_S = 60.0  # all members must have joined by then (they start joining together)
ALIGN = 256  # bytes: each tensor of a bucket starts on this boundary of a staging buffer


def device_identity(device) -> str:
    """What the sender's `choose_transport` (trainer/weight_transport.py) compares: `cuda:<GPU UUID>`
    (the same physical GPU whatever the process's CUDA_VISIBLE_DEVICES) or `cpu:<host>` (the host's
    boot id: the same machine)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_properties(device).uuid}"
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            host = f.read().strip()
    except OSError:
        host = socket.gethostname()
    return f"{device.type}:{host}"


def offsets(bucket) -> tuple[list[int], int]:
    """Byte offsets of a bucket's tensors in a staging buffer, and the bytes it needs."""
    starts, end = [], 0
    for _, shape, dtype in bucket:
        starts.append(end)
        end += -(-math.prod(shape) * dtype_of(dtype).itemsize // ALIGN) * ALIGN
    return starts, end


@dataclass
class GroupPlan:
    """Who joins a policy's weight group and how: `transports[m]` is member m+1's."""

    host: str
    port: int
    transports: list[str]
    # rank 0's two staging buffers, shared (trainer/weight_transport.py::share)
    buffers: list = field(default_factory=list)

    @property
    def backend(self) -> str:
        return "nccl" if "nccl" in self.transports and "gloo" not in self.transports else "gloo"

    def pg_rank(self, member: int) -> int | None:
        """Member's rank in the process group (rank 0 is 0; ipc members are not in it)."""
        if member == 0:
            return 0
        if self.transports[member - 1] == "ipc":
            return None
        return 1 + sum(t != "ipc" for t in self.transports[: member - 1])

    @property
    def pg_world(self) -> int:
        return 1 + sum(t != "ipc" for t in self.transports)


def attach(handle: tuple, device):
    """Open a buffer `share`d by rank 0, in this process (on `device`, the same physical one)."""
    import torch

    if handle[0] == "cuda":
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        args = list(handle[1])
        args[6] = torch.device(device).index  # the sender's device number is not necessarily ours
        return rebuild_cuda_tensor(*args)
    import mmap
    import os

    # mapped by hand, not with shared_memory.SharedMemory: the block is rank 0's, and Python 3.11's
    # resource tracker would unlink it when this process exits
    fd = os.open(f"/dev/shm/{handle[1].lstrip('/')}", os.O_RDWR)
    try:
        block = mmap.mmap(fd, handle[2])
    finally:
        os.close(fd)
    buffer = torch.frombuffer(block, dtype=torch.uint8, count=handle[2])
    buffer.shm = block
    return buffer


def release(buffers: list, owner: bool) -> None:
    """Drop staging buffers; the owner (rank 0) also frees a CPU buffer's shared memory block."""
    blocks = [getattr(b, "shm", None) for b in buffers]
    buffers.clear()
    for block in blocks:
        if block is None:
            continue
        try:
            block.close()  # a view still held elsewhere keeps the mapping until it goes
        except BufferError:
            pass
        if owner:
            block.unlink()


def dtype_of(name: str):
    import torch

    return getattr(torch, name.removeprefix("torch."))


class WeightGroup:
    def __init__(self, plan: GroupPlan, member: int, device, timeout_s: float, buffers: list | None = None):
        """Join `plan`'s group as `member` (0: rank 0, with its staging `buffers` from
        `staging_for`); all members join at once, and one missing after OPEN_TIMEOUT_S fails the
        join. Every later wait fails after `timeout_s` rather than hang."""
        import torch
        import torch.distributed as dist

        self.plan, self.member, self.device = plan, member, torch.device(device)
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.transport = "send" if member == 0 else plan.transports[member - 1]
        self.ipc_members = [m + 1 for m, t in enumerate(plan.transports) if t == "ipc"]
        store = dist.TCPStore(
            plan.host,
            plan.port,
            1 + len(plan.transports),
            is_master=member == 0,
            timeout=datetime.timedelta(seconds=OPEN_TIMEOUT_S),
            wait_for_workers=True,
            use_libuv=True,
        )
        self.store, self.signals = store, dist.PrefixStore("tracerl-ipc", store)
        self.group = None
        rank = plan.pg_rank(member)
        if rank is not None and plan.pg_world > 1:
            self.group = _process_group(
                dist.PrefixStore("tracerl-weights", store), rank, plan.pg_world, plan.backend, self.timeout
            )
        store.set_timeout(self.timeout)
        if member == 0:
            self.buffers = list(buffers or [])
        else:
            self.buffers = [attach(h, self.device) for h in plan.buffers] if self.transport == "ipc" else []

    def close(self) -> None:
        release(self.buffers, owner=self.member == 0)
        if self.group is not None and self.plan.backend == "nccl":
            # Dropped, a NCCL group shuts its communicator down in its destructor, waiting for the
            # peers (torch warns since 2.4): a peer that died (the engine restarting is why the group
            # reopens) can block it. abort() ends the communicator at once.
            self.group.abort()
        self.group = None

    # ------------------------------------------------------------------ rank 0
    def send(self, version: int, layout: Layout, buckets: Iterable[list], transient: bool = False) -> None:
        """Push `buckets` (each `layout` bucket's tensors, in order) as `version` to every member.
        `transient`: each bucket's tensors are freed when the next is asked for (ZeRO-3's gathered
        parameters), so the device is synchronised after each bucket's broadcasts: work.wait() orders
        only the current stream, and a gather on a side stream could reuse the memory sooner."""
        n = 0
        for k, (bucket, tensors) in enumerate(zip(layout, buckets)):
            if self.ipc_members:
                if k >= 2:  # its buffer is free once every ipc member has its clone of bucket k-2
                    self._await_acks(version, k - 2)
                self._stage(self.buffers[k % 2], bucket, tensors)
                self.signals.set(f"{version}/{k}", "")
            if self.group is not None:
                _wait(_broadcast(self.group, tensors))
                if transient:
                    _synchronize(self.device)
            n = k + 1
        for k in range(max(0, n - 2), n):
            self._await_acks(version, k)
        for k in range(n):
            self._forget(version, k)
        _synchronize(self.device)

    def _stage(self, buffer, bucket, tensors: list) -> None:
        starts, _ = offsets(bucket)
        for start, t in zip(starts, tensors):
            view = buffer[start : start + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            view.copy_(t, non_blocking=True)
        _synchronize(self.device)  # the bytes are in the buffer before the members are told

    def _await_acks(self, version: int, k: int) -> None:
        if not self.ipc_members:
            return
        keys = [f"{version}/{k}/ack/{m}" for m in self.ipc_members]
        try:
            self.signals.wait(keys, self.timeout)
        except RuntimeError as e:
            raise TimeoutError(
                f"weight push of version {version}: ipc members {self.ipc_members} did not take "
                f"bucket {k} within {self.timeout.total_seconds():.0f} s ({e})"
            ) from None

    def _forget(self, version: int, k: int) -> None:
        if self.ipc_members:
            for key in [f"{version}/{k}"] + [f"{version}/{k}/ack/{m}" for m in self.ipc_members]:
                self.signals.delete_key(key)

    # ----------------------------------------------------------------- members
    def receive(self, version: int, layout: Layout) -> Iterator[tuple[str, object]]:
        """The pushed tensors of `version`, (name, tensor) in `layout` order, one bucket held at a
        time (the next arrives while the caller loads this one)."""
        yield from (self._receive_ipc if self.transport == "ipc" else self._receive_broadcast)(version, layout)
        _synchronize(self.device)

    def _receive_ipc(self, version: int, layout: Layout):
        for k, bucket in enumerate(layout):
            try:
                self.signals.wait([f"{version}/{k}"], self.timeout)
            except RuntimeError as e:
                raise TimeoutError(
                    f"weight push of version {version}: bucket {k} did not arrive within "
                    f"{self.timeout.total_seconds():.0f} s ({e})"
                ) from None
            starts, size = offsets(bucket)
            staged = self.buffers[k % 2][:size].clone()
            _synchronize(self.device)
            self.signals.set(f"{version}/{k}/ack/{self.member}", "")
            for start, (name, shape, dtype) in zip(starts, bucket):
                t = dtype_of(dtype)
                n = math.prod(shape) * t.itemsize
                yield name, staged[start : start + n].view(t).view(shape)

    def _receive_broadcast(self, version: int, layout: Layout):
        import torch

        def start(bucket):
            received = [torch.empty(shape, dtype=dtype_of(dtype), device=self.device) for _, shape, dtype in bucket]
            return received, _broadcast(self.group, received)

        pending = start(layout[0]) if layout else None
        for k, bucket in enumerate(layout):
            received, works = pending
            _wait(works)
            pending = start(layout[k + 1]) if k + 1 < len(layout) else None
            yield from zip((name for name, _, _ in bucket), received)


def _process_group(store, rank: int, world: int, backend: str, timeout: datetime.timedelta):
    import torch.distributed as dist

    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        # A member that dies mid-push must fail the push, not the learner: by default NCCL's watchdog
        # tears the whole process down on a timeout (mode 3); mode 2 only aborts this communicator.
        # The group reads the variable when it is built, so DeepSpeed's own group keeps its default.
        saved = os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "2"
        try:
            return dist.ProcessGroupNCCL(store, rank, world, options)
        finally:
            if saved is None:
                os.environ.pop("TORCH_NCCL_ASYNC_ERROR_HANDLING")
            else:
                os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = saved
    return dist.ProcessGroupGloo(store, rank, world, timeout)


def _broadcast(group, tensors: list) -> list:
    """Start broadcasting `tensors` from rank 0 into the same-shaped tensors of every other rank."""
    import torch.distributed as dist

    works = []
    for t in tensors:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        works.append(group.broadcast([t], opts))
    return works


def _wait(works: list) -> None:
    for w in works:
        w.wait()


def _synchronize(device) -> None:
    """A GPU's queued copies are done (what the timings and the acks mean); nothing on CPU."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)
