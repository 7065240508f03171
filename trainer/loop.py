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
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from rollout.orchestration.cluster import start_ray
from rollout.orchestration.fleet import RolloutFleet
from rollout.stats import trace_metrics
from rollout.trace import Trace, read_jsonl, write_jsonl
from trainer import checkpoint
from trainer.checks import validate
from trainer.config import LoopConfig, TrainJobConfig
from trainer.evaluation import eval_sampling
from trainer.learner_group import LearnerFailed
from trainer.ledger import Ledger
from trainer.metrics import RunLogger, rollout_split, step_perf, step_totals, write_atomic
from trainer.policy import TrainedPolicy, start_learners, trained_policies
from trainer.run_dir import check_run_dir, restore, save, start_run_dir
from trainer.steps import stale_ids, step_traces, submit_steps
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
        first, held, ledger = restore(policies, resume_from, loop) if resume_from else (0, [], Ledger())
        logger = actors.enter_context(open_logger(cfg, run_dir, first if resume_from else None))
        initial = final = evaluate(fleet, cfg, first, again=resume_from is not None)
        if initial and not logger.logged(first, "eval/"):
            logger.log(first, trace_metrics(initial, "eval"))

        # ---- the steps: rollout ahead, train, sync, log, checkpoint, evaluate -------------
        at = start_rollout(fleet, Position(first, held, ledger), loop)
        while at.step < loop.steps:
            try:
                final = train_step(cfg, fleet, policies, logger, run_dir, at) or final
            except LearnerFailed as e:
                # ---- a learner rank died or hung: new ranks, back to the last checkpoint ----
                policies, at = rebuild_learners(cfg, fleet, actors, policies, logger, resume_from, at, e)

        # ---- summary ---------------------------------------------------------------------
        summary = run_summary(initial, final, first, time.time() - started, fleet, policies, loop)
        summary |= {"ledger": at.ledger.summary(), "learner_restarts": at.learner_restarts}
    write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2, allow_nan=False))
    return summary


@dataclass
class Position:
    """Where the loop stands: the next step to train, the complete groups already out of the fleet
    for the steps after it (`held`: drained at a checkpoint, or read from one), the ledger, and
    (start_rollout) the first step neither held nor submitted and the engines' clocks when the
    rollout waited for was submitted to."""

    step: int
    held: list[list[Trace]]
    ledger: Ledger
    ahead: int = 0
    clock: tuple = ()
    learner_restarts: int = 0  # learner groups rebuilt in this run
    rebuild_s: float = 0.0  # the last rebuild's seconds, from the failure to the rollout going again


def start_rollout(fleet: RolloutFleet, at: Position, loop: LoopConfig) -> Position:
    """Submit the rollout ahead of `at.step`: up to max_staleness steps in flight, never more."""
    resumed_at = at.step + len(at.held) // loop.groups_per_step
    at.ahead = submit_steps(fleet, at.ledger, resumed_at, at.step + 1 + loop.max_staleness, loop)
    at.clock = time.perf_counter(), fleet.engine_clocks()
    return at


def train_step(
    cfg: TrainJobConfig,
    fleet: RolloutFleet,
    policies: dict[str, TrainedPolicy],
    logger: RunLogger,
    run_dir: Path,
    at: Position,
) -> list[Trace] | None:
    """Step `at.step` + 1: its groups, one optimizer step and a weight push per policy, the next
    rollout submitted; its row, a checkpoint and an eval when due. Advances `at`; returns the eval's
    traces if it ran one."""
    loop, began, step = cfg.trainer, time.perf_counter(), at.step
    traces, at.held = step_traces(fleet, at.ledger, at.held, loop)
    waited_s = time.perf_counter() - began
    check_failures(traces, loop.max_failed_fraction, f"the rollout of step {step + 1}")
    metrics = trace_metrics(traces, "rollout")
    metrics.update(rollout_split(at.clock[1], fleet.engine_clocks(), time.perf_counter() - at.clock[0]))

    # ---- per policy: leave out what is too stale, one optimizer step, sync -------
    for policy in policies.values():
        metrics.update(policy.step(traces, loop.max_staleness))
    metrics.update(step_totals(metrics, list(policies)))
    at.ledger.settle(stale_ids(traces, policies))

    # ---- the engines have the new weights: the next rollout may start ----------
    at.ahead = submit_steps(fleet, at.ledger, at.ahead, step + 2 + loop.max_staleness, loop)
    at.clock = time.perf_counter(), fleet.engine_clocks()

    # ---- log, checkpoint, evaluate ---------------------------------------------
    metrics.update(step_perf(traces, metrics, waited_s, time.perf_counter() - began, fleet.engine_restarts()))
    metrics.update({**at.ledger.metrics(), **fault_metrics(fleet, at)})
    at.step = done = step + 1
    # the step's row and rollouts first, then the checkpoint: a driver killed between them resumes
    # from the checkpoint before and makes the row again; never a checkpoint without its step's
    # row. Then the eval: one that fails (the breaker) loses no training.
    log_step(logger, run_dir, done, traces, metrics, policies, loop)
    if every(loop.save_every, done, loop.steps):
        at.held = save(policies, fleet, run_dir, done, at.ahead, at.held, loop, at.ledger)
    if not every(loop.eval_every, done, loop.steps):
        return None
    final = evaluate(fleet, cfg, done)
    if final:
        logger.log(done, trace_metrics(final, "eval"))
    return final


def rebuild_learners(
    cfg: TrainJobConfig,
    fleet: RolloutFleet,
    stack: ExitStack,
    policies: dict[str, TrainedPolicy],
    logger: RunLogger,
    resume_from: Path | None,
    at: Position,
    error: LearnerFailed,
) -> tuple[dict[str, TrainedPolicy], Position]:
    """A learner rank died (or hung past learner.call_timeout_s) at step `at.step` + 1: every policy
    gets new ranks, the run goes back to its newest checkpoint (its weights, optimizer, ledger and
    held rollouts; none yet: the start), the rollouts in flight are dropped (the buffer fences them
    off), and the steps since run again, as a resume would, inside the run. Bounded by
    trainer.max_learner_restarts; takes a learner start, a checkpoint load and weight push, and
    the steps since the checkpoint (at most trainer.save_every)."""
    loop, t0 = cfg.trainer, time.perf_counter()
    if at.learner_restarts >= loop.max_learner_restarts:
        raise RuntimeError(
            f"{error}; the learners were rebuilt {at.learner_restarts} times already "
            f"(trainer.max_learner_restarts={loop.max_learner_restarts})"
        ) from error
    log.warning(f"[train] {error}: starting new learner ranks and going back to the last checkpoint")
    for policy in policies.values():
        policy.close()
    policies = trained_policies(cfg, fleet, stack)
    fleet.reset()
    source = Path(cfg.run_dir) if checkpoint.latest(cfg.run_dir) else resume_from
    if source is not None:
        first, held, ledger = restore(policies, source, loop)
    else:  # no checkpoint yet: from the start, the engines back on the model's own weights
        first, held, ledger = 0, [], Ledger()
        for policy in policies.values():
            policy.sync.push(policy.version)
    logger.rewind(first)
    restarts = at.learner_restarts + 1
    at = start_rollout(fleet, Position(first, held, ledger, learner_restarts=restarts), loop)
    at.rebuild_s = time.perf_counter() - t0
    log.warning(
        f"[train] learners rebuilt ({restarts} of trainer.max_learner_restarts={loop.max_learner_restarts}) "
        f"in {at.rebuild_s:.1f} s; training again from step {first}"
    )
    return policies, at


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


def fault_metrics(fleet: RolloutFleet, at: Position) -> dict[str, float]:
    """What the run survived so far (faults/*): learner rebuilds, worker restarts and calls rerun,
    the watchdog's restarts, its errors, and whether its thread still runs."""
    w = fleet.watchdog
    return {
        "faults/learner_restarts": float(at.learner_restarts),
        "faults/learner_rebuild_s": at.rebuild_s,
        "faults/worker_restarts": float(fleet.worker_restarts),
        "faults/unavailable_calls": float(fleet.unavailable_calls),
        "faults/engines_hung": float(w.hung_engines if w else 0),
        "faults/workers_hung": float(w.hung_workers if w else 0),
        "faults/watchdog_errors": float(w.errors if w else 0),
        "faults/watchdog_alive": float(bool(w and (w.alive or w.period_s == 0))),
    }


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
    to run_dir/rollouts/ (for the trace viewer and tools/bench/e2e.py) and a few to wandb."""
    if every(loop.rollouts_every, done):
        write_jsonl(traces, run_dir / "rollouts" / f"step_{done}.jsonl")
    if every(loop.log_traces_every, done):
        logger.traces(done, traces[:4], next(iter(policies.values())).format.decode)
    logger.log(done, metrics)
    logger.status(done, loop.steps, metrics, list(policies))


def evaluate(fleet: RolloutFleet, cfg: TrainJobConfig, step: int, again: bool = False) -> list[Trace]:
    """One harness run per held-out task, in task order, with eval sampling (never trained on);
    kept in run_dir/eval/step_<step>.jsonl for the trace viewer. [] when eval.size is 0. `again`:
    a resumed run's eval at its checkpoint's step, read from that file when the run before had
    written it whole (the same weights: the same eval), instead of run twice."""
    e = cfg.eval
    if e.size == 0:
        return []
    path = Path(cfg.run_dir) / "eval" / f"step_{step}.jsonl"
    if again and path.exists():
        traces = list(read_jsonl(path))
        if len(traces) == e.size:
            log.info(f"[train] eval at step {step}: read from {path} (written before the resume)")
            return traces
    traces = fleet.evaluate(e.size, eval_sampling(cfg), e.timeout_s)
    write_jsonl(traces, path)
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
