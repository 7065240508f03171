"""What a learner rank sets up before DeepSpeed starts, checked without Ray or ranks."""

import importlib

import pytest

from trainer.rank_env import skip_shm_comm_build

pytestmark = pytest.mark.unit


def test_the_shm_comm_op_is_not_built_on_cpu(monkeypatch):
    # the module DeepSpeed's TorchBackend reads `build_shm_op` from when it starts
    comm = importlib.import_module("deepspeed.comm.torch")
    monkeypatch.setattr(comm, "build_shm_op", comm.build_shm_op)  # undone after the test
    built = comm.build_shm_op
    skip_shm_comm_build()
    assert comm.build_shm_op is not built and comm.build_shm_op() is None
    assert not hasattr(importlib.import_module("torch"), "build_shm_op"), "the patch landed on torch"


def test_learner_ranks_on_a_gpu_start_without_nvls_and_on_a_shared_gpu_without_ipc_breaking_allocators():
    """GPU review F8 and F15, the ranks' Ray runtime_env from each cluster preset: on a GPU NCCL's NVLS
    is off unless the user set it (NVIDIA/nccl#1906: out-of-order all-gather chunks under Ray's GPU
    masks); on cluster=gpu, whose engines open rank 0's staging buffers by CUDA IPC handle, the
    allocator options that break IPC are left out and every other option kept; CPU: nothing."""
    from trainer.config import compose
    from trainer.rank_env import learner_env

    shared = compose("train", ["experiment=smoke", "cluster=gpu"]).learner
    whole = compose("train", ["experiment=smoke", "cluster=gpu_node"]).learner
    cpu = compose("train", ["experiment=smoke", "cluster=local"]).learner
    user = {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:512",
        "PYTORCH_ALLOC_CONF": "backend:cudaMallocAsync",
    }
    assert learner_env(shared, user) == {
        "NCCL_NVLS_ENABLE": "0",
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512",
        "PYTORCH_ALLOC_CONF": "",
    }
    assert learner_env(whole, user) == {"NCCL_NVLS_ENABLE": "0"}, "no engine on a whole GPU: the user's allocator"
    assert learner_env(shared, {"NCCL_NVLS_ENABLE": "1", "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"}) == {}
    assert learner_env(cpu, user) == {}


def test_an_allocator_setting_keeps_every_option_but_those_that_break_cuda_ipc():
    from trainer.rank_env import ipc_safe_alloc_conf

    assert ipc_safe_alloc_conf("") == ("", [])
    assert ipc_safe_alloc_conf("expandable_segments:False, garbage_collection_threshold:0.6") == (
        "expandable_segments:False,garbage_collection_threshold:0.6",
        [],
    )
    assert ipc_safe_alloc_conf("max_split_size_mb:128,expandable_segments:True,backend:cudaMallocAsync") == (
        "max_split_size_mb:128",
        ["expandable_segments:True", "backend:cudaMallocAsync"],
    )


def test_a_rank_on_a_share_of_a_gpu_is_held_to_that_share_of_its_memory():
    """GPU review F10: cluster=gpu's learner rank may allocate learner.num_gpus of the GPU's memory
    (torch.cuda.set_per_process_memory_fraction in Learner.setup), so a model too big for it fails the
    learner, not the engines beside it; a whole GPU or a CPU rank has no cap."""
    from trainer.config import compose
    from trainer.rank_env import gpu_memory_share

    assert gpu_memory_share(compose("train", ["experiment=smoke", "cluster=gpu"]).learner) == 0.4
    assert gpu_memory_share(compose("train", ["experiment=smoke", "cluster=gpu_node"]).learner) is None
    assert gpu_memory_share(compose("train", ["experiment=smoke", "cluster=local"]).learner) is None


def test_the_learner_group_starts_its_ranks_with_that_environment(monkeypatch, caplog):
    """The ranks' Ray options carry learner_env as their runtime_env (Ray sets those variables over
    the driver's in the rank's process, before torch loads), and the driver warns what it left out."""
    from types import SimpleNamespace

    from trainer.config import compose
    from trainer.learner_group import LearnerGroup

    for var in ("NCCL_NVLS_ENABLE", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    shared = SimpleNamespace(cfg=compose("train", ["experiment=smoke", "cluster=gpu"]).learner, name="main")
    assert LearnerGroup._runtime_env(shared) == {
        "runtime_env": {"env_vars": {"NCCL_NVLS_ENABLE": "0", "PYTORCH_CUDA_ALLOC_CONF": ""}}
    }
    assert "start with PYTORCH_CUDA_ALLOC_CONF='', not 'expandable_segments:True'" in caplog.text
    cpu = SimpleNamespace(cfg=compose("train", ["experiment=smoke", "cluster=local"]).learner, name="main")
    assert LearnerGroup._runtime_env(cpu) == {}, "CPU ranks keep Ray's pooled workers"


def test_a_rendezvous_port_is_free_and_outside_the_ports_port_0_hands_out():
    """Ports from binding port 0 can go to the next port-0 bind (an HTTP server) before the
    TCPStore listens: the rendezvous draws below the ephemeral range, and skips a port in use."""
    import socket

    from trainer.rank_env import RENDEZVOUS_PORTS, ephemeral_ports, free_port

    lo, _ = ephemeral_ports()
    ports = {free_port() for _ in range(20)}
    assert all(RENDEZVOUS_PORTS[0] <= p <= RENDEZVOUS_PORTS[1] and p < lo for p in ports), ports
    assert len(ports) > 1  # drawn, not a fixed port two runs would share
    with socket.socket() as held:
        held.bind(("", min(ports)))
        held.listen()
        assert all(free_port() != min(ports) for _ in range(50))
