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
from trainer import checkpoint
from trainer.config import LoopConfig, TrainJobConfig, validate
from trainer.evaluation import eval_sampling
from trainer.metrics import RunLogger, rollout_split, step_totals, write_atomic
from trainer.policy import TrainedPolicy, start_learners, trained_policies
from trainer.run_dir import check_run_dir, start_run_dir
from trainer.summary import eval_summary, mean_reward, policy_summary

log = logging.getLogger(__name__)


def train(cfg: TrainJobConfig) -> dict:
    """Run the training job; returns the summary (also written to run_dir/summary.json)."""
    check(cfg)
    t, t_start = cfg.trainer, time.time()
    run_dir, resume_from = start_run_dir(cfg)
    seed_everything(cfg.seed)
    start_ray(cfg.ray, cfg.cpus_asked(), cfg.asks())

    with ExitStack() as actors:
        # ---- actors: the rollout fleet, each trained policy's learners -------------------
        learners = start_learners(cfg, actors, gpu=False)  # they come up while the engines start
        fleet = actors.enter_context(RolloutFleet(cfg))
        policies = trained_policies(cfg, fleet, actors, learners)

        # ---- resume, the logger, and the held-out eval before training ---------------------
        start, held = restore(policies, resume_from) if resume_from else (0, [])
        if len(held) % t.groups_per_step:
            raise ValueError(
                f"the checkpoint keeps {len(held)} rollout groups, not whole steps of "
                f"trainer.groups_per_step={t.groups_per_step}: resume with the run's own value"
            )
        logger = actors.enter_context(
            RunLogger(
                run_dir,
                cfg.logger.mode,
                cfg.logger.project,
                cfg.logger.name,
                asdict(cfg),
                resume_step=start if resume_from else None,
            )
        )
        initial = final = evaluate(fleet, cfg, start)
        if initial:
            logger.log(start, trace_metrics(initial, "eval"))

        # ---- rollout ahead: up to max_staleness steps in flight, never more ------------
        # `held`: complete groups of the steps after the last trained one, already out of the
        # fleet (drained at a checkpoint, or read from one); `ahead`: the first step neither
        # held nor submitted
        ahead = submit_steps(fleet, start + len(held) // t.groups_per_step, start + 1 + t.max_staleness, t)
        # the engines' clocks when the rollout being waited for was last submitted to
        clock = time.perf_counter(), fleet.engine_clocks()
        for step in range(start, t.steps):
            t0 = time.perf_counter()
            groups, held = held[: t.groups_per_step], held[t.groups_per_step :]
            groups = groups or fleet.take(t.groups_per_step, t.rollout_timeout_s)
            # in the order of their ids, not of arrival (which varies from run to run): the same
            # groups pack into the same rows and micro-batches, so a resumed step repeats the
            # uninterrupted run's arithmetic
            traces = sorted((tr for group in groups for tr in group), key=lambda tr: (tr.group, tr.id))
            t_wait = time.perf_counter() - t0
            check_failures(traces, t.max_failed_fraction, f"the rollout of step {step + 1}")
            m = trace_metrics(traces, "rollout")
            m.update(rollout_split(clock[1], fleet.engine_clocks(), time.perf_counter() - clock[0]))

            # ---- per policy: leave out what is too stale, one optimizer step, sync -------
            for policy in policies.values():
                m.update(policy.train(traces, t.max_staleness))
            m.update(step_totals(m, list(policies)))

            # ---- the engines have the new weights: the next rollout may start ----------
            ahead = submit_steps(fleet, ahead, step + 2 + t.max_staleness, t)
            clock = time.perf_counter(), fleet.engine_clocks()

            # ---- log, evaluate, checkpoint ---------------------------------------------
            step_s = time.perf_counter() - t0
            m.update(
                {
                    "perf/rollout_wait_s": t_wait,
                    "perf/step_s": step_s,
                    "perf/rollout_tokens_per_s": m["rollout/generated_tokens"] / step_s,
                    "rollout/engine_restarts": float(fleet.engine_restarts()),
                    "rollout/retried": float(sum("attempts" in tr.info for tr in traces)),
                    "rollout/resent": float(sum(tr.info.get("requests_resent", 0) for tr in traces)),
                }
            )
            done = step + 1
            # the checkpoint first: an eval that fails (the breaker) must not lose the step's training
            if (t.save_every and done % t.save_every == 0) or done == t.steps:
                # the steps in flight ran (partly) on weights older than the checkpoint's: they finish and
                # are kept with it, since a resumed run could not generate them again
                in_flight = (ahead - done) * t.groups_per_step - len(held)
                held += fleet.take(in_flight, t.rollout_timeout_s) if in_flight else []
                save(policies, run_dir, done, t.keep_last, held)
            if (t.eval_every and done % t.eval_every == 0) or done == t.steps:
                final = evaluate(fleet, cfg, done)
                m.update(trace_metrics(final, "eval") if final else {})
            if t.rollouts_every and done % t.rollouts_every == 0:  # for the trace viewer and scripts/bench/e2e.py
                write_jsonl(traces, run_dir / "rollouts" / f"step_{done}.jsonl")
            if t.log_traces_every and done % t.log_traces_every == 0:
                logger.traces(done, traces[:4], next(iter(policies.values())).format.decode)
            logger.log(done, m)
            logger.status(done, t.steps, m, list(policies))

        # ---- summary ---------------------------------------------------------------------
        summary = {
            **eval_summary(initial, final),
            "steps": t.steps,
            "start_step": start,
            "wall_s": round(time.time() - t_start, 1),
            **policy_summary(fleet, policies),
        }
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


def step_tasks(step: int, groups_per_step: int) -> list[int]:
    """The task indices of `step`'s groups: a function of the step alone, so a resumed run
    sees the tasks the uninterrupted one would have."""
    return list(range(step * groups_per_step, (step + 1) * groups_per_step))


def submit_steps(fleet: RolloutFleet, first: int, end: int, t: LoopConfig) -> int:
    """Submit the groups of steps `first` .. `end - 1` (none past the last step); returns the
    first step not submitted."""
    for k in range(first, min(t.steps, end)):
        fleet.submit(step_tasks(k, t.groups_per_step))
    return max(first, min(t.steps, end))


def save(policies: dict[str, TrainedPolicy], run_dir: Path, step: int, keep_last: int, held: list[list[Trace]]) -> None:
    """One checkpoint of every trained policy at `step`, and the rollout groups `held` for the
    steps after it, visible only once all are written; then only the newest `keep_last` are kept."""
    checkpoint.start(run_dir, step)
    for policy in policies.values():
        policy.save(run_dir, step)
    checkpoint.save_rollouts(run_dir, step, held)
    checkpoint.finish(run_dir, step, {p: policy.version for p, policy in policies.items()})
    checkpoint.prune(run_dir, keep_last, step)


def restore(policies: dict[str, TrainedPolicy], run_dir: Path) -> tuple[int, list[list[Trace]]]:
    """Every trained policy from the newest checkpoint of `run_dir` that loads (the one before
    if the newest is damaged); returns its step and the rollout groups kept with it."""
    held = []

    def load(ckpt: Path, state: dict) -> None:
        if "versions" not in state:
            raise ValueError(
                f"{ckpt} is in the one-policy layout of older tracerl versions (hf/ and deepspeed/ "
                f"at its top); move them into {ckpt}/main/ and write "
                f'"versions": {{"main": {state.get("version")}}} into its trainer_state.json'
            )
        missing = sorted(set(policies) - set(state["versions"]))
        if missing:
            raise ValueError(f"{ckpt.name} has no policies {missing} (it holds {sorted(state['versions'])})")
        held[:] = checkpoint.load_rollouts(ckpt)
        for p, policy in policies.items():
            policy.restore(ckpt, state["versions"][p])

    ckpt, state = checkpoint.load_newest(run_dir, load)
    log.info(
        f"[train] resumed from {ckpt} at step {state['step']}"
        + (f" with {len(held)} rollout groups of the steps after it" if held else "")
    )
    return state["step"], held


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
