"""TrainedPolicy: one trained policy's bundle — its learner ranks, the weight sync to its
engines, and its version clock.

    with TrainedPolicy(cfg, "main", fleet) as policy:
        metrics = policy.train(traces)   # advantages -> rows -> micro-batches -> one step -> sync
        policy.save(run_dir, step)

The version counts optimizer steps; every sequence records the version of its
policy's weights it was sampled from, so staleness is `version - sequence.version`.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from rollout.client import ChatFormat
from rollout.fleet import RolloutFleet
from rollout.trace import Trace
from trainer import checkpoint
from trainer.advantages import compute_advantages
from trainer.config import TrainJobConfig
from trainer.learner_group import LearnerGroup
from trainer.metrics import advantage_metrics, train_metrics
from trainer.packing import build_rows, pack, packing_stats, token_weights
from trainer.weight_sync import ObjectStoreSync


class TrainedPolicy:
    def __init__(self, cfg: TrainJobConfig, name: str, fleet: RolloutFleet):
        self.cfg, self.name = cfg, name
        self.model_path = fleet.model_paths[name]
        self.format = ChatFormat.from_pretrained(self.model_path)
        self.learners = LearnerGroup(self.model_path, cfg.learner, cfg.algorithm.loss, cfg.model.dtype,
                                     cfg.seed, self.format.pad_id)
        self.sync = ObjectStoreSync(self.learners, fleet.engines[name])
        self.version = 0  # optimizer steps taken = the engines' weight version
        self.trained_tokens = 0.0  # generated tokens trained on, this process

    def __enter__(self) -> TrainedPolicy:
        return self

    def __exit__(self, *exc) -> None:
        self.learners.shutdown()

    def staleness(self, trace: Trace) -> int:
        """How many versions behind the oldest trainable sequence of the trace is."""
        versions = [s.version for s in trace.sequences if s.trainable]
        return self.version - min(versions) if versions else 0

    def train(self, traces: list[Trace]) -> dict[str, float]:
        """Advantages per sequence, loss weights, exact-prefix rows, packed micro-batches, one
        optimizer step, then the new weights to the engines as the next version. Returns
        rollout/adv_*, train/*, sync/*, async/* and perf/{train,sync}_* metrics."""
        a = self.cfg.algorithm
        lags = [self.staleness(tr) for tr in traces] or [0]
        advs = compute_advantages(traces, a.advantage)
        weights = token_weights(traces, a.loss.normalization, a.loss.constant)
        # A zero-advantage row has zero gradient unless a KL term pulls on it.
        rows = build_rows(traces, advs, weights, merge=a.merge_prefixes, skip_zero_advantage=a.loss.kl_coef == 0)
        batches = pack(rows, self.cfg.learner.micro_batch_tokens, self.format.pad_id)
        m = advantage_metrics(traces, advs)
        t0 = time.perf_counter()
        if batches:
            m.update(train_metrics(self.learners.train_step(batches), packing_stats(rows, batches)))
            self.trained_tokens += m["train/trained_tokens"]
        train_s = time.perf_counter() - t0
        self.version += 1
        synced = self.sync.push(self.version)
        m.update({"perf/train_s": train_s, "perf/train_tokens_per_s": m.get("train/trained_tokens", 0.0) / train_s,
                  "perf/sync_s": synced["seconds"], "sync/seconds": synced["seconds"],
                  "sync/bytes_per_s": synced["bytes_per_s"], "async/staleness_mean": float(np.mean(lags)),
                  "async/staleness_max": float(max(lags)), "async/version": float(self.version)})
        return m

    def save(self, run_dir: Path, step: int) -> None:
        checkpoint.save(self.learners, self.model_path, run_dir, step, self.version)

    def restore(self, run_dir: str) -> int:
        """Load the newest checkpoint of `run_dir` and push its weights to the engines; returns its step."""
        state = checkpoint.restore(self.learners, run_dir)
        self.version = state["version"]
        self.sync.push(self.version)
        return state["step"]
