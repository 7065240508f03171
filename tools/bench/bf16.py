"""Benchmark bf16 against fp32 on this CPU, both sides of training, in one run.

    python -m tools.bench.bf16 [--model smollm2_135m] [--prompts 32] [--max-tokens 64] [--quick]

(engine)  vLLM alone generating the same chat-templated prompts (ignore_eos, so every
          completion has max_tokens): generated tok/s with model.dtype float32 vs bfloat16.
(learner) one DeepSpeed rank with both cores, ZeRO-0, as `make train` runs it: trained
          tok/s of one optimizer step on the same micro-batches, fp32 vs bf16 (bf16
          compute and weights, fp32 master weights and optimizer in DeepSpeed).
Each side is warmed up, then the best of `--rounds` counts. `--quick`: the tiny model, 4 prompts of
8 tokens, 2 rows, one round, bfloat16 alone (float32 is the same code with every other run's dtype;
no ratios): the test suite's run. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import ray
import torch

from rollout.agents.chat_format import ChatFormat
from rollout.config import RayConfig, make_task_source
from rollout.log import setup_logging
from rollout.models import resolve_model
from rollout.orchestration.cluster import start_ray
from tools.bench.reference import batches_for, bench_vllm, conversation_trace
from trainer.config import LearnerConfig, LossConfig, compose
from trainer.learner_group import LearnerGroup

DTYPES = ("float32", "bfloat16")


def engine_side(model: str, prompts: int, max_tokens: int, rounds: int, dtypes=DTYPES) -> dict:
    cfg = compose(
        "generate",
        [
            f"model={model}",
            "harness=single_turn",
            "task=chain_sum",
            f"sampling.max_tokens={max_tokens}",
            "sampling.ignore_eos=true",
            f"engine.max_num_seqs={max(prompts, 8)}",
        ],
    )
    path = resolve_model(cfg.model.name, cfg.model.path)
    fmt = ChatFormat.from_pretrained(path)
    tasks = make_task_source(cfg.task, cfg.seed)
    batch = [fmt.render([{"role": "user", "content": tasks.train_task(i).prompt}]) for i in range(prompts)]
    out = {}
    for dtype in dtypes:
        runs = bench_vllm(path, batch, cfg.sampling, cfg.engine, rounds, dtype=dtype)
        out[f"{dtype}_tok_s"] = round(max(r["tokens"] / r["seconds"] for r in runs), 1)
        print("engine", dtype, out[f"{dtype}_tok_s"], flush=True)
    return with_ratio(out)


def with_ratio(out: dict) -> dict:
    """`out` and bfloat16's tok/s over float32's, where both ran (not in --quick)."""
    if "float32_tok_s" in out and "bfloat16_tok_s" in out:
        out["ratio"] = round(out["bfloat16_tok_s"] / out["float32_tok_s"], 3)
    return out


def learner_side(model: str, rows: int, rounds: int, budget: int, dtypes=DTYPES) -> dict:
    path = resolve_model(model)
    fmt = ChatFormat.from_pretrained(path)
    rng = random.Random(0)
    traces = [conversation_trace(fmt, fmt.vocab_size, 1, 96, 0, rng, f"t{i}") for i in range(rows)]
    _, mbs = batches_for(traces, True, budget)
    trained = sum(mb.num_trained for mb in mbs)
    cfg = LearnerConfig(world_size=1, num_cpus=1, torch_threads=2, zero_stage=0, lr=1e-6)
    start_ray(RayConfig(num_cpus=4))
    out = {"trained_tokens": trained}
    for dtype in dtypes:
        with LearnerGroup(path, cfg, LossConfig(), dtype=dtype) as group:
            seconds = []
            for _ in range(rounds + 1):
                t0 = time.perf_counter()
                stats = group.train_step(mbs)
                seconds.append(time.perf_counter() - t0)
            assert not stats["skipped"], f"{dtype}: the step was skipped (non-finite)"
        out[f"{dtype}_tok_s"] = round(trained / min(seconds[1:]), 1)  # the first step warms up
        print("learner", dtype, out[f"{dtype}_tok_s"], flush=True)
    return with_ratio(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2_135m")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--budget", type=int, default=1024, help="padded tokens per micro-batch")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="tiny, 4 prompts x 8 tokens, 2 rows, one round, bf16 only")
    args = ap.parse_args()
    dtypes = DTYPES
    if args.quick:
        args.model, args.prompts, args.max_tokens, args.rows, args.rounds = "tiny", 4, 8, 2, 1
        dtypes = ("bfloat16",)
    torch.manual_seed(0)
    result = {
        "bench": "bf16",
        "quick": args.quick,
        "model": args.model,
        "cpu_bf16": torch.cpu._is_avx512_bf16_supported(),
        "engine": engine_side(args.model, args.prompts, args.max_tokens, args.rounds, dtypes),
        "learner": learner_side(args.model, args.rows, args.rounds, args.budget, dtypes),
    }
    ray.shutdown()  # before the result: an actor's late log line would follow it otherwise
    print(json.dumps(result))


if __name__ == "__main__":
    setup_logging()  # tracerl's lines on stderr, one format (TRACERL_LOG_LEVEL)
    main()
