"""Where the GPU presets put the engines and learner ranks, with Ray's declared GPUs on a CPU box.

vLLM and DeepSpeed cannot start on GPUs that Ray only declares (`ray.init(num_gpus=...)` on a
machine without one), so the real Engine and Learner actors cannot run here. The honest check is
a probe actor created with exactly the Ray options the job's actors get (rollout.placement's
`actor_options`, the one function spawn_engines and LearnerGroup create them with), reporting the
GPU ids, the resources and the CUDA_VISIBLE_DEVICES Ray gave it: what a CUDA engine or rank would
see. Each case runs in its own process with its own Ray (tests/rollout/placement_probe.py), as the
session's shared Ray has no GPUs; the three cases' processes run at once (each is mostly Ray's start).
"""

import concurrent.futures
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


CASES = {  # test -> the probe's overrides
    "one_gpu": ("experiment=smollm2_solver_verifier", "cluster=gpu", "ray.num_gpus=1"),
    "node": ("experiment=smoke", "cluster=gpu_node", "ray.num_gpus=4", "engine.num_engines=2"),
    "too_few": ("experiment=smoke", "cluster=gpu_node", "ray.num_gpus=1"),
}


def probe(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tests.rollout.placement_probe", *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def placed() -> dict:
    """Every case's probe process, started together; each test reads its own."""
    with concurrent.futures.ThreadPoolExecutor(len(CASES)) as pool:
        running = {case: pool.submit(probe, *overrides) for case, overrides in CASES.items()}
        return {case: future.result() for case, future in running.items()}


def place(placed: dict, case: str) -> dict:
    proc = placed[case]
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_one_gpu_preset_puts_every_pool_and_the_learner_on_the_gpu_with_its_shares(placed):
    """`make train`'s experiment (a trained solver and a frozen verifier: two engine pools) on
    cluster=gpu: both pools' engines and the one learner rank land on GPU 0, with 0.25, 0.25 and
    0.4 of it, and each sees that GPU as its CUDA device."""
    out = place(placed, "one_gpu")
    assert out["cluster"] == 1.0
    placed = {p["what"]: p for p in out["probes"]}
    assert sorted(placed) == ["engines of pool 'frozen'", "engines of pool 'main'", "learner ranks of 'main'"]
    for what, share in (
        ("engines of pool 'frozen'", 0.25),
        ("engines of pool 'main'", 0.25),
        ("learner ranks of 'main'", 0.4),
    ):
        assert placed[what]["gpu_ids"] == ["0"] and placed[what]["cuda_visible_devices"] == "0", placed[what]
        assert placed[what]["resources"]["GPU"] == pytest.approx(share), placed[what]


def test_the_node_preset_gives_each_engine_and_learner_rank_a_gpu_of_its_own(placed):
    """cluster=gpu_node on 4 GPUs, 2 engines and 2 learner ranks: 4 different GPUs, whole."""
    out = place(placed, "node")
    assert out["cluster"] == 4.0
    probes = out["probes"]
    assert sorted(p["what"] for p in probes) == ["engines of pool 'main'"] * 2 + ["learner ranks of 'main'"] * 2
    assert sorted(p["cuda_visible_devices"] for p in probes) == ["0", "1", "2", "3"], probes
    assert all(len(p["gpu_ids"]) == 1 and p["resources"]["GPU"] == 1.0 for p in probes), probes


def test_a_cluster_with_too_few_gpus_is_refused_once_ray_is_up_before_any_actor(placed):
    """The comparison a joined cluster gets (ray.cluster_resources() right after ray.init, in
    start_ray) on an in-process one: 3 whole GPUs asked of a 1-GPU cluster, refused naming the
    keys and the preset that fits (before spawn_engines or LearnerGroup could be called)."""
    out = place(placed, "too_few")
    assert "probes" not in out
    assert "needs 3 GPU(s)" in out["error"] and "engine.num_gpus=1" in out["error"]
    assert "learner.num_gpus=1" in out["error"] and "has 1: use cluster=gpu" in out["error"]
