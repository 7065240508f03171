"""Where the job's actors go: the Ray resources each asks for, and whether they fit the GPUs.

`actor_options` turns an engine's or a learner rank's settings into its Ray options; spawn_engines
and LearnerGroup create their actors with it, and the config's `asks()` lists the same options
for the checks here (before Ray starts) and for tests/rollout/test_placement.py.

GPU sharing (conf/cluster/gpu.yaml): an actor with a fraction of a GPU (0 < num_gpus < 1) takes
that share of the GPU's memory at most: an engine its `gpu_memory_utilization` (which must not
exceed its num_gpus), a learner rank its num_gpus. Ray puts actors on a GPU while their
num_gpus add up to 1 at most, so the memory of any GPU they share stays within it; actors that
can all land on one GPU must also leave it headroom (their shares add up below 1).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

PRESETS = {
    "local": "CPU only",
    "gpu": "one GPU: the engines and one learner rank share it",
    "gpu_node": "one node of N GPUs: a GPU for each engine and each learner rank",
}


@dataclass(frozen=True)
class Ask:
    """What one group of the job's actors asks Ray for: `count` actors with `options` each."""

    what: str  # e.g. "engines of pool 'main'", for messages
    count: int  # actors
    options: dict  # actor_options(): num_cpus, num_gpus, resources
    memory: float  # share of its GPU's memory each actor takes (0: no GPU)
    gpu_key: str  # the key that sets options["num_gpus"], e.g. engine.num_gpus
    memory_key: str  # the key that sets `memory`

    @property
    def num_gpus(self) -> float:
        return self.options["num_gpus"]


def actor_options(cfg) -> dict:
    """Ray options of one engine actor or learner rank (an EngineConfig or a LearnerConfig)."""
    return {"num_cpus": cfg.num_cpus, "num_gpus": cfg.num_gpus, "resources": dict(cfg.resources) or None}


def _key(section: str, policy: str, overrides: dict, name: str) -> str:
    """Where field `name` of a policy's `section` (engine, learner) is set: its own override or the top level's."""
    return f"policies.{policy}.{section}.{name}" if name in overrides else f"{section}.{name}"


def engine_ask(pool: str, policy: str, overrides: dict, engine) -> Ask:
    """The engines of `pool` (settings `engine`: `policy`'s, with its `overrides` of `engine`)."""
    return Ask(
        f"engines of pool {pool!r}",
        engine.num_engines,
        actor_options(engine),
        engine.gpu_memory_utilization if engine.num_gpus > 0 else 0.0,
        _key("engine", policy, overrides, "num_gpus"),
        _key("engine", policy, overrides, "gpu_memory_utilization"),
    )


def learner_ask(group: str, policy: str, overrides: dict, learner) -> Ask:
    """The ranks of learner group `group` (settings `learner`: `policy`'s, with its `overrides`)."""
    gpu_key = _key("learner", policy, overrides, "num_gpus")
    return Ask(
        f"learner ranks of {group!r}",
        learner.world_size,
        actor_options(learner),
        min(learner.num_gpus, 1.0),
        gpu_key,
        gpu_key,
    )


def gpus_needed(asks: list[Ask]) -> int:
    """GPUs that hold every actor: whole-GPU actors each their own, and the fractional ones packed
    (first fit, largest first) onto GPUs holding at most 1.0 of num_gpus each, as Ray does."""
    whole = sum(round(a.num_gpus) * a.count for a in asks if a.num_gpus >= 1)
    shared: list[float] = []
    for f in sorted((a.num_gpus for a in asks if 0 < a.num_gpus < 1 for _ in range(a.count)), reverse=True):
        i = next((i for i, used in enumerate(shared) if used + f <= 1.0 + 1e-9), None)
        if i is None:
            shared.append(f)
        else:
            shared[i] += f
    return whole + len(shared)


# ---- checks of one section's settings (validate() runs them per policy) -------------------------


def check_engine_gpus(engine, where: str) -> None:
    """An engine's GPU settings are sound on their own; ValueError naming `where`'s keys."""
    g, util, tp = engine.num_gpus, engine.gpu_memory_utilization, engine.tensor_parallel_size
    if not 0 < util < 1:
        raise ValueError(
            f"{where}.gpu_memory_utilization={util} must be in (0, 1) (the share of each GPU's memory "
            f"the engine takes; cluster=gpu: 0.25, a GPU of its own: 0.85)"
        )
    if g < 0 or (g > 1 and g != int(g)):
        raise ValueError(
            f"{where}.num_gpus={g} must be 0 (CPU), a fraction of one GPU (engines and the learner "
            f"share it: cluster=gpu) or whole GPUs (cluster=gpu_node)"
        )
    if g > 0 and tp > 1 and g != tp:
        raise ValueError(
            f"{where}.tensor_parallel_size={tp} needs whole GPUs, one per rank: set "
            f"{where}.num_gpus={tp} (cluster=gpu_node), or tensor_parallel_size=1"
        )
    if g >= 1 and g != tp:
        raise ValueError(
            f"{where}.num_gpus={g}: an engine uses one GPU per tensor-parallel rank; set "
            f"{where}.num_gpus={tp} or {where}.tensor_parallel_size={round(g)}"
        )
    if 0 < g < 1 and util > g:
        raise ValueError(
            f"{where}.gpu_memory_utilization={util} is more than {where}.num_gpus={g}: an engine "
            f"sharing a GPU may use at most the share it asks Ray for (Ray packs a GPU by num_gpus); "
            f"set {where}.gpu_memory_utilization<={g} (cluster=gpu: 0.25 and 0.25)"
        )


def check_learner_gpus(learner, where: str) -> None:
    """A learner group's GPU settings are sound on their own; ValueError naming `where`'s keys."""
    g = learner.num_gpus
    if not 0 <= g <= 1:
        raise ValueError(
            f"{where}.num_gpus={g}: a learner rank uses one GPU: 0 (CPU), a fraction (sharing the "
            f"GPU with the engines: cluster=gpu) or 1 (cluster=gpu_node)"
        )
    if learner.world_size > 1 and 0 < g < 1:
        raise ValueError(
            f"{where}.world_size={learner.world_size} with {where}.num_gpus={g}: DeepSpeed ranks need "
            f"a whole GPU each (NCCL refuses two ranks on one device); set {where}.world_size=1 "
            f"(cluster=gpu) or {where}.num_gpus=1 (cluster=gpu_node)"
        )


# ---- checks of the whole job against the GPUs there are ------------------------------------------


def _listing(asks: list[Ask], value) -> str:
    return "; ".join(f"{a.what}: {a.count} x {value(a)}" for a in asks)


def check_shared_memory(asks: list[Ask]) -> None:
    """Actors with fractions of a GPU that can all land on one GPU leave it headroom: their
    memory shares add up below 1. ValueError naming the keys and the presets that fit."""
    shared = [a for a in asks if 0 < a.num_gpus < 1 and a.count]
    if sum(a.num_gpus * a.count for a in shared) > 1.0 + 1e-9:
        return  # they span GPUs; each one's memory is within its num_gpus (check_engine_gpus)
    total = sum(a.memory * a.count for a in shared)
    if total >= 1.0 - 1e-9:
        raise ValueError(
            f"the engines and learner ranks sharing one GPU take {total:g} of its memory, which must "
            f"add up below 1 ({_listing(shared, lambda a: f'{a.memory_key}={a.memory:g}')}); lower "
            f"them (cluster=gpu: 0.25 per engine, 0.4 for one learner rank), or give each its own "
            f"GPU (cluster=gpu_node)"
        )


def check_gpu_count(asks: list[Ask], visible: int, source: str) -> None:
    """The job's actors fit `visible` GPUs (of `source`, for the message); ValueError naming the
    keys and the preset that fits."""
    need = gpus_needed(asks)
    if need <= visible:
        return
    gpu_asks = [a for a in asks if a.num_gpus > 0 and a.count]
    fewer = "engine.num_engines, learner.world_size, policies.<name>.engine.num_engines"
    if visible == 0:
        fix = "use cluster=local (CPU), or a machine with GPUs"
    elif visible == 1 and all(a.num_gpus < 1 for a in gpu_asks):
        fix = (
            f"they share the GPU only if their num_gpus add up to 1 at most: lower them or ask fewer actors "
            f"({fewer}); cluster=gpu holds one learner rank and up to two engine pools"
        )
    elif visible == 1:
        fix = "use cluster=gpu (the engines and one learner rank share the GPU)"
    else:
        fix = f"ask fewer engines or learner ranks ({fewer}), or share GPUs (cluster=gpu)"
    raise ValueError(
        f"the job needs {need} GPU(s) ({_listing(gpu_asks, lambda a: f'{a.gpu_key}={a.num_gpus:g}')}"
        f") but {source} has {visible}: {fix}"
    )


def visible_gpus(declared: int | None) -> int:
    """GPUs of an in-process Ray cluster: `ray.num_gpus` if set, else those torch sees (it honours
    CUDA_VISIBLE_DEVICES; 0 with a CPU build of torch)."""
    if declared is not None:
        return declared
    import torch

    return torch.cuda.device_count()


# ---- the preset for this machine ---------------------------------------------------------------


def pick_cluster(args: list[str], gpus: int) -> tuple[list[str], str | None]:
    """The `cluster=` override for a machine with `gpus` GPUs when the command line `args` names no
    cluster preset and joins no Ray cluster (`ray.address`): local (0), gpu (1), gpu_node (more);
    a `ray.num_gpus=` there counts instead of `gpus`. Returns (the overrides to add, the line that
    says so), or ([], None) when nothing is picked."""
    given = dict((a.split("=", 1) + [""])[:2] for a in args if not a.startswith("-"))
    given = {key.lstrip("+~"): value for key, value in given.items()}
    if "cluster" in given or given.get("ray.address", "local") != "local":
        return [], None
    declared = given.get("ray.num_gpus", "null").isdigit()  # the GPUs the local cluster is told it has
    gpus = int(given["ray.num_gpus"]) if declared else gpus
    preset = "local" if gpus == 0 else "gpu" if gpus == 1 else "gpu_node"
    seen = "from ray.num_gpus" if declared else "seen by torch"
    return [f"cluster={preset}"], (
        f"[cluster] cluster={preset}: {PRESETS[preset]} ({gpus} GPU(s), {seen}); "
        f"to choose, add cluster=local|gpu|gpu_node|multinode_gpu"
    )


def with_cluster_for_this_machine(argv: list[str]) -> list[str]:
    """A script's `argv` with the cluster preset for this machine's GPUs added (pick_cluster),
    printing which. It goes first: hydra's flags (--cfg job) may end the command line."""
    extra, line = pick_cluster(argv[1:], visible_gpus(None))
    if line:
        log.info(line)
    return argv[:1] + extra + argv[1:]
