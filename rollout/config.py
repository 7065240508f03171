"""Typed config schemas for the rollout side, registered with Hydra's ConfigStore.

Hydra composes conf/*.yaml onto these dataclasses, so an unknown key or a
value of the wrong type fails at start naming the key. Cross-field checks
live in `validate()`, which runs before Ray starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

FROZEN_POLICY = "frozen"  # roles mapped here are served by engines but never trained


@dataclass
class ModelConfig:
    name: str = "tiny"  # tiny | tiny_tied | smollm2_135m, or a label when `path` is set
    path: str | None = None  # local HF model folder; overrides the built-in `name`
    dtype: str = "float32"  # float32 | bfloat16 (engine and learner)
    max_model_len: int = 2048  # longest prompt + completion, in tokens


@dataclass
class SamplingConfig:
    n: int = 1  # completions per request
    temperature: float = 1.0  # behaviour log-probs are taken after temperature scaling
    top_p: float = 1.0  # < 1 truncates the sampled distribution (log-probs follow it)
    max_tokens: int = 128  # new tokens per model call
    stop: list[str] = field(default_factory=list)  # stop strings (not in completion_ids)
    ignore_eos: bool = False  # always generate max_tokens (benchmarks)


@dataclass
class EngineConfig:
    num_engines: int = 1  # engines per policy; requests are routed sticky per trace
    num_cpus: float = 1.0  # Ray CPUs reserved per engine actor
    num_gpus: float = 0.0  # Ray GPUs per engine actor (0 on CPU machines)
    resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources (node placement)
    kv_cache_gb: float = 1.0  # KV cache size per engine, GiB
    gpu_memory_utilization: float = 0.85  # GPU only: fraction of device memory for vLLM
    tensor_parallel_size: int = 1  # GPU only
    max_num_seqs: int = 64  # sequences batched per engine step
    enforce_eager: bool = True  # skip CUDA graphs / torch.compile (start-up time on CPU)
    start_timeout_s: float = 300.0  # engine start (model load) limit
    sync_pause_mode: str = "wait"  # wait: in-flight requests finish on the old weights first; keep: they continue on the new ones


@dataclass
class RolloutConfig:
    num_workers: int = 1  # RolloutWorker actors
    concurrency: int = 16  # harness episodes in flight per worker
    group_size: int = 4  # traces per task instance (group baselines)
    timeout_s: float = 300.0  # per-episode limit; past it the trace is failed
    num_traces: int = 32  # scripts/rollout.py: traces to generate
    seed: int = 0  # task sampling seed, and the base of every model call's sampling seed


@dataclass
class HarnessConfig:
    _target_: str = MISSING  # dotted path of the harness function
    name: str = MISSING  # short name, used in logs
    roles: list[str] = field(default_factory=list)  # agent roles the harness calls
    options: dict[str, Any] = field(default_factory=dict)  # keyword args for the harness


@dataclass
class TaskConfig:
    _target_: str = "harnesses.tasks.ReasoningGymTasks"  # task source class
    name: str = MISSING  # reasoning-gym dataset name, e.g. chain_sum
    params: dict[str, Any] = field(default_factory=dict)  # dataset parameters (difficulty)
    instruction: str | None = None  # appended to each question; None: the dataset's default (NUMBER or EXPRESSION)
    size: int = 100000  # distinct training items
    eval_size: int = 64  # held-out items
    eval_seed: int = 1000003  # far from training seeds: reasoning-gym item i uses Random(seed + i)


@dataclass
class RayConfig:
    address: str = "local"  # "local": an in-process cluster; "auto" or host:port to join one
    num_cpus: int | None = None  # CPUs for a local cluster (None: all)


@dataclass
class RolloutJobConfig:
    """scripts/rollout.py: generate traces and write them to a JSONL file."""

    model: ModelConfig = field(default_factory=ModelConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    harness: HarnessConfig = field(default_factory=HarnessConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    agents: dict[str, str] = field(default_factory=dict)  # role -> policy ("main" or "frozen")
    out: str = "traces.jsonl"  # where to write the traces


def validate(cfg: RolloutJobConfig) -> None:
    """Cross-field checks; raise ValueError naming the key(s) and the fix."""
    s, e, r = cfg.sampling, cfg.engine, cfg.rollout
    checks = [
        (s.temperature >= 0, "sampling.temperature must be >= 0"),
        (0 < s.top_p <= 1, "sampling.top_p must be in (0, 1]"),
        (s.max_tokens > 0, "sampling.max_tokens must be > 0"),
        (s.n >= 1, "sampling.n must be >= 1"),
        (s.max_tokens < cfg.model.max_model_len, "sampling.max_tokens must be < model.max_model_len"),
        (e.num_engines >= 1, "engine.num_engines must be >= 1"),
        (e.kv_cache_gb > 0, "engine.kv_cache_gb must be > 0"),
        (e.sync_pause_mode in ("wait", "keep"), "engine.sync_pause_mode must be 'wait' or 'keep'"),
        (r.num_workers >= 1 and r.concurrency >= 1, "rollout.num_workers and rollout.concurrency must be >= 1"),
        (r.group_size >= 1, "rollout.group_size must be >= 1"),
        (r.timeout_s > 0, "rollout.timeout_s must be > 0"),
        (cfg.model.dtype in ("float32", "bfloat16"), "model.dtype must be float32 or bfloat16"),
    ]
    for ok, msg in checks:
        if not ok:
            raise ValueError(msg)
    missing = [role for role in cfg.harness.roles if role not in cfg.agents]
    if missing:
        raise ValueError(f"agents: harness {cfg.harness.name!r} uses roles {missing} that are not mapped "
                         f"to a policy; add e.g. agents.{missing[0]}=main")


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="rollout_schema", node=RolloutJobConfig)
