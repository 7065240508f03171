"""Benchmark engine start: Engine actor created -> its first token back, per engine core mode.

    python -m tools.bench.engine_start [--models tiny,smollm2_135m] [--cores process,thread]
                                         [--repeats 3] [--quick]

Through the real path, in an in-process Ray: rollout.orchestration.cluster.spawn_engines starts one Engine
actor with the `generate` config's engine settings for the model and `engine.core=<core>`
(`process`: vLLM's AsyncLLM with its engine core in a child process; `thread`: the core on a
thread of the actor's own process), waits until it answers, then asks it for one token. The
cores take turns within each repeat, the order flipped every repeat (this box is shared and
noisy), and each engine is shut down before the next starts. Per model and core: the median
and every sample of `up_s` (created -> first token), `spawn_s` (created -> answering) and the
engine's own `info()["start_s"]` (AsyncLLM construction, inside the actor); `ratio` is thread's
median up_s over process's. `--quick`: tiny only, one repeat, the thread core only (the
engine's default where this checkout's EngineConfig has no `core` key).
The last output line is one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import ray

from rollout.config import EngineConfig, RayConfig, SamplingConfig
from rollout.log import setup_logging
from rollout.models import resolve_model
from rollout.orchestration.cluster import spawn_engines, start_ray
from trainer.config import compose

HAS_CORE = "core" in {f.name for f in dataclasses.fields(EngineConfig)}
DEFAULT = "default"  # the label of the engine's own start where EngineConfig has no `core` key


def start_once(model: str, core: str) -> dict:
    """Seconds from creating one Engine actor to its first generated token, and its own start_s."""
    cfg = compose("generate", [f"model={model}", *([] if core == DEFAULT else [f"engine.core={core}"])])
    path = resolve_model(cfg.model.name, cfg.model.path)
    t0 = time.perf_counter()
    [engine] = spawn_engines({"main": (path, cfg.model, cfg.engine)})["main"]
    spawn_s = time.perf_counter() - t0
    try:
        [completion] = ray.get(
            engine.generate.remote([5] * 16, SamplingConfig(max_tokens=1)), timeout=cfg.engine.request_timeout_s
        )
        up_s = time.perf_counter() - t0
        assert len(completion.completion_ids) == 1, completion
        info = ray.get(engine.info.remote(), timeout=60)
    finally:
        ray.wait([engine.shutdown.remote()], timeout=60)
        ray.kill(engine)
    return {"up_s": up_s, "spawn_s": spawn_s, "start_s": info["start_s"]}


def summarize(samples: list[dict]) -> dict:
    out = {}
    for key in ("up_s", "spawn_s", "start_s"):
        values = [round(s[key], 3) for s in samples]
        out[key] = round(statistics.median(values), 3)
        out[f"{key}_samples"] = values
    return out


def bench_model(model: str, cores: list[str], repeats: int) -> dict:
    samples: dict[str, list[dict]] = {c: [] for c in cores}
    for r in range(repeats):
        for core in cores if r % 2 == 0 else cores[::-1]:
            samples[core].append(start_once(model, core))
            print(model, core, {k: round(v, 3) for k, v in samples[core][-1].items()}, flush=True)
    out = {core: summarize(s) for core, s in samples.items()}
    if "process" in out and "thread" in out:
        out["ratio"] = round(out["thread"]["up_s"] / out["process"]["up_s"], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,smollm2_135m")
    ap.add_argument("--cores", default="process,thread", help="comma-separated, of process, thread")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="tiny, one repeat, the thread core")
    args = ap.parse_args()
    if args.quick:
        models, cores, repeats = ["tiny"], ["thread" if HAS_CORE else DEFAULT], 1
    elif not HAS_CORE:
        raise SystemExit("EngineConfig has no `core` key in this checkout: only --quick runs here")
    else:
        models, cores, repeats = args.models.split(","), args.cores.split(","), args.repeats
    start_ray(RayConfig(address="local", num_cpus=4))
    t0 = time.time()
    result = {model: bench_model(model, cores, repeats) for model in models}
    ray.shutdown()
    print(
        json.dumps(
            {
                "bench": "engine_start",
                "quick": args.quick,
                "repeats": repeats,
                "cores": cores,
                **result,
                "wall_s": round(time.time() - t0, 1),
            }
        )
    )


if __name__ == "__main__":
    setup_logging()  # tracerl's lines on stderr, one format (TRACERL_LOG_LEVEL)
    main()
