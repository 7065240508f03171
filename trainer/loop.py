"""The training loop: rollout -> buffer -> advantages -> packing -> learners -> weight sync.

Read top to bottom. `train(cfg)` starts the actors, evaluates, then per step:
take `groups_per_step` complete groups from the buffer, drop traces more than
`max_staleness` versions old, compute advantages per sequence, merge and
pack, take one optimizer step on the DeepSpeed ranks, push the new weights
into the engines, log, and every so often evaluate and checkpoint.

Synchronous (`max_staleness=0`): the rollout of step k starts after the
weights of step k-1 reach the engines. Asynchronous (`max_staleness=s`):
rollout batches for up to s steps ahead are in flight while the learners
train; a batch is submitted only once the weights it may lag are out, so no
trained trace is more than s versions stale (stale ones are dropped, counted).
"""

from __future__ import annotations

import json
import math
import random
import time
from collections import deque
from dataclasses import asdict
from pathlib import Path

import numpy as np
import ray
import torch
from omegaconf import OmegaConf

from rollout.client import ChatFormat
from rollout.cluster import spawn_buffer, spawn_engines, spawn_workers, start_ray
from rollout.config import FROZEN_POLICY, SamplingConfig
from rollout.models import resolve_model
from rollout.trace import Trace, write_jsonl
from trainer import checkpoint
from trainer.advantages import advantage_stats, compute_advantages
from trainer.config import TrainJobConfig, validate
from trainer.learner_group import LearnerGroup
from trainer.metrics import RunLogger
from trainer.packing import build_rows, pack, packing_stats, token_weights
from trainer.weight_sync import ObjectStoreSync


def staleness(trace: Trace, version: int) -> int:
    """How many versions behind `version` the oldest trainable sequence of the trace is."""
    versions = [s.version for s in trace.sequences if s.trainable]
    return version - min(versions) if versions else 0


def rollout_metrics(traces: list[Trace]) -> dict[str, float]:
    n = max(len(traces), 1)
    m = {"rollout/reward": sum(t.reward for t in traces) / n,
         "rollout/success": sum(t.reward >= 1.0 for t in traces) / n,
         "rollout/failed": float(sum(t.status == "failed" for t in traces)),
         "rollout/truncated": float(sum(t.status == "truncated" for t in traces)),
         "rollout/sequences_per_trace": sum(len(t.sequences) for t in traces) / n,
         "rollout/generated_tokens": float(sum(t.num_generated_tokens for t in traces))}
    m.update({f"rollout/reward/{role}": r for role, r in agent_means(traces).items()})
    return m


def agent_means(traces: list[Trace]) -> dict[str, float]:
    """Mean per-agent reward of each role, over the traces that have per-agent rewards."""
    by_agent: dict[str, list[float]] = {}
    for t in traces:
        for role, r in (t.agent_rewards or {}).items():
            by_agent.setdefault(role, []).append(r)
    return {role: sum(v) / len(v) for role, v in sorted(by_agent.items())}


def train_metrics(stats: dict[str, float], packing: dict[str, float]) -> dict[str, float]:
    tokens = max(stats["tokens"], 1.0)
    return {"train/loss": stats["loss"], "train/grad_norm": stats["grad_norm"], "train/lr": stats["lr"],
            "train/trained_tokens": stats["tokens"], "train/clip_frac": stats["clip_frac"] / tokens,
            "train/ratio_mean": stats["ratio"] / tokens, "train/ratio_max": stats["ratio_max"],
            "train/mismatch_kl": stats["mismatch_kl"] / tokens, "train/kl_ref": stats["kl_ref"] / tokens,
            "train/entropy": stats["entropy"] / tokens, "train/merge_saving": packing["merge_saving"],
            "train/padding_fraction": packing["padding_fraction"], "train/rows": packing["rows"]}


def mean_reward(traces: list[Trace]) -> float:
    return sum(t.reward for t in traces) / len(traces) if traces else float("nan")


def eval_metrics(traces: list[Trace]) -> dict[str, float]:
    """eval/reward, eval/success, and eval/reward/<role> for harnesses with per-agent rewards."""
    m = {"eval/reward": mean_reward(traces),
         "eval/success": sum(t.reward >= 1.0 for t in traces) / len(traces) if traces else float("nan")}
    m.update({f"eval/reward/{role}": r for role, r in agent_means(traces).items()})
    return m


def paired_comparison(before: list[Trace], after: list[Trace]) -> dict[str, float]:
    """How the same held-out tasks moved between two evals: tasks that got better / worse,
    and the two-sided sign-test p-value of that split (ties dropped) — the noise check for
    "did eval reward really rise" that two independent means cannot give on a small set."""
    better = sum(a.reward > b.reward for b, a in zip(before, after))
    worse = sum(a.reward < b.reward for b, a in zip(before, after))
    n, k = better + worse, min(better, worse)
    p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0
    return {"better": better, "worse": worse, "sign_test_p": p}


class Run:
    """The actors of one training run, and the few calls the loop makes on them."""

    def __init__(self, cfg: TrainJobConfig):
        self.cfg = cfg
        self.model_path = resolve_model(cfg.model.name, cfg.model.path)
        start_ray(cfg.ray)
        policies = sorted(set(cfg.agents.values()))
        self.engines = {p: spawn_engines(self.model_path, cfg.model, cfg.engine, p, seed=cfg.trainer.seed)
                        for p in policies}
        vocab = ray.get(self.engines["main"][0].info.remote())["vocab_size"]
        self.buffer = spawn_buffer("main", cfg.rollout.group_size, {p: vocab for p in policies})
        self.workers = spawn_workers(cfg.rollout, cfg.harness, cfg.task, cfg.agents, self.engines,
                                     {p: self.model_path for p in policies}, cfg.sampling, self.buffer)
        self.format = ChatFormat.from_pretrained(self.model_path)
        tok = self.format.tok
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        loss = cfg.algorithm.loss
        self.learners = LearnerGroup(self.model_path, cfg.learner, loss, cfg.trainer.seed, self.pad_id)
        self.sync = ObjectStoreSync(self.learners, self.engines["main"])
        self.inflight: deque = deque()  # ObjectRefs of RolloutWorker.run calls

    def submit(self, step: int) -> None:
        """Start the rollout of `step`'s task groups, spread over the workers."""
        g = self.cfg.trainer.groups_per_step
        indices = list(range(step * g, (step + 1) * g))
        n = len(self.workers)
        self.inflight.extend(w.run.remote(indices[i::n]) for i, w in enumerate(self.workers) if indices[i::n])

    def take(self, num_groups: int) -> list[Trace]:
        """Block until `num_groups` complete groups are buffered; re-raise a dead worker's error."""
        deadline = time.perf_counter() + self.cfg.trainer.rollout_timeout_s
        groups: list[list[Trace]] = []
        while len(groups) < num_groups:
            groups += ray.get(self.buffer.get.remote(num_groups - len(groups), timeout_s=10.0))
            done, _ = ray.wait(list(self.inflight), num_returns=len(self.inflight), timeout=0)
            for ref in done:
                ray.get(ref)  # raises if the worker died
                self.inflight.remove(ref)
            if len(groups) < num_groups and (not self.inflight or time.perf_counter() > deadline):
                raise RuntimeError(f"rollout produced {len(groups)}/{num_groups} groups; buffer: "
                                   f"{ray.get(self.buffer.stats.remote())}")
        return [t for g in groups for t in g]

    def evaluate(self, step: int) -> list[Trace]:
        """One harness run per held-out task, in task order (eval sampling, not trained on);
        kept in run_dir/eval/step_<step>.jsonl for the trace viewer."""
        e = self.cfg.eval
        sampling = SamplingConfig(temperature=e.temperature, max_tokens=e.max_tokens or self.cfg.sampling.max_tokens)
        n = len(self.workers)
        parts = ray.get([w.evaluate.remote(list(range(i, e.size, n)), sampling) for i, w in enumerate(self.workers)])
        traces: list = [None] * e.size
        for i, part in enumerate(parts):
            for index, trace in zip(range(i, e.size, n), part):
                traces[index] = trace
        write_jsonl(traces, Path(self.cfg.run_dir) / "eval" / f"step_{step}.jsonl")
        return traces

    def checkpoint(self, step: int, version: int) -> None:
        d = checkpoint.save(self.learners, self.model_path, self.cfg.run_dir, step)
        # No RNG state to keep: tasks come from the step number and every model call samples
        # with a seed derived from (rollout.seed, trace id, role, call number).
        state = {"step": step, "version": version}
        (d / "trainer_state.json").write_text(json.dumps(state))

    def resume(self, run_dir: str) -> int:
        """Load the newest checkpoint of `run_dir` into the learners and engines; returns its step."""
        d = checkpoint.latest(run_dir)
        if d is None:
            raise FileNotFoundError(f"trainer.resume={run_dir!r}: no checkpoint under {run_dir}/checkpoints")
        state = json.loads((d / "trainer_state.json").read_text())
        self.learners.load(str(d / "deepspeed"))
        self.sync.push(state["version"])
        return state["step"]

    def shutdown(self) -> None:
        self.learners.shutdown()
        for actor in [*self.workers, self.buffer, *(e for pool in self.engines.values() for e in pool)]:
            ray.kill(actor)


def train(cfg: TrainJobConfig) -> dict:
    """Run the training job; returns the summary (also written to run_dir/summary.json)."""
    validate(cfg)
    t_start = time.time()
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    random.seed(cfg.trainer.seed)
    np.random.seed(cfg.trainer.seed)
    torch.manual_seed(cfg.trainer.seed)

    # ---- actors --------------------------------------------------------------------
    run = Run(cfg)
    try:
        return _loop(cfg, run, t_start)
    finally:
        run.shutdown()


def _loop(cfg: TrainJobConfig, run: Run, t_start: float) -> dict:
    logger = RunLogger(Path(cfg.run_dir), cfg.logger.backend, cfg.logger.mode, cfg.logger.project,
                       cfg.logger.name, asdict(cfg), resume=bool(cfg.trainer.resume))
    try:
        return _steps(cfg, run, logger, t_start)
    finally:
        logger.close()


def _steps(cfg: TrainJobConfig, run: Run, logger: RunLogger, t_start: float) -> dict:
    t, run_dir = cfg.trainer, Path(cfg.run_dir)
    start = run.resume(t.resume) if t.resume else 0
    version = start
    initial = final = run.evaluate(start)
    print(f"[train] eval before step {start}: reward {mean_reward(initial):.3f} on {cfg.eval.size} held-out tasks",
          flush=True)
    logger.log(start, eval_metrics(initial))

    # ---- rollout ahead: s steps of lag in flight, no more -------------------------
    for k in range(start, min(t.steps, start + 1 + t.max_staleness)):
        run.submit(k)
    trained_tokens, dropped = 0.0, 0
    for step in range(start, t.steps):
        t0 = time.perf_counter()
        traces = run.take(t.groups_per_step)
        t_wait = time.perf_counter() - t0

        # ---- drop what is too stale, then advantages and packing ------------------
        fresh = [tr for tr in traces if staleness(tr, version) <= t.max_staleness]
        dropped += len(traces) - len(fresh)
        lags = [staleness(tr, version) for tr in fresh] or [0]
        advs = compute_advantages(fresh, cfg.algorithm.advantage)
        weights = token_weights(fresh, cfg.algorithm.loss.normalization, cfg.algorithm.loss.constant)
        rows = build_rows(fresh, advs, weights, merge=cfg.algorithm.merge_prefixes,
                          skip_zero_advantage=cfg.algorithm.loss.kl_coef == 0)
        batches = pack(rows, cfg.learner.micro_batch_tokens, run.pad_id)

        # ---- train, then weights to the engines --------------------------------------
        t1 = time.perf_counter()
        stats = run.learners.train_step(batches) if batches else None
        t_train = time.perf_counter() - t1
        version += 1
        sync = run.sync.push(version)
        if step + 1 + t.max_staleness < t.steps:
            run.submit(step + 1 + t.max_staleness)  # the next rollout may now start

        # ---- log -----------------------------------------------------------------------
        m = rollout_metrics(traces)
        m.update({f"rollout/adv_{k.split('/')[1]}": v for k, v in advantage_stats(fresh, advs).items()})
        if stats is not None:
            m.update(train_metrics(stats, packing_stats(rows, batches)))
            trained_tokens += stats["tokens"]
        step_s = time.perf_counter() - t0
        m.update({"perf/rollout_wait_s": t_wait, "perf/train_s": t_train, "perf/sync_s": sync["seconds"],
                  "perf/step_s": step_s, "perf/train_tokens_per_s": (stats or {}).get("tokens", 0.0) / max(t_train, 1e-9),
                  "perf/rollout_tokens_per_s": m["rollout/generated_tokens"] / max(step_s, 1e-9),
                  "sync/seconds": sync["seconds"], "sync/bytes_per_s": sync["bytes_per_s"],
                  "async/staleness_mean": float(np.mean(lags)), "async/staleness_max": float(max(lags)),
                  "async/dropped_stale": float(dropped), "async/version": float(version)})
        done = step + 1
        if (t.eval_every and done % t.eval_every == 0) or done == t.steps:
            final = run.evaluate(done)
            m.update(eval_metrics(final))
        if t.log_traces_every and done % t.log_traces_every == 0:
            logger.traces(done, traces[:4], run.format.decode)
        logger.log(done, m)
        logger.status(done, t.steps, m)
        if (t.save_every and done % t.save_every == 0) or done == t.steps:
            run.checkpoint(done, version)

    # ---- summary -------------------------------------------------------------------
    infos = ray.get([e.info.remote() for pool in run.engines.values() for e in pool])
    summary = {"initial_eval_reward": mean_reward(initial), "final_eval_reward": mean_reward(final),
               "eval_size": cfg.eval.size, "eval_paired": paired_comparison(initial, final),
               "initial_eval": eval_metrics(initial), "final_eval": eval_metrics(final),
               "steps": t.steps, "start_step": start, "wall_s": round(time.time() - t_start, 1),
               "trained_tokens": trained_tokens, "dropped_stale": dropped,
               "trainable_policies": sorted({p for p in cfg.agents.values() if p != FROZEN_POLICY}),
               "engine_busy_s": sum(i["busy_s"] for i in infos if i["policy"] != FROZEN_POLICY),
               "nodes": {"engines": [i["node_id"] for i in infos], "learners": run.learners.node_ids}}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
