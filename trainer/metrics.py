"""Run logging: metrics.jsonl in the run dir, wandb (offline by default), one status line per step."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from rollout.trace import Trace
from rollout.view import build_view, render_sequence


def trace_table(traces: list[Trace], decode):
    """A wandb Table of full traces: a row per sequence with its text and reward, and its card
    from the trace viewer (rollout/view.py: prompt / trained / masked tokens, training row,
    weight version) as HTML."""
    import wandb

    table = wandb.Table(columns=["trace", "seq", "agent", "policy", "version", "prompt_tail",
                                 "completion", "reward", "view"])
    for t in traces:
        view = build_view(t, decode)
        for i, s in enumerate(t.sequences):
            card = wandb.Html(render_sequence(view, i), inject=False, data_is_not_path=True)
            table.add_data(t.id, i, s.agent, s.policy, s.version, decode(s.prompt_ids)[-300:],
                           decode(s.completion_ids), t.reward, card)
    return table


class RunLogger:
    def __init__(self, run_dir: Path, backend: str, mode: str, project: str, name: str | None,
                 config: dict[str, Any], resume: bool = False):
        self.run_dir = run_dir
        self.path = run_dir / "metrics.jsonl"
        self._file = open(self.path, "a" if resume else "w")
        self.wandb = None
        if backend == "wandb" and mode != "disabled":
            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")
            self.wandb = wandb.init(project=project, name=name or run_dir.name, dir=str(run_dir),
                                    mode=mode, config=config, resume="allow" if resume else None)
        self._t0 = time.time()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        record = {"step": step, "time_s": round(time.time() - self._t0, 2), **metrics}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)

    def status(self, step: int, steps: int, m: dict[str, float]) -> None:
        """One terminal line per step: the numbers a researcher watches."""
        parts = [f"step {step:>4}/{steps}",
                 f"reward {m.get('rollout/reward', 0):.3f}",
                 f"loss {m.get('train/loss', 0):+.4f}",
                 f"tok/s {m.get('perf/train_tokens_per_s', 0):7.1f}",
                 f"step {m.get('perf/step_s', 0):6.1f}s"]
        if "eval/reward" in m:
            parts.append(f"eval {m['eval/reward']:.3f}")
        if m.get("async/dropped_stale", 0):
            parts.append(f"dropped {int(m['async/dropped_stale'])}")
        print("[train] " + " | ".join(parts), flush=True)

    def traces(self, step: int, traces: list[Trace], decode) -> None:
        """Log `trace_table` of a few full traces."""
        if self.wandb is not None:
            self.wandb.log({"rollout/traces": trace_table(traces, decode)}, step=step)

    def close(self) -> None:
        if self._file.closed:
            return
        self._file.close()
        if self.wandb is not None:
            self.wandb.finish()
