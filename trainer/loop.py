"""The training loop: rollout -> buffer -> advantages -> packing -> learners -> weight sync.

Read `train(cfg)` top to bottom. It starts the rollout fleet (rollout/orchestration/fleet.py),
each trainable policy's learners (trainer/policy.py) and the logger, evaluates,
then per step: takes `groups_per_step` complete groups and, for each trained
policy, leaves out traces more than `max_staleness` versions behind its clock,
computes advantages per sequence, merges and packs its own sequences, takes one
optimizer step on its DeepSpeed ranks and pushes the new weights into its
engines; then logs, and every so often evaluates and checkpoints.

Synchronous (`max_staleness=0`): the rollout of step k starts after the
weights of step k-1 reach the engines. Asynchronous (`max_staleness=s`):
rollout batches for up to s steps ahead are in flight while the learners
train; a batch is submitted only once the weights it may lag are out, so no
trained trace is more than s versions stale (stale ones are dropped, counted).
At a checkpoint the steps in flight are let finish and kept with it, so a
resumed asynchronous run trains exactly what the uninterrupted one would have.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from rollout.orchestration.cluster import start_ray
from rollout.orchestration.fleet import RolloutFleet
from rollout.stats import trace_metrics
from rollout.trace import Trace, write_jsonl
from trainer.checks import validate
from trainer.config import LoopConfig, TrainJobConfig
from trainer.evaluation import eval_sampling
from trainer.metrics import RunLogger, rollout_split, step_perf, step_totals, write_atomic
from trainer.policy import TrainedPolicy, start_learners, trained_policies
from trainer.run_dir import check_run_dir, restore, save, start_run_dir
from trainer.summary import mean_reward, run_summary

log = logging.getLogger(__name__)


def train(cfg: TrainJobConfig) -> dict:
    """Run the training job; returns the summary (also written to run_dir/summary.json)."""
    check(cfg)
    loop, started = cfg.trainer, time.time()
    run_dir, resume_from = start_run_dir(cfg)
    seed_everything(cfg.seed)
    start_ray(cfg.ray, cfg.cpus_asked(), cfg.asks())

    with ExitStack() as actors:
        # ---- actors: the rollout fleet, each trained policy's learners -------------------
        learners = start_learners(cfg, actors, gpu=False)  # they come up while the engines start
        fleet = actors.enter_context(RolloutFleet(cfg))
        policies = trained_policies(cfg, fleet, actors, learners)

        # ---- resume, the logger, and the held-out eval before training ---------------------
        first, held = restore(policies, resume_from, loop) if resume_from else (0, [])
        logger = actors.enter_context(open_logger(cfg, run_dir, first if resume_from else None))
        initial = final = evaluate(fleet, cfg, first)
        if initial:
            logger.log(first, trace_metrics(initial, "eval"))

        # ---- rollout ahead: up to max_staleness steps in flight, never more ------------
        # `held`: complete groups of the steps after the last trained one, already out of the
        # fleet (drained at a checkpoint, or read from one); `ahead`: the first step neither
        # held nor submitted
        ahead = submit_steps(fleet, first + len(held) // loop.groups_per_step, first + 1 + loop.max_staleness, loop)
        # the engines' clocks when the rollout being waited for was last submitted to
        clock = time.perf_counter(), fleet.engine_clocks()
        for step in range(first, loop.steps):
            began = time.perf_counter()
            traces, held = step_traces(fleet, held, loop)
            waited_s = time.perf_counter() - began
            check_failures(traces, loop.max_failed_fraction, f"the rollout of step {step + 1}")
            metrics = trace_metrics(traces, "rollout")
            metrics.update(rollout_split(clock[1], fleet.engine_clocks(), time.perf_counter() - clock[0]))

            # ---- per policy: leave out what is too stale, one optimizer step, sync -------
            for policy in policies.values():
                metrics.update(policy.step(traces, loop.max_staleness))
            metrics.update(step_totals(metrics, list(policies)))

            # ---- the engines have the new weights: the next rollout may start ----------
            ahead = submit_steps(fleet, ahead, step + 2 + loop.max_staleness, loop)
            clock = time.perf_counter(), fleet.engine_clocks()

            # ---- log, checkpoint, evaluate ---------------------------------------------
            metrics.update(step_perf(traces, metrics, waited_s, time.perf_counter() - began, fleet.engine_restarts()))
            done = step + 1
            # the checkpoint first: an eval that fails (the breaker) must not lose the step's training
            if every(loop.save_every, done, loop.steps):
                held = save(policies, fleet, run_dir, done, ahead, held, loop)
            if every(loop.eval_every, done, loop.steps):
                final = evaluate(fleet, cfg, done)
                metrics.update(trace_metrics(final, "eval") if final else {})
            log_step(logger, run_dir, done, traces, metrics, policies, loop)

        # ---- summary ---------------------------------------------------------------------
        summary = run_summary(initial, final, first, time.time() - started, fleet, policies, loop)
    write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2, allow_nan=False))
    return summary


# ---- the pieces train() calls -------------------------------------------------------------


def check(cfg: TrainJobConfig) -> None:
    """Everything that can be checked before Ray starts: the config, and what run_dir holds."""
    validate(cfg)
    check_run_dir(cfg)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def open_logger(cfg: TrainJobConfig, run_dir: Path, resume_step: int | None) -> RunLogger:
    """metrics.jsonl and wandb (cfg.logger), the config logged with them; a resumed run keeps the
    rows up to `resume_step`."""
    wandb = cfg.logger
    return RunLogger(run_dir, wandb.mode, wandb.project, wandb.name, asdict(cfg), resume_step)


def step_tasks(step: int, groups_per_step: int) -> list[int]:
    """The task indices of `step`'s groups: a function of the step alone, so a resumed run
    sees the tasks the uninterrupted one would have."""
    return list(range(step * groups_per_step, (step + 1) * groups_per_step))


def submit_steps(fleet: RolloutFleet, first: int, end: int, loop: LoopConfig) -> int:
    """Submit the groups of steps `first` .. `end - 1` (none past the last step); returns the
    first step not submitted."""
    for k in range(first, min(loop.steps, end)):
        fleet.submit(step_tasks(k, loop.groups_per_step))
    return max(first, min(loop.steps, end))


def step_traces(fleet: RolloutFleet, held: list[list[Trace]], loop: LoopConfig) -> tuple[list[Trace], list]:
    """One step's traces (the first held groups, else the fleet's next complete ones) and the
    groups still held. In the order of their ids, not of arrival (which varies from run to run):
    the same groups pack into the same rows and micro-batches, so a resumed step repeats the
    uninterrupted run's arithmetic."""
    groups, held = held[: loop.groups_per_step], held[loop.groups_per_step :]
    groups = groups or fleet.take(loop.groups_per_step, loop.rollout_timeout_s)
    return sorted((tr for group in groups for tr in group), key=lambda tr: (tr.group, tr.id)), held


def every(period: int, done: int, last: int | None = None) -> bool:
    """Whether `done` steps are a multiple of `period` (0: never), or the `last` step."""
    return bool(period and done % period == 0) or done == last


def log_step(
    logger: RunLogger,
    run_dir: Path,
    done: int,
    traces: list[Trace],
    metrics: dict[str, float],
    policies: dict[str, TrainedPolicy],
    loop: LoopConfig,
) -> None:
    """The step's row in metrics.jsonl (and wandb) and its status line; every so often its traces
    to run_dir/rollouts/ (for the trace viewer and scripts/bench/e2e.py) and a few to wandb."""
    if every(loop.rollouts_every, done):
        write_jsonl(traces, run_dir / "rollouts" / f"step_{done}.jsonl")
    if every(loop.log_traces_every, done):
        logger.traces(done, traces[:4], next(iter(policies.values())).format.decode)
    logger.log(done, metrics)
    logger.status(done, loop.steps, metrics, list(policies))


def evaluate(fleet: RolloutFleet, cfg: TrainJobConfig, step: int) -> list[Trace]:
    """One harness run per held-out task, in task order, with eval sampling (never trained on);
    kept in run_dir/eval/step_<step>.jsonl for the trace viewer. [] when eval.size is 0."""
    e = cfg.eval
    if e.size == 0:
        return []
    traces = fleet.evaluate(e.size, eval_sampling(cfg), e.timeout_s)
    write_jsonl(traces, Path(cfg.run_dir) / "eval" / f"step_{step}.jsonl")
    check_failures(traces, cfg.trainer.max_failed_fraction, f"the eval at step {step}")
    log.info(f"[train] eval at step {step}: reward {mean_reward(traces):.3f} on {len(traces)} held-out tasks")
    return traces


def check_failures(traces: list[Trace], limit: float, what: str) -> None:
    """Stop the run (RuntimeError with the commonest errors) when more than `limit` of the traces
    failed: training or evaluating on failures measures the infrastructure, not the model."""
    failed = [t.error or "no error recorded" for t in traces if t.status == "failed"]
    if traces and len(failed) > limit * len(traces):
        top = Counter(e.strip().splitlines()[0][:300] for e in failed).most_common(3)
        raise RuntimeError(
            f"{what}: {len(failed)} of {len(traces)} traces failed, more than "
            f"trainer.max_failed_fraction={limit}; the commonest errors: " + "; ".join(f"{n}x {e}" for e, n in top)
        )
