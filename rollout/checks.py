"""The rollout side's cross-field checks: `validate()` runs them before Ray starts.

The schemas in rollout/config.py decide what a single value may be (Hydra refuses an
unknown key, a wrong type, a choice outside an enum at compose time); these checks
decide which values go together, and raise ValueError naming the key(s) and the fix.
trainer/checks.py adds the training job's checks on top.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re

from harnesses.base import check_harness_options, load_harness
from rollout.config import (
    LORA_TARGETS,
    VLLM_LORA_RANKS,
    EngineConfig,
    EngineCore,
    PolicyConfig,
    RolloutConfig,
    RolloutJobConfig,
    SyncPauseMode,
    TaskConfig,
    make_task_source,
)
from rollout.models import check_model
from rollout.placement import check_engine_gpus, check_gpu_count, check_shared_memory, visible_gpus


def validate(cfg: RolloutJobConfig) -> None:
    """Cross-field checks, then whether the job fits the machine; raise ValueError naming the
    key(s) and the fix."""
    check_fields(cfg)
    check_placement(cfg)


def check_placement(cfg: RolloutJobConfig) -> None:
    """The job's actors fit the GPUs: those sharing one leave it headroom, and on an in-process
    cluster (`ray.address=local`) they fit its GPUs (a joined cluster's are compared once Ray has
    joined it: rollout.orchestration.cluster.start_ray). Runs after every other check: it depends on the machine."""
    asks = cfg.asks()
    check_shared_memory(asks)
    if cfg.ray.address == "local":
        where = (
            f"the local cluster (ray.num_gpus={cfg.ray.num_gpus})"
            if cfg.ray.num_gpus is not None
            else "this machine (the GPUs torch sees)"
        )
        check_gpu_count(asks, visible_gpus(cfg.ray.num_gpus), where)


def check_fields(cfg: RolloutJobConfig) -> None:
    """Every cross-field check of the rollout side that does not depend on the machine."""
    s, r = cfg.sampling, cfg.rollout
    checks = [
        (s.temperature >= 0, "sampling.temperature must be >= 0"),
        (0 < s.top_p <= 1, "sampling.top_p must be in (0, 1]"),
        (s.max_tokens > 0, "sampling.max_tokens must be > 0"),
        (s.n >= 1, "sampling.n must be >= 1"),
        (r.num_workers >= 1 and r.concurrency >= 1, "rollout.num_workers and rollout.concurrency must be >= 1"),
        (r.group_size >= 1, "rollout.group_size must be >= 1"),
        (r.timeout_s > 0, "rollout.timeout_s must be > 0"),
        (r.retries >= 0, "rollout.retries must be >= 0"),
        (r.max_worker_restarts >= 0, "rollout.max_worker_restarts must be >= 0"),
        (r.worker_restart_timeout_s > 0, "rollout.worker_restart_timeout_s must be > 0"),
        (r.buffer_timeout_s > 0, "rollout.buffer_timeout_s must be > 0"),
        (r.health_check_s >= 0, "rollout.health_check_s must be >= 0 (0: no worker watchdog)"),
        (r.health_timeout_s > 0, "rollout.health_timeout_s must be > 0"),
        (
            _is_range(cfg.harness.reward_range),
            f"harness.reward_range={list(cfg.harness.reward_range)} must be [low, high]: finite numbers, low < high",
        ),
    ]
    for ok, msg in checks:
        if not ok:
            raise ValueError(msg)
    missing = [role for role in cfg.harness.roles if role not in cfg.agents]
    if missing:
        raise ValueError(
            f"agents: harness {cfg.harness.name!r} uses roles {missing} that are not mapped "
            f"to a policy; add e.g. agents.{missing[0]}=main"
        )
    validate_policies(cfg)
    # The harness and task source import, and the options fit the harness (its signature, its own check).
    check_harness_options(load_harness(cfg.harness._target_), dict(cfg.harness.options), cfg.harness._target_)
    roles = _check_task_source(json.dumps(dataclasses.asdict(cfg.task), sort_keys=True, default=str), cfg.seed)
    check_scoring_roles(cfg, roles)


def _is_range(bounds: list[float]) -> bool:
    return len(bounds) == 2 and all(map(math.isfinite, bounds)) and bounds[0] < bounds[1]


@functools.lru_cache(maxsize=64)
def _check_task_source(task_json: str, seed: int) -> tuple[str, ...]:
    """The task source builds (a known dataset, good params) and its held-out set fits the task's
    question space (task.eval_size distinct questions); returns the roles its scoring asks.
    Cached: it builds datasets."""
    source = make_task_source(TaskConfig(**json.loads(task_json)), seed)
    source.eval_tasks()
    return tuple(source.scoring_roles())


def check_scoring_roles(cfg: RolloutJobConfig, roles: tuple[str, ...]) -> None:
    """Each role the task's scoring asks (an LLM judge) is served by a frozen policy: a judge
    trained on the rewards it gives would learn to please itself."""
    table = cfg.policy_table()
    for role in roles:
        if role not in cfg.agents:
            raise ValueError(
                f"task.params.verifier asks role {role!r} (an LLM judge) but agents does not map it: "
                f"add +agents.{role}=frozen (or another frozen policy)"
            )
        if table[cfg.agents[role]].trainable:
            raise ValueError(
                f"agents.{role}={cfg.agents[role]} is a trained policy, but role {role!r} judges the "
                f"rewards (task.params.verifier): map it to a frozen one, e.g. agents.{role}=frozen"
            )


# ---- the policies: roles to policies, each used policy's model, engines and adapter -----
def validate_policies(cfg: RolloutJobConfig) -> None:
    """Every role maps to a defined policy, every defined policy serves a role, and each used
    policy's model exists and its engine settings are sound."""
    table = cfg.policy_table()
    check_agents(cfg, table)
    for policy in cfg.used_policies():
        check_policy_model(cfg, policy, table[policy])
        check_policy_engine(cfg, policy, table[policy])
        check_lora(policy, table[policy])
    for pool in cfg.engine_pools().values():
        first = cfg.pool_engine(pool)
        for policy in pool[1:]:
            if cfg.policy_engine(policy) != first:
                raise ValueError(
                    f"policies {pool} share engines (LoRA adapters and frozen policies of one base "
                    f"model) but their engine settings differ ({pool[0]!r} vs {policy!r}): set "
                    f"policies.<name>.engine the same for all of them, or only on none"
                )


def check_agents(cfg: RolloutJobConfig, table: dict[str, PolicyConfig]) -> None:
    """Every role maps to a defined policy, and every policy the config defines serves a role."""
    for role, policy in cfg.agents.items():
        if policy not in table:
            raise ValueError(
                f"agents.{role}={policy!r} is not a policy; define it, e.g. "
                f"+policies.{policy}.trainable=true, or use one of {sorted(table)}"
            )
    unused = sorted(set(cfg.policies) - set(cfg.agents.values()))
    if unused:
        raise ValueError(
            f"policies.{unused[0]} is used by no role; map one to it (e.g. "
            f"agents.{next(iter(cfg.agents), 'solver')}={unused[0]}) or remove it"
        )


def check_policy_model(cfg: RolloutJobConfig, policy: str, entry: PolicyConfig) -> None:
    """The policy's model exists and leaves room for a prompt beside sampling.max_tokens."""
    model = cfg.policy_model(policy)
    where = f"policies.{policy}.model" if entry.model else "model"
    try:
        check_model(model.name, model.path)
    except (FileNotFoundError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None
    if cfg.sampling.max_tokens >= model.max_model_len:
        raise ValueError(f"sampling.max_tokens must be < {where}.max_model_len")


def check_policy_engine(cfg: RolloutJobConfig, policy: str, entry: PolicyConfig) -> None:
    """The policy's engine settings: a KV cache, deadlines that fit together, a core vLLM can run,
    GPUs that exist, a block size the attention backend takes, a `cpu_cores` it can parse."""
    engine = cfg.policy_engine(policy)
    where = f"policies.{policy}.engine" if entry.engine else "engine"
    if engine.num_engines < 1 or (engine.kv_cache_gb is not None and engine.kv_cache_gb <= 0):
        raise ValueError(f"{where}.num_engines must be >= 1 and {where}.kv_cache_gb > 0")
    if engine.kv_cache_gb is None and not engine.num_gpus:
        raise ValueError(
            f"{where}.kv_cache_gb=null (the KV cache from gpu_memory_utilization) is for GPU "
            f"engines: set {where}.kv_cache_gb in GiB for a CPU engine"
        )
    check_engine_waits(engine, where, cfg.rollout)
    check_engine_core(engine, where)
    check_engine_gpus(engine, where)
    if engine.block_size is not None and (
        engine.block_size <= 0 or engine.block_size % (16 if engine.num_gpus else 32)
    ):
        raise ValueError(
            f"{where}.block_size={engine.block_size} must be a multiple of "
            f"{16 if engine.num_gpus else 32} (vLLM's {'GPU' if engine.num_gpus else 'CPU'} "
            f"attention), or null for vLLM's default"
        )
    share = re.fullmatch(r"(\d+)/(\d+)", engine.cpu_cores)
    if not (
        engine.cpu_cores in ("auto", "all")
        or (share and int(share[1]) < int(share[2]))
        or (not share and re.fullmatch(r"[0-9,\-|]+", engine.cpu_cores))
    ):
        raise ValueError(
            f"{where}.cpu_cores={engine.cpu_cores!r}: auto, all, i/n (the i-th of n shares of the "
            f"cores, i < n), or core ids like 0-1 (tensor-parallel ranks split by |)"
        )


def check_lora(policy: str, entry: PolicyConfig) -> None:
    """A LoRA adapter is trained, of a rank vLLM serves, on some modules, without dropout."""
    lora = entry.lora
    if lora is None:
        return
    where = f"policies.{policy}.lora"
    if not entry.trainable:
        raise ValueError(
            f"{where} is set but policy {policy!r} is not trainable: an untrained adapter "
            f"is its base model; map the role to a frozen policy of that model instead"
        )
    if not 1 <= lora.rank <= VLLM_LORA_RANKS[-1]:
        raise ValueError(f"{where}.rank={lora.rank} must be in [1, {VLLM_LORA_RANKS[-1]}] (vLLM's largest)")
    if not lora.target_modules:
        raise ValueError(f"{where}.target_modules is empty; e.g. {list(LORA_TARGETS)}")
    if lora.dropout != 0:
        raise ValueError(
            f"{where}.dropout={lora.dropout}: the learner must score what the engine "
            f"sampled, which has no dropout; set it to 0"
        )


def check_engine_waits(engine: EngineConfig, where: str, rollout: RolloutConfig) -> None:
    """The engine's deadlines are positive and fit together: a request ends before its episode
    does (else a hung request can never be retried) and, when a weight load waits for the requests
    in flight, before the load's own deadline. Ray reads max_restarts=-1 as "forever": refused."""
    for key in ("start_timeout_s", "request_timeout_s", "sync_timeout_s", "health_timeout_s"):
        if not getattr(engine, key) > 0:
            raise ValueError(f"{where}.{key}={getattr(engine, key)} must be > 0")
    if engine.health_check_s < 0 or engine.max_restarts < 0:
        raise ValueError(f"{where}.health_check_s (0: no probes) and {where}.max_restarts must be >= 0")
    if engine.request_timeout_s >= rollout.timeout_s:
        raise ValueError(
            f"{where}.request_timeout_s={engine.request_timeout_s} must be < rollout.timeout_s="
            f"{rollout.timeout_s}: a hung request is cancelled and its episode run again only if it "
            f"times out before the episode does; lower it or raise rollout.timeout_s"
        )
    if engine.sync_pause_mode == SyncPauseMode.wait and engine.sync_timeout_s <= engine.request_timeout_s:
        raise ValueError(
            f"{where}.sync_timeout_s={engine.sync_timeout_s} must be > {where}.request_timeout_s="
            f"{engine.request_timeout_s}: with sync_pause_mode=wait a weight load first waits for "
            f"the requests in flight"
        )


def check_engine_core(engine: EngineConfig, where: str) -> None:
    """The thread core runs vLLM's uni-process executor: one worker, so no tensor parallelism."""
    if engine.core == EngineCore.thread and engine.tensor_parallel_size > 1:
        raise ValueError(
            f"{where}.core=thread runs one worker in the engine's process: "
            f"{where}.tensor_parallel_size={engine.tensor_parallel_size} needs {where}.core=process "
            f"(or auto)"
        )
    if engine.vllm_log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ValueError(f"{where}.vllm_log_level={engine.vllm_log_level}: DEBUG, INFO, WARNING, ERROR or CRITICAL")
