"""A learner rank's process: its environment before torch, NCCL and DeepSpeed load (the variables
Ray's runtime_env sets, the allocator settings CUDA IPC needs, the GPU memory share), what a start
prints, and the rendezvous port. Standard library only at import, so a torch-only process (the GPU
check's roles) can take `free_port` from here."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainer.config import LearnerConfig

# Rendezvous ports come from below the kernel's ephemeral range and above Ray's worker ports
# (10002-19999): a port found by binding port 0 is the kind the next process to bind port 0 (a
# gateway's or Ray's HTTP server) may be handed before the TCPStore listens on it, which a test run
# saw (EADDRINUSE on rank 0, rank 1 pinging an HTTP server).
RENDEZVOUS_PORTS = (20000, 32767)


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for port-0 binds (Linux's default where /proc does not say)."""
    try:
        lo, hi = open("/proc/sys/net/ipv4/ip_local_port_range").read().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(tries: int = 64) -> int:
    """A port this node can listen on for a rendezvous, drawn at random from RENDEZVOUS_PORTS below
    the ephemeral range; a bound port 0 only if none of `tries` draws is free."""
    import random

    lo, hi = RENDEZVOUS_PORTS[0], min(RENDEZVOUS_PORTS[1], ephemeral_ports()[0] - 1)
    for port in random.Random().sample(range(lo, hi + 1), min(tries, max(hi - lo + 1, 0))):
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


# Allocator settings under which another process cannot open a CUDA block by IPC handle (GPU review
# F15): expandable segments share through CUDA VMM and pidfd_getfd, which containers often refuse
# ("kernel does not support pidfd_open"); cudaMallocAsync memory cannot be shared at all.
IPC_BREAKING_ALLOC = {"expandable_segments": "true", "backend": "cudamallocasync"}
ALLOC_CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")  # torch reads the first one set


def ipc_safe_alloc_conf(conf: str) -> tuple[str, list[str]]:
    """An allocator setting string (PYTORCH_CUDA_ALLOC_CONF) without the options that break CUDA IPC,
    every other option kept as written; and the options it left out."""
    kept, dropped = [], []
    for option in filter(None, (o.strip() for o in conf.split(","))):
        key, _, value = option.partition(":")
        (dropped if IPC_BREAKING_ALLOC.get(key.strip()) == value.strip().lower() else kept).append(option)
    return ",".join(kept), dropped


def learner_env(cfg: LearnerConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment variables a learner rank starts with beyond the driver's `environ` (its Ray
    runtime_env; read when torch and NCCL load, so they cannot be set later in the rank). On a GPU:
    NCCL_NVLS_ENABLE=0 unless set (GPU review F8: NVIDIA/nccl#1906, NVLS all-gather/reduce-scatter
    chunks out of order when the ranks' order is not the GPUs', as under Ray's masks: ZeRO's
    collectives on an NVSwitch box, until verified). On a share of a GPU, where the engines open rank
    0's staging buffers by CUDA IPC handle, the allocator settings that break IPC are left out (F15)."""
    env: dict[str, str] = {}
    if cfg.num_gpus <= 0:
        return env
    if "NCCL_NVLS_ENABLE" not in environ:
        env["NCCL_NVLS_ENABLE"] = "0"
    if cfg.num_gpus < 1:
        for var in ALLOC_CONF_VARS:
            kept, dropped = ipc_safe_alloc_conf(environ.get(var, ""))
            if dropped:
                env[var] = kept
    return env


def gpu_memory_share(cfg: LearnerConfig) -> float | None:
    """The fraction of its GPU's memory a rank may allocate: its `learner.num_gpus` when it shares the
    GPU (None: a whole GPU, or CPU). Enforced, a rank past it fails with CUDA OOM itself, instead of
    the engines beside it failing mid-generation (GPU review F10)."""
    return cfg.num_gpus if 0 < cfg.num_gpus < 1 else None


def quiet_start(on_gpu: bool) -> None:
    """Before DeepSpeed is imported: leave out what a learner start prints every time that is not
    the user's to act on (DeepSpeed's notice that it found no GPU, the weights' progress bar,
    torch's deprecation warning for a collective ZeRO calls)."""
    import warnings

    from transformers.utils import logging as hf_logging

    if not on_gpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed")


def skip_shm_comm_build() -> None:
    """DeepSpeed g++-builds a shared-memory all-reduce op (20-70 s) whenever its torch comm backend
    starts; it is only an inference fast path, unused on CPU. Skip it. The module is reached
    through importlib: `import deepspeed.comm.torch as m` binds `deepspeed.comm`'s attribute
    `torch`, which is the torch package itself, and a patch on that misses the op."""
    import importlib

    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
