"""Typed config of the training job (scripts/train.py), registered with Hydra's ConfigStore.

Extends the rollout fleet's schema with the learner, the algorithm, the loop,
evaluation, logging and the weight sync: every schema the trainer reads lives here, so
composing a config imports no torch, Ray, vLLM or DeepSpeed. trainer/checks.py's
`validate()` runs every cross-field check before Ray starts.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from hydra.core.config_store import ConfigStore

from rollout.config import (
    GenerateJobConfig,
    RolloutJobConfig,
    override,
    register_configs as register_rollout_configs,
)
from rollout.placement import Ask, learner_ask


# ---- the learner ranks (trainer/learner.py) -----
class Normalization(StrEnum):
    """What each token's loss weight is normalised by (trainer/packing.py's `token_weights`)."""

    token = "token"
    sequence = "sequence"
    trace = "trace"
    constant = "constant"


class Optimizer(StrEnum):
    adamw = "adamw"
    sgd = "sgd"


@dataclass
class LearnerConfig:
    world_size: int = 2  # DeepSpeed ranks (Ray actors)
    num_cpus: float = 1.0  # Ray CPUs per rank
    num_gpus: float = 0.0  # Ray GPUs per rank (1 on GPU machines)
    torch_threads: int = 0  # CPU: intra-op threads per rank (0: Ray's default, num_cpus)
    resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources (node placement)
    zero_stage: int = 2  # DeepSpeed ZeRO stage 0-3
    optimizer: Optimizer = Optimizer.adamw  # a torch optimizer (DeepSpeed's own would g++-build ops)
    lr: float = 1e-5  # peak learning rate
    warmup_steps: int = 0  # linear warm-up from 0 to lr
    weight_decay: float = 0.0  # the optimizer's weight decay (AdamW's decoupled; SGD's L2)
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW betas
    grad_clip: float = 1.0  # max global grad norm (0 disables)
    micro_batch_tokens: int = 4096  # padded tokens per forward/backward
    gradient_checkpointing: bool = False  # trade compute for activation memory
    dist_timeout_s: float = 600.0  # collective-op timeout
    # one learner call (train step, weight export, save, load) longer than this stops the run
    call_timeout_s: float = 1800.0
    share_lora_base: bool = True  # LoRA policies on one base model train on one set of ranks holding the base once


# The learner settings each adapter of a shared group keeps its own (its optimizer's).
PER_ADAPTER = ("optimizer", "lr", "warmup_steps", "weight_decay", "betas", "grad_clip")


# ---- the algorithm: loss (trainer/losses.py) and advantages (trainer/advantages.py) -----
@dataclass
class LossConfig:
    clip_low: float = 0.2  # PPO clip below 1
    clip_high: float = 0.28  # PPO clip above 1 (DAPO's clip-higher)
    dual_clip: float = 3.0  # bound on -r*A for negative advantages (0 disables)
    kl_coef: float = 0.0  # weight of KL to the frozen reference (0: no reference model)
    temperature: float = 1.0  # logits are divided by this, as the engine sampled
    normalization: Normalization = Normalization.token  # what a token's loss weight is divided by (trainer/packing.py)
    constant: float = 1024.0  # the "constant" normalisation's tokens per trace


class Estimator(StrEnum):
    grpo = "grpo"  # group mean baseline [/ group std]
    rloo = "rloo"  # leave-one-out group baseline
    batch_mean = "batch_mean"  # batch mean baseline [/ batch std]
    uniform = "uniform"  # no baseline


@dataclass
class AdvantageConfig:
    """How advantages are computed (config group `algorithm.advantage`)."""

    estimator: Estimator = Estimator.grpo  # the baseline (see Estimator)
    scale_by_std: bool = True  # grpo / batch_mean: divide by the pool's population std (+ eps)
    per_agent_rewards: bool = False  # a role's sequences use agent_rewards[role]; baselines per role
    normalize_per_agent: bool = False  # then divide each role's advantages by its batch std (Dr. MAS)
    use_turn_rewards: bool = False  # add a sequence's own `reward` to its advantage (no baseline)
    eps: float = 1e-6  # added to every std before dividing
    role_baseline: bool = True  # with per_agent_rewards: baselines per role; False: one pool for all roles

    def __post_init__(self) -> None:
        validate_config(self)


def validate_config(cfg: AdvantageConfig) -> None:
    """Raise ValueError naming the config key for a bad estimator or eps (for configs built in
    Python; Hydra's schema already rejects both)."""
    if cfg.estimator not in Estimator.__members__:
        raise ValueError(
            f"algorithm.advantage.estimator = {cfg.estimator!r} is not a known advantage "
            f"estimator; choose one of {list(Estimator)}"
        )
    if not math.isfinite(cfg.eps) or cfg.eps < 0:
        raise ValueError(f"algorithm.advantage.eps = {cfg.eps!r} must be a finite number >= 0")


# ---- weights from the learners to the engines (trainer/weight_sync.py) -----
class SyncMethod(StrEnum):
    auto = "auto"  # collective for full weights, object_store for LoRA adapters or if the group cannot form
    collective = "collective"  # a process group from learner rank 0 to the engines (error if it cannot form)
    object_store = "object_store"  # safetensors buckets through Ray's object store


class Transport(StrEnum):  # trainer/weight_transport.py::choose_transport
    auto = "auto"
    ipc = "ipc"
    nccl = "nccl"
    gloo = "gloo"


@dataclass
class SyncConfig:
    method: SyncMethod = SyncMethod.auto  # how weights travel from the learners to the engines
    # collective's transport per engine worker: auto (ipc on learner rank 0's GPU, nccl on another GPU,
    # gloo on CPU), or one of ipc / nccl / gloo (an error at start where it cannot work)
    transport: Transport = Transport.auto
    bucket_mb: int = 64  # weights per broadcast bucket / per safetensors blob, MiB
    # collective: every this many pushes rank 0 also exports the weights to the object store, which an
    # engine that restarts loads (1: every push; k: an engine restarting between snapshots serves an
    # older version, tagged as such, until the next push reaches it; spares k-1 of k full-weight exports)
    snapshot_every: int = 1


@dataclass
class AlgorithmConfig:
    name: str = "grpo"  # label for logs
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    loss: LossConfig = field(default_factory=LossConfig)  # conf/train.yaml ties loss.temperature to sampling's
    merge_prefixes: bool = True  # train exact-prefix turns of a trace as one row
    share_prefixes: bool = True  # rows with the same untrained head (one prompt's samples): the head once


@dataclass
class LoopConfig:
    steps: int = 20  # optimizer steps
    groups_per_step: int = 8  # task groups per step (traces per step = this x rollout.group_size)
    max_staleness: int = 0  # 0: synchronous; k: rollout may run k weight versions ahead
    eval_every: int = 10  # steps between held-out evaluations (0: only before and after)
    save_every: int = 10  # steps between checkpoints (0: only at the end)
    keep_last: int = 2  # complete checkpoints kept (older ones are deleted)
    log_traces_every: int = 10  # steps between wandb trace tables (0: never)
    # steps between writing the step's rollout traces to run_dir/rollouts/step_<n>.jsonl (0: never)
    rollouts_every: int = 0
    resume: str | None = None  # `auto`: run_dir's newest checkpoint if it has one; a run dir: its newest
    overwrite: bool = False  # start afresh in a run_dir that holds a previous run (its outputs are deleted)
    rollout_timeout_s: float = 1800.0  # waiting for one step's traces longer than this is an error
    max_skipped_steps: int = 3  # optimizer steps in a row skipped for a non-finite loss/gradient that stop the run
    max_failed_fraction: float = 0.5  # a step's (or an eval's) traces failing above this share stop the run
    # learner groups that died or hung rebuilt inside the run (back to the last checkpoint); one more stops it
    max_learner_restarts: int = 3
    # a synchronous run ends with the same weights, to the bit, with or without faults (docs/faults.md): needs
    # engine.max_num_seqs=1, engine.prefix_caching=false, learner.torch_threads >= 1, max_staleness=0 (CPU)
    deterministic: bool = False


@dataclass
class EvalConfig:
    size: int = 32  # held-out tasks evaluated (the first of task.eval_size distinct questions never trained on)
    temperature: float = 0.0  # 0: greedy
    max_tokens: int | None = None  # None: sampling.max_tokens
    timeout_s: float = 1800.0  # one evaluation taking longer than this is an error


class LoggerMode(StrEnum):
    offline = "offline"  # wandb run files in run_dir/wandb; `wandb sync` uploads later
    online = "online"  # wandb with WANDB_API_KEY
    disabled = "disabled"  # no wandb (metrics.jsonl and the status line are always written)


@dataclass
class LoggerConfig:
    mode: LoggerMode = LoggerMode.offline  # wandb mode
    project: str = "tracerl"  # wandb project
    name: str | None = None  # run name (default: the run dir's name)


@dataclass
class TrainJobConfig(RolloutJobConfig):
    trainer: LoopConfig = field(default_factory=LoopConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)  # learners -> engines weight transport
    run_dir: str = "runs/default"  # resolved config, metrics.jsonl, checkpoints, summary.json

    def asks(self) -> list[Ask]:
        """What the job's actors ask Ray for, group by group: the engines, and every learner group's ranks."""
        table = self.policy_table()
        return super().asks() + [
            learner_ask(name, ps[0], table[ps[0]].learner, self.group_learner(ps))
            for name, ps in self.learner_groups().items()
        ]

    def learner_groups(self) -> dict[str, list[str]]:
        """Which trained policies share learner ranks: group name -> its policies. LoRA policies on
        one base model share one group, which holds the base once, when `learner.share_lora_base`
        is on for them and their ranks are placed and sharded alike (every learner setting but the
        optimizer's, ZeRO stage below 3); every other trained policy has its own group."""
        groups: dict[tuple, list[str]] = {}
        for p in self.trainable_policies():
            lr = self.policy_learner(p)
            if self.policy_lora(p) is not None and lr.share_lora_base and lr.zero_stage < 3:
                ranks = dataclasses.replace(lr, **{k: getattr(LearnerConfig, k) for k in PER_ADAPTER})
                key = ("lora", self.base_model_key(p), repr(ranks))
            else:
                key = ("own", p)
            groups.setdefault(key, []).append(p)
        return {"+".join(ps): ps for ps in groups.values()}

    def group_learner(self, policies: list[str]) -> LearnerConfig:
        """The learner settings of a group's ranks (its policies agree on them but the optimizer's)."""
        return self.policy_learner(policies[0])

    def sync_method(self, policy: str) -> SyncMethod:
        """How `policy`'s weights reach its engines: `sync.method`, with `auto` resolved (the
        collective group carries full weights; adapters go through the object store)."""
        if self.sync.method != SyncMethod.auto:
            return self.sync.method
        return SyncMethod.object_store if self.policy_lora(policy) is not None else SyncMethod.collective

    def policy_learner(self, policy: str) -> LearnerConfig:
        """`learner` with `policies.<policy>.learner` applied: that policy's learner ranks."""
        return override(self.learner, self.policy_table()[policy].learner, f"policies.{policy}.learner")


CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def register_configs() -> None:
    ConfigStore.instance().store(name="train_schema", node=TrainJobConfig)


def compose(config_name: str = "train", overrides: list[str] = ()) -> TrainJobConfig | GenerateJobConfig:
    """conf/<config_name>.yaml with hydra `overrides`, as the typed config object (for benches and
    tests; the scripts get the same from @hydra.main); ValueError where an experiment preset's own
    task settings meet a task the command line picked (check_experiment_task)."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    register_rollout_configs()
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        dcfg = hydra_compose(config_name, overrides=list(overrides), return_hydra_config=True)
    check_experiment_task(dict(dcfg.hydra.runtime.choices))
    with open_dict(dcfg):
        del dcfg["hydra"]
    return OmegaConf.to_object(dcfg)


def check_experiment_task(choices: dict[str, str | None]) -> None:
    """An experiment never silently overrides what the user picks: the `task.*` keys an experiment
    preset sets itself belong to the task its defaults list picks, so with another task (`task=`
    on the command line) they are an error naming the preset, not keys quietly merged into (or
    dropped from) the user's task. `choices`: Hydra's group choices (hydra.runtime.choices)."""
    experiment = choices.get("experiment")
    if not experiment:
        return
    task, keys = experiment_task(experiment)
    if keys and choices.get("task") != task:
        raise ValueError(
            f"experiment={experiment} sets {', '.join(f'task.{k}' for k in keys)} for its task ({task}), "
            f"which cannot apply to task={choices.get('task')}: drop task= to run the experiment as it is, "
            f"or give the task's keys yourself without experiment={experiment}"
        )


def experiment_task(experiment: str) -> tuple[str | None, list[str]]:
    """The task conf/experiment/<experiment>.yaml picks (its defaults list's `override /task`, or
    that of a preset it extends) and the task keys it sets itself (and those it extends do)."""
    from omegaconf import OmegaConf

    conf = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "experiment" / f"{experiment}.yaml"))
    task, keys = None, []
    for entry in conf.get("defaults", []):
        if isinstance(entry, dict):
            task = entry.get("override /task", task)
        elif entry != "_self_":  # a preset this one extends: its task and keys, then this one's
            task, keys = experiment_task(entry)
    return task, keys + _dotted_keys(conf.get("task", {}))


def _dotted_keys(node: dict, prefix: str = "") -> list[str]:
    return [
        key
        for name, value in node.items()
        for key in (_dotted_keys(value, f"{prefix}{name}.") if isinstance(value, dict) and value else [prefix + name])
    ]
