"""The weight transport each engine worker gets, chosen from device identities; the group plan."""

import socket

import pytest
import torch

from rollout.engine.weight_group import ALIGN, GroupPlan, device_identity, offsets
from trainer.weight_transport import choose_transport, choose_transports

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


GPU2 = "cuda:GPU-3c5e90aa-0002"


def test_two_nccl_members_on_one_gpu_make_a_gloo_group_or_are_refused_naming_them():
    """GPU review F9: transports were chosen per worker against rank 0 only, so two engines sharing
    a GPU that is not the learner's both took nccl, and NCCL fails every broadcast of such a group
    ("Duplicate GPU detected"). Now `auto` runs that group on gloo, and `nccl` is refused at start."""
    assert choose_transports(GPU0, [[GPU1], [GPU2]]) == ["nccl", "nccl"]  # a whole GPU each: NCCL
    assert choose_transports(GPU0, [[GPU1], [GPU1]]) == ["gloo", "gloo"]
    assert choose_transports(GPU0, [[GPU0], [GPU1], [GPU1]]) == ["ipc", "gloo", "gloo"]  # ipc stays out of it
    assert choose_transports(GPU0, [[GPU1, GPU2]]) == ["nccl", "nccl"]  # one engine's TP workers
    with pytest.raises(ValueError, match="sync.transport=nccl") as e:
        choose_transports(GPU0, [[GPU1], [GPU2, GPU1]], "nccl")
    assert "workers 0 and 2 are both on " + GPU1 in str(e.value) and "engine.num_gpus=1" in str(e.value)


def test_one_group_has_one_backend_so_a_gloo_member_takes_the_nccl_members_along():
    """A CPU engine beside GPU engines: the group is gloo (GroupPlan.backend), and the transports
    logged for every member say so."""
    assert choose_transports(GPU0, [[GPU1], [HOST_A]]) == ["gloo", "gloo"]
    assert choose_transports(HOST_A, [[HOST_A], [HOST_A]], "ipc") == ["ipc", "ipc"]


def pattern(layout, version: int) -> list[list[torch.Tensor]]:
    """Each bucket's tensors in `version`: other bytes in every version and tensor."""
    out = []
    for k, bucket in enumerate(layout):
        out.append([])
        for j, (_, shape, dtype) in enumerate(bucket):
            g = torch.Generator().manual_seed(1000 * version + 10 * k + j)
            out[-1].append(torch.randn(shape, generator=g).to(getattr(torch, dtype)))
    return out


@pytest.mark.parametrize("transport", ["ipc", "gloo"])
def test_two_receivers_keep_every_tensor_of_every_version_and_each_holds_its_own_bytes(transport):
    """Rank 0 and two members of a real WeightGroup (threads of this process; ipc over POSIX shared
    memory, the protocol CUDA IPC runs): three pushes with new bytes each, four buckets (so both
    staging buffers are reused within a push), and the members keep every tensor they were given
    (as vLLM's layerwise reload may) until all pushes are done: nothing a member holds is
    overwritten by a later bucket or version (GPU review §5.2)."""
    import threading

    from rollout.engine.weight_group import WeightGroup
    from trainer.weight_transport import staging_for

    layout = [[(f"w{k}.{j}", [64, 8 + j], ("float32", "bfloat16")[j % 2]) for j in range(3)] for k in range(4)]
    versions = [1, 2, 3]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    plan, buffers = staging_for(GroupPlan("127.0.0.1", port, [transport] * 2), layout, "cpu")
    wrong, errors = {}, []

    def sender():
        group = WeightGroup(plan, 0, "cpu", 30, buffers)
        for v in versions:
            group.send(v, layout, iter(pattern(layout, v)))
        group.close()

    def receiver(m):
        group = WeightGroup(plan, m, "cpu", 30)
        kept = [(v, list(group.receive(v, layout))) for v in versions]
        # every tensor of every version, compared once the last push is over (before the group closes)
        wrong[m] = [
            (v, name)
            for v, got in kept
            for (name, t), e in zip(got, (t for ts in pattern(layout, v) for t in ts), strict=True)
            if not torch.equal(t, e)
        ] + [(v, "count") for v, got in kept if len(got) != sum(map(len, layout))]
        group.close()

    def guarded(fn, *args):
        try:
            fn(*args)
        except Exception as e:  # reported by the test thread
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(sender,))]
    threads += [threading.Thread(target=guarded, args=(receiver, m)) for m in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and not any(t.is_alive() for t in threads), errors
    assert wrong == {1: [], 2: []}
