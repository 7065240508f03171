"""Benchmark: generated tokens/s through the full rollout path vs vLLM's own generate.

    python -m tools.bench.rollout_path [--model smollm2_135m] [--prompts 32] [--max-tokens 64] [--quick]

Same prompts (single_turn on chain_sum, chat-templated), same engine args and
sampling, one run, one after the other:
  vllm:  vLLM's AsyncLLM.generate in this process, all prompts submitted at once.
  path:  the RolloutFleet training uses: RolloutWorker -> Agent client -> Router ->
         Engine actor (Ray), the single_turn harness, traces streamed to the TraceBuffer.
  gateway: the same fleet with the openai_agent harness: an agent function makes the same
         single chat call with the `openai` SDK through the worker's OpenAI-compatible
         gateway (HTTP, rendered to the same prompt ids), over one HTTP client per worker.
  own_client: the same, the agent building its own SDK client per episode (not with --quick).
Each side is warmed up, then timed `--rounds` times; the best round counts. The three
fleets take turns, round by round, one up at a time (vLLM alone runs first, in this
process); the ratios to the path pair each round with the path's round of the same turn.
`--quick`: the tiny model, 4 prompts of 8 tokens, one round, the fleets alone (vLLM alone is
reference.bench_vllm, which bf16.py's quick run runs; no ratios to it): the test suite's run.
The last output line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import ray

from rollout.agents.chat_format import ChatFormat
from rollout.config import GenerateJobConfig, make_task_source
from rollout.log import setup_logging
from rollout.models import resolve_model
from rollout.orchestration.cluster import start_ray
from rollout.orchestration.fleet import RolloutFleet
from tools.bench.reference import bench_vllm
from trainer.config import compose


def bench_paths(cfgs: dict[str, GenerateJobConfig], n: int, rounds: int) -> dict[str, list[dict]]:
    """Each config's fleet timed in turns: round 1 of each, then round 2 of each, ... (the box's
    drift falls on every side alike). One fleet is up at a time, started and warmed up for its
    round: an idle CPU engine next to a working one costs the working one ~15%."""
    start_ray(next(iter(cfgs.values())).ray, max(c.cpus_asked() for c in cfgs.values()))

    def timed(fleet: RolloutFleet, k: int) -> dict:
        t0 = time.perf_counter()
        fleet.submit(list(range(k)))
        traces = [t for g in fleet.take(k, timeout_s=600) for t in g]
        seconds = time.perf_counter() - t0
        assert all(t.status != "failed" for t in traces), [t.error for t in traces]
        return {"tokens": sum(t.num_generated_tokens for t in traces), "seconds": round(seconds, 3)}

    results: dict[str, list[dict]] = {name: [] for name in cfgs}
    for _ in range(rounds):
        for name, cfg in cfgs.items():
            with RolloutFleet(cfg) as fleet:
                timed(fleet, 4)  # warm-up
                results[name].append(timed(fleet, n))
    ray.shutdown()
    return results


def configs(args: argparse.Namespace) -> dict[str, GenerateJobConfig]:
    """The path's config (single_turn) and the gateway sides' (openai_agent, the same single call
    through the SDK); --quick keeps one gateway side."""
    # ignore_eos: every completion is max_tokens long on both sides, so tok/s compare like for like.
    common = [
        f"model={args.model}",
        "task=chain_sum",
        f"sampling.max_tokens={args.max_tokens}",
        f"sampling.temperature={args.temperature}",
        "sampling.ignore_eos=true",
        f"engine.max_num_seqs={max(args.prompts, 8)}",
        f"rollout.concurrency={args.prompts}",
        "rollout.group_size=1",
        "engine.cpu_cores=all",
        "ray.num_cpus=4",
    ]
    sides = {"gateway": "one_call", **({} if args.quick else {"own_client": "one_call_own_client"})}
    agent = "harness.options.agent=tools.corpora.one_call_agents."
    return {
        "path": compose("generate", ["harness=single_turn", *common]),
        **{side: compose("generate", ["harness=openai_agent", agent + fn, *common]) for side, fn in sides.items()},
    }


def report(args: argparse.Namespace, vllm_rounds: list[dict] | None, paths: dict[str, list[dict]]) -> dict:
    """Print each side's best tokens/s and its ratio to the path; the bench's JSON result.
    `vllm_rounds`: None where vLLM alone did not run (--quick)."""

    def best(rounds):
        return max(r["tokens"] / r["seconds"] for r in rounds)

    def paired(rounds):  # each round against the path's round of the same turn: the drift-free ratio
        return statistics.median(
            (g["tokens"] / g["seconds"]) / (p["tokens"] / p["seconds"]) for p, g in zip(paths["path"], rounds)
        )

    path_tps = best(paths["path"])
    vllm: dict = {}  # vLLM alone, and the path's ratio to it (not in --quick)
    if vllm_rounds is not None:
        vllm_tps = best(vllm_rounds)
        print(f"vLLM generate:    {vllm_tps:8.1f} generated tok/s  rounds={vllm_rounds}")
        vllm = {"vllm_tok_s": round(vllm_tps, 1), "ratio": round(path_tps / vllm_tps, 3), "vllm_rounds": vllm_rounds}
    print(
        f"worker->client->engine: {path_tps:8.1f} generated tok/s  rounds={paths['path']}"
        + (f"  ratio path/vllm: {vllm['ratio']:.3f}" if vllm else "")
    )
    result = {
        "bench": "rollout_path",
        "quick": args.quick,
        "model": args.model,
        "prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "path_tok_s": round(path_tps, 1),
        **vllm,
        "path_rounds": paths["path"],
    }
    for side in (s for s in paths if s != "path"):  # own_client: an SDK client built per episode
        print(
            f"worker->openai SDK->gateway->engine ({side}): {best(paths[side]):8.1f} generated tok/s  "
            f"rounds={paths[side]}  over path: {paired(paths[side]):.3f} (median of paired rounds)"
        )
        result.update(
            {
                f"{side}_tok_s": round(best(paths[side]), 1),
                f"{side}_over_path_paired": round(paired(paths[side]), 3),
                f"{side}_rounds": paths[side],
            }
        )
    result["gateway_over_path"] = round(best(paths["gateway"]) / path_tps, 3)  # best rounds
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2_135m")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="tiny, 4 prompts x 8 tokens, one round, no vLLM alone")
    args = ap.parse_args()
    if args.quick:
        args.model, args.prompts, args.max_tokens, args.rounds = "tiny", 4, 8, 1

    cfgs = configs(args)
    cfg = cfgs["path"]
    model_path = resolve_model(cfg.model.name, cfg.model.path)
    fmt = ChatFormat.from_pretrained(model_path)
    tasks = make_task_source(cfg.task, cfg.seed)
    prompts = [fmt.render([{"role": "user", "content": tasks.train_task(i).prompt}]) for i in range(args.prompts)]
    vllm_rounds = None if args.quick else bench_vllm(model_path, prompts, cfg.sampling, cfg.engine, args.rounds)
    print(json.dumps(report(args, vllm_rounds, bench_paths(cfgs, args.prompts, args.rounds))))


if __name__ == "__main__":
    setup_logging()  # tracerl's lines on stderr, one format (TRACERL_LOG_LEVEL)
    main()
