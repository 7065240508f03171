"""Benchmark: writing and loading (with full validation) a large traces.jsonl.

    python -m tools.bench.trace_io [--mb 100] [--rounds 3] [--quick]

Builds synthetic traces shaped like a multi-agent run (3 sequences each: a
prompt of 200 tokens, 60 generated tokens with their log-probs, agent rewards,
info), writes them with `rollout.trace.write_jsonl` until the file holds
`--mb` MB, then times, best of `--rounds`, in one run:
  load:        rollout.trace.read_jsonl — parse, type-check and validate every trace
  json_parse:  json.loads of every line, no validation (the stdlib parser's floor)
`--quick`: 2 MB, one round (the test suite's run). The last output line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from rollout.log import setup_logging
from rollout.trace import Sequence, Trace, read_jsonl, write_jsonl


def synthetic_trace(rng: random.Random, i: int) -> Trace:
    prompt = [rng.randrange(49152) for _ in range(200)]
    seqs = []
    for k, agent in enumerate(("solver", "verifier", "solver")):
        completion = [rng.randrange(49152) for _ in range(60)]
        seqs.append(
            Sequence(
                prompt,
                completion,
                [-rng.random() * 5 for _ in completion],
                agent,
                "main",
                3,
                parent=0 if k == 2 else None,
            )
        )
        prompt = prompt + completion + [rng.randrange(49152) for _ in range(10)]
    return Trace(
        f"t{i}",
        f"g{i // 8}",
        seqs,
        reward=float(i % 2),
        agent_rewards={"solver": 1.0, "verifier": 0.0},
        info={"task": f"chain_sum/train/{i // 8}", "worker": 0},
        timings={"start": 1.0, "end": 2.5, "duration_s": 1.5},
    )


def best_of(rounds: int, fn) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=100.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="2 MB, one round")
    args = ap.parse_args()
    if args.quick:
        args.mb, args.rounds = 2.0, 1

    rng = random.Random(0)
    one = [synthetic_trace(rng, i) for i in range(64)]  # repeated: building traces is not what is timed
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "traces.jsonl"
        per_trace = len(json.dumps(one[0].to_dict()))
        n = int(args.mb * 1e6 / per_trace)
        t0 = time.perf_counter()
        write_jsonl((one[i % len(one)] for i in range(n)), path)
        write_s = time.perf_counter() - t0
        mb = path.stat().st_size / 1e6
        loaded = []
        load_s = best_of(args.rounds, lambda: loaded.append(sum(1 for _ in read_jsonl(path))))
        assert loaded[-1] == n

        def parse():
            with open(path) as f:
                for line in f:
                    json.loads(line)

        parse_s = best_of(args.rounds, parse)
    print(
        f"{n} traces, {mb:.1f} MB: write {write_s:.2f}s, load {load_s:.2f}s ({mb / load_s:.1f} MB/s), "
        f"json.loads alone {parse_s:.2f}s"
    )
    print(
        json.dumps(
            {
                "bench": "trace_io",
                "quick": args.quick,
                "traces": n,
                "mb": round(mb, 1),
                "write_s": round(write_s, 2),
                "load_s": round(load_s, 2),
                "load_mb_per_s": round(mb / load_s, 1),
                "json_parse_s": round(parse_s, 2),
                "load_over_json_parse": round(load_s / parse_s, 2),
            }
        )
    )


if __name__ == "__main__":
    setup_logging()  # tracerl's lines on stderr, one format (TRACERL_LOG_LEVEL)
    main()
