"""Invariant 4: after a weight sync the engine generates from the learner's new weights."""

import pytest
import ray
import torch
from transformers import AutoModelForCausalLM

from rollout.config import SamplingConfig
from rollout.models import resolve_model
from rollout.weights.sync import CollectiveSync, ObjectStoreSync
from tests.conftest import chat_prompt, hf_logprobs
from trainer import checkpoint
from trainer.learner import LearnerConfig
from trainer.learner_group import LearnerGroup
from trainer.losses import LossConfig

pytestmark = pytest.mark.e2e


def test_sync_engine_matches_learner_and_tags_version(
    engine, tiny_path, hf_tiny, tiny_tokenizer, fixed_batch, tmp_path
):
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
        # put the shared engine back on the original weights for other tests
        from safetensors.torch import save

        ray.get(
            engine.update_weights.remote(
                ray.get(engine.info.remote())["version"] + 1,
                [save({k: v.detach().contiguous() for k, v in hf_tiny.named_parameters()})],
            )
        )


@pytest.mark.parametrize("model,zero,transport", [("tiny", 0, "ipc"), ("tiny_tied", 3, "gloo")])
def test_collective_sync_engine_matches_learner(
    model, zero, transport, engine, hf_tiny, tiny_tokenizer, fixed_batch, request
):
    """CollectiveSync (learner rank 0 -> engine worker, straight into the parameters) over a gloo
    group, and over the ipc protocol a GPU shares with its engines (here through POSIX shared
    memory: the same staging buffers, announcements and acks; only the handle differs): after
    each push the engine scores as the learner (invariant 4), tied embeddings and ZeRO-3
    included, and serves the pushed version; the group carries several pushes."""
    prompt = chat_prompt(tiny_tokenizer)
    path = resolve_model(model)
    eng = engine if model == "tiny" else request.getfixturevalue("tied_engine")
    learners = LearnerGroup(path, LearnerConfig(world_size=2, num_cpus=0.5, zero_stage=zero, lr=3e-3), LossConfig())
    try:
        [c] = ray.get(eng.generate.remote(prompt, SamplingConfig(max_tokens=16)), timeout=120)
        ids = prompt + c.completion_ids
        sync = CollectiveSync(learners, [eng], transport, bucket_bytes=300_000)
        assert len(sync.layout) > 2, "several buckets: both staging buffers are reused"
        assert sync.transports == [[transport]]
        version = ray.get(eng.info.remote(), timeout=60)["version"]
        for _ in range(2):
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


def test_a_group_that_cannot_carry_pushes_rests_instead_of_reopening_every_push(
    engine, tiny_path, hf_tiny, monkeypatch
):
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
        from safetensors.torch import save

        ray.get(
            engine.update_weights.remote(
                ray.get(engine.info.remote())["version"] + 1,
                [save({k: v.detach().contiguous() for k, v in hf_tiny.named_parameters()})],
            )
        )
