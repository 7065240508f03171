"""What each fault costs a run: the same short run without a fault and with one fault at a time.

    python -m tools.bench.faults [--steps 5] [--faults engine_killed,worker_killed,...]
                                   [--cores process,thread] [--quick]

The run is the fault test's (tests/trainer/test_faults.py): the smoke experiment with
solver_verifier, the verifier on a frozen engine, 64 traces per step, a 2 s health check. Each
fault hits half a second into step 2's rollout, through the same injection helpers as the test
(tools/faults.py): SIGKILL of the trained policy's engine, of the frozen policy's engine, of both
half a second apart, of the rollout worker; SIGSTOP of an engine (alive, never answers: the
watchdog must find it); and all of them in turn in one run (`in_turn`, 6 steps: the main engine
killed in step 2, the worker in step 3, the frozen engine stopped in step 4, both engines killed in
step 5). For each: did the run finish, how many traces it trained of those it
should have, how many failed, the restarts, the requests sent again and the episodes run
again, and the extra wall time over the fault-free run of the same bench (measured side by
side; this box is shared and noisy). `--cores process,thread`: every run once per engine core mode
(`engine.core=...`), the cores taking turns run by run, the extra wall time against the same
core's fault-free run (`extra_wall_s`: core -> fault -> s). `--quick`: in_turn only, no fault-free
run, its run dir kept and named (`run_dir`): the test suite's run, which
tests/trainer/test_faults.py reads step by step (it checks the run survives every fault, not what
they cost, so `extra_wall_s` is empty; a fault-free run is the same `run` without a plan).
The last output line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import ray

from rollout.config import RayConfig
from rollout.log import setup_logging
from rollout.orchestration.cluster import start_ray
from tools.faults import Injector
from trainer.config import compose
from trainer.loop import train

RUN = [
    "experiment=smoke",
    "harness=solver_verifier",
    "agents.verifier=frozen",
    "learner.world_size=1",
    "eval.size=0",
    "logger=disabled",
    "engine.health_check_s=2",
    "engine.health_timeout_s=10",
    "engine.request_timeout_s=30",
]
ENGINE_KILLED = ("tracerl-engine-main-0-", "info", "kill")
FROZEN_ENGINE_KILLED = ("tracerl-engine-frozen-0-", "info", "kill")
WORKER_KILLED = ("tracerl-worker-0-", "stats", "kill")
# name -> [(after step, actor name prefix, the actor method that answers its pid, psutil action)]:
# each struck once its step's rollout has begun (tools/faults.py), those of a step 0.5 s apart
FAULTS = {
    "none": [],
    "engine_killed": [(1, *ENGINE_KILLED)],
    "frozen_engine_killed": [(1, *FROZEN_ENGINE_KILLED)],
    "two_engines_killed": [(1, *ENGINE_KILLED), (1, *FROZEN_ENGINE_KILLED)],
    "engine_hung": [(1, "tracerl-engine-main-0-", "info", "suspend")],
    "worker_killed": [(1, *WORKER_KILLED)],
    "in_turn": [  # SIGKILL, SIGSTOP (alive, silent), two SIGKILLs as when a node goes
        (1, *ENGINE_KILLED),
        (2, *WORKER_KILLED),
        (3, "tracerl-engine-frozen-0-", "info", "suspend"),
        (4, *ENGINE_KILLED),
        (4, *FROZEN_ENGINE_KILLED),
    ],
}


def min_steps(plan: list[tuple]) -> int:
    """The steps a run needs for `plan`: a strike comes in the step after its `after step`, or in the
    next one when that step's rollout was already over; room for both."""
    return max((after for after, *_ in plan), default=0) + 2


DEFAULT = "default"  # the engine core mode the config picks (no engine.core override)


def run(fault: str, steps: int, core: str, keep: bool = False) -> dict:
    """One run with `fault` (none: fault-free) on engines of `core` (DEFAULT: the config's). `keep`:
    its run dir is left for the caller (named in `run_dir`), else deleted."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"bench-faults-{fault}-"))
    try:
        return {**measure(fault, steps, core, run_dir), **({"run_dir": str(run_dir)} if keep else {})}
    finally:
        if not keep:
            shutil.rmtree(run_dir, ignore_errors=True)


def measure(fault: str, steps: int, core: str, run_dir: Path) -> dict:
    cfg = compose(
        "train",
        [*RUN, f"run_dir={run_dir}", f"trainer.steps={steps}", *([] if core == DEFAULT else [f"engine.core={core}"])],
    )
    plan = FAULTS[fault]
    t0 = time.perf_counter()
    try:
        with Injector(run_dir, plan) as injector:
            summary = train(cfg)
        error = None
    except Exception as e:  # a fault the run did not survive is a result, not a bench crash
        summary, error = {}, f"{type(e).__name__}: {e}"
    wall_s = time.perf_counter() - t0
    rows = (
        [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        if (run_dir / "metrics.jsonl").exists()
        else []
    )
    rows = [r for r in rows if "rollout/traces" in r]
    expected = steps * cfg.trainer.groups_per_step * cfg.rollout.group_size
    ok = sum(r["rollout/traces"] - r["rollout/failed"] for r in rows)
    return {
        "fault": fault,
        "core": core,
        "steps": steps,
        "injected": len(injector.injected) == len(plan),
        "injector_errors": injector.errors,
        "survived": error is None,
        "error": error,
        "steps_done": len(rows),
        "traces_expected": expected,
        "traces_trained_ok": ok,
        "traces_lost": expected - ok,
        "failed": sum(r["rollout/failed"] for r in rows),
        "retried": sum(r["rollout/retried"] for r in rows),
        "resent": sum(r.get("rollout/resent", 0) for r in rows),
        "engine_restarts": summary.get("engine_restarts"),
        "engines_hung": summary.get("engines_hung"),
        "worker_restarts": summary.get("worker_restarts"),
        "sync": summary.get("policies", {}).get("main", {}).get("sync"),
        "wall_s": round(wall_s, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument(
        "--faults",
        default=",".join(f for f in FAULTS if f != "none"),
        help=f"comma-separated, of {sorted(FAULTS)} (a run is at least 2 steps past its last strike's)",
    )
    ap.add_argument("--cores", default=DEFAULT, help="comma-separated engine.core values, e.g. process,thread")
    ap.add_argument("--quick", action="store_true", help="in_turn only, its run dir kept, no fault-free run")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.faults = 0, "in_turn"  # its steps: min_steps
    names = [*([] if args.quick else ["none"]), *[f for f in args.faults.split(",") if f != "none"]]
    unknown = sorted(set(names) - set(FAULTS))
    if unknown:
        raise SystemExit(f"--faults: unknown {unknown}; choose from {sorted(FAULTS)}")
    # every run as long as the longest plan needs: the fault-free run's wall is the others' reference
    args.steps = max(args.steps, *(min_steps(FAULTS[n]) for n in names))
    cores = args.cores.split(",")
    start_ray(RayConfig(num_cpus=4))
    t0, results = time.time(), {c: {} for c in cores}
    for i, name in enumerate(names):
        for core in cores if i % 2 == 0 else cores[::-1]:  # side by side: the box's drift hits every core
            results[core][name] = run(name, args.steps, core, keep=args.quick)
            print(results[core][name], flush=True)
    ray.shutdown()
    extra = {  # against the same core's fault-free run (none in --quick)
        core: {name: round(r["wall_s"] - rows["none"]["wall_s"], 1) for name, r in rows.items()}
        for core, rows in results.items()
        if "none" in rows
    }
    for core, rows in results.items():
        for name, r in rows.items():
            r["extra_wall_s"] = extra.get(core, {}).get(name)
    runs = [r for rows in results.values() for r in rows.values()]
    print(
        json.dumps(
            {
                "bench": "faults",
                "quick": args.quick,
                "steps": args.steps,
                "cores": cores,
                "overrides": RUN,
                "runs": runs,
                "extra_wall_s": extra,
                "traces_lost_total": sum(r["traces_lost"] for r in runs),
                "wall_s": round(time.time() - t0, 1),
            }
        )
    )


if __name__ == "__main__":
    setup_logging()  # tracerl's lines on stderr, one format (TRACERL_LOG_LEVEL)
    main()
