"""Generate traces with a model, harness and task on Ray + vLLM, and write them to JSONL.

    python scripts/generate.py model=tiny harness=solver_verifier task=chain_sum \
        num_traces=32 out=/tmp/traces.jsonl

Drives the same RolloutFleet as training (rollout/orchestration/fleet.py), on the cluster preset for this
machine's GPUs unless `cluster=` is given (as scripts/train.py). Prints a progress
line as groups complete and a summary (traces/s, generated tokens/s, and the
`rollout/*` statistics the training loop logs: reward, failures, agents and
sequences per trace); the last line is JSON.
"""

from __future__ import annotations

import json
import math
import sys
import time

import hydra
from omegaconf import DictConfig

from rollout.checks import validate
from rollout.config import GenerateJobConfig, register_configs
from rollout.log import setup_logging
from rollout.orchestration.cluster import run_job, start_ray
from rollout.orchestration.fleet import RolloutFleet
from rollout.placement import with_cluster_for_this_machine
from rollout.stats import trace_metrics
from rollout.trace import Trace, write_jsonl
from trainer.config import compose

register_configs()


def generate(cfg: GenerateJobConfig) -> dict:
    """Run `num_traces` (whole groups) episodes, write them to `cfg.out`; returns the summary."""
    validate(cfg)
    start_ray(cfg.ray, cfg.cpus_asked(), cfg.asks())
    r = cfg.rollout
    num_groups = math.ceil(cfg.num_traces / r.group_size)
    # Every episode ends within rollout.timeout_s (or fails), and they run in waves of
    # num_workers x concurrency: the whole rollout has a deadline.
    waves = math.ceil(num_groups * r.group_size / (r.num_workers * r.concurrency))
    with RolloutFleet(cfg) as fleet:
        t0 = time.perf_counter()
        deadline = t0 + (waves + 1) * r.timeout_s
        fleet.submit(list(range(num_groups)))
        traces: list[Trace] = []
        for _ in range(num_groups):
            traces += fleet.take(1, deadline - time.perf_counter())[0]
            print(
                f"[generate] {len(traces)}/{num_groups * r.group_size} traces {time.perf_counter() - t0:6.1f}s",
                flush=True,
            )
        wall = time.perf_counter() - t0
    write_jsonl(traces, cfg.out)
    return {
        "out": cfg.out,
        "harness": cfg.harness.name,
        "task": cfg.task.name,
        "model": cfg.model.name,
        "traces": len(traces),
        "wall_s": round(wall, 2),
        "traces_per_s": round(len(traces) / wall, 3),
        "generated_tokens_per_s": round(sum(t.num_generated_tokens for t in traces) / wall, 1),
        **trace_metrics(traces, "rollout"),
    }


@hydra.main(version_base=None, config_path="../conf", config_name="generate")
def main(dcfg: DictConfig) -> None:
    print(json.dumps(run_job(dcfg, validate, generate)))  # the summary: the last line of output


if __name__ == "__main__":
    setup_logging()  # tracerl's lines on stderr, one format (TRACERL_LOG_LEVEL)
    # no cluster= given: the preset for this machine's GPUs that the composed job fits
    sys.argv = with_cluster_for_this_machine(sys.argv, lambda overrides: compose("generate", overrides))
    main()
