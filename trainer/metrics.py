"""Metrics under their final names, and run logging: metrics.jsonl, wandb, one status line per step.

Prefixes: `rollout/*` (this step's traces, rollout/stats.py), `train/<policy>/*`
(each trained policy's advantages and optimizer step), `perf/*` (where the
seconds go), `sync/<policy>/*` (its weight sync), `async/<policy>/*` (its
staleness and version), `eval/*` (held-out runs).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from rollout.trace import Trace
from rollout.viewer import build_view, render_sequence
from trainer.advantages import advantage_stats, role_advantage_counts

log = logging.getLogger(__name__)


def advantage_metrics(traces: list[Trace], advs: list[list[float]], policy: str) -> dict[str, float]:
    """train/<policy>/adv_{mean,std,min,max,count,frac_zero} over its trainable sequences of ok traces,
    and per role `train/<policy>/sequences/<role>` and `train/<policy>/nonzero_adv/<role>` (of those,
    the ones with a gradient): which roles' rows this step trained."""
    m = {f"train/{policy}/adv_{k}": v for k, v in advantage_stats(traces, advs).items()}
    for role, c in role_advantage_counts(traces, advs).items():
        m.update({f"train/{policy}/{k}/{role}": v for k, v in c.items()})
    return m


def train_metrics(stats: dict[str, float], packing: dict[str, float], policy: str) -> dict[str, float]:
    """train/<policy>/*: one optimizer step's learner sums (per token where it is a mean) and packing."""
    tokens = max(stats["tokens"], 1.0)
    values = {
        "loss": stats["loss"],
        "grad_norm": stats["grad_norm"],
        "lr": stats["lr"],
        "trained_tokens": stats["tokens"],
        "clip_frac": stats["clip_frac"] / tokens,
        "ratio_mean": stats["ratio"] / tokens,
        "ratio_max": stats["ratio_max"],
        "mismatch_kl": stats["mismatch_kl"] / tokens,
        "kl_ref": stats["kl_ref"] / tokens,
        "entropy": stats["entropy"] / tokens,
        "merge_saving": packing["merge_saving"],
        "padding_fraction": packing["padding_fraction"],
        "rows": packing["rows"],
        "shared_prefix_rows": packing["shared_prefix_rows"],
        "padded_tokens": stats["padded_tokens"],
        "skipped_steps": stats["skipped_steps"],
    }
    return {f"train/{policy}/{k}": v for k, v in values.items()}


def step_totals(metrics: dict[str, float], policies: list[str]) -> dict[str, float]:
    """The step's sums over the trained policies: perf/{train,sync}_s, train/trained_tokens,
    perf/train_tokens_per_s (trained tokens per second of learner time) and async/dropped_stale."""
    train_s = sum(metrics[f"perf/{p}/train_s"] for p in policies)
    tokens = sum(metrics.get(f"train/{p}/trained_tokens", 0.0) for p in policies)
    return {
        "perf/train_s": train_s,
        "perf/sync_s": sum(metrics[f"perf/{p}/sync_s"] for p in policies),
        "train/trained_tokens": tokens,
        "perf/train_tokens_per_s": tokens / train_s if train_s else 0.0,
        "async/dropped_stale": sum(metrics[f"async/{p}/dropped_stale"] for p in policies),
    }


def step_perf(
    traces: list[Trace], metrics: dict[str, float], waited_s: float, step_s: float, engine_restarts: int
) -> dict[str, float]:
    """perf/* of the whole step (`waited_s` of its `step_s` waiting for the rollout; generated
    tokens per second of step), and the rollout's recoveries: engine restarts so far, traces
    retried and requests resent this step."""
    return {
        "perf/rollout_wait_s": waited_s,
        "perf/step_s": step_s,
        "perf/rollout_tokens_per_s": metrics["rollout/generated_tokens"] / step_s,
        "rollout/engine_restarts": float(engine_restarts),
        "rollout/retried": float(sum("attempts" in tr.info for tr in traces)),
        "rollout/resent": float(sum(tr.info.get("requests_resent", 0) for tr in traces)),
    }


def rollout_split(before: list[dict], after: list[dict], window_s: float) -> dict[str, float]:
    """Where the engines' time went over a rollout window of `window_s` seconds, from two
    snapshots of `Engine.info()` (at its start and its end; an engine whose pid changed between
    them restarted, and counts from zero). Seconds are the mean over engines: `engine_busy_s`
    (some request in flight) = `engine_prefill_s` + `engine_decode_s` (vLLM engine-core steps,
    rollout/engine/clock.py) + `engine_other_s` (in flight, no step running: the engine actor's
    own work); `engine_idle_s` (no request in flight: the workers, the agent client, Ray, the
    harness, or nothing submitted). Also the decode steps, their mean batch, the prefilled and
    prefix-cached prompt tokens, and generated tokens per second of the window."""
    old = {(i["node_id"], i["pid"]): i for i in before}
    n = max(len(after), 1)
    busy = 0.0
    steps = dict.fromkeys(
        (
            "prefill_s",
            "decode_s",
            "decode_steps",
            "decode_batch_sum",
            "prefill_tokens",
            "cached_prompt_tokens",
            "generated_tokens",
        ),
        0.0,
    )
    for info in after:
        prev = old.get((info["node_id"], info["pid"]))
        busy += info["busy_s"] - (prev["busy_s"] if prev else 0.0)
        for k in steps:
            steps[k] += info["steps"][k] - (prev["steps"][k] if prev else 0.0)
    busy /= n
    prefill, decode = steps["prefill_s"] / n, steps["decode_s"] / n
    return {
        "perf/rollout_window_s": window_s,
        "perf/engine_busy_s": busy,
        "perf/engine_prefill_s": prefill,
        "perf/engine_decode_s": decode,
        "perf/engine_other_s": max(busy - prefill - decode, 0.0),
        "perf/engine_idle_s": max(window_s - busy, 0.0),
        "perf/engine_generated_tokens_per_s": steps["generated_tokens"] / window_s if window_s else 0.0,
        "rollout/decode_steps": steps["decode_steps"],
        "rollout/decode_batch": steps["decode_batch_sum"] / steps["decode_steps"] if steps["decode_steps"] else 0.0,
        "rollout/prefill_tokens": steps["prefill_tokens"],
        "rollout/cached_prompt_tokens": steps["cached_prompt_tokens"],
    }


def sign_test_p(better: int, worse: int) -> float:
    """The exact two-sided binomial p of a better / worse split (ties dropped): the sign test."""
    n, k = better + worse, min(better, worse)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n) if n else 1.0


def paired_comparison(before: list[Trace], after: list[Trace]) -> dict[str, float]:
    """How the same held-out questions moved between two evals: questions that got better /
    worse, and the two-sided sign-test p-value of that split (ties dropped) — the noise check
    for "did eval reward really rise" that two independent means cannot give on a small set.

    Paired by question (the trace's info["question"], else its task id), each counted once: a
    repeated question must not count as independent evidence. A question whose run failed on
    either side (an infrastructure error, not an answer) is left out and counted apart.
    """

    def by_question(traces: list[Trace]) -> tuple[dict[str, float], set[str]]:
        rewards: dict[str, list[float]] = {}
        failed: set[str] = set()
        for t in traces:
            key = t.info.get("question", t.info.get("task", t.id))
            rewards.setdefault(key, []).append(t.reward)
            if t.status == "failed":
                failed.add(key)
        return {q: sum(r) / len(r) for q, r in rewards.items()}, failed

    (b, b_failed), (a, a_failed) = by_question(before), by_question(after)
    both = b.keys() & a.keys()
    common = sorted(both - b_failed - a_failed)
    better = sum(a[q] > b[q] for q in common)
    worse = sum(a[q] < b[q] for q in common)
    p = sign_test_p(better, worse)
    return {
        "questions": len(common),
        "left_out_failed": len(both) - len(common),
        "better": better,
        "worse": worse,
        "sign_test_p": p,
    }


def trace_table(traces: list[Trace], decode):
    """A wandb Table of full traces: a row per sequence with its text and reward, and its card
    from the trace viewer (rollout/viewer.py: prompt / trained / masked tokens, training row,
    weight version) as HTML."""
    import wandb

    table = wandb.Table(
        columns=["trace", "seq", "agent", "policy", "version", "prompt_tail", "completion", "reward", "view"]
    )
    for t in traces:
        view = build_view(t, decode)
        for i, s in enumerate(t.sequences):
            card = wandb.Html(render_sequence(view, i), inject=False, data_is_not_path=True)
            table.add_data(
                t.id,
                i,
                s.agent,
                s.policy,
                s.version,
                decode(s.prompt_ids)[-300:],
                decode(s.completion_ids),
                t.reward,
                card,
            )
    return table


def kept_rows(path: Path, resume_step: int) -> list[str]:
    """The lines of a metrics.jsonl up to `resume_step`; lines that do not decode to a row (the
    last one torn by a crash mid-write) are left out, and counted once."""
    kept, torn = [], 0
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
            if not isinstance(row.get("step"), int):
                raise ValueError("no integer step")
        except (ValueError, AttributeError):
            torn += bool(line.strip())
            continue
        if row["step"] <= resume_step:
            kept.append(line)
    if torn:
        log.warning(f"[train] {path}: left out {torn} line(s) that are not metric rows (a write cut short)")
    return kept


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` all at once: a crash leaves the old file or the new one, never a
    half-written one (written beside it, fsynced, renamed over it)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RunLogger:
    """metrics.jsonl, wandb unless `mode` is disabled; a context manager.

    `resume_step`: a resumed run keeps the rows up to that step (those after it came from the
    interrupted run past its checkpoint, and are made again) and appends."""

    def __init__(
        self,
        run_dir: Path,
        mode: str,
        project: str,
        name: str | None,
        config: dict[str, Any],
        resume_step: int | None = None,
    ):
        self.run_dir = run_dir
        self.path = run_dir / "metrics.jsonl"
        resume = resume_step is not None
        self._keys: dict[int, set[str]] = {}  # step -> the metrics logged at it (this run's and the kept rows')
        if resume and self.path.exists():
            kept = kept_rows(self.path, resume_step)
            write_atomic(self.path, "".join(line + "\n" for line in kept))
            for line in kept:
                row = json.loads(line)
                self._keys.setdefault(row["step"], set()).update(row)
        self._file = open(self.path, "a" if resume else "w")
        self.wandb = None
        if mode != "disabled":
            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")
            self.wandb = wandb.init(
                project=project,
                name=name or run_dir.name,
                dir=str(run_dir),
                mode=mode,
                config=config,
                resume="allow" if resume else None,
            )
        self._t0 = time.time()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Append one row to metrics.jsonl (strict JSON: a non-finite value is written as null)."""
        record = {
            "step": step,
            "time_s": round(time.time() - self._t0, 2),
            **{k: v if not isinstance(v, float) or math.isfinite(v) else None for k, v in metrics.items()},
        }
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        self._keys.setdefault(step, set()).update(metrics)
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)

    def rewind(self, step: int) -> None:
        """Keep the rows up to `step` only (the run went back to its checkpoint at `step` and makes the
        rows after it again). wandb keeps what it was sent: its rows past `step` are not made again."""
        self._file.close()
        kept = kept_rows(self.path, step)
        write_atomic(self.path, "".join(line + "\n" for line in kept))
        self._keys = {k: v for k, v in self._keys.items() if k <= step}
        self._file = open(self.path, "a")

    def logged(self, step: int, prefix: str) -> bool:
        """Whether a metric named `prefix`... was logged at `step` (by this run, or a kept row)."""
        return any(k.startswith(prefix) for k in self._keys.get(step, ()))

    def status(self, step: int, steps: int, m: dict[str, float], policies: list[str]) -> None:
        """One terminal line per step: the numbers a researcher watches."""
        losses = [f"{p} " * (len(policies) > 1) + f"{m.get(f'train/{p}/loss', 0):+.4f}" for p in policies]
        parts = [
            f"step {step:>4}/{steps}",
            f"reward {m.get('rollout/reward', 0):.3f}",
            f"loss {' '.join(losses)}",
            f"tok/s {m.get('perf/train_tokens_per_s', 0):7.1f}",
            f"step {m.get('perf/step_s', 0):6.1f}s (rollout {m.get('perf/rollout_wait_s', 0):.1f}, "
            f"train {m.get('perf/train_s', 0):.1f}, sync {m.get('perf/sync_s', 0):.1f}; engines busy "
            f"{m.get('perf/engine_busy_s', 0):.1f}s of {m.get('perf/rollout_window_s', 0):.1f})",
        ]
        if "eval/reward" in m:
            parts.append(f"eval {m['eval/reward']:.3f}")
        if m.get("rollout/failed", 0):
            parts.append(f"failed {int(m['rollout/failed'])}")
        skipped = sum(m.get(f"train/{p}/skipped_steps", 0) for p in policies)
        if skipped:
            parts.append(f"skipped {int(skipped)}")
        if m.get("rollout/engine_restarts", 0):
            parts.append(f"engine restarts {int(m['rollout/engine_restarts'])}")
        if m.get("async/dropped_stale", 0):
            parts.append(f"dropped {int(m['async/dropped_stale'])}")
        log.info("[train] " + " | ".join(parts))

    def traces(self, step: int, traces: list[Trace], decode) -> None:
        """Log `trace_table` of a few full traces."""
        if self.wandb is not None:
            self.wandb.log({"rollout/traces": trace_table(traces, decode)}, step=step)

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._file.closed:
            return
        self._file.close()
        if self.wandb is not None:
            self.wandb.finish()
