"""Benchmark the whole loop: two variants of one config side by side in one run, or one config
against its speed of light.

    python -m tools.bench.e2e --model smollm2_135m [--steps 3] [overrides ...]  # speed of light
    python -m tools.bench.e2e [--steps 12] [overrides ...]                 # sync vs async (max_staleness 0 vs 1)
    python -m tools.bench.e2e --compare policies [--steps 6] [overrides ...]  # one trained policy vs two
    python -m tools.bench.e2e --compare lora [--steps 6] [overrides ...]      # two full policies vs two adapters
    python -m tools.bench.e2e --quick [--compare ...] [overrides ...]  # the test suite's run (tiny)

`--compare staleness` (default overrides: experiment=smoke) trains synchronously and with
max_staleness=1. `--compare policies` (default: experiment=smoke harness=solver_verifier) trains
solver and verifier as one shared policy, then as two (verifier -> its own `critic`), with the
same traces per step. `--compare lora` trains solver and verifier as two full policies (an engine
each), then as two LoRA adapters (rank 16) of one base on one engine. For each variant: trained
tokens/s over the loop, seconds per step, and
how idle each side was — the learners (1 - train seconds / loop seconds) and the rollout engines
(1 - seconds with a request in flight / loop seconds).

`--model NAME`: the speed of light of one training step of `make train`'s config
(experiment=smollm2_solver_verifier with model=NAME and the overrides). It trains `--steps` steps,
keeps the last step's rollout traces and, once the run has ended, measures on the same machine
what that step's work costs with nothing else in the way: vLLM alone generating the same tokens
(every sequence of the step at once, each to its own length, on engines with the run's settings),
the plain torch loop (tools/bench/reference.py's) training the same packed rows, and a memory copy
of the trained weights. It prints the step's seconds over their sum and where the rest went
(rollout wait, train, sync, the loop's own). `--quick`: the comparison's second variant alone
(the first is the same code with other overrides; no ratios), 2 steps on one learner rank, and
the speed of light of its last step (the tiny model), in one JSON object (`speed_of_light`).
The last output line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import ray

from rollout.agents.chat_format import ChatFormat
from rollout.config import RayConfig, SamplingConfig
from rollout.log import setup_logging
from rollout.models import resolve_model
from rollout.orchestration.cluster import spawn_engines, start_ray
from rollout.trace import read_jsonl
from tools.bench.reference import PlainLoop, memcpy_s
from trainer.advantages import compute_advantages
from trainer.config import compose
from trainer.loop import train
from trainer.policy import micro_batches

VARIANTS = {  # name -> (default overrides, {variant: its overrides})
    "staleness": (["experiment=smoke"], {"sync": ["trainer.max_staleness=0"], "async": ["trainer.max_staleness=1"]}),
    "policies": (
        ["experiment=smoke", "harness=solver_verifier"],
        {"one_policy": [], "two_policies": ["agents.verifier=critic", "+policies.critic.trainable=true"]},
    ),
    "lora": (
        ["experiment=smoke", "harness=solver_verifier"],
        {
            "two_full": [
                "agents.solver=a",
                "agents.verifier=b",
                "+policies.a.trainable=true",
                "+policies.b.trainable=true",
            ],
            "two_lora": [
                "agents.solver=a",
                "agents.verifier=b",
                "+policies.a.lora.rank=16",
                "+policies.b.lora.rank=16",
            ],
        },
    ),
}


def run_variant(name: str, overrides: list[str], steps: int, light: bool = False) -> dict:
    """One variant's run and its loop figures; `light`: also the speed of light of its last step."""
    with tempfile.TemporaryDirectory(prefix=f"bench-e2e-{name}-") as run_dir:  # checkpoints: GBs each
        cfg = compose(
            "train",
            [
                *overrides,
                f"run_dir={run_dir}",
                f"trainer.steps={steps}",
                "eval.size=0",
                "logger=disabled",
                *(["trainer.rollouts_every=1"] if light else []),
            ],
        )
        t0 = time.time()
        summary = train(cfg)
        result = variant_figures(name, run_dir, summary)
        if light:
            result["speed_of_light"] = light_of_last_step(cfg, run_dir, summary, time.time() - t0)
        return result


def variant_figures(name: str, run_dir: str, summary: dict) -> dict:
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    steps_m = [r for r in rows if "perf/step_s" in r]
    loop_s = sum(r["perf/step_s"] for r in steps_m)
    trained = sum(r["train/trained_tokens"] for r in steps_m)
    return {
        "variant": name,
        "trainable_policies": summary["trainable_policies"],
        "steps": len(steps_m),
        "traces": sum(r["rollout/traces"] for r in steps_m),
        "loop_s": round(loop_s, 2),
        "s_per_step": round(loop_s / len(steps_m), 3),
        "trained_tokens": trained,
        "trained_tokens_per_s": round(trained / loop_s, 1),
        "learner_idle_frac": round(1 - sum(r["perf/train_s"] for r in steps_m) / loop_s, 3),
        "sync_s_per_step": round(sum(r["perf/sync_s"] for r in steps_m) / len(steps_m), 3),
        # engine busy time includes the start's few seconds, a small overestimate
        "rollout_idle_frac": round(max(0.0, 1 - summary["engine_busy_s"] / loop_s), 3),
        "final_reward": round(steps_m[-1]["rollout/reward"], 3),
        "dropped_stale": summary["dropped_stale"],
    }


def engines_alone_s(cfg, traces) -> float:
    """Seconds for the run's engine pools (fresh, the run's settings) to generate every sequence of
    `traces` at once, each prompt to its own completion's length: no harness, no dependencies."""
    pools = cfg.engine_pools()
    spec = {
        pool: (
            resolve_model(cfg.policy_model(ps[0]).name, cfg.policy_model(ps[0]).path),
            cfg.policy_model(ps[0]),
            cfg.pool_engine(ps),
        )
        for pool, ps in pools.items()
    }
    engines = spawn_engines(spec, seed=cfg.seed)
    of_policy = {p: engines[pool] for pool, ps in pools.items() for p in ps}
    everyone = [e for pool in engines.values() for e in pool]
    seqs = [s for t in traces for s in t.sequences if s.completion_ids]
    try:
        ray.get([e.generate.remote([5] * 32, SamplingConfig(max_tokens=4)) for e in everyone], timeout=600)
        t0 = time.perf_counter()
        ray.get(
            [
                of_policy[s.policy][i % len(of_policy[s.policy])].generate.remote(
                    s.prompt_ids,
                    SamplingConfig(
                        temperature=cfg.sampling.temperature, max_tokens=len(s.completion_ids), ignore_eos=True
                    ),
                    seed=i,
                )
                for i, s in enumerate(seqs)
            ],
            timeout=1800,
        )
        return time.perf_counter() - t0
    finally:
        ray.wait([e.shutdown.remote() for e in everyone], num_returns=len(everyone), timeout=60)
        for e in everyone:
            ray.kill(e)


def plain_train_s(cfg, traces) -> tuple[float, int]:
    """Seconds of the plain torch loop (reference.py's PlainLoop) over the micro-batches
    each trained policy's learners got from `traces` (the best of two, after a warm-up), and the
    trained weights' bytes."""
    a, total, nbytes = cfg.algorithm, 0.0, 0
    for p in cfg.trainable_policies():
        mine = [t.only_policy(p) for t in traces]
        path = resolve_model(cfg.policy_model(p).name, cfg.policy_model(p).path)
        _, mbs = micro_batches(
            mine,
            compute_advantages(mine, a.advantage),
            a,
            cfg.policy_learner(p).micro_batch_tokens,
            ChatFormat.from_pretrained(path).pad_id,
        )
        loop = ray.remote(num_cpus=1)(PlainLoop).remote(path, max(cfg.policy_learner(p).torch_threads, 1))
        try:
            nbytes += ray.get(loop.nbytes.remote(), timeout=600)
            times = [ray.get(loop.step.remote(mbs), timeout=1800) for _ in range(3)] if mbs else [0.0]
        finally:
            ray.kill(loop)
        total += min(times[1:] or times)
    return total, nbytes


def speed_of_light(model: str, overrides: list[str], steps: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-e2e-sol-") as run_dir:  # checkpoints: GBs each
        cfg = compose(
            "train",
            [
                "experiment=smollm2_solver_verifier",
                f"model={model}",
                *overrides,
                f"run_dir={run_dir}",
                f"trainer.steps={steps}",
                "trainer.rollouts_every=1",
                "trainer.save_every=0",
                "eval.size=0",
                "logger=disabled",
            ],
        )
        t0 = time.time()
        summary = train(cfg)
        return {"model": model, "overrides": overrides, **light_of_last_step(cfg, run_dir, summary, time.time() - t0)}


def light_of_last_step(cfg, run_dir: str, summary: dict, run_s: float) -> dict:
    """What the run's last step cost against the same work alone (the run has ended: its engines
    and learners are gone); the step's traces are its rollouts/step_<N>.jsonl."""
    steps = cfg.trainer.steps
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    m = [r for r in rows if "perf/step_s" in r][-1]
    traces = list(read_jsonl(Path(run_dir) / "rollouts" / f"step_{steps}.jsonl"))
    print(f"[bench] step {steps}: {m['perf/step_s']:.1f} s; measuring its speed of light", flush=True)

    engine_s = engines_alone_s(cfg, traces)
    plain_s, nbytes = plain_train_s(cfg, traces)
    copy_s = memcpy_s(nbytes)
    light = engine_s + plain_s + copy_s
    step_s, wait, train_s, sync_s = m["perf/step_s"], m["perf/rollout_wait_s"], m["perf/train_s"], m["perf/sync_s"]
    return {
        "model": cfg.model.name,
        "step": steps,
        "step_s": round(step_s, 2),
        "speed_of_light_s": round(light, 2),
        "step_over_speed_of_light": round(step_s / light, 2),
        "generated_tokens": m["rollout/generated_tokens"],
        "trained_tokens": m["train/trained_tokens"],
        "parts": {  # the step's seconds and what the same work costs alone
            "rollout": {
                "step_s": round(wait, 2),
                "engine_alone_s": round(engine_s, 2),
                "engines_busy_s": round(m["perf/engine_busy_s"], 2),
                "engines_idle_s": round(m["perf/engine_idle_s"], 2),
            },
            # learner_s: inside the ranks (the rest of step_s: packing, Ray calls, sharding)
            "train": {
                "step_s": round(train_s, 2),
                "plain_loop_s": round(plain_s, 2),
                "learner_s": round(sum(m[f"perf/{p}/learner_s"] for p in summary["trainable_policies"]), 2),
            },
            "sync": {"step_s": round(sync_s, 2), "memcpy_s": round(copy_s, 3), "bytes": nbytes},
            "loop_other_s": round(step_s - wait - train_s - sync_s, 2),
        },
        "run_s": round(run_s, 1),
        "final_reward": round(m["rollout/reward"], 3),
        "trainable_policies": summary["trainable_policies"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", choices=sorted(VARIANTS), default="staleness")
    ap.add_argument("--model", help="the speed of light of `make train`'s config with this model")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default 12; 3 with --model)")
    ap.add_argument("overrides", nargs="*", help="hydra overrides for both variants")
    ap.add_argument(
        "--quick", action="store_true", help="the second variant (2 steps, one rank) and its last step's speed of light"
    )
    args = ap.parse_args()
    if args.quick:
        args.model, args.steps = None, 2
    if args.model:
        start_ray(RayConfig(num_cpus=4))
        result = speed_of_light(args.model, args.overrides, args.steps or 3)
        ray.shutdown()
        print(json.dumps({"bench": "e2e", "quick": False, "compare": "speed_of_light", **result}))
        return
    args.steps = args.steps or 12
    defaults, variants = VARIANTS[args.compare]
    overrides = args.overrides or defaults
    if args.quick:  # one start of each part: a single run, one learner rank
        overrides, variants = [*overrides, "learner.world_size=1"], dict(list(variants.items())[-1:])
    start_ray(RayConfig(num_cpus=4))
    t0, results = time.time(), {}
    for name, extra in variants.items():
        results[name] = run_variant(name, [*overrides, *extra], args.steps, light=args.quick)
        print(name, results[name], flush=True)
    light = results[name].pop("speed_of_light", None)
    ray.shutdown()
    ratios = {}
    if len(results) == 2:  # --quick runs one variant
        first, second = results.values()
        ratios = {
            "tokens_per_s_ratio": round(second["trained_tokens_per_s"] / first["trained_tokens_per_s"], 3),
            "s_per_step_ratio": round(second["s_per_step"] / first["s_per_step"], 3),
        }
    print(
        json.dumps(
            {
                "bench": "e2e",
                "quick": args.quick,
                "compare": args.compare,
                "overrides": overrides,
                **results,
                **({"speed_of_light": light} if light else {}),
                **ratios,
                "wall_s": round(time.time() - t0, 1),
            }
        )
    )


if __name__ == "__main__":
    setup_logging()  # tracerl's lines on stderr, one format (TRACERL_LOG_LEVEL)
    main()
