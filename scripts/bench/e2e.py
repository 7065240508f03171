"""Benchmark the whole loop: synchronous vs asynchronous training on the same config, one run.

    python scripts/bench/e2e.py [--steps 12] [overrides ...]   # default: experiment=smoke

For each mode: trained tokens/s over the loop, seconds per step, and how idle
each side was — the learners (1 - train seconds / loop seconds) and the rollout
engines (1 - seconds with a request in flight / loop seconds). The last output
line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import ray

from rollout.cluster import start_ray
from rollout.config import RayConfig
from trainer.config import compose
from trainer.loop import train


def run_mode(overrides: list[str], staleness: int, steps: int) -> dict:
    run_dir = tempfile.mkdtemp(prefix=f"bench-e2e-s{staleness}-")
    summary = train(compose("train", [*overrides, f"run_dir={run_dir}", f"trainer.steps={steps}",
                                      f"trainer.max_staleness={staleness}", "eval.size=0", "logger=disabled"]))
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    steps_m = [r for r in rows if "perf/step_s" in r]
    loop_s = sum(r["perf/step_s"] for r in steps_m)
    trained = sum(r.get("train/trained_tokens", 0.0) for r in steps_m)
    return {"max_staleness": staleness, "steps": len(steps_m), "loop_s": round(loop_s, 2),
            "s_per_step": round(loop_s / len(steps_m), 3), "trained_tokens": trained,
            "trained_tokens_per_s": round(trained / loop_s, 1),
            "learner_idle_frac": round(1 - sum(r["perf/train_s"] for r in steps_m) / loop_s, 3),
            # engine busy time includes the initial eval's few seconds, a small overestimate
            "rollout_idle_frac": round(max(0.0, 1 - summary["engine_busy_s"] / loop_s), 3),
            "final_reward": round(steps_m[-1]["rollout/reward"], 3), "dropped_stale": summary["dropped_stale"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("overrides", nargs="*", default=["experiment=smoke"])
    args = ap.parse_args()
    start_ray(RayConfig(num_cpus=4))
    t0 = time.time()
    sync = run_mode(args.overrides, 0, args.steps)
    print("sync ", sync, flush=True)
    asyn = run_mode(args.overrides, 1, args.steps)
    print("async", asyn, flush=True)
    ray.shutdown()
    print(json.dumps({"bench": "e2e", "overrides": args.overrides, "sync": sync, "async": asyn,
                      "async_over_sync_tokens_per_s": round(asyn["trained_tokens_per_s"] / sync["trained_tokens_per_s"], 3),
                      "wall_s": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    main()
