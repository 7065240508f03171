"""rollout/orchestration/cluster.py's start_ray: where a job's Ray comes from."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.integration
def test_a_local_job_joins_the_cluster_tracerl_ray_address_names(ray_cluster):
    """With TRACERL_RAY_ADDRESS set (the suite's lane sets it for its script runs), an
    `address=local` job joins that cluster instead of starting its own: here the session's, whose 8
    logical CPUs it sees (a cluster of its own would have num_cpus=3). Without it, its own."""
    import ray

    address = ray.get_runtime_context().gcs_address
    probe = (
        "import ray; from rollout.config import RayConfig; from rollout.orchestration.cluster import start_ray; "
        "start_ray(RayConfig(address='local', num_cpus=3)); "
        "print(ray.get_runtime_context().gcs_address, int(ray.cluster_resources()['CPU']))"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRACERL_RAY_ADDRESS"}
    joined, own = (
        subprocess.run(
            [sys.executable, "-c", probe], cwd=ROOT, env=e, capture_output=True, text=True, timeout=180, check=True
        ).stdout.split()[-2:]
        for e in ({**env, "TRACERL_RAY_ADDRESS": address}, env)
    )
    assert joined == [address, "8"]
    assert own[0] != address and own[1] == "3"
