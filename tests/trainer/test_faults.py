"""Faults a long run meets, on the real stack: checkpoints cut short, a damaged checkpoint, a
reused run dir, a learner rank that dies or hangs, a harness that always fails."""

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import ray
import torch

from rollout.trace import Sequence, Trace, TraceError
from tests import lane
from tests.conftest import fake_checkpoint, read_metrics
from tests.tools.test_bench import lane_jobs as bench_jobs
from trainer import checkpoint
from trainer.config import LearnerConfig, LossConfig, compose
from trainer.learner_group import LearnerGroup
from trainer.loop import check_failures, train
from trainer.run_dir import check_run_dir, start_run_dir

LANE_TESTS = {"test_a_run_survives_killed_engines_a_killed_worker_and_a_hung_engine": "faults"}


def lane_jobs() -> dict[str, lane.Job]:
    """The killed-engines run is the faults bench's quick run (python -m tools.bench.faults --quick: its
    `in_turn` fault plan), in the background lane beside the main tests, with a Ray of its own: the
    injector finds the actors it strikes by name. tests/tools/test_bench.py checks the same run's
    JSON as a bench's."""
    return {"faults": bench_jobs()["faults"]}


@pytest.mark.unit
def test_a_save_cut_short_is_never_resumed_from_and_prune_keeps_the_newest(tmp_path):
    for step in (2, 4, 6):
        fake_checkpoint(tmp_path, step)
    fake_checkpoint(tmp_path, 8, complete=False)  # the process died while writing step 8
    assert checkpoint.latest(tmp_path).name == "step_000006"
    assert [d.name for d in checkpoint.prune(tmp_path, keep_last=2, step=6)] == ["step_000002"]
    assert [d.name for d in checkpoint.complete(tmp_path)] == ["step_000004", "step_000006"]
    fake_checkpoint(tmp_path, 8)  # saving step 8 again replaces the leftover
    assert checkpoint.latest(tmp_path).name == "step_000008"
    assert not checkpoint.partial_dir(tmp_path, 8).exists()


@pytest.mark.unit
def test_rollouts_kept_with_a_checkpoint_come_back_by_group_and_a_damaged_one_is_named(tmp_path):
    def trace(group, i, reward):
        return Trace(f"{group}-{i}", group, [Sequence([1, 2], [3], [-0.5], "solver", "main", 1)], reward=reward)

    groups = [[trace("g1", 0, 1.0), trace("g1", 1, 0.0)], [trace("g2", 0, 0.5), trace("g2", 1, 0.25)]]
    checkpoint.start(tmp_path, 2)
    checkpoint.save_rollouts(tmp_path, 2, groups)
    checkpoint.finish(tmp_path, 2, {"main": 2})
    assert checkpoint.load_rollouts(checkpoint.step_dir(tmp_path, 2)) == groups
    path = checkpoint.step_dir(tmp_path, 2) / "rollouts.jsonl"
    path.write_bytes(path.read_bytes()[:-20] + b"\n")  # cut short
    with pytest.raises(TraceError, match="rollouts.jsonl:2"):
        checkpoint.load_rollouts(checkpoint.step_dir(tmp_path, 2))


@pytest.mark.unit
def test_a_reused_run_dir_is_refused_unless_resumed_or_overwritten(tmp_path):
    def cfg(*overrides):
        return compose("train", ["experiment=smoke", f"run_dir={tmp_path}", "trainer.steps=4", *overrides])

    check_run_dir(cfg())  # empty: fine
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(ValueError, match="holds a previous run.*trainer.resume=auto.*trainer.overwrite=true"):
        check_run_dir(cfg())
    with pytest.raises(ValueError, match="trainer.resume=.*no complete checkpoint"):
        check_run_dir(cfg(f"trainer.resume={tmp_path}"))
    check_run_dir(cfg("trainer.resume=auto"))  # no checkpoint: auto starts afresh
    assert start_run_dir(cfg("trainer.resume=auto")) == (tmp_path, None)
    assert not (tmp_path / "metrics.jsonl").exists(), "the previous run's outputs are deleted"

    fake_checkpoint(tmp_path, 2)
    check_run_dir(cfg("trainer.resume=auto"))
    assert start_run_dir(cfg("trainer.resume=auto")) == (tmp_path, tmp_path)
    assert checkpoint.latest(tmp_path), "resuming keeps the checkpoints"
    with pytest.raises(ValueError, match="nothing left to train"):
        check_run_dir(cfg("trainer.resume=auto", "trainer.steps=1"))
    check_run_dir(cfg("trainer.overwrite=true"))
    start_run_dir(cfg("trainer.overwrite=true"))
    assert checkpoint.latest(tmp_path) is None


@pytest.mark.unit
def test_too_many_failed_traces_stop_with_the_commonest_errors():
    def trace(i, error=None):
        return Trace(
            f"t{i}",
            "g",
            [Sequence([1], [2], [-0.1], "solver", "main", 0)],
            reward=0.0,
            status="failed" if error else "ok",
            error=error,
        )

    check_failures([trace(0, "KeyError: 'x'"), trace(1), trace(2)], 0.5, "step 3")  # 1 of 3: goes on
    traces = [trace(0, "KeyError: 'x'\n  at line 3"), trace(1, "KeyError: 'x'"), trace(2, "OSError: disk"), trace(3)]
    with pytest.raises(
        RuntimeError, match=r"step 3: 3 of 4 traces failed.*max_failed_fraction=0.5.*2x KeyError: 'x'; 1x OSError"
    ):
        check_failures(traces, 0.5, "step 3")
    check_failures(traces, 1.0, "step 3")  # 1: never stop


class RunsCode:
    """Unpickling it calls `open(marker, "w")`: any code could run instead."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


@pytest.mark.e2e
def test_a_damaged_checkpoint_falls_back_to_the_previous_and_a_dead_or_hung_rank_is_named(
    ray_cluster, tiny_path, fixed_batch, tmp_path
):
    """ZeRO-2: DeepSpeed's optimizer file holds its own classes, which the weights-only load allows;
    a pickled object that would run code is refused, naming the file."""
    cfg = LearnerConfig(world_size=1, num_cpus=0.5, zero_stage=2, lr=1e-3)
    group = LearnerGroup(tiny_path, cfg, LossConfig(), name="solver")
    try:
        digests = {}
        for step in (1, 2):
            group.train_step(fixed_batch)
            digests[step] = group.param_digests()[0]
            checkpoint.start(tmp_path, step)
            checkpoint.save_policy(group, tiny_path, tmp_path, step, "solver")
            checkpoint.finish(tmp_path, step, {"solver": step})
        assert digests[1] != digests[2]
        [states] = (checkpoint.step_dir(tmp_path, 2) / "solver" / "deepspeed").rglob("mp_rank_00_model_states.pt")
        states.write_bytes(states.read_bytes()[:1000])  # the disk filled up after the rename
        group.train_step(fixed_batch)
        ckpt, state = checkpoint.load_newest(tmp_path, lambda d, s: checkpoint.restore_policy(group, d, "solver"))
        assert (ckpt.name, state["step"]) == ("step_000001", 1)
        assert group.param_digests()[0] == digests[1], "the learner holds step 1's weights"

        [optim] = (checkpoint.step_dir(tmp_path, 1) / "solver" / "deepspeed").rglob("*optim_states.pt")
        state = torch.load(optim, weights_only=False)
        torch.save({**state, "extra": RunsCode(tmp_path / "ran")}, optim)  # a forged checkpoint
        shutil.rmtree(checkpoint.step_dir(tmp_path, 2))
        with pytest.raises(
            RuntimeError, match=r"(?s)none of the 1 .*optim_states.pt holds a pickled object .* refused"
        ):
            checkpoint.load_newest(tmp_path, lambda d, s: checkpoint.restore_policy(group, d, "solver"))
        assert not (tmp_path / "ran").exists(), "nothing in the file ran"

        group.cfg = replace(cfg, call_timeout_s=1e-3)  # no train step answers within a millisecond
        with pytest.raises(
            TimeoutError,
            match=r"learner train_step of policy 'solver': rank 0 on node \w+ did "
            r"not answer within learner.call_timeout_s=0.001",
        ):
            group.train_step(fixed_batch)
        group.cfg = cfg
        ray.kill(group.ranks[0])
        with pytest.raises(RuntimeError, match="learner param_digest of policy 'solver': rank 0 on node .* died"):
            group.param_digests()
    finally:
        group.shutdown()


@pytest.mark.e2e
@pytest.mark.needs_memory_gb(4)  # a smoke run's engine, learner ranks and worker
def test_a_run_whose_traces_all_fail_stops_with_the_error(ray_cluster, tmp_path):
    cfg = compose(
        "train",
        [
            "experiment=smoke",
            f"run_dir={tmp_path}",
            "trainer.steps=3",
            "eval.size=0",
            "learner.world_size=1",  # one rank is enough to show that nothing was trained
            "harness._target_=tests.rollout.orchestration.flaky_harnesses.broken",
            "harness.name=broken",
        ],
    )
    with pytest.raises(
        RuntimeError,
        match=r"the rollout of step 1: 64 of 64 traces failed.*64x ConnectionError: "
        r"tool server at localhost:9 refused",
    ):
        train(cfg)
    assert not (tmp_path / "checkpoints").exists(), "nothing was trained"


@pytest.mark.e2e
def test_a_run_survives_killed_engines_a_killed_worker_and_a_hung_engine():
    """SIGKILL of the trained policy's engine in step 2 and of the rollout worker in step 3, SIGSTOP of
    the frozen policy's engine in step 4, SIGKILL of both engines half a second apart in step 5 (as
    when a node goes), each engine struck once it has requests in flight (so a step later when a
    step's rollout was over within half a second): Ray restarts the killed ones, the watchdog finds
    the hung one and has it restarted; the requests they cut short are sent again to the restarted
    engines, the worker's unfinished groups run again. Every step still trains exactly its groups,
    none failed, and the restarted engines sample from the learner's weights (the importance ratio
    stays at 1 to float noise, as it would not if they served the base model). The run is the
    faults bench's quick run (`in_turn`), a background lane job with a Ray of its own."""
    [run] = lane.result("faults")["runs"]
    tmp_path = Path(run["run_dir"])
    try:
        assert run["fault"] == "in_turn" and run["injected"] and not run["injector_errors"], run
        assert run["survived"] and run["engine_restarts"] == 4 and run["engines_hung"] == 1, run
        rows = [m for m in read_metrics(tmp_path) if "rollout/reward" in m]
        assert [m["step"] for m in rows] == list(range(1, run["steps"] + 1))
        assert all(m["rollout/traces"] == 64 and m["rollout/failed"] == 0 for m in rows), rows
        # The Injector strikes an engine once it has requests in flight: in the step after `after_step`
        # or, when that step's rollout was already done (the thread core is fast), in the next one.
        assert sum(m["rollout/resent"] > 0 for m in rows) >= 2, (
            "the requests the killed engines cut short were sent again",
            [m["rollout/resent"] for m in rows],
        )
        # a restart is counted when the restarted engine takes its first request: in the step of its
        # fault, or (seen once in CI for the frozen engine of step 5) in the next one
        restarts = [m["rollout/engine_restarts"] for m in rows]
        assert restarts[0] == 0 and 1 in restarts and restarts[-1] == 4, restarts
        assert restarts == sorted(restarts), restarts
        assert run["worker_restarts"] == 1
        # the engine's behaviour log-probs are the learner's to float noise at every step (base weights
        # served after a restart would put the importance ratio far from 1 at these learning rates)
        assert max(abs(m["train/main/ratio_max"] - 1) for m in rows) < 1e-3, [m["train/main/ratio_max"] for m in rows]
        # the weights went over the collective group, which reopened with the restarted engines
        assert run["sync"] == "CollectiveSync"
        assert rows[0]["sync/main/fallbacks"] == 0 and rows[-1]["sync/main/fallbacks"] == 0, [
            m["sync/main/fallbacks"] for m in rows
        ]
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)
