"""TrainedPolicy: one trained policy's bundle — its learner ranks, the weight sync to its
engines, and its version clock. A run has one per trainable policy.

    with TrainedPolicy(cfg, "solver", fleet) as policy:
        metrics = policy.step(traces, max_staleness)   # its rows only -> one step -> sync
        policy.save(run_dir, step)

The version counts this policy's optimizer steps; every sequence records the
version of its own policy's weights it was sampled from, so a trace's staleness
for this policy is `version - min(sequence.version)` over this policy's sequences.
A trace whose sequences come from several policies is trained by each of them
on its own sequences only: the others are marked untrainable in this policy's
view (Trace.only_policy), which leaves every advantage as it was.
"""

from __future__ import annotations

import logging
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import ray

from rollout.agents.chat_format import ChatFormat
from rollout.models import resolve_model
from rollout.orchestration.fleet import RolloutFleet
from rollout.trace import Trace
from trainer import checkpoint
from trainer.advantages import compute_advantages
from trainer.config import SyncMethod, TrainJobConfig
from trainer.learner_group import AdapterLearners, LearnerGroup
from trainer.metrics import advantage_metrics, train_metrics
from trainer.packing import MicroBatch, Row, build_rows, pack, packing_stats, share_prefixes, token_weights
from trainer.weight_sync import CollectiveSync, ObjectStoreSync

log = logging.getLogger(__name__)


def start_learners(cfg: TrainJobConfig, stack: ExitStack, gpu: bool) -> dict[str, LearnerGroup | AdapterLearners]:
    """The learner ranks of every trainable policy whose ranks are on a GPU (`gpu`) or not, asked
    to start without waiting, in `stack`. LoRA policies on one base share one group
    (cfg.learner_groups()). A run starts the CPU ones before its fleet, so that they come up while
    the engines do, and the GPU ones after: vLLM sizes its KV cache from the GPU memory free while
    it starts, which a learner loading weights onto the same GPU would skew."""
    learners: dict[str, LearnerGroup | AdapterLearners] = {}
    for group, members in cfg.learner_groups().items():
        first = members[0]
        learner = cfg.group_learner(members) if len(members) > 1 else cfg.policy_learner(first)
        if (learner.num_gpus > 0) != gpu:
            continue
        model = cfg.policy_model(first)
        path = resolve_model(model.name, model.path)
        args = (path, learner, cfg.algorithm.loss, model.dtype, cfg.seed, ChatFormat.from_pretrained(path).pad_id)
        if len(members) > 1:
            shared = stack.enter_context(
                LearnerGroup(
                    *args,
                    name=group,
                    adapters={p: (cfg.policy_lora(p), cfg.policy_learner(p)) for p in members},
                    wait=False,
                )
            )
            learners.update({p: shared.view(p) for p in members})
        else:
            learners[first] = stack.enter_context(
                LearnerGroup(*args, name=first, lora=cfg.policy_lora(first), wait=False)
            )
    return learners


def trained_policies(
    cfg: TrainJobConfig,
    fleet: RolloutFleet,
    stack: ExitStack,
    started: dict[str, LearnerGroup | AdapterLearners] | None = None,
) -> dict[str, TrainedPolicy]:
    """Every trainable policy's bundle, in `stack`, once its learners are ready: the CPU ones
    `started` before the fleet (start_learners; None: start them now), the GPU ones started here."""
    if started is None:
        started = start_learners(cfg, stack, gpu=False)
    started = {**started, **start_learners(cfg, stack, gpu=True)}
    return {p: stack.enter_context(TrainedPolicy(cfg, p, fleet, started[p].ready())) for p in cfg.trainable_policies()}


class TrainedPolicy:
    def __init__(self, cfg: TrainJobConfig, name: str, fleet: RolloutFleet, learners: AdapterLearners | None = None):
        """`learners`: this policy's view of a learner group it shares with other adapter policies
        (not shut down with this bundle); None: the bundle starts its own."""
        self.cfg, self.name = cfg, name
        self.learner_cfg = cfg.policy_learner(name)
        self.model_path = fleet.model_paths[name]
        self.format = ChatFormat.from_pretrained(self.model_path)
        self.owns_learners = learners is None
        self.learners = (
            learners
            if learners is not None
            else LearnerGroup(
                self.model_path,
                self.learner_cfg,
                cfg.algorithm.loss,
                cfg.policy_model(name).dtype,
                cfg.seed,
                self.format.pad_id,
                name=name,
                lora=cfg.policy_lora(name),
            )
        )
        self.sync = self._weight_sync(fleet)
        self.version = 0  # optimizer steps taken = the engines' weight version
        self.trained_tokens = 0.0  # generated tokens trained on, this process
        self.dropped_stale = 0  # traces this policy left out for staleness, this process
        self.stale_ids: set[str] = set()  # the ids of those it left out in its last step
        self.skipped_in_a_row = 0  # optimizer steps skipped (non-finite) since the last applied one

    def _weight_sync(self, fleet: RolloutFleet) -> CollectiveSync | ObjectStoreSync:
        """The policy's weight transport (`sync.method`); `auto` falls back to the object store
        when the collective group cannot form (say, no route between a learner and an engine node)."""
        engine, method = self.cfg.policy_engine(self.name), self.cfg.sync_method(self.name)
        args = dict(
            bucket_bytes=self.cfg.sync.bucket_mb << 20, timeout_s=engine.sync_timeout_s, store=fleet.stores[self.name]
        )
        if method == SyncMethod.collective:
            try:
                return CollectiveSync(
                    self.learners,
                    fleet.engines[self.name],
                    self.cfg.sync.transport,
                    snapshot_every=self.cfg.sync.snapshot_every,
                    **args,
                )
            except (ray.exceptions.RayError, RuntimeError, TimeoutError) as e:
                if self.cfg.sync.method == SyncMethod.collective:
                    raise RuntimeError(
                        f"sync.method=collective: the weight group of policy {self.name!r} did not "
                        f"form ({e}); set sync.method=object_store"
                    ) from e
                log.warning(
                    f"[sync] policy {self.name!r}: the weight group did not form ({type(e).__name__}: "
                    f"{str(e)[:200]}); sync.method=auto sends weights through the object store"
                )
        return ObjectStoreSync(self.learners, fleet.engines[self.name], **args)

    def __enter__(self) -> TrainedPolicy:
        return self

    def __exit__(self, *exc) -> None:
        if self.owns_learners:
            self.learners.shutdown()

    def close(self) -> None:
        """Kill this policy's learner ranks, whoever started them (a shared adapter group: the group's
        ranks): the loop rebuilds every policy's after one rank died, and a rank left alive would
        keep its CPUs, memory and GPU from the new ones."""
        group = getattr(self.learners, "group", self.learners)
        group.shutdown()

    def staleness(self, trace: Trace) -> int:
        """How many versions behind this policy's oldest trainable sequence in the trace is (0 if none)."""
        versions = [s.version for s in trace.sequences if s.trainable and s.policy == self.name]
        return self.version - min(versions) if versions else 0

    def step(self, traces: list[Trace], max_staleness: int) -> dict[str, float]:
        """This policy's view of the traces; those more than `max_staleness` versions behind its clock
        left out (counted); advantages per sequence, loss weights, exact-prefix rows of its own
        sequences, packed micro-batches, one optimizer step, then the new weights to its engines as
        the next version. Returns train/<policy>/*, sync/<policy>/* and async/<policy>/* metrics, and
        perf/<policy>/{train,sync,learner}_s."""
        algo, p = self.cfg.algorithm, self.name
        lags = [self.staleness(tr) for tr in traces]
        mine = [tr.only_policy(p) for tr, lag in zip(traces, lags) if lag <= max_staleness]
        self.stale_ids = {tr.id for tr, lag in zip(traces, lags) if lag > max_staleness}
        self.dropped_stale += len(self.stale_ids)
        advs = compute_advantages(mine, algo.advantage)
        rows, batches = micro_batches(mine, advs, algo, self.learner_cfg.micro_batch_tokens, self.format.pad_id)
        metrics = advantage_metrics(mine, advs, p)
        t0 = time.perf_counter()
        applied = bool(batches)
        if batches:
            stats = self.learners.train_step(batches)
            metrics.update(train_metrics(stats, packing_stats(rows, batches), p))
            applied = not self.skipped(stats)
            self.trained_tokens += metrics[f"train/{p}/trained_tokens"] if applied else 0.0
        train_s = time.perf_counter() - t0
        if applied or not batches:
            self.version += 1
            synced = self.sync.push(self.version)
        else:  # the weights did not change: the engines keep serving this version
            synced = {"seconds": 0.0, "bytes_per_s": 0.0, "bytes": 0.0, "fallbacks": 0.0}
        metrics.update(
            {
                f"perf/{p}/train_s": train_s,
                f"perf/{p}/sync_s": synced["seconds"],
                # inside the ranks (the rest of train_s: packing, Ray); 0 when nothing was trained
                f"perf/{p}/learner_s": stats["seconds"] if batches else 0.0,
                f"sync/{p}/seconds": synced["seconds"],
                f"sync/{p}/bytes_per_s": synced["bytes_per_s"],
                f"sync/{p}/bytes": synced["bytes"],
                f"sync/{p}/fallbacks": synced.get("fallbacks", 0.0),
                f"async/{p}/staleness_mean": float(np.mean(lags or [0])),
                f"async/{p}/staleness_max": float(max(lags or [0])),
                f"async/{p}/version": float(self.version),
                f"async/{p}/dropped_stale": float(self.dropped_stale),
            }
        )
        return metrics

    def skipped(self, stats: dict[str, float]) -> bool:
        """Whether the learners skipped this optimizer step (a non-finite loss or gradient: weights
        and optimizer state untouched); `trainer.max_skipped_steps` in a row stop the run."""
        if not stats["skipped"]:
            self.skipped_in_a_row = 0
            return False
        self.skipped_in_a_row += 1
        limit = self.cfg.trainer.max_skipped_steps
        log.warning(
            f"[train] policy {self.name}: optimizer step skipped (non-finite loss or gradient norm "
            f"{stats['grad_norm']}); {self.skipped_in_a_row} in a row, the run stops at {limit}"
        )
        if self.skipped_in_a_row >= limit:
            raise RuntimeError(
                f"policy {self.name}: {limit} optimizer steps in a row had a non-finite loss or "
                f"gradient and were skipped (trainer.max_skipped_steps={limit}); the weights "
                f"are those of version {self.version}: check the rewards, the advantages and lr"
            )
        return True

    def save(self, run_dir: Path, step: int) -> None:
        checkpoint.save_policy(self.learners, self.model_path, run_dir, step, self.name)

    def restore(self, ckpt: Path, version: int) -> None:
        """Load this policy's state from checkpoint folder `ckpt` and push it to the engines as `version`."""
        checkpoint.restore_policy(self.learners, ckpt, self.name)
        self.version = version
        self.sync.push(self.version)

    def summary(self) -> dict:
        return {
            "trained_tokens": self.trained_tokens,
            "version": self.version,
            "dropped_stale": self.dropped_stale,
            # what trainer.deterministic runs compare: a hash of the trained weights (rank 0's, as every rank's)
            "digest": self.learners.param_digests()[0],
            "learner_nodes": self.learners.node_ids,
            "sync": type(self.sync).__name__,
        }


def micro_batches(
    traces: list[Trace], advantages: list[list[float]], a, token_budget: int, pad_id: int
) -> tuple[list[Row], list[MicroBatch]]:
    """One policy's training rows and packed micro-batches of `traces` (already its view):
    loss weights, exact-prefix rows, shared-prompt trees, packing, as `algorithm` (`a`) says."""
    weights = token_weights(traces, a.loss.normalization, a.loss.constant)
    # A zero-advantage row has zero gradient unless a KL term pulls on it.
    rows = build_rows(traces, advantages, weights, merge=a.merge_prefixes, skip_zero_advantage=a.loss.kl_coef == 0)
    if a.share_prefixes:
        rows = share_prefixes(rows, token_budget)
    return rows, pack(rows, token_budget, pad_id)
