"""The sender's end of the weight push: which transport each engine worker takes, and rank 0's staging buffers.

`trainer/weight_sync.py::CollectiveSync` opens one `WeightGroup` (rollout/engine/weight_group.py) per
trained policy: member 0 is learner rank 0 (it hosts the TCPStore), members 1.. are the policy's engine
workers. Each member takes the weights over the transport its device and rank 0's call for, chosen
once at group start (`choose_transport`):

- `ipc`: the same GPU. NCCL refuses two ranks on one device, so rank 0 copies each bucket into one
  of two staging buffers it shared by CUDA IPC handle at group start; the worker clones the bucket
  out of it and acks through the store. (On CPU the same protocol runs over POSIX shared memory,
  for hosts that ask for it with `sync.transport=ipc`.)
- `nccl`: two GPUs; `gloo`: CPU (or anything else). One process group joins rank 0 and every
  member of these two kinds, built on the group's own store outside torch's default group, so
  neither DeepSpeed's group in the learner nor vLLM's in the engine worker is touched.

Only the learner side runs this module (the choice in the driver, the staging buffers in learner
rank 0); what both ends share, the plan, the layout and the group, is in rollout/engine/weight_group.py.
It needs torch only, so tools/gpu_check/transport.py runs it on a box with nothing else.
"""

from __future__ import annotations

from dataclasses import replace

from rollout.engine.weight_group import GroupPlan, Layout, offsets

TRANSPORTS = ("ipc", "nccl", "gloo")


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


def staging_for(plan: GroupPlan, layout: Layout, device) -> tuple[GroupPlan, list]:
    """Rank 0's two staging buffers when a member takes ipc (none otherwise), recorded in `plan`."""
    if "ipc" not in plan.transports:
        return plan, []
    nbytes = max(offsets(bucket)[1] for bucket in layout)
    buffers = [staging_buffer(nbytes, device) for _ in range(2)]
    return replace(plan, buffers=[share(b) for b in buffers]), buffers
