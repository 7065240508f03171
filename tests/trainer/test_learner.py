"""Learners as real DeepSpeed ranks (gloo) in Ray actors, with the tiny model."""

import numpy as np
import pytest
import ray
import torch

from trainer.config import LearnerConfig, LossConfig
from trainer.learner_group import LearnerGroup
from trainer.losses import microbatch_loss

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", params=[0, 2, 3], ids=["zero0", "zero2", "zero3"])
def group(request, ray_cluster, tiny_path):
    cfg = LearnerConfig(world_size=2, num_cpus=0.5, zero_stage=request.param, lr=1e-4, grad_clip=0.0)
    g = LearnerGroup(tiny_path, cfg, LossConfig())
    yield g
    g.shutdown()


def test_ranks_stay_identical_and_loss_goes_down(group, fixed_batch):
    losses = [group.train_step(fixed_batch)["loss"] for _ in range(4)]
    assert losses[-1] < losses[0], losses
    a, b = group.param_digests()
    assert a == b


def test_a_non_finite_loss_skips_the_step_on_every_rank_and_training_goes_on(group, fixed_batch):
    """A NaN advantage on one rank's micro-batch: no rank changes its weights or optimizer state (the
    group has trained before, so an optimizer step on zero gradients would still move them), the
    step is counted as skipped, and the next good batch trains as usual."""
    import copy

    from safetensors.torch import load

    before = group.param_digests()
    bad = copy.deepcopy(fixed_batch)
    bad[0].advantages[0, :] = np.nan
    out = group.train_step(bad)
    assert out["skipped"] == 1.0
    assert group.param_digests() == before
    good = group.train_step(fixed_batch)
    assert good["skipped"] == 0.0 and good["skipped_steps"] == out["skipped_steps"]
    after = group.param_digests()
    assert after[0] != before[0] and after[0] == after[1]
    for bucket in ray.get(group.export_weights()):
        assert all(torch.isfinite(t).all() for t in load(bucket).values())


def test_export_equals_consolidated_state(group, tmp_path):
    """Rank 0's export equals DeepSpeed's own consolidation of a saved (ZeRO-partitioned) checkpoint
    (under ZeRO-0: the module state it saved)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from safetensors.torch import load

    buckets = ray.get(group.export_weights(bucket_bytes=200_000))
    assert len(buckets) > 1, "small buckets: the export is split"
    exported = {}
    for b in buckets:
        exported.update(load(b))
    group.save(str(tmp_path))
    if group.cfg.zero_stage == 0:  # nothing partitioned: DeepSpeed saves the module's state as it is
        [states] = tmp_path.rglob("mp_rank_00_model_states.pt")
        consolidated = torch.load(states, weights_only=False)["module"]
    else:
        consolidated = get_fp32_state_dict_from_zero_checkpoint(str(tmp_path), tag="state")
    assert set(exported) <= set(consolidated)
    for name, t in exported.items():
        assert torch.equal(t, consolidated[name].float()), name


def test_save_load_step_matches_uninterrupted(ray_cluster, tiny_path, fixed_batch, tmp_path):
    from safetensors.torch import load

    def weights(g):
        out = {}
        for b in ray.get(g.export_weights()):
            out.update(load(b))
        return out

    batches = fixed_batch
    cfg = LearnerConfig(world_size=2, num_cpus=0.5, zero_stage=2, lr=1e-3, warmup_steps=3)
    a = LearnerGroup(tiny_path, cfg, LossConfig())
    try:
        a.train_step(batches)
        a.train_step(batches)
        a.save(str(tmp_path))
        last = a.train_step(batches)
        straight = weights(a)
    finally:
        a.shutdown()
    b = LearnerGroup(tiny_path, cfg, LossConfig())
    try:
        assert b.load(str(tmp_path)) == 2
        resumed_step = b.train_step(batches)
        resumed = weights(b)
    finally:
        b.shutdown()
    assert resumed_step["step"] == last["step"] == 3
    assert resumed_step["lr"] == last["lr"]  # the scheduler resumed too (warm-up)
    for name, t in straight.items():
        assert torch.equal(t, resumed[name]), name


@pytest.mark.parametrize("world_size, zero_stage", [(2, 2), (1, 0)])
def test_steps_equal_single_process_sgd_whatever_their_micro_batch_counts(
    ray_cluster, tiny_path, fixed_batch, world_size, zero_stage
):
    """2 ranks x ZeRO-2, and 1 rank x ZeRO-0 (`make train`'s, which skips DeepSpeed's all-reduce),
    SGD: each step's update is lr x (sum of its micro-batch gradients), exactly what one process
    computes on the whole batch: no averaging over ranks or micro-batches; and the optimizer steps
    once per step, after all its micro-batches, also when consecutive steps have different numbers
    of them (every run's do: DeepSpeed's own boundary count would step inside a batch)."""
    from safetensors.torch import load
    from transformers import AutoModelForCausalLM

    schedule = [fixed_batch, fixed_batch[:1], fixed_batch, fixed_batch[1:]]
    cfg = LearnerConfig(
        world_size=world_size, num_cpus=0.5, zero_stage=zero_stage, optimizer="sgd", lr=0.5, grad_clip=0.0
    )
    g = LearnerGroup(tiny_path, cfg, LossConfig())
    try:
        for batches in schedule:
            g.train_step(batches)
        got = {}
        for b in ray.get(g.export_weights()):
            got.update(load(b))
    finally:
        g.shutdown()
    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for batches in schedule:
        for mb in batches:
            microbatch_loss(model, mb, LossConfig())[0].backward()
        opt.step()
        opt.zero_grad()
    delta = max((got[n] - p.detach()).abs().max().item() for n, p in model.named_parameters())
    moved = max(
        (got[n] - p0).abs().max().item()
        for (n, _), p0 in zip(model.named_parameters(), AutoModelForCausalLM.from_pretrained(tiny_path).parameters())
    )
    assert moved > 1e-3, "the step must move the weights"
    assert delta < 1e-6 * max(1.0, moved) * 100, (delta, moved)


def test_bf16_zero2_trains_and_ranks_agree(ray_cluster, tiny_path, fixed_batch):
    batches = fixed_batch
    g = LearnerGroup(
        tiny_path, LearnerConfig(world_size=2, num_cpus=0.5, zero_stage=2, lr=1e-4), LossConfig(), dtype="bfloat16"
    )
    try:
        first = g.train_step(batches)
        for _ in range(3):
            last = g.train_step(batches)
        assert last["loss"] < first["loss"], (first["loss"], last["loss"])
        assert np.isfinite(last["grad_norm"]) and last["grad_norm"] > 0
        a, b = g.param_digests()
        assert a == b
    finally:
        g.shutdown()


def test_a_sequence_trains_at_the_temperature_it_was_sampled_at(ray_cluster, engine, tiny_path, tiny_tokenizer):
    """An agent whose sampling default is 0.7 samples one call at 1.0, in a run whose loss
    temperature is 0.7: the sequence records 1.0, and the learner's log-probs of it, at that
    temperature, equal the engine's; trained through packing, every importance ratio is 1."""
    import asyncio

    import msgspec

    from rollout.agents.chat_format import ChatFormat
    from rollout.agents.client import Agent, TraceRecorder
    from rollout.config import SamplingConfig
    from rollout.orchestration.router import Router
    from rollout.trace import Trace
    from tests.conftest import chat_prompt
    from trainer.packing import build_rows, pack, token_weights

    fmt = ChatFormat(tiny_tokenizer)
    rec = TraceRecorder("temperature")
    agent = Agent("solver", "main", Router([engine]), fmt, rec, SamplingConfig(temperature=0.7, max_tokens=24))
    prompt = chat_prompt(tiny_tokenizer)
    # ignore_eos: all 24 tokens, whatever the (already trained, shared) engine samples first
    asyncio.run(agent.generate(prompt, temperature=1.0, ignore_eos=True))
    [seq] = rec.sequences
    assert seq.temperature == 1.0 and len(seq.completion_ids) == 24

    cfg = LearnerConfig(world_size=1, num_cpus=1, zero_stage=0, optimizer="sgd", lr=1e-9, grad_clip=0.0)
    g = LearnerGroup(tiny_path, cfg, LossConfig(temperature=0.7))
    try:
        ids = seq.prompt_ids + seq.completion_ids
        mine = torch.tensor(g.logprobs(ids, len(prompt), temperature=seq.temperature))
        assert (mine - torch.tensor(seq.logprobs)).abs().max() < 1e-3

        def trained(s) -> dict:
            trace = Trace("t", "g", [s], reward=1.0)
            return g.train_step(pack(build_rows([trace], [[1.0]], token_weights([trace], "token")), 4096, fmt.pad_id))

        out = trained(seq)
        assert out["tokens"] == len(seq.completion_ids)
        assert out["ratio_max"] < 1 + 2e-3 and out["mismatch_kl"] / out["tokens"] < 1e-6
        # the same sequence without its temperature is scored at the run's 0.7: off-policy
        blind = trained(msgspec.structs.replace(seq, temperature=None))
        assert blind["ratio_max"] > 1.05 and blind["mismatch_kl"] / blind["tokens"] > 1e-3
    finally:
        g.shutdown()
