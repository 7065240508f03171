"""How a policy's weights travel from learner rank 0 into every engine worker.

`trainer/weight_sync.py::CollectiveSync` opens one `WeightGroup` per trained policy: member 0 is
learner rank 0 (it hosts the TCPStore), members 1.. are the policy's engine workers. Each member
takes the weights over the transport its device and rank 0's call for, chosen once at group start
(`choose_transport`):

- `ipc`: the same GPU. NCCL refuses two ranks on one device, so rank 0 copies each bucket into one
  of two staging buffers it shared by CUDA IPC handle at group start; the worker clones the bucket
  out of it and acks through the store. (On CPU the same protocol runs over POSIX shared memory,
  for hosts that ask for it with `sync.transport=ipc`.)
- `nccl`: two GPUs; `gloo`: CPU (or anything else). One process group joins rank 0 and every
  member of these two kinds, built on the group's own store outside torch's default group, so
  neither DeepSpeed's group in the learner nor vLLM's in the engine worker is touched.

This module holds the choice, the plan and the staging buffers; rollout/weights/group.py the group
and its push. Both sides import them (the engine side inside vLLM's worker process;
scripts/gpu_check_transport.py on a bare GPU box), so they need torch only.
"""

from __future__ import annotations

import math
import socket
from dataclasses import dataclass, field, replace

Layout = list[list[tuple[str, list[int], str]]]  # buckets of (name, shape, dtype name)

TRANSPORTS = ("ipc", "nccl", "gloo")
OPEN_TIMEOUT_S = 60.0  # all members must have joined by then (they start joining together)
ALIGN = 256  # bytes: each tensor of a bucket starts on this boundary of a staging buffer


def device_identity(device) -> str:
    """What `choose_transport` compares: `cuda:<GPU UUID>` (the same physical GPU whatever the
    process's CUDA_VISIBLE_DEVICES) or `cpu:<host>` (the host's boot id: the same machine)."""
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


def choose_transport(sender: str, receiver: str, prefer: str = "auto") -> str:
    """The transport from a sender to a receiver device (`device_identity`s). `auto`: ipc when both
    are the same GPU, nccl between two GPUs, gloo otherwise. A `prefer`red one that cannot work
    between these two devices is a ValueError that says why."""
    kinds = sender.partition(":")[0], receiver.partition(":")[0]
    same = sender == receiver
    if prefer == "auto":
        if kinds == ("cuda", "cuda"):
            return "ipc" if same else "nccl"
        return "gloo"
    if prefer == "ipc" and not same:  # CPU: one host's shared memory; GPU: one device's memory
        raise ValueError(
            f"sync.transport=ipc needs the learner's rank 0 and the engine worker on the same "
            f"{'host' if kinds == ('cpu', 'cpu') else 'device'}; they are on {sender} and {receiver}"
        )
    if prefer == "nccl" and (kinds != ("cuda", "cuda") or same):
        raise ValueError(
            f"sync.transport=nccl needs two different GPUs (NCCL refuses two ranks on one); "
            f"the learner's rank 0 is on {sender}, the engine worker on {receiver}"
        )
    if prefer not in TRANSPORTS:
        raise ValueError(f"sync.transport={prefer!r}: expected auto or one of {TRANSPORTS}")
    return prefer


def choose_transports(sender: str, workers: list[list[str]], prefer: str = "auto") -> list[str]:
    """Every engine worker's transport (`workers`: each engine's workers' `device_identity`s, in
    member order): `choose_transport` for each, then for the one process group they share. NCCL
    refuses two ranks of one communicator on one GPU ("Duplicate GPU detected", every push failing):
    when two nccl members hold the same GPU (fractional engines on a GPU without the learner), the
    group runs on gloo instead (`auto`), or the choice is refused naming them (`nccl`). One group has
    one backend: where a member takes gloo, the nccl members take it too (GroupPlan.backend)."""
    flat = [w for ws in workers for w in ws]
    transports = [choose_transport(sender, w, prefer) for w in flat]
    on_gpu: dict[str, int] = {}
    for i, (t, w) in enumerate(zip(transports, flat)):
        if t != "nccl":
            continue
        if w in on_gpu:
            if prefer == "nccl":
                raise ValueError(
                    f"sync.transport=nccl: engine workers {on_gpu[w]} and {i} are both on {w}, and NCCL "
                    f"refuses two ranks on one GPU; give each engine a whole GPU (engine.num_gpus=1) "
                    f"or set sync.transport=auto (gloo for such a group)"
                )
            return ["gloo" if t == "nccl" else t for t in transports]
        on_gpu[w] = i
    if "gloo" in transports:
        return ["gloo" if t == "nccl" else t for t in transports]
    return transports


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
    buffers: list = field(default_factory=list)  # rank 0's two staging buffers, shared (`share`)

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


def share(buffer) -> tuple:
    """A staging buffer as a handle another process on the same device opens with `attach`:
    CUDA IPC on a GPU, the POSIX shared memory block it lives in on CPU."""
    if buffer.is_cuda:
        from torch.multiprocessing.reductions import reduce_tensor

        _, args = reduce_tensor(buffer)
        return ("cuda", args)
    return ("shm", buffer.shm_name, buffer.numel())


def staging_buffer(nbytes: int, device):
    """A uint8 buffer `share` can hand out: CUDA memory, or a shared memory block on CPU (kept
    alive by the tensor's `shm` attribute)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    from multiprocessing import shared_memory

    shm = shared_memory.SharedMemory(create=True, size=nbytes)
    buffer = torch.frombuffer(shm.buf, dtype=torch.uint8)
    buffer.shm, buffer.shm_name = shm, shm.name
    return buffer


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


def staging_for(plan: GroupPlan, layout: Layout, device) -> tuple[GroupPlan, list]:
    """Rank 0's two staging buffers when a member takes ipc (none otherwise), recorded in `plan`."""
    if "ipc" not in plan.transports:
        return plan, []
    nbytes = max(offsets(bucket)[1] for bucket in layout)
    buffers = [staging_buffer(nbytes, device) for _ in range(2)]
    return replace(plan, buffers=[share(b) for b in buffers]), buffers


def dtype_of(name: str):
    import torch

    return getattr(torch, name.removeprefix("torch."))
