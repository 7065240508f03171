"""Make examples/arith.jsonl: small arithmetic questions with their answers, no download.

    python examples/make_arith.py            # writes examples/arith.jsonl (deterministic)

Each line is {"question": ..., "answer": ..., "terms": ...}: the sum or difference of 2 or 3
one-digit numbers, the difficulty SmolLM2-135M learns on a CPU (docs/cpu_notes.md). It is
the file docs/own_data.md trains on: task=file task.params.path=examples/arith.jsonl.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent


def make_items(count: int, seed: int) -> list[dict]:
    """`count` distinct questions, drawn with `seed`."""
    rng, items, seen = random.Random(seed), [], set()
    while len(items) < count:
        terms = rng.choice((2, 3))
        numbers = [rng.randint(0, 9) for _ in range(terms)]
        signs = [rng.choice("+-") for _ in range(terms - 1)]
        text = str(numbers[0]) + "".join(f" {s} {n}" for s, n in zip(signs, numbers[1:]))
        if text in seen:
            continue
        seen.add(text)
        value = numbers[0] + sum(n if s == "+" else -n for s, n in zip(signs, numbers[1:]))
        items.append({"question": f"What is {text}?", "answer": str(value), "terms": terms})
    return items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=600, help="distinct questions")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE / "arith.jsonl")
    args = parser.parse_args()
    with args.out.open("w") as f:
        for item in make_items(args.count, args.seed):
            f.write(json.dumps(item) + "\n")
    print(f"wrote {args.count} items to {args.out}")


if __name__ == "__main__":
    main()
