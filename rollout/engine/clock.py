"""Where an engine's busy time goes: a vLLM stat logger that times each engine-core step.

vLLM's front-end calls `record` once per engine-core output batch (one scheduler step). The
time from the previous step's output (or from the moment the engine went from no request in
flight to one) to this one is that step's time, counted as a prefill step when it computed
prompt tokens and as a decode step otherwise; decode steps also add up their batch size (the
requests running). `Engine.info()` returns the running totals and the loop reports their
change over each step's rollout wait (trainer/loop.py::rollout_split).

Imports vLLM at the top: import this module only where vLLM may be imported (the engine actor).
"""

from __future__ import annotations

import time

from vllm.v1.metrics.loggers import StatLoggerBase

# The counters `StepClock.totals()` returns, each a running total since the engine started.
FIELDS = (
    "prefill_s",
    "decode_s",
    "prefill_steps",
    "decode_steps",
    "prefill_tokens",
    "cached_prompt_tokens",
    "generated_tokens",
    "decode_batch_sum",
)


class StepClock(StatLoggerBase):
    def __init__(self, vllm_config=None, engine_index: int = 0):
        self.counts = dict.fromkeys(FIELDS, 0.0)
        self._last = None  # wall time the running step started at (None: idle)
        self._idle = True

    def wake(self) -> None:
        """The engine got a request with none in flight: the next step's time starts now."""
        self._last, self._idle = time.time(), False

    def sleep(self) -> None:
        """No request in flight any more: after the step that finished it (whose output may be
        recorded a moment later), the time until the next `wake` is idle."""
        self._idle = True

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        if iteration_stats is None:
            return
        now = iteration_stats.iteration_timestamp
        dt = now - self._last if self._last is not None else 0.0
        self._last = None if self._idle else now
        c = self.counts
        prompt = iteration_stats.prompt_token_stats
        if prompt.total:
            c["prefill_s"] += dt
            c["prefill_steps"] += 1
            c["prefill_tokens"] += prompt.computed
            c["cached_prompt_tokens"] += prompt.cached_tokens
        elif iteration_stats.num_generation_tokens:
            c["decode_s"] += dt
            c["decode_steps"] += 1
            c["decode_batch_sum"] += scheduler_stats.num_running_reqs if scheduler_stats else 0
        c["generated_tokens"] += iteration_stats.num_generation_tokens

    def log_engine_initialized(self) -> None:
        pass

    def totals(self) -> dict[str, float]:
        return dict(self.counts)
