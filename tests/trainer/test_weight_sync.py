"""Invariant 4: after a weight sync the engine generates from the learner's new weights.

Each sync runs against both of vLLM's engine cores: the thread core (the CPU default, the session's
shared engines) and the process core (vLLM's AsyncLLM, `engine.core=process`, the path every GPU run
takes: every weight call crosses vLLM's msgpack RPC into the engine-core child, where the worker and
our extension live). One process-core engine serves all of this module's process-core tests.
"""

import pytest
import ray
import torch
from transformers import AutoModelForCausalLM

from rollout.config import EngineConfig, ModelConfig, SamplingConfig
from rollout.models import resolve_model
from rollout.orchestration.cluster import spawn_engines
from tests.conftest import chat_prompt, hf_logprobs
from trainer import checkpoint
from trainer.config import LearnerConfig, LossConfig
from trainer.learner_group import LearnerGroup
from trainer.weight_sync import CollectiveSync, ObjectStoreSync

pytestmark = pytest.mark.e2e


@pytest.fixture
def engine_weights_restored(engine, hf_tiny):
    """After the test, the session's shared engine back on the tiny model's own weights (the tests
    here push trained ones into it; the other tests share it)."""
    yield
    from safetensors.torch import save

    ray.get(
        engine.update_weights.remote(
            ray.get(engine.info.remote())["version"] + 1,
            [save({k: v.detach().contiguous() for k, v in hf_tiny.named_parameters()})],
        )
    )


@pytest.mark.usefixtures("engine_weights_restored")
def test_sync_engine_matches_learner_and_tags_version(engine, tiny_path, tiny_tokenizer, fixed_batch, tmp_path):
    prompt = chat_prompt(tiny_tokenizer)
    [c] = ray.get(engine.generate.remote(prompt, SamplingConfig(max_tokens=16)))
    ids = prompt + c.completion_ids
    before = torch.tensor(ray.get(engine.score.remote(prompt, c.completion_ids)))

    learners = LearnerGroup(tiny_path, LearnerConfig(world_size=2, num_cpus=0.5, zero_stage=3, lr=3e-3), LossConfig())
    try:
        assert (torch.tensor(learners.logprobs(ids, len(prompt))) - before).abs().max() < 1e-3
        for _ in range(3):
            learners.train_step(fixed_batch)
        learner_lp = torch.tensor(learners.logprobs(ids, len(prompt)))
        assert (learner_lp - before).abs().max() > 0.01, "training must change the log-probs"

        version = ray.get(engine.info.remote())["version"] + 1
        stats = ObjectStoreSync(learners, [engine], bucket_bytes=300_000).push(version)
        assert stats["bytes"] > 1e6 and stats["seconds"] > 0
        after = torch.tensor(ray.get(engine.score.remote(prompt, c.completion_ids)))
        assert (after - learner_lp).abs().max() < 1e-3
        assert ray.get(engine.info.remote())["version"] == version
        [c2] = ray.get(engine.generate.remote(prompt, SamplingConfig(max_tokens=4)))
        assert c2.version == version

        # the HF export loads in transformers and gives the learner's log-probs
        d = checkpoint.save_hf(learners, tiny_path, tmp_path / "hf")
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
        hf_lp = hf_logprobs(model, prompt, c.completion_ids)
        assert (hf_lp - learner_lp).abs().max() < 1e-4
    finally:
        learners.shutdown()


@pytest.fixture(scope="module")
def process_engine(ray_cluster, tiny_path):
    """One engine serving the tiny model with vLLM's engine core in a child process
    (`engine.core=process`, vLLM's AsyncLLM), for this module's process-core tests."""
    cfg = EngineConfig(num_cpus=1, kv_cache_gb=0.25, max_num_seqs=32, core="process")
    [e] = spawn_engines({"main": (tiny_path, ModelConfig(name="tiny"), cfg)})["main"]
    yield e
    try:
        ray.get(e.shutdown.remote(), timeout=60)
    except ray.exceptions.RayActorError:
        pass  # the last test of this module crashes it
    ray.kill(e)


@pytest.fixture(scope="module")
def zero3_learners(ray_cluster, tiny_path):
    """Two ZeRO-3 learner ranks of the tiny model, for this module's process-core tests (each trains
    them on before it pushes)."""
    learners = LearnerGroup(tiny_path, LearnerConfig(world_size=2, num_cpus=0.5, zero_stage=3, lr=3e-3), LossConfig())
    yield learners
    learners.shutdown()


def collective_pushes(eng, learners, transport: str, tokenizer, fixed_batch, pushes: int = 2) -> None:
    """Train, push over a CollectiveSync of `transport`, and check after each push that the engine
    scores as the learner (invariant 4) and serves the pushed version; `pushes` over one group."""
    prompt = chat_prompt(tokenizer)
    [c] = ray.get(eng.generate.remote(prompt, SamplingConfig(max_tokens=16)), timeout=120)
    ids = prompt + c.completion_ids
    sync = CollectiveSync(learners, [eng], transport, bucket_bytes=300_000)
    assert len(sync.layout) > 2, "several buckets: both staging buffers are reused"
    assert sync.transports == [[transport]]
    version = ray.get(eng.info.remote(), timeout=60)["version"]
    for _ in range(pushes):
        before = torch.tensor(ray.get(eng.score.remote(prompt, c.completion_ids), timeout=120))
        learners.train_step(fixed_batch)
        learner_lp = torch.tensor(learners.logprobs(ids, len(prompt)))
        assert (learner_lp - before).abs().max() > 0.01, "training must change the log-probs"
        version += 1
        stats = sync.push(version)
        assert stats["fallbacks"] == 0 and stats["bytes"] > 1e6
        after = torch.tensor(ray.get(eng.score.remote(prompt, c.completion_ids), timeout=120))
        assert (after - learner_lp).abs().max() < 1e-3
        [c2] = ray.get(eng.generate.remote(prompt, SamplingConfig(max_tokens=4)), timeout=120)
        assert c2.version == version


@pytest.mark.parametrize("model,zero,transport", [("tiny", 0, "ipc"), ("tiny_tied", 3, "gloo")])
def test_collective_sync_engine_matches_learner(
    model, zero, transport, engine, hf_tiny, tiny_tokenizer, fixed_batch, request
):
    """CollectiveSync (learner rank 0 -> engine worker, straight into the parameters) over a gloo
    group, and over the ipc protocol a GPU shares with its engines (here through POSIX shared
    memory: the same staging buffers, announcements and acks; only the handle differs): after
    each push the engine scores as the learner (invariant 4), tied embeddings and ZeRO-3
    included, and serves the pushed version; the group carries several pushes."""
    path = resolve_model(model)
    eng = engine if model == "tiny" else request.getfixturevalue("tied_engine")
    learners = LearnerGroup(path, LearnerConfig(world_size=2, num_cpus=0.5, zero_stage=zero, lr=3e-3), LossConfig())
    try:
        collective_pushes(eng, learners, transport, tiny_tokenizer, fixed_batch)
    finally:
        learners.shutdown()
        # the shared engines go back to the original weights for other tests
        from safetensors.torch import save

        original = hf_tiny if eng is engine else AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        ray.get(
            eng.update_weights.remote(
                ray.get(eng.info.remote())["version"] + 1,
                [save({k: v.detach().contiguous() for k, v in original.named_parameters()})],
            )
        )


@pytest.mark.parametrize("transport", ["ipc", "gloo"])
def test_collective_sync_through_vllms_engine_process(
    transport, process_engine, zero3_learners, tiny_tokenizer, fixed_batch
):
    """GPU review F7: with `engine.core=process` every weight call (device identity, the pickled
    plan, the receive with its (tensors, seconds) answer, pause/resume) crosses vLLM's msgpack RPC
    into the engine-core child, which maps rank 0's staging buffers (ipc) or joins the gloo group
    itself: the engine then scores as the learner after each push, ZeRO-3 gathers included."""
    info = ray.get(process_engine.info.remote(), timeout=60)
    assert info["core_pids"] and info["pid"] not in info["core_pids"], "vLLM's engine core is a child process"
    collective_pushes(process_engine, zero3_learners, transport, tiny_tokenizer, fixed_batch)


def test_object_store_sync_through_vllms_engine_process(process_engine, zero3_learners, tiny_tokenizer, fixed_batch):
    """GPU review F7: an object-store push (safetensors bytes through vLLM's RPC into the engine-core
    child, as the fallback and a restarted engine take it) loads in place there too."""
    prompt = chat_prompt(tiny_tokenizer)
    [c] = ray.get(process_engine.generate.remote(prompt, SamplingConfig(max_tokens=16)), timeout=120)
    before = torch.tensor(ray.get(process_engine.score.remote(prompt, c.completion_ids), timeout=120))
    zero3_learners.train_step(fixed_batch)
    learner_lp = torch.tensor(zero3_learners.logprobs(prompt + c.completion_ids, len(prompt)))
    assert (learner_lp - before).abs().max() > 0.01, "training must change the log-probs"
    version = ray.get(process_engine.info.remote(), timeout=60)["version"] + 1
    stats = ObjectStoreSync(zero3_learners, [process_engine], bucket_bytes=300_000).push(version)
    assert stats["bytes"] > 1e6
    after = torch.tensor(ray.get(process_engine.score.remote(prompt, c.completion_ids), timeout=120))
    assert (after - learner_lp).abs().max() < 1e-3
    [c2] = ray.get(process_engine.generate.remote(prompt, SamplingConfig(max_tokens=4)), timeout=120)
    assert c2.version == version


@pytest.mark.usefixtures("engine_weights_restored")
def test_a_group_that_cannot_carry_pushes_rests_instead_of_reopening_every_push(engine, tiny_path, monkeypatch):
    """A transport that fails every push (as NCCL does with two ranks on one GPU) costs one group
    open per 1, 2, 4, ... pushes, not one per push; every version still reaches the engine (through
    the object store) and is counted as a fallback."""
    learners = LearnerGroup(tiny_path, LearnerConfig(world_size=1, num_cpus=0.5), LossConfig())
    try:
        sync = CollectiveSync(learners, [engine], "gloo", bucket_bytes=300_000)
        opens = []
        real_open = sync._open
        monkeypatch.setattr(sync, "_open", lambda: (opens.append(1), real_open()))

        def broken(version, layout):
            raise RuntimeError("ncclInvalidUsage: Duplicate GPU detected")

        monkeypatch.setattr(learners, "broadcast_weights", broken)
        sync.members = None  # the first push opens the group, as after a restart
        version = ray.get(engine.info.remote(), timeout=60)["version"]
        fallbacks = []
        for k in range(1, 8):
            fallbacks.append(sync.push(version + k)["fallbacks"])
            assert ray.get(engine.info.remote(), timeout=60)["version"] == version + k
        assert fallbacks == [1.0] * 7
        assert len(opens) == 3, "tried at pushes 1, 3 and 7 (rests of 1 and 3 pushes between)"
    finally:
        learners.shutdown()


def test_the_restart_snapshot_is_exported_every_snapshot_every_pushes(process_engine, zero3_learners, fixed_batch):
    """GPU review F11: after every collective push rank 0 exported the full weights to the object store
    (for an engine that restarts): ~15 GB a step at 7B. With sync.snapshot_every=k only every k-th
    push does; the others reach the engines alone, and the store keeps the last snapshot's version."""
    from rollout.engine.weight_store import WeightStore

    store = ray.remote(num_cpus=0)(WeightStore).remote()
    sync = CollectiveSync(zero3_learners, [process_engine], "gloo", bucket_bytes=300_000, store=store, snapshot_every=2)
    version = ray.get(process_engine.info.remote(), timeout=60)["version"]
    stored = []
    for k in range(1, 5):
        zero3_learners.train_step(fixed_batch)
        assert sync.push(version + k)["fallbacks"] == 0
        assert ray.get(process_engine.info.remote(), timeout=60)["version"] == version + k
        stored.append(ray.get(store.checkout.remote(0), timeout=60)[0])
    assert stored == [0, version + 2, version + 2, version + 4]
    with pytest.raises(ValueError, match="sync.snapshot_every=0"):
        CollectiveSync(zero3_learners, [process_engine], "gloo", snapshot_every=0)


def test_an_engine_actor_that_crashes_takes_its_engine_core_along(process_engine):
    """GPU review F16 (last in this module: it ends the module's process-core engine). The review
    read Ray's docs: children of a crashed worker (SIGKILL, as the OOM killer sends; not ray.kill,
    after which the worker ends its children itself) are orphaned, so vLLM's engine core would keep
    its GPU memory and the restarted engine fail vLLM's free-memory check. Not so with the pinned
    Ray 2.60: its raylet starts each worker in a process group of its own and kills that group when
    the worker dies ("Per-worker process group cleanup is ENABLED" in raylet.out), engine core
    included. This holds the pinned stack to it: a Ray that changes it fails here."""
    import os
    import signal

    import psutil

    info = ray.get(process_engine.info.remote(), timeout=60)
    cores = [psutil.Process(pid) for pid in info["core_pids"]]
    assert cores, "vLLM's engine core runs in a child process of the actor"
    os.kill(info["pid"], signal.SIGKILL)
    _, alive = psutil.wait_procs(cores, timeout=60)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], "an engine core outlived its actor"
