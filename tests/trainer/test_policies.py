"""Several trainable policies in one run (invariant 7 of docs/design.md): each policy is trained
by its own learners on its own roles' sequences only, serves its own weights from its own
engines, and keeps its own version clock; a frozen policy never changes. Real vLLM engines,
DeepSpeed ranks and Ray actors on the tiny model."""

import contextlib
import shutil

import msgspec
import pytest
import ray
import torch
from safetensors.torch import load_file

from rollout.orchestration.fleet import RolloutFleet
from rollout.trace import Trace, read_jsonl
from tests.conftest import read_metrics
from trainer import checkpoint
from trainer.checks import validate
from trainer.config import compose
from trainer.loop import train
from trainer.policy import trained_policies
from trainer.summary import policy_summary

# two policies: two engines (and a frozen one), two learner groups, a run of their own each
pytestmark = [pytest.mark.e2e, pytest.mark.needs_memory_gb(5)]

TWO_POLICIES = [
    "experiment=smoke",
    "harness=solver_verifier",
    "agents.solver=main",
    "agents.verifier=critic",
    "+policies.critic.trainable=true",
    "learner.world_size=1",
    "eval.size=0",
]


def without(trace: Trace, policy: str) -> Trace:
    """`trace` with `policy`'s sequences removed (parents re-pointed; one into a removed sequence dropped)."""
    keep = [i for i, s in enumerate(trace.sequences) if s.policy != policy]
    new_index = {old: new for new, old in enumerate(keep)}
    seqs = [msgspec.structs.replace(trace.sequences[i], parent=new_index.get(trace.sequences[i].parent)) for i in keep]
    return msgspec.structs.replace(trace, sequences=seqs)


def scores(engine, seq, policy=None) -> torch.Tensor:
    return torch.tensor(ray.get(engine.score.remote(seq.prompt_ids, seq.completion_ids, policy), timeout=60))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_each_policy_trains_on_its_own_roles_only(ray_cluster, tmp_path, lora):
    """Full policies each have their own engine; LoRA policies are two adapters of one base,
    served by one engine with the frozen corrector (the base without an adapter)."""
    adapters = ["+policies.solver_p.lora.rank=8", "+policies.verifier_p.lora.rank=8", "learner.lr=3e-2"] if lora else []
    cfg = compose(
        "train",
        [
            "experiment=smoke",
            "harness=solver_verifier_corrector",
            f"run_dir={tmp_path}",
            "agents.solver=solver_p",
            "agents.verifier=verifier_p",
            "agents.corrector=frozen",
            "+policies.solver_p.trainable=true",
            "+policies.verifier_p.trainable=true",
            "learner.world_size=1",
            "eval.size=0",
            *adapters,
        ],
    )
    validate(cfg)
    with RolloutFleet(cfg) as fleet:
        assert len(fleet.pools) == (1 if lora else 3)
        fleet.submit([0, 1])
        traces = [tr for group in fleet.take(2, 300) for tr in group]
        spoke = {(s.agent, s.policy, s.trainable) for tr in traces for s in tr.sequences}
        assert {("solver", "solver_p", True), ("verifier", "verifier_p", True)} <= spoke, spoke
        assert spoke <= {("solver", "solver_p", True), ("verifier", "verifier_p", True), ("corrector", "frozen", False)}
        probe = {
            p: next(s for tr in traces for s in tr.sequences if s.policy == p and s.completion_ids)
            for p in ("solver_p", "verifier_p")
        }
        frozen_engine = fleet.engines["frozen"][0]
        frozen_before = scores(frozen_engine, probe["solver_p"], "frozen")

        with contextlib.ExitStack() as stack:
            policies = trained_policies(cfg, fleet, stack)
            a, b = policies["solver_p"], policies["verifier_p"]
            # two adapters on one base: one learner group holds the base once and trains both
            assert (a.learners.ranks == b.learners.ranks) == lora
            start = a.learners.param_digests()
            assert b.learners.param_digests() == start, "both start from the same weights"
            for name, policy in (("solver_p", a), ("verifier_p", b)):  # the start, trained again below
                policy.learners.save(str(tmp_path / "start" / name / "deepspeed"))
            base = ray.get(a.learners.ranks[0].base_digest.remote(), timeout=60)
            metrics = {**a.step(traces, 0), **b.step(traces, 0)}
            if lora:  # the base weights never change; only the adapters were sent
                assert all(ray.get(p.learners.ranks[0].base_digest.remote(), timeout=60) == base for p in (a, b))
                assert all(0 < metrics[f"sync/{p}/bytes"] < 1e6 for p in ("solver_p", "verifier_p"))
            after = {"solver_p": a.learners.param_digests(), "verifier_p": b.learners.param_digests()}
            assert start not in after.values() and after["solver_p"] != after["verifier_p"]
            assert metrics["train/solver_p/trained_tokens"] == sum(
                len(s.completion_ids) for tr in traces for s in tr.sequences if s.policy == "solver_p"
            )
            assert metrics["train/verifier_p/trained_tokens"] == sum(
                len(s.completion_ids) for tr in traces for s in tr.sequences if s.policy == "verifier_p"
            )
            # invariant 4 per policy: each engine now serves its own learner's weights, as version 1
            for name, policy, other in (("solver_p", a, b), ("verifier_p", b, a)):
                seq = probe[name]
                served = scores(fleet.engines[name][0], seq, name)
                mine = torch.tensor(policy.learners.logprobs(seq.prompt_ids + seq.completion_ids, len(seq.prompt_ids)))
                theirs = torch.tensor(other.learners.logprobs(seq.prompt_ids + seq.completion_ids, len(seq.prompt_ids)))
                assert (served - mine).abs().max() < 1e-3
                assert (served - theirs).abs().max() > 1e-3, "the other policy's weights differ"
                info = ray.get(fleet.engines[name][0].info.remote(), timeout=60)
                assert (info["adapter_versions"][name] if lora else info["version"]) == 1
            # the run summary finds each policy's engines, also in the pool two adapters share
            summary = policy_summary(fleet, policies)["policies"]
            for name in ("solver_p", "verifier_p"):
                assert len(summary[name]["engine_nodes"]) == 1 and summary[name]["engine_busy_s"] > 0, summary[name]

            # the same batch with the other policy's sequences removed trains each policy, from the
            # same start (its learners' saved state, back as version 0), to the same weights (and a
            # LoRA adapter trains in a shared group as alone: tests/rollout/engine/test_lora.py)
            for name, policy, other in (("solver_p", a, "verifier_p"), ("verifier_p", b, "solver_p")):
                policy.restore(tmp_path / "start", 0)
                assert policy.learners.param_digests() == start, name
                policy.step([without(tr, other) for tr in traces], 0)
                assert policy.learners.param_digests() == after[name], name

        # the frozen policy: never trained, never synced
        assert ray.get(frozen_engine.info.remote(), timeout=60)["version"] == 0
        assert torch.equal(scores(frozen_engine, probe["solver_p"], "frozen"), frozen_before)


def test_two_policies_async_keep_their_own_clocks_and_resume_exactly(ray_cluster, tmp_path):
    """One asynchronous two-policy run (max_staleness=1): each policy's traces stay within the bound
    of its own clock. Then a run resumed from its step-2 checkpoint alone, in a new run dir: its
    engines serve both policies' restored weights (its first held-out eval is the uninterrupted
    run's at step 2, token for token), and it trains steps 3 and 4 (in flight at the save, kept
    with it) to the uninterrupted run's weights, each policy its own. (A run SIGKILLed after a
    checkpoint resumes from it: tests/trainer/test_loop.py's async test.)"""
    # no health probes: a probe request changes an engine's batch composition, and with it the last
    # bits of vLLM's log-probs, which the greedy eval and the weights comparison are sensitive to
    common = [
        *TWO_POLICIES,
        "trainer.max_staleness=1",
        "trainer.save_every=2",
        "trainer.eval_every=2",
        "eval.size=8",
        "trainer.groups_per_step=4",
        "trainer.steps=4",
        "engine.health_check_s=0",
    ]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    summary = train(compose("train", [*common, f"run_dir={straight}"]))
    assert summary["trainable_policies"] == ["critic", "main"]
    steps = [m for m in read_metrics(straight) if "rollout/reward" in m]
    assert [m["step"] for m in steps] == [1, 2, 3, 4]
    for p in ("main", "critic"):
        lags = [m[f"async/{p}/staleness_max"] for m in steps]
        assert max(lags) <= 1 and 1 in lags, (p, lags)
        assert [m[f"async/{p}/version"] for m in steps] == [1, 2, 3, 4]
        assert summary["policies"][p]["version"] == 4 and summary["policies"][p]["trained_tokens"] > 0
    # the trained tokens of a step are split between the two policies, none counted twice
    for m in steps:
        assert m["train/trained_tokens"] == (
            m.get("train/main/trained_tokens", 0) + m.get("train/critic/trained_tokens", 0)
        )
    # steps 3 and 4 were in flight at the step-2 save: kept with it, each trace holding both policies' turns
    kept = checkpoint.load_rollouts(checkpoint.step_dir(straight, 2))
    assert len(kept) == 2 * 4, len(kept)
    assert {s.policy for g in kept for tr in g for s in tr.sequences} == {"main", "critic"}

    shutil.copytree(checkpoint.step_dir(straight, 2), checkpoint.step_dir(resumed, 2))
    summary = train(compose("train", [*common, f"run_dir={resumed}", "trainer.resume=auto"]))
    assert summary["start_step"] == 2
    assert {p: v["version"] for p, v in summary["policies"].items()} == {"main": 4, "critic": 4}
    # the resumed engines sample from the checkpoint's weights: greedy, the same tokens of both roles
    evals = {d: list(read_jsonl(d / "eval/step_2.jsonl")) for d in (straight, resumed)}
    assert len(evals[resumed]) == 8 and {s.policy for tr in evals[resumed] for s in tr.sequences} == {"main", "critic"}
    assert [[(s.policy, s.completion_ids) for s in tr.sequences] for tr in evals[resumed]] == [
        [(s.policy, s.completion_ids) for s in tr.sequences] for tr in evals[straight]
    ]
    assert [tr.reward for tr in evals[resumed]] == [tr.reward for tr in evals[straight]]
    for p in ("main", "critic"):
        a = load_file(straight / f"checkpoints/step_000004/{p}/hf/model.safetensors")
        b = load_file(resumed / f"checkpoints/step_000004/{p}/hf/model.safetensors")
        first = load_file(resumed / f"checkpoints/step_000002/{p}/hf/model.safetensors")
        assert max((first[k] - b[k]).abs().max().item() for k in b) > 1e-3, f"{p}: the resumed half must train"
        # the same traces (kept with the checkpoint) on the same weights, in id order (the same rows
        # and micro-batches): each tensor's difference is measured against the resumed half's update
        for k in a:
            off = ((a[k] - b[k]).norm() / (b[k] - first[k]).norm()).item()
            assert off < 1e-3, f"{p} {k}: the resumed run's weights differ by {off:.2e} of its update"
    main = load_file(straight / "checkpoints/step_000004/main/hf/model.safetensors")
    critic = load_file(straight / "checkpoints/step_000004/critic/hf/model.safetensors")
    assert max((main[k] - critic[k]).abs().max().item() for k in main) > 1e-3, "two policies, two sets of weights"
    before = {m["step"]: m for m in steps}
    after = {m["step"]: m for m in read_metrics(resumed) if "rollout/reward" in m}
    assert sorted(after) == [3, 4]
    for step in (3, 4):  # the same traces on the same weights: the same rewards, each policy the same loss
        assert after[step]["rollout/reward"] == before[step]["rollout/reward"]
        for p in ("main", "critic"):
            assert after[step][f"train/{p}/loss"] == pytest.approx(before[step][f"train/{p}/loss"], abs=1e-6)
            assert after[step][f"train/{p}/trained_tokens"] == before[step][f"train/{p}/trained_tokens"]
