"""What a learner rank sets up before DeepSpeed starts, checked without Ray or ranks."""

import importlib

import pytest

from trainer.learner import skip_shm_comm_build

pytestmark = pytest.mark.unit


def test_the_shm_comm_op_is_not_built_on_cpu(monkeypatch):
    # the module DeepSpeed's TorchBackend reads `build_shm_op` from when it starts
    comm = importlib.import_module("deepspeed.comm.torch")
    monkeypatch.setattr(comm, "build_shm_op", comm.build_shm_op)  # undone after the test
    built = comm.build_shm_op
    skip_shm_comm_build()
    assert comm.build_shm_op is not built and comm.build_shm_op() is None
    assert not hasattr(importlib.import_module("torch"), "build_shm_op"), "the patch landed on torch"
