"""LearnerGroup: the driver's handle on one policy's DeepSpeed ranks.

Starts `world_size` Learner actors with resources from config, runs the
rendezvous, and turns each collective call into one call on every rank,
returning rank 0's answer. Shards a batch's micro-batches over the ranks.

Several LoRA policies on one base model can share one group, which holds the
base once: `adapters={policy: (lora, learner cfg)}`, and `group.view(policy)`
is that policy's handle (the same calls, on its adapter only).
"""

from __future__ import annotations

import logging
import os
import uuid

import ray

from rollout.engine.weight_group import Layout
from rollout.orchestration.cluster import await_started
from rollout.placement import actor_options
from trainer.config import LearnerConfig, LossConfig
from trainer.learner import Learner
from trainer.packing import MicroBatch, shard
from trainer.rank_env import ALLOC_CONF_VARS, learner_env

log = logging.getLogger(__name__)

# per-rank metrics that add up over ranks (sums over each rank's tokens)
SUMMED = ("tokens", "padded_tokens", "loss", "clip_frac", "ratio", "mismatch_kl", "kl_ref", "logp", "entropy")


class LearnerFailed(RuntimeError):
    """A learner rank died or did not answer: the policy's ranks can no longer train together. The
    loop rebuilds them and goes back to the last checkpoint (trainer.max_learner_restarts)."""


class LearnerTimeout(LearnerFailed, TimeoutError):
    """A learner call not answered within learner.call_timeout_s (a hung collective)."""


class LearnerGroup:
    """`world_size` Learner ranks of one policy (or of several adapter policies on one base); a
    context manager that kills them on exit."""

    def __init__(
        self,
        model_path: str,
        cfg: LearnerConfig,
        loss: LossConfig,
        dtype: str = "float32",
        seed: int = 0,
        pad_id: int = 0,
        setup_timeout_s: float = 900.0,
        name: str = "main",
        lora=None,
        adapters: dict | None = None,
        wait: bool = True,
    ):
        """`lora`: a rollout.config.LoraConfig: the ranks train that adapter (policy `name`) on the
        frozen model. `adapters`: {policy: (LoraConfig, LearnerConfig)}: they train one adapter per
        policy on one copy of the frozen model, each with its own optimizer settings; `name` is
        the group's, for messages. `wait=False`: return once the ranks are asked to start; they
        come up (process, imports, DeepSpeed setup) while the caller goes on, and `ready()` waits."""
        if lora is not None:
            adapters = {name: (lora, cfg)}
        self.cfg, self.pad_id, self.name, self.adapters = cfg, pad_id, name, dict(adapters or {})
        self._resources = actor_options(cfg)  # the same options the config checks and the placement tests read
        self._setup_timeout_s = setup_timeout_s
        cls = ray.remote(**self._resources, **self._runtime_env())(Learner)
        tag = uuid.uuid4().hex[:8]  # named, so that a fault test finds a rank's process
        self.ranks = [
            cls.options(name=f"tracerl-learner-{name}-{r}-{tag}").remote(
                r, model_path, cfg, loss, dtype, seed, self.adapters
            )
            for r in range(cfg.world_size)
        ]
        # every rank enters DeepSpeed's rendezvous at once, at rank 0's address: Ray hands each
        # setup call that address when rank 0 has answered, so nothing here waits for it
        address = self.ranks[0].master_address.remote()
        self._setup: list | None = [r.setup.remote(address) for r in self.ranks]
        self.node_ids: list[str] = []  # where each rank runs (once ready)
        if wait:
            self.ready()

    def _runtime_env(self) -> dict:
        """The ranks' environment beyond the driver's (trainer/rank_env.py::learner_env; none on CPU)."""
        env = learner_env(self.cfg, os.environ)
        for var in ALLOC_CONF_VARS:
            if var in env:
                log.warning(
                    f"[learner] the ranks of {self.name!r} start with {var}={env[var]!r}, not "
                    f"{os.environ[var]!r}: on a shared GPU the engines open rank 0's weight buffers by "
                    f"CUDA IPC handle, which expandable segments and cudaMallocAsync break"
                )
        return {"runtime_env": {"env_vars": env}} if env else {}

    def ready(self) -> LearnerGroup:
        """Wait until every rank has started and set up DeepSpeed (at most `setup_timeout_s`); a
        rank that failed or did not start kills them all and names what it asked for."""
        if self._setup is not None:
            infos = await_started(
                self.ranks,
                self._setup,
                self._setup_timeout_s,
                f"{self.cfg.world_size} learner ranks of {self.name!r} (start, DeepSpeed setup)",
                self._resources,
            )
            self.node_ids, self._setup = [i["node_id"] for i in infos], None
        return self

    @property
    def lora(self):
        """The LoRA settings of the group's one adapter (None: full weights)."""
        return self.adapters[self._adapter(None)][0] if self.adapters else None

    def _adapter(self, adapter: str | None) -> str | None:
        """The adapter a call is for: the one named, else the group's only one (None: full weights)."""
        if adapter is not None or not self.adapters:
            return adapter
        if len(self.adapters) > 1:
            raise ValueError(f"learner group {self.name!r} trains adapters {sorted(self.adapters)}: name one")
        return next(iter(self.adapters))

    def view(self, adapter: str) -> AdapterLearners:
        """Adapter policy `adapter`'s handle on this group."""
        if adapter not in self.adapters:
            raise KeyError(f"learner group {self.name!r} trains {sorted(self.adapters)}, not {adapter!r}")
        return AdapterLearners(self, adapter)

    def collect(self, what: str, refs: list) -> list:
        """Every rank's answer to one call. A rank that died, or did not answer within
        learner.call_timeout_s (a hung collective), stops the run with an error naming it and its node."""
        try:
            return ray.get(refs, timeout=self.cfg.call_timeout_s)
        except ray.exceptions.GetTimeoutError:
            late = [i for i, ref in enumerate(refs) if not ray.wait([ref], timeout=0)[0]]
            raise LearnerTimeout(
                f"learner {what} of policy {self.name!r}: {self._ranks(late)} did not answer "
                f"within learner.call_timeout_s={self.cfg.call_timeout_s}"
            ) from None
        except ray.exceptions.RayActorError as e:
            dead = []
            for i, ref in enumerate(refs):
                try:
                    ray.get(ref, timeout=0)
                except ray.exceptions.RayActorError:
                    dead.append(i)
                except Exception:
                    pass
            raise LearnerFailed(
                f"learner {what} of policy {self.name!r}: {self._ranks(dead)} died ({type(e).__name__})"
            ) from e

    def _ranks(self, ranks: list[int]) -> str:
        nodes = self.node_ids
        return ", ".join(f"rank {i}" + (f" on node {nodes[i][:12]}" if i < len(nodes) else "") for i in ranks)

    def train_step(self, batches: list[MicroBatch], adapter: str | None = None) -> dict[str, float]:
        """One optimizer step on all ranks; metrics summed over ranks (ratio_max: max)."""
        adapter = self._adapter(adapter)
        shards = shard(batches, self.cfg.world_size, self.pad_id)
        results = self.collect("train_step", [r.train_step.remote(s, adapter) for r, s in zip(self.ranks, shards)])
        out = dict(results[0])  # step, lr, grad_norm: the same on every rank
        for res in results[1:]:
            for k in SUMMED:
                out[k] += res[k]
            for k in ("ratio_max", "seconds"):
                out[k] = max(out[k], res[k])
        return out

    def export_weights(self, bucket_bytes: int = 64 << 20, adapter: str | None = None) -> ray.ObjectRef:
        """Rank 0's safetensors buckets, as an ObjectRef (engines fetch it from the object store)."""
        adapter = self._adapter(adapter)
        refs = [r.export_weights.remote(bucket_bytes, adapter) for r in self.ranks]
        self.collect("export_weights", refs[1:])  # the other ranks only take part in ZeRO-3 gathers
        return refs[0]

    def write_hf(self, folder: str, base_model: str, shard_bytes: int) -> dict:
        """Rank 0 writes the full weights as an HF model folder (the other ranks take part in ZeRO-3's
        gathers); returns rank 0's report, the files and their sizes: the weights never reach the driver."""
        return self.collect("write_hf", [r.write_hf.remote(folder, base_model, shard_bytes) for r in self.ranks])[0]

    def weight_address(self) -> tuple[str, int]:
        """Where rank 0 will host the weight group (trainer/weight_sync.py::CollectiveSync)."""
        return self.collect("weight_address", [self.ranks[0].master_address.remote()])[0]

    def weight_identity(self) -> str:
        """Rank 0's device identity (rollout/engine/weight_group.py::device_identity)."""
        return self.collect("weight_identity", [self.ranks[0].weight_identity.remote()])[0]

    def prepare_weight_group(self, plan, layout: Layout, timeout_s: float):
        """Rank 0's staging buffers for `plan`'s ipc members; returns the plan with their handles."""
        return self.collect(
            "prepare_weight_group", [self.ranks[0].prepare_weight_group.remote(plan, layout, timeout_s)]
        )[0]

    def open_weight_group(self) -> ray.ObjectRef:
        """Rank 0's side of opening the weight group; returns its ref (the engines join meanwhile)."""
        return self.ranks[0].open_weight_group.remote()

    def weight_layout(self, bucket_bytes: int = 64 << 20) -> Layout:
        return self.collect("weight_layout", [self.ranks[0].weight_layout.remote(bucket_bytes)])[0]

    def broadcast_weights(self, version: int, layout: Layout) -> list[ray.ObjectRef]:
        """Every rank's send call of `version` (rank 0 sends; the others take part in ZeRO-3's
        gathers), not waited for: the engines receive at the same time."""
        return [r.broadcast_weights.remote(version, layout) for r in self.ranks]

    def logprobs(
        self, input_ids: list[int], start: int, adapter: str | None = None, temperature: float | None = None
    ) -> list[float]:
        adapter = self._adapter(adapter)
        return self.collect(
            "logprobs", [r.logprobs.remote(input_ids, start, adapter, temperature) for r in self.ranks]
        )[0]

    def save(self, path: str, adapter: str | None = None) -> None:
        adapter = self._adapter(adapter)
        self.collect("save", [r.save.remote(path, adapter) for r in self.ranks])

    def load(self, path: str, adapter: str | None = None) -> int:
        adapter = self._adapter(adapter)
        return self.collect("load", [r.load.remote(path, adapter) for r in self.ranks])[0]

    def param_digests(self, adapter: str | None = None) -> list[str]:
        """Each rank's hash of its trained parameters (of a LoRA group: the adapter's)."""
        adapter = self._adapter(adapter)
        return self.collect("param_digest", [r.param_digest.remote(adapter) for r in self.ranks])

    def base_digests(self) -> list[str]:
        return self.collect("base_digest", [r.base_digest.remote() for r in self.ranks])

    def __enter__(self) -> LearnerGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        for r in self.ranks:
            ray.kill(r)


class AdapterLearners:
    """One adapter policy's handle on a LearnerGroup that several adapters share: the group's
    calls, on this adapter only. The group (not this view) owns the ranks."""

    def __init__(self, group: LearnerGroup, adapter: str):
        self.group, self.name = group, adapter
        self.cfg, self.ranks = group.cfg, group.ranks
        self.lora = group.adapters[adapter][0]

    @property
    def node_ids(self) -> list[str]:
        return self.group.node_ids

    def ready(self) -> AdapterLearners:
        self.group.ready()
        return self

    def collect(self, what: str, refs: list) -> list:
        return self.group.collect(f"{what} (adapter {self.name!r})", refs)

    def train_step(self, batches: list[MicroBatch]) -> dict[str, float]:
        return self.group.train_step(batches, self.name)

    def export_weights(self, bucket_bytes: int = 64 << 20) -> ray.ObjectRef:
        return self.group.export_weights(bucket_bytes, self.name)

    def logprobs(self, input_ids: list[int], start: int) -> list[float]:
        return self.group.logprobs(input_ids, start, self.name)

    def save(self, path: str) -> None:
        self.group.save(path, self.name)

    def load(self, path: str) -> int:
        return self.group.load(path, self.name)

    def param_digests(self) -> list[str]:
        return self.group.param_digests(self.name)

    def base_digests(self) -> list[str]:
        return self.group.base_digests()
