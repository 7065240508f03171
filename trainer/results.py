"""Per-item evaluation results: the record of one evaluated trace, their gzip'd JSONL files (with a
condition's meta file beside them), and the statistics over paired items and seeds.

An item is one held-out task of an evaluation in short (its id, reward, tokens, answer; a relay
team's sub-task steps). scripts/relay.py (the pilot gate) and scripts/relay_runs.py (the main runs
and the analysis) write and read them; the tests are those docs/preregistration/relay.md fixes
("Analysis": they were in scripts/relay.py at 6a842dc, moved here unchanged): the exact sign test
over items, the paired t-test over seeds, the two-level bootstrap CI, Holm's adjustment. What is
computed from them over conditions and seeds (contrasts, summaries, tables) is trainer/contrasts.py.
"""

from __future__ import annotations

import gzip
import json
import math
import statistics
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

from harnesses.programs.majority_vote import majority
from harnesses.verifiers.answers import extract_answer
from rollout.models import resolve_model
from rollout.trace import Trace, read_jsonl
from trainer.config import compose
from trainer.metrics import sign_test_p, write_atomic

# ---- items and their files ------------------------------------------------------------------


def item(trace: Trace, decode: Callable[[list[int]], str] | None) -> dict:
    """One evaluated item in short. `decode` (token ids -> text) reads a non-relay trace's answer
    out of its last sequence."""
    rec = {
        "id": trace.info.get("task", trace.group),
        "reward": trace.reward,
        "tokens": trace.num_generated_tokens,
        "tokens_by_role": {
            r: sum(len(s.completion_ids) for s in trace.sequences if s.agent == r) for r in trace.agents
        },
        "truncated": trace.status == "truncated",
        "failed": trace.status == "failed",
    }
    if trace.agent_rewards:
        rec["roles"] = trace.agent_rewards
    if "expression" in trace.info:  # harnesses/programs/relay.py
        rec.update({k: trace.info[k] for k in ("expression", "steps", "calculator_right")})
        rec["answer"] = trace.info["final"]
    else:
        rec["answer"] = extract_answer(decode(trace.sequences[-1].completion_ids)) if trace.sequences else None
    return rec


def records(traces: list[Trace], decode: Callable[[list[int]], str] | None) -> list[dict]:
    """item() of each trace, in task order. A majority vote's answer is the voted one and its
    samples' answers are kept (item() reads the last sample)."""
    recs = []
    for t in traces:
        rec = item(t, decode)
        if "votes" in t.info:  # harnesses/programs/majority_vote.py
            answers = t.info["answers"]
            rec.update(answer=answers[majority(answers)], answers=answers, votes=t.info["votes"])
        recs.append(rec)
    return sorted(recs, key=item_number)


def decoder(overrides: list[str]) -> Callable[[list[int]], str]:
    """The token decoder (ids -> text) of the composed run's first trained policy."""
    from tokenizers import Tokenizer

    cfg = compose("train", overrides)
    model = cfg.policy_model(cfg.trainable_policies()[0])
    tok = Tokenizer.from_file(str(Path(resolve_model(model.name, model.path)) / "tokenizer.json"))
    return lambda ids: tok.decode(ids, skip_special_tokens=True)


def run_decoder(run_dir: Path) -> Callable[[list[int]], str]:
    """The token decoder of a run's base model (`model` of its config.yaml)."""
    from omegaconf import OmegaConf
    from tokenizers import Tokenizer

    model = OmegaConf.load(run_dir / "config.yaml").model
    tok = Tokenizer.from_file(str(Path(resolve_model(model.name, model.path)) / "tokenizer.json"))
    return lambda ids: tok.decode(ids, skip_special_tokens=True)


def publish_evals(run_dir: Path, out: Path) -> list[int]:
    """Each held-out evaluation of a run (run_dir/eval/step_<N>.jsonl) as a condition
    `step_<N>` in `out`, its items read with the run's tokenizer; the steps written."""
    decode, steps = run_decoder(run_dir), []
    for path in sorted((run_dir / "eval").glob("step_*.jsonl"), key=lambda p: int(p.stem[5:])):
        step = int(path.stem[5:])
        recs = records(list(read_jsonl(path)), decode)
        write_condition(out, f"step_{step}", recs, {"step": step, "items": len(recs)})
        steps.append(step)
    return steps


def item_number(rec: dict) -> int:
    """The task's number in its id (the sort key of a file's items)."""
    return int(rec["id"].rsplit("/", 1)[1])  # "story_sum/eval/17"


def write_items(path: Path, recs: list[dict]) -> None:
    """One JSON line per item, gzip'd without a timestamp: the same items give the same bytes."""
    with path.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as out:  # the same bytes each time
        out.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in recs).encode())


def read_items(path: Path) -> list[dict]:
    """The items of a file written by write_items."""
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def write_condition(folder: Path, name: str, recs: list[dict], meta: dict) -> None:
    """One evaluated condition: <name>.items.jsonl.gz, then <name>.meta.json (what it ran at, what
    it took): a meta file means the items are whole."""
    folder.mkdir(parents=True, exist_ok=True)
    write_items(folder / f"{name}.items.jsonl.gz", recs)
    write_atomic(folder / f"{name}.meta.json", json.dumps(meta, indent=2, allow_nan=False))


def read_condition(folder: Path, name: str) -> tuple[list[dict], dict] | None:
    """(items, meta) of a condition written by write_condition; None before its meta file is."""
    if not (folder / f"{name}.meta.json").exists():
        return None
    return read_items(folder / f"{name}.items.jsonl.gz"), json.loads((folder / f"{name}.meta.json").read_text())


def head_commit(root: Path) -> str:
    """The commit checked out at `root` (the repository root): what an evaluation ran at."""
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()


# ---- statistics ---------------------------------------------------------------------------------


def mean(xs: Iterable[float]) -> float | None:
    """The mean rounded to 4 digits; None for no values."""
    xs = list(xs)
    return round(statistics.fmean(xs), 4) if xs else None


def sign_test(before: list[dict], after: list[dict]) -> dict:
    """Items that got better / worse from `before` to `after` (the same items), and the exact
    two-sided binomial p of that split (McNemar's exact test; ties dropped)."""
    assert [r["id"] for r in before] == [r["id"] for r in after], "the conditions must hold the same items"
    better = sum(a["reward"] > b["reward"] for b, a in zip(before, after))
    worse = sum(a["reward"] < b["reward"] for b, a in zip(before, after))
    return {"better": better, "worse": worse, "p": sign_test_p(better, worse)}


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (Lentz's method, as in
    Numerical Recipes' betacf)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with `df` degrees of freedom: I_x(df/2, 1/2), x = df/(df+t^2)."""
    x, a, b = df / (df + t * t), df / 2.0, 0.5
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def paired_t(diffs: list[float]) -> dict:
    """The paired t-test over seeds of per-seed differences: mean, t, two-sided p (n - 1 df)."""
    n, m = len(diffs), statistics.fmean(diffs)
    assert n >= 2, "a paired t-test needs at least 2 seeds"
    sd = statistics.stdev(diffs)
    if sd == 0.0:
        return {"seeds": n, "mean": m, "t": math.copysign(math.inf, m) if m else 0.0, "p": 0.0 if m else 1.0}
    t = m / (sd / math.sqrt(n))
    return {"seeds": n, "mean": m, "t": t, "p": t_two_sided_p(t, n - 1)}


def bootstrap_ci(a: list[list[float]], c: list[list[float]], resamples: int = 10000, seed: int = 0) -> tuple:
    """95% two-level bootstrap CI of mean over seeds of (mean c - mean a): resample seeds, then
    within each drawn seed its items (one item draw for both arms: they stay paired).
    a[s][i], c[s][i]: the reward of item i in seed s."""
    import numpy as np

    d = np.asarray(c, dtype=float) - np.asarray(a, dtype=float)  # (seeds, items)
    rng = np.random.default_rng(seed)
    seeds, items = d.shape
    stats = []
    for start in range(0, resamples, 500):  # in chunks: (500, seeds, items) indices at a time
        n = min(500, resamples - start)
        picks = rng.integers(0, seeds, size=(n, seeds))
        rows = rng.integers(0, items, size=(n, seeds, items))
        stats.append(d[picks[..., None], rows].mean(axis=(1, 2)))
    stats = np.concatenate(stats)
    return float(np.percentile(stats, 2.5)), float(np.percentile(stats, 97.5))


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm-adjusted p-values of a family (step-down, monotone, capped at 1)."""
    order = sorted(pvalues, key=pvalues.get)
    adjusted, running = {}, 0.0
    for rank, name in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * pvalues[name]))
        adjusted[name] = running
    return adjusted
