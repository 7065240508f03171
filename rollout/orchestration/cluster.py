"""Driver-side helpers that start Ray and spawn the rollout actors with resources from config.

The actor classes themselves stay plain Python (testable without Ray); this
is the one place that decides where they run. `rollout/orchestration/fleet.py` composes
them into the rollout side of a run.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import uuid
from collections.abc import Callable
from typing import Any

import ray

from rollout.config import EngineConfig, LoraConfig, ModelConfig, RayConfig, RolloutJobConfig
from rollout.engine.engine import Engine
from rollout.engine.weight_store import WeightStore
from rollout.orchestration.buffer import TraceBuffer
from rollout.orchestration.worker import RolloutWorker
from rollout.placement import Ask, actor_options, check_gpu_count, visible_gpus

log = logging.getLogger(__name__)


JOIN_ENV = "TRACERL_RAY_ADDRESS"  # a running cluster that `address=local` jobs join instead


def start_ray(cfg: RayConfig, cpus_asked: float = 0.0, asks: list[Ask] = ()) -> None:
    """Start an in-process cluster (`address=local`) or join an existing one. With
    TRACERL_RAY_ADDRESS set, an `address=local` job joins the cluster there instead of starting its
    own: a script that runs many short jobs one after another (the test suite's lane) pays Ray's
    start and stop (GCS, raylet, dashboard and log processes: ~5 CPU-s) once. A local cluster has
    `ray.num_cpus` logical CPUs, by default the machine's or, if more, `cpus_asked` (what the
    job's actors ask for together), so that every actor of any `agents` mapping can be placed
    (Ray's CPUs are placement tokens: more of them than cores only shares the cores), and
    `ray.num_gpus` GPUs, by default those torch sees. Then, before any actor is spawned, the
    cluster must hold the GPUs the job's actors (`asks`) need: ValueError naming the keys."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    # Each worker in a process group of its own, killed with it even when it crashes: an engine
    # actor's vLLM engine core goes with it, never left holding its GPU (GPU review F16; Ray 2.60's
    # default, named here because the engines rely on it; a cluster joined by address has its own)
    os.environ.setdefault("RAY_process_group_cleanup_enabled", "1")
    kwargs = {"include_dashboard": False, "log_to_driver": True}
    address, where = cfg.address, f"ray.address={cfg.address}"
    if address == "local" and os.environ.get(JOIN_ENV):
        address, where = os.environ[JOIN_ENV], f"{JOIN_ENV}={os.environ[JOIN_ENV]}"
        log.info(f"[ray] joining the cluster at {address} ({JOIN_ENV}) instead of starting one")
    if address == "local":
        kwargs.update(num_cpus=local_cpus(cfg, cpus_asked), num_gpus=visible_gpus(cfg.num_gpus))
    ray.init(address=address, **kwargs)
    check_gpu_count(list(asks), int(ray.cluster_resources().get("GPU", 0)), f"the Ray cluster ({where})")


def local_cpus(cfg: RayConfig, cpus_asked: float) -> int:
    """Logical CPUs of a local cluster: ray.num_cpus if set, else max(cores, what the actors ask)."""
    return cfg.num_cpus or max(os.cpu_count() or 1, math.ceil(cpus_asked))


def run_job(dcfg, validate: Callable[[Any], None], job: Callable[[Any], dict]) -> dict:
    """What every entry point does with the config Hydra composed: convert it to the typed
    schema and validate it (a bad one exits 2 with `config error: ...` logged, before Ray starts),
    run the job and shut Ray down whatever happens. Returns the job's summary, which the script
    prints as its last line (JSON)."""
    from omegaconf import OmegaConf

    try:
        cfg = OmegaConf.to_object(dcfg)
        validate(cfg)
    except ValueError as e:
        log.error(f"config error: {e}")
        sys.exit(2)
    try:
        summary = job(cfg)
    finally:
        ray.shutdown()
    return summary


def await_started(actors: list, ready: list, timeout_s: float, what: str, resources: dict) -> list:
    """ray.get the `ready` refs of freshly created `actors`; on any failure kill them all, and name
    `what` did not start, with the resources each asked for and those free, past `timeout_s`."""
    try:
        return ray.get(ready, timeout=timeout_s)
    except BaseException as e:
        for actor in actors:
            ray.kill(actor)
        if isinstance(e, ray.exceptions.GetTimeoutError):
            raise TimeoutError(
                f"{what} did not start within {timeout_s}s: each asks for {resources}; "
                f"free in the cluster: {ray.available_resources()}"
            ) from None
        raise


def spawn_engines(
    pools: dict[str, tuple[str, ModelConfig, EngineConfig]],
    seed: int = 0,
    stores: dict | None = None,
    adapters: dict[str, dict[str, LoraConfig]] | None = None,
) -> dict[str, list]:
    """Start every pool's engines at once — `pool: (model folder, model, engine settings)`,
    `num_engines` Engine actors each, with that pool's Ray resources — and wait until all are up.
    `stores`: pool -> {policy: WeightStore} of the policies it takes weight pushes of (see
    spawn_stores); with them Ray restarts a dead engine up to `engine.max_restarts` times, and
    it comes back with their newest weights. `adapters`: pool -> {LoRA policy: its settings}."""
    engines, asks, stores, adapters = {}, {}, stores or {}, adapters or {}
    for pool, (model_path, model, cfg) in pools.items():
        cls = ray.remote(**actor_options(cfg))(Engine)
        restarts = cfg.max_restarts if stores.get(pool) else 0
        engines[pool] = [
            cls.options(
                max_concurrency=1000, max_restarts=restarts, name=f"tracerl-engine-{pool}-{i}-{uuid.uuid4().hex[:8]}"
            ).remote(
                model_path,
                cfg,
                pool=pool,
                dtype=model.dtype,
                max_model_len=model.max_model_len,
                seed=seed + i,
                stores=stores.get(pool),
                index=i,
                adapters=adapters.get(pool),
            )
            for i in range(cfg.num_engines)
        ]
        asks[pool] = actor_options(cfg)
    # Surface a failed start (bad model, too little memory, no room to place it) here.
    everyone = [e for pool in engines.values() for e in pool]
    await_started(
        everyone,
        [e.info.remote() for e in everyone],
        max(c.start_timeout_s for *_, c in pools.values()),
        f"engines of {sorted(pools)} (engine.start_timeout_s)",
        asks,
    )
    return engines


def on_driver_node() -> dict:
    """Actor options that place it on the driver's node. The run's state holders (the trace
    buffer, the weight stores) are not restartable: pinned there they fail only with the driver,
    whose run then resumes from its checkpoint, never with a node that leaves a running job."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)}


def spawn_stores(policies: list[str]) -> dict:
    """One WeightStore actor per policy (no CPU), on the driver's node: what a restarted engine loads first."""
    tag = uuid.uuid4().hex[:8]  # named, so that a fault test finds their processes
    cls = ray.remote(num_cpus=0)(WeightStore)
    return {p: cls.options(name=f"tracerl-store-{p}-{tag}", **on_driver_node()).remote() for p in policies}


def spawn_buffer(group_size: int, vocab_sizes: dict[str, int]):
    """The TraceBuffer (no CPU), on the driver's node."""
    name = f"tracerl-buffer-{uuid.uuid4().hex[:8]}"  # named, so that a fault test finds its process
    return ray.remote(num_cpus=0)(TraceBuffer).options(name=name, **on_driver_node()).remote(group_size, vocab_sizes)


def spawn_workers(
    cfg: RolloutJobConfig,
    engines: dict[str, list],
    tokenizers: dict[str, tuple[str, str | None]],
    buffer,
    start_timeout_s: float = 300.0,
) -> list:
    """Start `cfg.rollout.num_workers` RolloutWorker actors sharing the engines and the buffer,
    and wait until they are up (a harness or task source that fails to load fails here)."""
    cls = ray.remote(num_cpus=0)(RolloutWorker)
    workers = [
        cls.options(
            max_concurrency=1000,
            max_restarts=cfg.rollout.max_worker_restarts,
            name=f"tracerl-worker-{i}-{uuid.uuid4().hex[:8]}",
        ).remote(i, cfg, engines, tokenizers, buffer)
        for i in range(cfg.rollout.num_workers)
    ]
    await_started(workers, [w.stats.remote() for w in workers], start_timeout_s, "rollout workers", {"num_cpus": 0})
    return workers
