"""The GPU cluster presets (conf/cluster/gpu.yaml, gpu_node.yaml) with every experiment, the GPU
config checks (each error names the keys and a preset that fits; all run before Ray starts), the
pick of a preset by the machine's GPUs and the job's needs, and the stop when nvidia-smi lists GPUs
that torch cannot use. Pure config: the GPUs are declared (`ray.num_gpus`) or listed by a stand-in
`nvidia-smi`; tests/rollout/test_placement.py places actors with them."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollout.placement import (
    CUDA_DRIVER_MIN,
    MachineGpus,
    gpus_needed,
    pick_cluster,
    unusable_gpus,
)
from trainer.checks import validate
from trainer.config import compose

pytestmark = pytest.mark.unit

CONF = Path(__file__).resolve().parents[1] / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
TWO_TRAINED = {"smollm2_two_policies", "study_team_full"}  # two learners and two pools: more than one GPU's shares


def test_every_cluster_preset_has_its_learner_part():
    """conf/train.yaml takes a preset's learner ranks from cluster/learner/<the same name>."""
    assert sorted(p.stem for p in (CONF / "cluster").glob("*.yaml")) == sorted(
        p.stem for p in (CONF / "cluster/learner").glob("*.yaml")
    )


@pytest.mark.parametrize("experiment", sorted(set(EXPERIMENTS) - TWO_TRAINED))
def test_every_experiment_fits_one_gpu_with_the_gpu_preset(experiment):
    """The cluster preset comes after the experiment: one learner rank even for smoke (whose
    schema default is 2), every pool (a frozen verifier's or judge's too) on the GPU at 0.25 of
    its memory, bf16, memory shares below 1."""
    cfg = compose("train", [f"experiment={experiment}", "cluster=gpu", "ray.num_gpus=1"])
    validate(cfg)
    asks = cfg.asks()
    assert cfg.model.dtype == "bfloat16" and gpus_needed(asks) == 1
    assert cfg.ray.num_cpus is None, "the preset, after the experiment, drops its CPU-box count"
    for ask in asks:
        assert 0 < ask.num_gpus < 1 and ask.memory == ask.num_gpus, ask
    assert [a.count for a in asks if a.what.startswith("learner")] == [1]
    assert sum(a.memory * a.count for a in asks) <= 0.9


@pytest.mark.parametrize("experiment", sorted(TWO_TRAINED))
def test_two_trained_policies_do_not_fit_one_gpu_and_the_error_says_which_keys(experiment):
    cfg = compose("train", [f"experiment={experiment}", "cluster=gpu", "ray.num_gpus=1"])
    with pytest.raises(
        ValueError,
        match=r"needs 2 GPU\(s\) \(engines of pool 'critic': 1 x engine.num_gpus=0.25;"
        r".*learner ranks of 'main': 1 x learner.num_gpus=0.4\) but the local "
        r"cluster \(ray.num_gpus=1\) has 1: .*cluster=gpu holds one learner rank",
    ):
        validate(cfg)
    validate(compose("train", [f"experiment={experiment}", "cluster=gpu", "ray.num_gpus=2"]))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_gets_whole_gpus_with_the_node_preset(experiment):
    cfg = compose("train", [f"experiment={experiment}", "cluster=gpu_node", "ray.num_gpus=4"])
    validate(cfg)
    assert cfg.model.dtype == "bfloat16"
    assert all(a.num_gpus == 1 for a in cfg.asks()), cfg.asks()
    assert gpus_needed(cfg.asks()) == sum(a.count for a in cfg.asks()) <= 4


def test_the_gpu_presets_need_gpus_and_say_which_preset_fits():
    """On a box where torch sees no GPU (this one, and every CPU CI run) the check refuses them
    before Ray starts, naming cluster=local."""
    for preset in ("gpu", "gpu_node"):
        with pytest.raises(ValueError, match=r"the job needs \d GPU\(s\) .* has 0: use cluster=local"):
            validate(compose("train", [f"cluster={preset}", "ray.num_gpus=0"]))


@pytest.mark.parametrize(
    "overrides, msg",
    [
        # more GPUs than the machine: the preset that fits
        (
            ["experiment=smoke", "cluster=gpu_node", "ray.num_gpus=1"],
            r"needs 3 GPU\(s\) \(engines of pool 'main': 1 x engine.num_gpus=1; learner ranks of 'main': 2 x "
            r"learner.num_gpus=1\) but the local cluster \(ray.num_gpus=1\) has 1: use cluster=gpu",
        ),
        (
            ["experiment=smoke", "cluster=gpu_node", "ray.num_gpus=2"],
            r"needs 3 GPU\(s\) .* has 2: ask fewer engines or learner ranks \(engine.num_engines, learner.world_size",
        ),
        # a per-policy override is named as such
        (
            [
                "experiment=smollm2_solver_verifier",
                "cluster=gpu",
                "ray.num_gpus=1",
                "+policies.frozen.engine.num_gpus=1",
            ],
            r"needs 2 GPU\(s\) \(engines of pool 'frozen': 1 x policies.frozen.engine.num_gpus=1; "
            r"engines of pool 'main': 1 x engine.num_gpus=0.25",
        ),
        # learner ranks > 1 need whole GPUs
        (
            ["cluster=gpu", "ray.num_gpus=1", "learner.world_size=2"],
            r"learner.world_size=2 with learner.num_gpus=0.4: DeepSpeed ranks need a whole GPU each .* set "
            r"learner.world_size=1 \(cluster=gpu\) or learner.num_gpus=1 \(cluster=gpu_node\)",
        ),
        (
            ["cluster=gpu", "ray.num_gpus=1", "learner.num_gpus=2"],
            r"learner.num_gpus=2.0: a learner rank uses one GPU.*cluster=gpu_node",
        ),
        # memory shares of one GPU add up below 1
        (
            [
                "cluster=gpu",
                "ray.num_gpus=1",
                "engine.num_gpus=0.5",
                "engine.gpu_memory_utilization=0.5",
                "learner.num_gpus=0.5",
            ],
            r"sharing one GPU take 1 of its memory, which must add up below 1 \(engines of pool 'main': 1 x "
            r"engine.gpu_memory_utilization=0.5; learner ranks of 'main': 1 x learner.num_gpus=0.5\); "
            r".*cluster=gpu.*cluster=gpu_node",
        ),
        (
            ["cluster=gpu", "ray.num_gpus=1", "engine.gpu_memory_utilization=0.85"],
            r"engine.gpu_memory_utilization=0.85 is more than engine.num_gpus=0.25: .*cluster=gpu: 0.25 and 0.25",
        ),
        # ranges
        (
            ["cluster=gpu", "ray.num_gpus=1", "engine.gpu_memory_utilization=1.0"],
            r"engine.gpu_memory_utilization=1.0 must be in \(0, 1\) .*cluster=gpu: 0.25",
        ),
        (["engine.num_gpus=-1"], r"engine.num_gpus=-1.0 must be 0 \(CPU\), a fraction .*cluster=gpu.*cluster=gpu_node"),
        (["cluster=gpu_node", "ray.num_gpus=4", "engine.num_gpus=1.5"], r"engine.num_gpus=1.5 must be 0 \(CPU\)"),
        (
            ["cluster=gpu_node", "ray.num_gpus=4", "engine.num_gpus=2"],
            r"engine.num_gpus=2.0: an engine uses one GPU per tensor-parallel rank; set engine.num_gpus=1 or "
            r"engine.tensor_parallel_size=2",
        ),
        (
            ["cluster=gpu_node", "ray.num_gpus=4", "engine.tensor_parallel_size=2"],
            r"engine.tensor_parallel_size=2 needs whole GPUs, one per rank: set engine.num_gpus=2 \(cluster=gpu_node\)",
        ),
        (
            ["cluster=gpu", "ray.num_gpus=1", "engine.tensor_parallel_size=2"],
            r"engine.tensor_parallel_size=2 needs whole GPUs",
        ),
    ],
)
def test_gpu_config_errors_name_the_keys_and_a_preset(overrides, msg):
    with pytest.raises(ValueError, match=msg):
        validate(compose("train", overrides))


def test_the_gpu_checks_come_after_the_machine_independent_ones():
    """A config that is wrong in itself says so on any machine, before its GPU count is compared."""
    with pytest.raises(ValueError, match="trainer.steps must be >= 1"):
        validate(compose("train", ["cluster=gpu_node", "ray.num_gpus=0", "trainer.steps=0"]))


def test_a_joined_cluster_is_compared_once_ray_has_joined_it():
    """ray.address=auto: the machine running the driver says nothing about the cluster's GPUs;
    start_ray compares them (tests/rollout/test_placement.py)."""
    validate(compose("train", ["cluster=multinode_gpu", "learner.world_size=64"]))


@pytest.mark.parametrize(
    "args, gpus, picked",
    [
        ([], 0, "cluster=local"),
        (["experiment=smoke"], 1, "cluster=gpu"),
        (["experiment=smoke"], 8, "cluster=gpu_node"),
        (["ray.num_gpus=1"], 0, "cluster=gpu"),  # the GPUs the local cluster is told it has
        (["ray.address=local"], 2, "cluster=gpu_node"),
        (["cluster=local"], 8, None),  # named: always wins
        (["+cluster=gpu"], 0, None),
        (["ray.address=auto"], 8, None),  # joining a cluster: its preset is the user's to name
        (["ray.address=10.0.0.1:6379", "trainer.steps=3"], 1, None),
    ],
)
def test_the_preset_is_picked_by_the_gpu_count_unless_one_is_named(args, gpus, picked):
    extra, line = pick_cluster(args, gpus)
    assert extra == ([picked] if picked else [])
    if picked:
        assert line.startswith(f"[cluster] {picked}:") and "to choose, add cluster=" in line
    else:
        assert line is None


def test_the_train_script_picks_a_preset_and_refuses_what_it_cannot_place_before_ray_starts():
    """scripts/train.py with no cluster= on a machine of one GPU (declared): it says it picked
    cluster=gpu, which keeps a command-line learner.world_size=2 (the command line wins) and so is
    refused before Ray starts, naming the keys and the preset that fits."""
    proc = subprocess.run(
        [sys.executable, "scripts/train.py", "ray.num_gpus=1", "learner.world_size=2"],
        cwd=CONF.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert (
        "[cluster] cluster=gpu: one GPU: the engines and one learner rank share it (1 GPU(s), from ray.num_gpus)"
    ) in proc.stderr  # a log line (rollout/log.py)
    assert "config error: learner.world_size=2 with learner.num_gpus=0.4" in proc.stderr
    assert "learner.num_gpus=1 (cluster=gpu_node)" in proc.stderr
    assert "Started a local Ray instance" not in proc.stderr + proc.stdout


def test_learners_on_a_gpu_start_after_the_engines():
    """A run starts CPU learner ranks before its fleet (they come up while the engines do), and
    GPU ones after it (vLLM sizes its KV cache from the GPU memory free while it starts): with
    the GPU preset nothing starts before the fleet. (No Ray runs here: a start would fail.)"""
    from contextlib import ExitStack

    from trainer.policy import start_learners

    cfg = compose("train", ["experiment=smoke", "cluster=gpu", "ray.num_gpus=1"])
    assert cfg.trainable_policies() and cfg.policy_learner("main").num_gpus > 0
    with ExitStack() as stack:
        assert start_learners(cfg, stack, gpu=False) == {}


# ---- the pick fits the job (GPU review F3) and never falls back to the CPU (F1) -----------------

MAKE_TRAIN = "experiment=smollm2_solver_verifier"  # make train's experiment: two engine pools, one learner rank


@pytest.mark.parametrize(
    "gpus, picked, why",
    [
        (1, "cluster=gpu", "(1 GPU(s), from ray.num_gpus)"),
        (
            2,
            "cluster=gpu",
            "(2 GPU(s), from ray.num_gpus; too few for cluster=gpu_node, which would need 3: a GPU each for "
            "engines of pool 'frozen': 1, engines of pool 'main': 1, learner ranks of 'main': 1)",
        ),
        (4, "cluster=gpu_node", "(4 GPU(s), from ray.num_gpus; the job takes 3 of them)"),
        (8, "cluster=gpu_node", "(8 GPU(s), from ray.num_gpus; the job takes 3 of them)"),
    ],
)
def test_make_trains_job_gets_gpu_node_only_where_it_fits(gpus, picked, why):
    """GPU review F3: on 2 GPUs the pick was gpu_node, which make train's job (solver engine,
    frozen verifier engine, one learner rank: 3 whole GPUs) does not fit, so the default command
    failed its config check. The pick composes the job: gpu_node where it fits, else gpu (shares),
    and its line says what and why; the job it picks passes the check on that machine."""
    args = [MAKE_TRAIN, f"ray.num_gpus={gpus}"]
    extra, line = pick_cluster(args, 0, lambda overrides: compose("train", overrides))
    assert extra == [picked]
    assert line.startswith(f"[cluster] {picked}: ") and f" {why}; to choose, add cluster=" in line
    validate(compose("train", extra + args))


def test_the_train_script_picks_shares_on_two_gpus():
    """GPU review F3, through scripts/train.py (`--cfg job`: hydra prints the job and stops):
    two declared GPUs give make train's job cluster=gpu, the learner on 0.4 of a GPU."""
    proc = subprocess.run(
        [sys.executable, "scripts/train.py", MAKE_TRAIN, "ray.num_gpus=2", "--cfg", "job"],
        cwd=CONF.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "[cluster] cluster=gpu: one GPU: the engines and one learner rank share it (2 GPU(s)," in proc.stderr
    assert "too few for cluster=gpu_node, which would need 3" in proc.stderr
    learner = proc.stdout[proc.stdout.index("\nlearner:") :]
    assert "\n  num_gpus: 0.4\n" in learner and "\n  world_size: 1\n" in learner


def machine(**kw) -> MachineGpus:
    """An H100 box as torch and nvidia-smi see it: the CUDA builds, a driver new enough, one GPU."""
    facts = dict(
        torch=1,
        listed=1,
        driver=f"{CUDA_DRIVER_MIN}.65.06",
        torch_version="2.13.0",
        torch_cuda="13.0",
        vllm_cuda=True,
        cuda_visible_devices=None,
    )
    return MachineGpus(**{**facts, **kw})


@pytest.mark.parametrize(
    "facts, why",
    [
        (dict(), None),
        (dict(torch=0, listed=0, driver=""), None),  # no GPU: the CPU
        (dict(torch=0, torch_version="2.13.0+cpu", torch_cuda=None, vllm_cuda=False), None),  # a CPU install
        (
            dict(torch=0, driver="570.124.06"),
            f"nvidia-smi lists 1 GPU(s) but torch sees none: torch 2.13.0 is a CUDA 13.0 build and the NVIDIA "
            f"driver is 570.124.06; the pinned torch needs driver {CUDA_DRIVER_MIN} or newer: upgrade the driver "
            f"(the job does not fall back to the CPU)",
        ),
        (
            dict(torch=0, torch_version="2.13.0+cpu", torch_cuda=None),
            "this venv mixes torch's CPU build (2.13.0+cpu) with vLLM's CUDA build (a CPU venv reused for the GPU "
            "install): run `bash scripts/setup.sh`, which makes it anew",
        ),
        (
            dict(torch=0, cuda_visible_devices=""),
            "CUDA_VISIBLE_DEVICES='' hides them from torch, while vLLM's CUDA build still finds them (NVML)",
        ),
        (dict(torch=0, driver="570.124.06", cuda_visible_devices="0"), "the NVIDIA driver is 570.124.06"),
        (dict(torch=0), "cannot initialise CUDA with driver 580.65.06"),
    ],
)
def test_gpus_that_torch_cannot_use_stop_the_job_saying_why(facts, why):
    """GPU review F1: nvidia-smi listed a GPU, torch (CUDA 13.0, driver < 580) saw none, the pick
    was silently cluster=local, and vLLM's CUDA build, which finds GPUs by NVML, failed in every
    engine with an error that never names the driver. Now the job stops and says why."""
    got = unusable_gpus(machine(**facts))
    assert got == why if why is None or why.startswith("nvidia-smi") else why in got


@pytest.fixture
def gpu_listed(tmp_path):
    """PATH with a stand-in nvidia-smi listing one H100 with driver 570 (too old for CUDA 13.0)."""
    stub = tmp_path / "bin" / "nvidia-smi"
    stub.parent.mkdir()
    stub.write_text(
        "#!/bin/bash\n"
        'case "$*" in\n'
        '    -L) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)" ;;\n'
        "    *driver_version*) echo 570.124.06 ;;\n"
        "esac\n"
    )
    stub.chmod(0o755)
    return {**os.environ, "PATH": f"{stub.parent}:{os.environ['PATH']}"}


def train_script(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "scripts/train.py", *args],
        cwd=CONF.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_cpu_install_on_a_gpu_machine_runs_on_the_cpu_and_says_why(gpu_listed):
    """GPU review F1/F4: this venv holds the CPU builds (the test suite's venv on a GPU machine),
    so nvidia-smi's GPU is not torch's: cluster=local, and the line says so and how to get the CUDA
    builds."""
    proc = train_script(gpu_listed, "--cfg", "job")  # hydra prints the job and stops
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (
        "[cluster] cluster=local: CPU only (0 GPU(s), seen by torch); to choose, add cluster=local|gpu|gpu_node|"
        "multinode_gpu [nvidia-smi lists 1 GPU(s); this venv holds the CPU builds of torch and vLLM: "
        "TRACERL_DEVICE=gpu bash scripts/setup.sh installs the CUDA ones]"
    ) in proc.stderr


def test_the_train_script_stops_when_vllms_cuda_build_would_get_no_gpu(gpu_listed, tmp_path):
    """GPU review F1 and F2, through scripts/train.py: the venv a device switch used to leave, CPU
    torch under vLLM's CUDA build (here its installed-package record, on PYTHONPATH), on a machine
    whose nvidia-smi lists a GPU. The script exits 2 before Ray starts, saying why, instead of
    running CPU engines that vLLM's CUDA build would fail."""
    record = tmp_path / "site" / "vllm-0.32.0.dist-info"
    record.mkdir(parents=True)
    (record / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n")
    env = {**gpu_listed, "PYTHONPATH": str(record.parent)}
    proc = train_script(env, "--cfg", "job")  # the pick stops it before hydra even composes
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert (
        "config error: nvidia-smi lists 1 GPU(s) but torch sees none: this venv mixes torch's CPU build "
        "(2.13.0+cpu) with vLLM's CUDA build"
    ) in proc.stderr
    assert "[cluster]" not in proc.stderr and "Started a local Ray instance" not in proc.stderr + proc.stdout
    named = train_script(env, "cluster=local")  # named: the config check refuses it, before Ray starts
    assert named.returncode == 2 and "config error: nvidia-smi lists 1 GPU(s) but torch sees none" in named.stderr
