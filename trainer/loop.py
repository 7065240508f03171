"""The training loop: rollout -> buffer -> advantages -> packing -> learners -> weight sync.

Read `train(cfg)` top to bottom. It starts the rollout fleet (rollout/fleet.py),
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
"""

from __future__ import annotations

import json
import random
import time
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from rollout.cluster import start_ray
from rollout.config import SamplingConfig
from rollout.fleet import RolloutFleet
from rollout.stats import trace_metrics
from rollout.trace import Trace, write_jsonl
from trainer.config import TrainJobConfig, validate
from trainer import checkpoint
from trainer.metrics import RunLogger, paired_comparison, step_totals
from trainer.policy import TrainedPolicy


def train(cfg: TrainJobConfig) -> dict:
    """Run the training job; returns the summary (also written to run_dir/summary.json)."""
    validate(cfg)
    t, run_dir, t_start = cfg.trainer, start_run_dir(cfg), time.time()
    seed_everything(cfg.seed)
    start_ray(cfg.ray)

    with ExitStack() as actors:
        # ---- actors: the rollout fleet, each trained policy's learners, the logger -------
        fleet = actors.enter_context(RolloutFleet(cfg))
        policies = {p: actors.enter_context(TrainedPolicy(cfg, p, fleet)) for p in cfg.trainable_policies()}
        logger = actors.enter_context(RunLogger(run_dir, cfg.logger.mode, cfg.logger.project, cfg.logger.name,
                                                asdict(cfg), resume=bool(t.resume)))

        # ---- resume, and the held-out eval before training -----------------------------
        start = restore(policies, t.resume) if t.resume else 0
        initial = final = evaluate(fleet, cfg, start)
        if initial:
            logger.log(start, trace_metrics(initial, "eval"))

        # ---- rollout ahead: up to max_staleness steps in flight, never more ------------
        for k in range(start, min(t.steps, start + 1 + t.max_staleness)):
            fleet.submit(step_tasks(k, t.groups_per_step))
        for step in range(start, t.steps):
            t0 = time.perf_counter()
            traces = [tr for group in fleet.take(t.groups_per_step, t.rollout_timeout_s) for tr in group]
            t_wait = time.perf_counter() - t0

            # ---- per policy: leave out what is too stale, one optimizer step, sync -------
            m = trace_metrics(traces, "rollout")
            for policy in policies.values():
                m.update(policy.train(traces, t.max_staleness))
            m.update(step_totals(m, list(policies)))

            # ---- the engines have the new weights: the next rollout may start ----------
            if step + 1 + t.max_staleness < t.steps:
                fleet.submit(step_tasks(step + 1 + t.max_staleness, t.groups_per_step))

            # ---- log, evaluate, checkpoint ---------------------------------------------
            step_s = time.perf_counter() - t0
            m.update({"perf/rollout_wait_s": t_wait, "perf/step_s": step_s,
                      "perf/rollout_tokens_per_s": m["rollout/generated_tokens"] / step_s})
            done = step + 1
            if (t.eval_every and done % t.eval_every == 0) or done == t.steps:
                final = evaluate(fleet, cfg, done)
                m.update(trace_metrics(final, "eval") if final else {})
            if t.log_traces_every and done % t.log_traces_every == 0:
                logger.traces(done, traces[:4], next(iter(policies.values())).format.decode)
            logger.log(done, m)
            logger.status(done, t.steps, m, list(policies))
            if (t.save_every and done % t.save_every == 0) or done == t.steps:
                save(policies, run_dir, done)

        # ---- summary ---------------------------------------------------------------------
        summary = {**eval_summary(initial, final), "steps": t.steps, "start_step": start,
                   "wall_s": round(time.time() - t_start, 1), **policy_summary(fleet, policies)}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False))
    return summary


# ---- the pieces train() calls -------------------------------------------------------------

def start_run_dir(cfg: TrainJobConfig) -> Path:
    """Create run_dir and record the resolved config in it (config.yaml)."""
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    return run_dir


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def step_tasks(step: int, groups_per_step: int) -> list[int]:
    """The task indices of `step`'s groups: a function of the step alone, so a resumed run
    sees the tasks the uninterrupted one would have."""
    return list(range(step * groups_per_step, (step + 1) * groups_per_step))


def save(policies: dict[str, TrainedPolicy], run_dir: Path, step: int) -> None:
    """One checkpoint of every trained policy at `step`, marked complete once all are written."""
    for policy in policies.values():
        policy.save(run_dir, step)
    checkpoint.finish(run_dir, step, {p: policy.version for p, policy in policies.items()})


def restore(policies: dict[str, TrainedPolicy], run_dir: str) -> int:
    """Every trained policy from the newest complete checkpoint of `run_dir`; returns its step."""
    ckpt, state = checkpoint.newest_state(run_dir)
    if "versions" not in state:
        raise ValueError(f"trainer.resume={run_dir!r}: {ckpt} is in the one-policy layout of older tracerl "
                         f"versions (hf/ and deepspeed/ at its top); move them into {ckpt}/main/ and write "
                         f'"versions": {{"main": {state.get("version")}}} into its trainer_state.json')
    missing = sorted(set(policies) - set(state["versions"]))
    if missing:
        raise ValueError(f"trainer.resume={run_dir!r}: {ckpt.name} has no policies {missing} "
                         f"(it holds {sorted(state['versions'])})")
    for p, policy in policies.items():
        policy.restore(ckpt, state["versions"][p])
    return state["step"]


def evaluate(fleet: RolloutFleet, cfg: TrainJobConfig, step: int) -> list[Trace]:
    """One harness run per held-out task, in task order, with eval sampling (never trained on);
    kept in run_dir/eval/step_<step>.jsonl for the trace viewer. [] when eval.size is 0."""
    e = cfg.eval
    if e.size == 0:
        return []
    sampling = SamplingConfig(temperature=e.temperature, max_tokens=e.max_tokens or cfg.sampling.max_tokens)
    traces = fleet.evaluate(e.size, sampling, e.timeout_s)
    write_jsonl(traces, Path(cfg.run_dir) / "eval" / f"step_{step}.jsonl")
    print(f"[train] eval at step {step}: reward {mean_reward(traces):.3f} on {len(traces)} held-out tasks",
          flush=True)
    return traces


def mean_reward(traces: list[Trace]) -> float | None:
    return sum(t.reward for t in traces) / len(traces) if traces else None


def eval_summary(initial: list[Trace], final: list[Trace]) -> dict:
    """Held-out reward before and after (None without an eval), how many eval runs failed (an
    infrastructure problem, not a weak model), and the paired comparison by question."""
    return {"initial_eval_reward": mean_reward(initial), "final_eval_reward": mean_reward(final),
            "eval_size": len(final), "eval_paired": paired_comparison(initial, final),
            "eval_failed": {"initial": sum(t.status == "failed" for t in initial),
                            "final": sum(t.status == "failed" for t in final)},
            "initial_eval": trace_metrics(initial, "eval") if initial else {},
            "final_eval": trace_metrics(final, "eval") if final else {}}


def policy_summary(fleet: RolloutFleet, policies: dict[str, TrainedPolicy]) -> dict:
    """What each trained policy got (tokens, versions, stale traces left out), and where the actors ran."""
    infos = fleet.engine_infos()
    per_policy = {p: {**policy.summary(), "engine_nodes": [i["node_id"] for i in infos if i["policy"] == p],
                      "engine_busy_s": sum(i["busy_s"] for i in infos if i["policy"] == p)}
                  for p, policy in policies.items()}
    return {"trainable_policies": list(policies), "policies": per_policy,
            "trained_tokens": sum(v["trained_tokens"] for v in per_policy.values()),
            "dropped_stale": sum(v["dropped_stale"] for v in per_policy.values()),
            "engine_busy_s": sum(i["busy_s"] for i in infos),
            "nodes": {"engines": [i["node_id"] for i in infos],
                      "learners": [n for v in per_policy.values() for n in v["learner_nodes"]]}}
