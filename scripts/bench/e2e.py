"""Benchmark the whole loop, two variants of one config side by side in one run.

    python scripts/bench/e2e.py [--steps 12] [overrides ...]                 # sync vs async (max_staleness 0 vs 1)
    python scripts/bench/e2e.py --compare policies [--steps 6] [overrides ...]  # one trained policy vs two
    python scripts/bench/e2e.py --compare lora [--steps 6] [overrides ...]      # two full policies vs two adapters

`--compare staleness` (default overrides: experiment=smoke) trains synchronously and with
max_staleness=1. `--compare policies` (default: experiment=smoke harness=solver_verifier) trains
solver and verifier as one shared policy, then as two (verifier -> its own `critic`), with the
same traces per step. `--compare lora` trains solver and verifier as two full policies (an engine
each), then as two LoRA adapters (rank 16) of one base on one engine. For each variant: trained tokens/s over the loop, seconds per step, and
how idle each side was — the learners (1 - train seconds / loop seconds) and the rollout engines
(1 - seconds with a request in flight / loop seconds). The last output line is one JSON object.
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

VARIANTS = {  # name -> (default overrides, {variant: its overrides})
    "staleness": (["experiment=smoke"], {"sync": ["trainer.max_staleness=0"], "async": ["trainer.max_staleness=1"]}),
    "policies": (["experiment=smoke", "harness=solver_verifier"],
                 {"one_policy": [], "two_policies": ["agents.verifier=critic", "+policies.critic.trainable=true"]}),
    "lora": (["experiment=smoke", "harness=solver_verifier"],
             {"two_full": ["agents.solver=a", "agents.verifier=b", "+policies.a.trainable=true",
                           "+policies.b.trainable=true"],
              "two_lora": ["agents.solver=a", "agents.verifier=b", "+policies.a.lora.rank=16",
                           "+policies.b.lora.rank=16"]}),
}


def run_variant(name: str, overrides: list[str], steps: int) -> dict:
    run_dir = tempfile.mkdtemp(prefix=f"bench-e2e-{name}-")
    summary = train(compose("train", [*overrides, f"run_dir={run_dir}", f"trainer.steps={steps}", "eval.size=0",
                                      "logger=disabled"]))
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    steps_m = [r for r in rows if "perf/step_s" in r]
    loop_s = sum(r["perf/step_s"] for r in steps_m)
    trained = sum(r["train/trained_tokens"] for r in steps_m)
    return {"variant": name, "trainable_policies": summary["trainable_policies"], "steps": len(steps_m),
            "traces": sum(r["rollout/traces"] for r in steps_m), "loop_s": round(loop_s, 2),
            "s_per_step": round(loop_s / len(steps_m), 3), "trained_tokens": trained,
            "trained_tokens_per_s": round(trained / loop_s, 1),
            "learner_idle_frac": round(1 - sum(r["perf/train_s"] for r in steps_m) / loop_s, 3),
            "sync_s_per_step": round(sum(r["perf/sync_s"] for r in steps_m) / len(steps_m), 3),
            # engine busy time includes the start's few seconds, a small overestimate
            "rollout_idle_frac": round(max(0.0, 1 - summary["engine_busy_s"] / loop_s), 3),
            "final_reward": round(steps_m[-1]["rollout/reward"], 3), "dropped_stale": summary["dropped_stale"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", choices=sorted(VARIANTS), default="staleness")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("overrides", nargs="*", help="hydra overrides for both variants")
    args = ap.parse_args()
    defaults, variants = VARIANTS[args.compare]
    overrides = args.overrides or defaults
    start_ray(RayConfig(num_cpus=4))
    t0, results = time.time(), {}
    for name, extra in variants.items():
        results[name] = run_variant(name, [*overrides, *extra], args.steps)
        print(name, results[name], flush=True)
    ray.shutdown()
    first, second = results.values()
    print(json.dumps({"bench": "e2e", "compare": args.compare, "overrides": overrides, **results,
                      "tokens_per_s_ratio": round(second["trained_tokens_per_s"] / first["trained_tokens_per_s"], 3),
                      "s_per_step_ratio": round(second["s_per_step"] / first["s_per_step"], 3),
                      "wall_s": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    main()
