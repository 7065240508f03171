"""The weight transport each engine worker gets, chosen from device identities; the group plan."""

import pytest
import torch

from rollout.weights.transport import ALIGN, GroupPlan, choose_transport, device_identity, offsets

pytestmark = pytest.mark.unit

GPU0, GPU1 = "cuda:GPU-7f1c0d2e-0000", "cuda:GPU-9a44b1f0-0001"
HOST_A, HOST_B = "cpu:boot-a", "cpu:boot-b"


@pytest.mark.parametrize(
    "sender,receiver,picked",
    [
        (GPU0, GPU0, "ipc"),  # the same GPU: NCCL refuses two ranks on one device
        (GPU0, GPU1, "nccl"),
        (HOST_A, HOST_A, "gloo"),
        (HOST_A, HOST_B, "gloo"),
        (GPU0, HOST_A, "gloo"),  # a CPU engine of a GPU learner: gloo stages CUDA tensors through the host
    ],
)
def test_auto_picks_the_transport_from_the_two_devices(sender, receiver, picked):
    assert choose_transport(sender, receiver) == picked


@pytest.mark.parametrize(
    "prefer,sender,receiver,words",
    [
        ("ipc", GPU0, GPU1, "same device"),
        ("ipc", HOST_A, HOST_B, "same host"),
        ("nccl", GPU0, GPU0, "two different GPUs"),
        ("nccl", HOST_A, HOST_A, "two different GPUs"),
        ("tcp", HOST_A, HOST_A, "expected auto or one of"),
    ],
)
def test_a_transport_that_cannot_work_between_the_devices_is_refused_with_the_reason(prefer, sender, receiver, words):
    with pytest.raises(ValueError, match=f"sync.transport={prefer}|sync.transport='{prefer}'") as e:
        choose_transport(sender, receiver, prefer)
    assert words in str(e.value)


def test_a_transport_that_works_is_taken_as_asked():
    assert choose_transport(HOST_A, HOST_A, "ipc") == "ipc"  # POSIX shared memory on one host
    assert choose_transport(GPU0, GPU1, "gloo") == "gloo"


def test_this_process_identity_names_its_device_kind_and_host():
    me = device_identity("cpu")
    assert me.startswith("cpu:") and len(me) > 8
    assert device_identity(torch.device("cpu")) == me


def test_ipc_members_stay_out_of_the_process_group():
    plan = GroupPlan("h", 1, ["ipc", "nccl", "nccl"])
    assert [plan.pg_rank(m) for m in range(4)] == [0, None, 1, 2]
    assert plan.pg_world == 3 and plan.backend == "nccl"
    mixed = GroupPlan("h", 1, ["gloo", "ipc", "nccl"])
    assert [mixed.pg_rank(m) for m in range(4)] == [0, 1, None, 2]
    assert mixed.backend == "gloo"  # one group cannot be both; gloo carries CUDA tensors too
    assert GroupPlan("h", 1, ["ipc"]).pg_world == 1


def test_bucket_offsets_are_aligned_and_do_not_overlap():
    bucket = [("a", [3], "bfloat16"), ("b", [5, 7], "float32"), ("c", [1], "float16")]
    starts, size = offsets(bucket)
    assert starts == [0, ALIGN, 2 * ALIGN] and size == 3 * ALIGN
    big = [("w", [1000, 3], "float32"), ("v", [2], "float32")]
    starts, size = offsets(big)
    assert starts[1] >= 12000 and starts[1] % ALIGN == 0 and size >= starts[1] + 8
