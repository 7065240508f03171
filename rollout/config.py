"""Typed config schemas of the rollout side, registered with Hydra's ConfigStore.

Hydra composes conf/*.yaml onto these dataclasses, so an unknown key, a value
of the wrong type or a choice outside an enum fails at compose time naming the
key. Every default lives here, once; YAML presets state only what they change.
Which values go together is checked by rollout/checks.py's `validate()`, before Ray starts.
Here too: how each policy's sections resolve against the top-level ones (`policy_table`,
`override`), which policies share engines, and building the task source.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from harnesses.base import REWARD_RANGE, TaskSource, load_task_source
from rollout.placement import Ask, engine_ask

MAIN_POLICY, FROZEN_POLICY = "main", "frozen"  # the two policies every config has without a `policies:` section


class Dtype(StrEnum):
    float32 = "float32"
    bfloat16 = "bfloat16"


class EngineCore(StrEnum):
    auto = "auto"  # thread on CPU, process on GPU
    thread = "thread"  # vLLM's engine core on a thread of the engine actor (rollout/engine/thread.py)
    process = "process"  # vLLM's AsyncLLM: the engine core in a child process of the actor


class SyncPauseMode(StrEnum):
    wait = "wait"  # in-flight requests finish on the old weights first
    keep = "keep"  # in-flight requests continue on the new weights


@dataclass
class ModelConfig:
    name: str = MISSING  # tiny | tiny_tied | smollm2_135m (conf/model/), or a label when `path` is set
    path: str | None = None  # local HF model folder; overrides the built-in `name`
    dtype: Dtype = Dtype.float32  # engine and learner weights
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
    # KV cache size per engine, GiB; null (GPU only): what gpu_memory_utilization leaves
    kv_cache_gb: float | None = 1.0
    gpu_memory_utilization: float = 0.85  # GPU only: fraction of device memory for vLLM
    tensor_parallel_size: int = 1  # GPU only
    max_num_seqs: int = 64  # sequences batched per engine step
    # vLLM's prefix cache: later turns reuse earlier turns' KV blocks (off for trainer.deterministic: a
    # cached prefix is computed in another batch, which changes the last bits of what follows)
    prefix_caching: bool = True
    # KV-cache block (tokens): the prefix cache reuses whole blocks only (vLLM's CPU default, 128, caches no
    # short prompt); null: vLLM's
    block_size: int | None = 32
    # CPU only: the cores vLLM's worker binds its OpenMP threads to: "auto" (vLLM's: one core per
    # node kept for its scheduler, so ONE core on a 2-core box, the same one for every engine),
    # "all" (every core this engine may run on), "i/n" (the i-th of n equal shares of them, e.g.
    # 0/2 and 1/2 for two engines that generate at once), or vLLM's list ("0-1", TP ranks split by
    # "|"); a share is split over tensor_parallel_size ranks
    cpu_cores: str = "auto"
    enforce_eager: bool = True  # skip CUDA graphs / torch.compile (start-up time on CPU)
    # where vLLM's engine core runs: "thread" imports vLLM once per engine (a CPU engine starts in
    # about half the time); "process" is vLLM's own AsyncLLM; "auto": thread on CPU, process on GPU
    core: EngineCore = EngineCore.auto
    vllm_log_level: str = "ERROR"  # vLLM's log level in the engine actors (its start-up warnings are at WARNING)
    start_timeout_s: float = 300.0  # engine start (model load) limit
    # one model call longer than this is cancelled and its episode run again (< rollout.timeout_s)
    request_timeout_s: float = 240.0
    sync_timeout_s: float = 600.0  # loading new weights into the engines longer than this stops the run
    # times Ray restarts a dead (or hung: see health_*) engine over its life; past it the run stops (resume continues)
    max_restarts: int = 3
    health_check_s: float = 30.0  # seconds between health probes of each engine (0: no probes)
    health_timeout_s: float = 120.0  # an engine that does not answer a probe within this is killed and restarted
    sync_pause_mode: SyncPauseMode = SyncPauseMode.wait  # what in-flight requests do during a weight load


@dataclass
class LoraConfig:
    """A LoRA adapter on the policy's model (PEFT on the learner, vLLM multi-LoRA on the engine)."""

    rank: int = 16  # r: the adapter's inner dimension
    alpha: float = 32.0  # scaling numerator: the update is (alpha / rank) * B @ A
    dropout: float = 0.0  # on the adapter's input while training (0 keeps learner and engine exact)
    target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS))  # module names adapted


# Attention and MLP projections of Llama/Qwen2-style models (SmolLM2, the tiny model).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's allowed max_lora_rank values


@dataclass
class PolicyConfig:
    """One policy: a set of weights with its own engines (and, if trainable, its own learner ranks).
    Each section overrides the top-level one of the same name, key by key; setting `model.name`
    or `model.path` serves a different model (e.g. a bigger frozen judge). With `lora` the policy
    is an adapter on its model: it shares the engines of every policy on the same base model that
    is an adapter or frozen, and trains only the adapter."""

    trainable: bool = True  # False: served, never trained
    model: dict[str, Any] = field(default_factory=dict)  # overrides of `model`
    engine: dict[str, Any] = field(default_factory=dict)  # overrides of `engine`
    learner: dict[str, Any] = field(default_factory=dict)  # overrides of `learner` (training only)
    lora: LoraConfig | None = None  # set (e.g. `+policies.a.lora.rank=16`): a LoRA adapter on `model`


# What `policies:` holds before the config adds to it: `main` trained from `model`, `frozen` the same model untrained.
DEFAULT_POLICIES = {MAIN_POLICY: PolicyConfig(trainable=True), FROZEN_POLICY: PolicyConfig(trainable=False)}


def override(base, overrides: dict[str, Any], key: str):
    """A copy of the dataclass `base` with each field in `overrides` replaced (a dict value, e.g.
    `resources`, replaces the whole dict), type-checked like a YAML value; ValueError naming
    `key.<field>` for an unknown field or a bad value."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if not overrides:
        return base
    try:
        conf = OmegaConf.structured(base)
        for name, value in overrides.items():
            if isinstance(value, dict) and conf.get(name, "") is None:
                # a section that is off (None, e.g. `lora`): its schema's defaults, then the given keys
                section = _section_type(type(base), name)
                try:
                    value = OmegaConf.merge(OmegaConf.structured(section), value)
                except OmegaConfBaseException as e:
                    reason = str(e).splitlines()[0]
                    raise ValueError(
                        f"{key}.{name}.{getattr(e, 'full_key', '')}: {reason} (fields: "
                        f"{', '.join(f.name for f in dataclasses.fields(section))})"
                    ) from None
            conf[name] = value
        return OmegaConf.to_object(conf)
    except OmegaConfBaseException as e:
        field_name = getattr(e, "full_key", None) or ""
        reason = str(e).splitlines()[0]
        raise ValueError(
            f"{key}.{field_name}: {reason} (fields: {', '.join(f.name for f in dataclasses.fields(base))})"
            if field_name
            else f"{key}: {reason}"
        ) from None


def _section_type(cls, name: str) -> type:
    """The dataclass type of `cls`'s optional section `name` (`X | None`)."""
    import typing

    hint = typing.get_type_hints(cls)[name]
    return next(t for t in typing.get_args(hint) if dataclasses.is_dataclass(t))


@dataclass
class RolloutConfig:
    num_workers: int = 1  # RolloutWorker actors
    concurrency: int = 16  # harness episodes in flight per worker
    group_size: int = 4  # traces per task instance (group baselines)
    timeout_s: float = 300.0  # per-episode limit; past it the trace is failed
    retries: int = 1  # times an episode an engine failure ended is run again (same trace id and seeds)
    max_worker_restarts: int = 3  # times a dead worker is restarted and its unfinished groups run again
    worker_restart_timeout_s: float = 300.0  # a restarted worker that does not answer within this stops the run
    buffer_timeout_s: float = 120.0  # a trace buffer call (put, reopen) not answered within this fails its worker call
    # the watchdog asks each worker for its stats every this often (0: never); one whose event loop does not
    # answer within health_timeout_s (a harness that blocks it) is killed, restarted, and its groups run again
    health_check_s: float = 30.0
    health_timeout_s: float = 120.0  # a worker that does not answer the watchdog within this is restarted


@dataclass
class HarnessConfig:
    _target_: str = MISSING  # dotted path of the harness function
    name: str = MISSING  # short name, used in logs
    roles: list[str] = field(default_factory=list)  # agent roles the harness calls
    options: dict[str, Any] = field(default_factory=dict)  # keyword args for the harness
    # [low, high]: a harness's reward (or a role's) outside it fails the trace; one an agent reports is refused (400)
    reward_range: list[float] = field(default_factory=lambda: list(REWARD_RANGE))


@dataclass
class TaskConfig:
    _target_: str = "harnesses.tasks.reasoning_gym.ReasoningGymTasks"  # a harnesses.base.TaskSource class
    name: str = MISSING  # reasoning-gym dataset name, e.g. chain_sum
    params: dict[str, Any] = field(default_factory=dict)  # dataset parameters (difficulty)
    instruction: str | None = None  # appended to each question; None: the source's default
    size: int = 100000  # distinct training items
    eval_size: int = 64  # held-out tasks: distinct questions, none ever a training question
    eval_seed: int = 1000003  # the held-out stream's seed, far from training's (reasoning-gym item i: Random(seed + i))


@dataclass
class RayConfig:
    address: str = "local"  # "local": an in-process cluster; "auto" or host:port to join one
    num_cpus: int | None = None  # logical CPUs of a local cluster (None: the machine's, or what the actors ask if more)
    num_gpus: int | None = None  # GPUs of a local cluster (None: those torch sees; CUDA_VISIBLE_DEVICES honoured)


@dataclass
class RolloutJobConfig:
    """What a rollout fleet needs: model, engines, workers, harness, task, agents (train and generate)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    harness: HarnessConfig = field(default_factory=HarnessConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    # name -> PolicyConfig fields, added to DEFAULT_POLICIES; untyped so that hydra's `+policies.x.model.path=...`
    # can add a policy key by key (each checked against PolicyConfig by validate())
    policies: dict[str, Any] = field(default_factory=dict)
    agents: dict[str, str] = field(default_factory=dict)  # role -> policy (a key of `policies`, "main" or "frozen")
    seed: int = 0  # tasks, every model call's sampling seed (with the trace id), torch

    # ---- the policies the agents use, each resolved against the top-level sections -----
    def policy_table(self) -> dict[str, PolicyConfig]:
        base = {**DEFAULT_POLICIES}
        return {
            **base,
            **{
                name: override(base.get(name, PolicyConfig()), dict(fields or {}), f"policies.{name}")
                for name, fields in self.policies.items()
            },
        }

    def used_policies(self) -> list[str]:
        """The policies some role is mapped to, sorted: the ones that get engines."""
        return sorted(set(self.agents.values()))

    def trainable_policies(self) -> list[str]:
        table = self.policy_table()
        return [p for p in self.used_policies() if p in table and table[p].trainable]

    def policy_model(self, policy: str) -> ModelConfig:
        overrides = dict(self.policy_table()[policy].model)
        base = self.model
        if "name" in overrides or "path" in overrides:  # another model: nothing of `model`'s identity carries over
            base = dataclasses.replace(base, name=overrides.get("name", overrides.get("path")), path=None)
        return override(base, overrides, f"policies.{policy}.model")

    def policy_engine(self, policy: str) -> EngineConfig:
        return override(self.engine, self.policy_table()[policy].engine, f"policies.{policy}.engine")

    def policy_lora(self, policy: str) -> LoraConfig | None:
        return self.policy_table()[policy].lora

    def base_model_key(self, policy: str) -> tuple:
        """What makes two policies' models the same base (for engines and learners to share it)."""
        m = self.policy_model(policy)
        return m.name, m.path, m.dtype, m.max_model_len

    def engine_pools(self) -> dict[str, list[str]]:
        """Which used policies share engines: pool name -> its policies (sorted). A LoRA policy's
        engines serve its base model with every adapter on that base, and the base itself to the
        frozen policies of the same model; every other policy has its own pool, named after it."""
        base = self.base_model_key
        table, pools = self.policy_table(), {}
        adapters = [p for p in self.used_policies() if table[p].lora is not None]
        for p in self.used_policies():
            if table[p].lora is None and (table[p].trainable or all(base(a) != base(p) for a in adapters)):
                pools[p] = [p]
        for key in dict.fromkeys(base(a) for a in adapters):
            members = [p for p in self.used_policies() if p not in pools and base(p) == key]
            pools["+".join(members)] = members
        return pools

    def pool_engine(self, pool: list[str]) -> EngineConfig:
        """The engine settings of a pool (its policies must agree on them: validate_policies)."""
        return self.policy_engine(pool[0])

    def asks(self) -> list[Ask]:
        """What the job's actors ask Ray for, group by group: every engine pool's engines (the
        workers and the state holders ask nothing)."""
        table = self.policy_table()
        return [
            engine_ask(name, pool[0], table[pool[0]].engine, self.pool_engine(pool))
            for name, pool in self.engine_pools().items()
        ]

    def cpus_asked(self) -> float:
        """Ray CPUs the job's actors ask for together."""
        return sum(a.options["num_cpus"] * a.count for a in self.asks())


@dataclass
class GenerateJobConfig(RolloutJobConfig):
    """scripts/generate.py: generate traces and write them to a JSONL file."""

    num_traces: int = 32  # traces to generate (rounded up to whole groups)
    out: str = "traces.jsonl"  # where to write them


def make_task_source(cfg: TaskConfig, seed: int) -> TaskSource:
    """The task source named by `task._target_`, built from the other `task.*` keys (TaskSource's
    constructor takes exactly them) and the run's seed."""
    keys = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "_target_"}
    return load_task_source(cfg._target_)(**{**keys, "params": dict(cfg.params)}, seed=seed)


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="generate_schema", node=GenerateJobConfig)
