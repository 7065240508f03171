"""Generate traces with a model, harness and task on Ray + vLLM, and write them to JSONL.

    python scripts/rollout.py model=tiny harness=solver_verifier task=chain_sum \
        rollout.num_traces=32 out=/tmp/traces.jsonl

Prints a progress line as groups complete and a summary (traces/s, generated
tokens/s, failures, agents and sequences per trace); the last line is JSON.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

# This script shares its name with the `rollout` package: keep its folder off
# sys.path so `import rollout` finds the package.
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import hydra  # noqa: E402
import ray  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from rollout.cluster import spawn_buffer, spawn_engines, spawn_workers, start_ray  # noqa: E402
from rollout.config import RolloutJobConfig, register_configs, validate  # noqa: E402
from rollout.models import resolve_model  # noqa: E402
from rollout.trace import Trace, write_jsonl  # noqa: E402

register_configs()


def summarize(traces: list[Trace], wall_s: float) -> dict:
    n = max(len(traces), 1)
    generated = sum(t.num_generated_tokens for t in traces)
    return {
        "traces": len(traces),
        "failed": sum(t.status == "failed" for t in traces),
        "truncated": sum(t.status == "truncated" for t in traces),
        "wall_s": round(wall_s, 2),
        "traces_per_s": round(len(traces) / wall_s, 3),
        "generated_tokens_per_s": round(generated / wall_s, 1),
        "generated_tokens": generated,
        "mean_reward": round(sum(t.reward for t in traces) / n, 4),
        "agents_per_trace": round(sum(len(t.agents) for t in traces) / n, 2),
        "sequences_per_trace": round(sum(len(t.sequences) for t in traces) / n, 2),
    }


def run(cfg: RolloutJobConfig) -> dict:
    validate(cfg)
    model_path = resolve_model(cfg.model.name, cfg.model.path)
    start_ray(cfg.ray)

    # -- actors: one engine pool per policy, one buffer, the workers ----------
    policies = sorted(set(cfg.agents.values()))
    engines = {p: spawn_engines(model_path, cfg.model, cfg.engine, p, seed=cfg.rollout.seed)
               for p in policies}
    vocab = ray.get(engines[policies[0]][0].info.remote())["vocab_size"]
    buffer = spawn_buffer("all", cfg.rollout.group_size, {p: vocab for p in policies})
    workers = spawn_workers(cfg.rollout, cfg.harness, cfg.task, cfg.agents, engines,
                            {p: model_path for p in policies}, cfg.sampling, buffer)

    # -- run: groups round-robin over workers; collect as they complete -------
    num_groups = math.ceil(cfg.rollout.num_traces / cfg.rollout.group_size)
    t0 = time.perf_counter()
    runs = [w.run.remote(list(range(i, num_groups, len(workers)))) for i, w in enumerate(workers)]
    traces: list[Trace] = []
    while len(traces) < num_groups * cfg.rollout.group_size:
        ready, _ = ray.wait(runs, num_returns=len(runs), timeout=0)
        groups = ray.get(buffer.get.remote(1, timeout_s=30.0))
        if not groups and len(ready) == len(runs):
            ray.get(runs)  # re-raise a worker failure with its traceback
            raise RuntimeError(f"workers finished but the buffer is short: "
                               f"{ray.get(buffer.stats.remote())}")
        for g in groups:
            traces.extend(g)
        print(f"[rollout] {len(traces)}/{num_groups * cfg.rollout.group_size} traces "
              f"{time.perf_counter() - t0:6.1f}s", flush=True)
    wall = time.perf_counter() - t0
    ray.get(runs)

    write_jsonl(traces, cfg.out)
    summary = {"out": cfg.out, "harness": cfg.harness.name, "task": cfg.task.name,
               "model": cfg.model.name, **summarize(traces, wall)}
    return summary


@hydra.main(version_base=None, config_path="../conf", config_name="rollout")
def main(dcfg: DictConfig) -> None:
    cfg: RolloutJobConfig = OmegaConf.to_object(dcfg)
    try:
        summary = run(cfg)
    finally:
        ray.shutdown()
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
