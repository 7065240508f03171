"""A driver for tests/rollout/test_placement.py, run in its own process (its own in-process Ray,
with the GPUs the config declares in `ray.num_gpus`):

    python -m tests.rollout.placement_probe <hydra override> ...

Composes conf/train.yaml with the overrides, starts Ray as the training job does (start_ray with
the job's asks), then creates one probe actor per engine and learner rank with exactly the Ray
options the job's actors get (`cfg.asks()`: rollout.placement.actor_options of each pool's engine
and each learner group's settings, as spawn_engines and LearnerGroup use). Each probe reports the
GPUs Ray gave it. Prints one JSON line: {"cluster": ..., "probes": [{what, gpu_ids, resources,
cuda_visible_devices}]}, or {"error": ...} when start_ray refuses the job.
"""

from __future__ import annotations

import json
import os
import sys

import ray

from rollout.orchestration.cluster import start_ray
from trainer.config import compose


class Probe:
    def where(self) -> dict:
        return {
            "gpu_ids": [str(i) for i in ray.get_gpu_ids()],
            "resources": ray.get_runtime_context().get_assigned_resources(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }


def main(overrides: list[str]) -> dict:
    cfg = compose("train", overrides)
    try:
        start_ray(cfg.ray, cfg.cpus_asked(), cfg.asks())
    except ValueError as e:
        return {"error": str(e)}
    probes = [(a.what, ray.remote(**a.options)(Probe).remote()) for a in cfg.asks() for _ in range(a.count)]
    placed = ray.get([p.where.remote() for _, p in probes], timeout=120)
    return {
        "cluster": ray.cluster_resources().get("GPU", 0.0),
        "probes": [{"what": what, **w} for (what, _), w in zip(probes, placed)],
    }


if __name__ == "__main__":
    try:
        print(json.dumps(main(sys.argv[1:])))
    finally:
        ray.shutdown()
