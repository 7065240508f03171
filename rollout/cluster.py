"""Driver-side helpers that start Ray and spawn the rollout actors with resources from config.

The actor classes themselves stay plain Python (testable without Ray); this
is the one place that decides where they run.
"""

from __future__ import annotations

import os

import ray

from rollout.buffer import TraceBuffer
from rollout.config import EngineConfig, ModelConfig, RayConfig, RolloutConfig, SamplingConfig
from rollout.engine import Engine
from rollout.worker import RolloutWorker


def start_ray(cfg: RayConfig) -> None:
    """Start an in-process cluster (`address=local`) or join an existing one."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    kwargs = {"include_dashboard": False, "log_to_driver": True}
    if cfg.address == "local":
        kwargs["num_cpus"] = cfg.num_cpus or os.cpu_count()
    ray.init(address=cfg.address, **kwargs)


def spawn_engines(model_path: str, model: ModelConfig, cfg: EngineConfig, policy: str,
                  seed: int = 0) -> list:
    """Start `cfg.num_engines` Engine actors for one policy and wait until they are up."""
    cls = ray.remote(num_cpus=cfg.num_cpus, num_gpus=cfg.num_gpus, resources=dict(cfg.resources) or None)(Engine)
    engines = [cls.options(max_concurrency=1000).remote(
        model_path, cfg, policy=policy, dtype=model.dtype, max_model_len=model.max_model_len,
        seed=seed + i) for i in range(cfg.num_engines)]
    # Surface a failed start (bad model, too little memory) here, with vLLM's error.
    ray.get([e.info.remote() for e in engines], timeout=cfg.start_timeout_s)
    return engines


def spawn_buffer(policy: str, group_size: int, vocab_sizes: dict[str, int]):
    return ray.remote(num_cpus=0)(TraceBuffer).remote(policy, group_size, vocab_sizes)


def spawn_workers(cfg: RolloutConfig, harness, task, agents: dict[str, str],
                  engines: dict[str, list], tokenizer_paths: dict[str, str],
                  sampling: SamplingConfig, buffer) -> list:
    """Start `cfg.num_workers` RolloutWorker actors sharing the engines and the buffer."""
    cls = ray.remote(num_cpus=0)(RolloutWorker)
    return [cls.options(max_concurrency=1000).remote(
        i, harness, task, agents, engines, tokenizer_paths, sampling, cfg, buffer)
        for i in range(cfg.num_workers)]
