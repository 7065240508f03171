"""The training loop end to end on the tiny model (real Ray, real vLLM engines, 2 DeepSpeed ranks),
and its eval summary.

Rewards can only rise if the engines really sample from the trained weights,
so a rising held-out reward shows the whole loop closes.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from rollout.trace import Sequence, Trace, read_jsonl
from tests.conftest import read_metrics as metrics
from tools.faults import wait_for_step
from trainer import checkpoint
from trainer.config import compose
from trainer.loop import train
from trainer.summary import eval_summary

ROOT = Path(__file__).resolve().parents[2]


def smoke_cfg(run_dir, *overrides):
    return compose("train", ["experiment=smoke", f"run_dir={run_dir}", *overrides])


def eval_trace(question, reward, failed=False):
    return Trace(
        f"t-{question}",
        "g",
        [Sequence([1], [2], [-0.1], "solver", "main", 0)],
        reward=reward,
        status="failed" if failed else "ok",
        error="RuntimeError: engine gone" if failed else None,
        info={"question": question},
    )


@pytest.mark.unit
def test_eval_summary_counts_failures_apart_from_wrong_answers_and_is_strict_json():
    initial = [eval_trace("a", 0.0), eval_trace("b", 0.0, failed=True), eval_trace("c", 1.0)]
    final = [eval_trace("a", 1.0), eval_trace("b", 0.0, failed=True), eval_trace("c", 0.0, failed=True)]
    s = eval_summary(initial, final)
    assert s["eval_failed"] == {"initial": 1, "final": 2}
    assert s["final_eval"]["eval/failed"] == 2.0 and s["initial_eval"]["eval/failed"] == 1.0
    # b and c failed on one side or both: an error is not a wrong answer, so only a is compared
    assert s["eval_paired"] == {"questions": 1, "left_out_failed": 2, "better": 1, "worse": 0, "sign_test_p": 1.0}
    none = eval_summary([], [])  # eval.size=0: no numbers, not NaN
    assert none["initial_eval_reward"] is None and none["final_eval"] == {}
    json.dumps({**s, **none}, allow_nan=False)


@pytest.mark.e2e
@pytest.mark.needs_memory_gb(5)  # a smoke run, then scripts/train.py with a Ray of its own
def test_async_training_learns_within_staleness_bound_and_resumes_exactly(ray_cluster, tmp_path):
    """20 async steps; then a run resumed from the step-10 checkpoint, SIGKILLed in step 12 and
    resumed again, trains exactly what this one trained in steps 11 and 12, whose rollouts were
    in flight at the save (kept with it)."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    summary = train(smoke_cfg(straight, "trainer.max_staleness=1", "trainer.steps=20", "trainer.save_every=10"))
    assert summary["initial_eval_reward"] < 0.3
    assert summary["final_eval_reward"] > 0.6, summary
    steps = [m for m in metrics(straight) if "async/main/staleness_max" in m]
    assert len(steps) == 20
    assert all(m["async/main/staleness_max"] <= 1 for m in steps)
    assert any(m["async/main/staleness_max"] == 1 for m in steps), "rollout must actually overlap training"
    # Back-pressure: a batch is submitted only once the weights it may lag are out, so only a
    # group overtaken by the next step's can come in too stale (dropped, counted).
    assert summary["dropped_stale"] == steps[-1]["async/dropped_stale"]
    assert summary["dropped_stale"] < 0.25 * 20 * 64, summary["dropped_stale"]

    # steps 11 and 12 were in flight at the step-10 save: 2 steps of 8 groups kept with it, none at the end
    kept = checkpoint.load_rollouts(checkpoint.step_dir(straight, 10))
    assert len(kept) == 2 * 8 and len({g[0].group for g in kept}) == 16 and all(len(g) == 8 for g in kept)
    assert checkpoint.load_rollouts(checkpoint.step_dir(straight, 20)) == []
    # that checkpoint alone, in a new run dir: scripts/train.py resumes from it and is SIGKILLed
    # once it has trained step 11; it runs for 20 steps, as the straight run, so its next checkpoint
    # is 9 steps past the kill (with 12, a test starved of CPU once polled too late: the run had
    # saved its last step); the same command with 12 steps resumes again and runs to the end
    shutil.copytree(checkpoint.step_dir(straight, 10), checkpoint.step_dir(resumed, 10))
    common = [
        "experiment=smoke",
        "trainer.max_staleness=1",
        "trainer.steps=12",
        "trainer.save_every=10",
        "eval.size=0",
        "trainer.resume=auto",
        f"run_dir={resumed}",
    ]
    driver = subprocess.Popen(
        [sys.executable, "scripts/train.py", *[a.replace("steps=12", "steps=20") for a in common]],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for_step(resumed, 11, process=driver)
        driver.kill()
        driver.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)  # the Ray processes it started
    assert checkpoint.latest(resumed).name == "step_000010"
    summary = train(compose("train", common))
    assert summary["start_step"] == 10
    before = {m["step"]: m for m in metrics(straight) if "rollout/reward" in m}
    after = {m["step"]: m for m in metrics(resumed) if "rollout/reward" in m}
    assert sorted(after) == [11, 12]
    for step in (11, 12):  # the same traces on the same weights: the same rewards, the same loss
        assert after[step]["rollout/reward"] == before[step]["rollout/reward"]
        assert after[step]["train/main/loss"] == pytest.approx(before[step]["train/main/loss"], abs=1e-6)
        assert after[step]["train/main/trained_tokens"] == before[step]["train/main/trained_tokens"]


@pytest.mark.e2e
def test_a_driver_that_dies_right_after_a_checkpoint_loses_no_row_and_its_resume_repeats_none(ray_cluster, tmp_path):
    """The driver dies just after step 2's checkpoint is complete (the fault point
    driver_dies_after_save), before its eval. The step's metrics row and rollouts were written
    before the checkpoint, so the resumed run has every step's row once, every step's rollouts and
    one eval row per eval step (before: step 2's row was written after the checkpoint, so it was
    lost for good, and the resumed run started at step 3)."""
    from rollout import faultpoints

    run = ["trainer.steps=4", "trainer.save_every=2", "trainer.eval_every=2", "eval.size=4", "trainer.rollouts_every=1"]
    faultpoints.arm("driver_dies_after_save", times=1)
    try:
        with pytest.raises(faultpoints.FaultPointFired, match="after the checkpoint of step 2"):
            train(smoke_cfg(tmp_path, *run))
    finally:
        faultpoints.disarm()
    summary = train(smoke_cfg(tmp_path, *run, "trainer.resume=auto"))
    rows = metrics(tmp_path)
    assert [m["step"] for m in rows if "rollout/reward" in m] == [1, 2, 3, 4]
    assert [m["step"] for m in rows if "eval/reward" in m] == [0, 2, 4]
    assert all(len(list(read_jsonl(tmp_path / "rollouts" / f"step_{k}.jsonl"))) == 64 for k in range(1, 5))
    assert summary["start_step"] == 2
    assert summary["ledger"] == {
        "submitted": 32,
        "trained": 32,
        "stale": 0,
        "failed": 0,
        "duplicated": 0,
        "open": 0,
        "balanced": True,
    }


@pytest.mark.e2e
def test_held_groups_an_engine_failure_cut_short_run_again_after_a_resume(ray_cluster, tmp_path):
    """A checkpoint keeps the next step's rollout groups (drained at the save). If an engine failure
    had failed them (an engine out of restarts: the run then stopped), every resume trained those
    same failed traces and stopped again: a crash loop the chaos soak found. Now the resumed run
    runs such groups again on its fresh engines: step 3 trains all its groups, none failed."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run = ["trainer.steps=3", "trainer.save_every=2", "eval.size=0", "trainer.rollouts_every=1"]
    train(smoke_cfg(straight, *run))
    shutil.copytree(checkpoint.step_dir(straight, 2), checkpoint.step_dir(resumed, 2))
    held = checkpoint.load_rollouts(checkpoint.step_dir(resumed, 2))
    assert len(held) == 8, "step 3's groups, drained at the save"
    failed = [
        [
            Trace(
                t.id,
                t.group,
                [],
                status="failed",
                error="EngineError: engine 0 of policy 'main' died during a request",
                info={**t.info, "engine_failed": True},
            )
            for t in g
        ]
        for g in held
    ]
    lines = b"".join(msgspec.json.encode(group) + b"\n" for group in failed)
    (checkpoint.step_dir(resumed, 2) / "rollouts.jsonl").write_bytes(lines)
    summary = train(smoke_cfg(resumed, *run, "trainer.resume=auto"))
    [row] = [m for m in metrics(resumed) if "rollout/reward" in m]
    assert row["step"] == 3 and row["rollout/failed"] == 0 and row["rollout/traces"] == 64, row
    again = sorted((t.id, t.sequences[0].completion_ids) for t in read_jsonl(resumed / "rollouts" / "step_3.jsonl"))
    first = sorted((t.id, t.sequences[0].completion_ids) for t in read_jsonl(straight / "rollouts" / "step_3.jsonl"))
    assert [i for i, _ in again] == [i for i, _ in first], "the same groups, run again with the same seeds"
    assert summary["ledger"]["balanced"] and summary["ledger"]["trained"] == 24


@pytest.mark.e2e
@pytest.mark.needs_memory_gb(4)  # two engines (the player, the frozen one) and a learner rank
def test_selfplay_against_a_frozen_player_trains_on_per_agent_rewards(ray_cluster, tmp_path):
    """A multi-agent run through the real loop: selfplay with player_b frozen (its own engine),
    zero-sum per-agent rewards, per-role GRPO baselines."""
    summary = train(
        smoke_cfg(
            tmp_path,
            "harness=selfplay",
            "agents.player_b=frozen",
            "algorithm=grpo_per_agent",
            "trainer.steps=2",
            "trainer.eval_every=0",
            "eval.size=8",
            "learner.world_size=1",
        )
    )
    assert summary["trainable_policies"] == ["main"]
    assert len(summary["nodes"]["engines"]) == 2, "one engine for main, one for the frozen player"
    steps = [m for m in metrics(tmp_path) if "rollout/reward/player_a" in m]
    assert len(steps) == 2
    for m in steps:
        assert m["rollout/reward"] == 0.0 and m["rollout/failed"] == 0 and m["train/main/adv_count"] > 0
    assert summary["trained_tokens"] > 0
    # zero-sum per agent: +1 for the winner, -1 for the loser (of those who moved)
    evals = list(read_jsonl(tmp_path / "eval/step_2.jsonl"))
    assert len(evals) == 8 and all(t.status != "failed" for t in evals)
    for t in evals:
        assert sorted(t.agent_rewards.values()) in ([-1.0], [1.0], [-1.0, 1.0]), t.agent_rewards
    player_a = [t.agent_rewards["player_a"] for t in evals]
    assert summary["final_eval"]["eval/reward/player_a"] == pytest.approx(sum(player_a) / len(player_a))
