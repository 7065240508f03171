"""LearnerGroup: the driver's handle on one policy's DeepSpeed ranks.

Starts `world_size` Learner actors with resources from config, runs the
rendezvous, and turns each collective call into one call on every rank,
returning rank 0's answer. Shards a batch's micro-batches over the ranks.
"""

from __future__ import annotations

import ray

from rollout.cluster import await_started
from trainer.learner import Learner, LearnerConfig
from trainer.losses import LossConfig
from trainer.packing import MicroBatch, shard

# per-rank metrics that add up over ranks (sums over each rank's tokens)
SUMMED = ("tokens", "padded_tokens", "loss", "clip_frac", "ratio", "mismatch_kl", "kl_ref", "logp", "entropy")


class LearnerGroup:
    """`world_size` Learner ranks of one policy; a context manager that kills them on exit."""

    def __init__(self, model_path: str, cfg: LearnerConfig, loss: LossConfig, dtype: str = "float32",
                 seed: int = 0, pad_id: int = 0, setup_timeout_s: float = 900.0, name: str = "main", lora=None):
        """`lora`: a rollout.config.LoraConfig: the ranks train that adapter on the frozen model."""
        self.cfg, self.pad_id, self.name, self.lora = cfg, pad_id, name, lora  # name: the policy
        cls = ray.remote(num_cpus=cfg.num_cpus, num_gpus=cfg.num_gpus,
                         resources=dict(cfg.resources) or None)(Learner)
        self.ranks = [cls.remote(r, model_path, cfg, loss, dtype, seed, lora) for r in range(cfg.world_size)]
        # every rank must enter DeepSpeed's rendezvous at the same time
        resources = {"num_cpus": cfg.num_cpus, "num_gpus": cfg.num_gpus, **cfg.resources}
        [(addr, port)] = await_started(self.ranks, [self.ranks[0].master_address.remote()], setup_timeout_s,
                                       f"learner rank 0 of {cfg.world_size}", resources)
        infos = await_started(self.ranks, [r.setup.remote(addr, port) for r in self.ranks], setup_timeout_s,
                              f"{cfg.world_size} learner ranks (DeepSpeed setup)", resources)
        self.node_ids = [i["node_id"] for i in infos]  # where each rank runs

    def collect(self, what: str, refs: list) -> list:
        """Every rank's answer to one call. A rank that died, or did not answer within
        learner.call_timeout_s (a hung collective), stops the run with an error naming it and its node."""
        try:
            return ray.get(refs, timeout=self.cfg.call_timeout_s)
        except ray.exceptions.GetTimeoutError:
            late = [i for i, ref in enumerate(refs) if not ray.wait([ref], timeout=0)[0]]
            raise TimeoutError(f"learner {what} of policy {self.name!r}: {self._ranks(late)} did not answer "
                               f"within learner.call_timeout_s={self.cfg.call_timeout_s}") from None
        except ray.exceptions.RayActorError as e:
            dead = []
            for i, ref in enumerate(refs):
                try:
                    ray.get(ref, timeout=0)
                except ray.exceptions.RayActorError:
                    dead.append(i)
                except Exception:
                    pass
            raise RuntimeError(f"learner {what} of policy {self.name!r}: {self._ranks(dead)} died "
                               f"({type(e).__name__})") from e

    def _ranks(self, ranks: list[int]) -> str:
        nodes = getattr(self, "node_ids", [])
        return ", ".join(f"rank {i}" + (f" on node {nodes[i][:12]}" if i < len(nodes) else "") for i in ranks)

    def train_step(self, batches: list[MicroBatch]) -> dict[str, float]:
        """One optimizer step on all ranks; metrics summed over ranks (ratio_max: max)."""
        shards = shard(batches, self.cfg.world_size, self.pad_id)
        results = self.collect("train_step", [r.train_step.remote(s) for r, s in zip(self.ranks, shards)])
        out = dict(results[0])  # step, lr, grad_norm: the same on every rank
        for res in results[1:]:
            for k in SUMMED:
                out[k] += res[k]
            for k in ("ratio_max", "seconds"):
                out[k] = max(out[k], res[k])
        return out

    def export_weights(self, bucket_bytes: int = 64 << 20) -> ray.ObjectRef:
        """Rank 0's safetensors buckets, as an ObjectRef (engines fetch it from the object store)."""
        refs = [r.export_weights.remote(bucket_bytes) for r in self.ranks]
        self.collect("export_weights", refs[1:])  # the other ranks only take part in ZeRO-3 gathers
        return refs[0]

    def logprobs(self, input_ids: list[int], start: int) -> list[float]:
        return self.collect("logprobs", [r.logprobs.remote(input_ids, start) for r in self.ranks])[0]

    def save(self, path: str) -> None:
        self.collect("save", [r.save.remote(path) for r in self.ranks])

    def load(self, path: str) -> int:
        return self.collect("load", [r.load.remote(path) for r in self.ranks])[0]

    def param_digests(self) -> list[str]:
        return self.collect("param_digest", [r.param_digest.remote() for r in self.ranks])

    def __enter__(self) -> LearnerGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        for r in self.ranks:
            ray.kill(r)
