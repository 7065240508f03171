"""Several trainable policies in one run (invariant 7 of docs/design.md): each policy is trained
by its own learners on its own roles' sequences only, serves its own weights from its own
engines, and keeps its own version clock; a frozen policy never changes. Real vLLM engines,
DeepSpeed ranks and Ray actors on the tiny model."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
import ray
import torch
from safetensors.torch import load_file

from rollout.orchestration.fleet import RolloutFleet
from rollout.trace import Trace
from tests.conftest import read_metrics
from trainer import checkpoint
from trainer.checks import validate
from trainer.config import compose
from trainer.loop import train
from trainer.policy import TrainedPolicy, trained_policies
from trainer.summary import policy_summary

# two policies: two engines (and a frozen one), two learner groups, a run of their own each
pytestmark = [pytest.mark.e2e, pytest.mark.needs_memory_gb(5)]

ROOT = Path(__file__).resolve().parents[2]
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

        # the same batch with the other policy's sequences removed trains each policy to the same weights
        for name, other in (("solver_p", "verifier_p"), ("verifier_p", "solver_p")):
            with TrainedPolicy(cfg, name, fleet) as alone:
                alone.step([without(tr, other) for tr in traces], 0)
                assert alone.learners.param_digests() == after[name], name

        # the frozen policy: never trained, never synced
        assert ray.get(frozen_engine.info.remote(), timeout=60)["version"] == 0
        assert torch.equal(scores(frozen_engine, probe["solver_p"], "frozen"), frozen_before)


def test_two_policies_async_stay_within_the_bound_of_their_own_clock(ray_cluster, tmp_path):
    summary = train(
        compose(
            "train",
            [
                *TWO_POLICIES,
                f"run_dir={tmp_path}",
                "trainer.max_staleness=1",
                "trainer.steps=5",
                "trainer.groups_per_step=2",
            ],
        )
    )
    assert summary["trainable_policies"] == ["critic", "main"]
    steps = read_metrics(tmp_path)[-5:]
    for p in ("main", "critic"):
        lags = [m[f"async/{p}/staleness_max"] for m in steps]
        assert max(lags) <= 1 and 1 in lags, (p, lags)
        assert [m[f"async/{p}/version"] for m in steps] == [1, 2, 3, 4, 5]
        assert summary["policies"][p]["version"] == 5 and summary["policies"][p]["trained_tokens"] > 0
    # the trained tokens of a step are split between the two policies, none counted twice
    for m in steps:
        assert m["train/trained_tokens"] == (
            m.get("train/main/trained_tokens", 0) + m.get("train/critic/trained_tokens", 0)
        )


def test_resume_with_two_policies_continues_as_the_uninterrupted_run(ray_cluster, tmp_path):
    """scripts/train.py SIGKILLed in step 3 (after its step-2 checkpoint), then the same command
    with trainer.resume=auto: the run ends where the uninterrupted one does, step by step."""
    # no health probes: a probe request changes an engine's batch composition, and with it the last
    # bits of vLLM's log-probs, which this weights comparison (to 1e-4) is sensitive to
    common = [
        *TWO_POLICIES,
        "trainer.save_every=2",
        "trainer.groups_per_step=4",
        "trainer.steps=4",
        "engine.health_check_s=0",
    ]
    straight, halves = tmp_path / "straight", tmp_path / "halves"
    train(compose("train", [*common, f"run_dir={straight}"]))
    driver = subprocess.Popen(
        [sys.executable, "scripts/train.py", *common, f"run_dir={halves}"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        while checkpoint.latest(halves) is None and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert checkpoint.latest(halves).name == "step_000002" and driver.poll() is None
        driver.kill()  # SIGKILL: no cleanup, no final checkpoint
        driver.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)  # the Ray processes it started
    summary = train(compose("train", [*common, f"run_dir={halves}", "trainer.resume=auto"]))
    assert summary["start_step"] == 2
    assert {p: v["version"] for p, v in summary["policies"].items()} == {"main": 4, "critic": 4}
    for p in ("main", "critic"):
        a = load_file(straight / f"checkpoints/step_000004/{p}/hf/model.safetensors")
        b = load_file(halves / f"checkpoints/step_000004/{p}/hf/model.safetensors")
        first = load_file(halves / f"checkpoints/step_000002/{p}/hf/model.safetensors")
        assert max((first[k] - b[k]).abs().max().item() for k in b) > 1e-3, f"{p}: the resumed half must train"
        # vLLM's log-probs vary in the last bits with batch composition, and Adam's normalised
        # step amplifies that in weights whose gradient is near zero (one embedding entry can move
        # by a few 1e-5 where the run moved it 6e-3): so each tensor's difference is measured
        # against the resumed half's own update (measured: 0 since a step's traces train in id
        # order, so the same rows and micro-batches; up to 1.6e-3 of it before, with tree rows).
        for k in a:
            off = ((a[k] - b[k]).norm() / (b[k] - first[k]).norm()).item()
            assert off < 1e-3, f"{p} {k}: the resumed run's weights differ by {off:.2e} of its update"
    main = load_file(straight / "checkpoints/step_000004/main/hf/model.safetensors")
    critic = load_file(straight / "checkpoints/step_000004/critic/hf/model.safetensors")
    assert max((main[k] - critic[k]).abs().max().item() for k in main) > 1e-3, "two policies, two sets of weights"
    rewards = {m["step"]: m["rollout/reward"] for m in read_metrics(straight) if "rollout/reward" in m}
    resumed = {m["step"]: m["rollout/reward"] for m in read_metrics(halves) if "rollout/reward" in m}
    assert rewards == pytest.approx(resumed, abs=1e-9)
