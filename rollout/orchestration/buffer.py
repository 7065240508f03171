"""TraceBuffer: where finished traces wait for the trainer (a Ray actor).

Rollout workers `put` traces as they finish; the trainer `get`s whole groups
(all `group_size` traces of one task instance, needed by group baselines such
as GRPO). A malformed trace is rejected at the door with the reason, counted,
and never reaches the trainer. Failed traces still complete their group (the
trainer sees and counts them) so a crashing harness cannot stall a group.
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict
from typing import Any

from rollout.trace import Trace, TraceError


class TraceBuffer:
    """Holds traces by group and releases complete groups in completion order."""

    def __init__(self, group_size: int, vocab_sizes: dict[str, int] | None = None, max_errors_kept: int = 20):
        """`vocab_sizes`: policy -> vocabulary size; a sequence's ids must fall inside its policy's."""
        self.group_size = group_size
        self.vocab_sizes = dict(vocab_sizes or {})
        self._partial: dict[str, list[Trace]] = OrderedDict()  # group id -> traces so far
        self._ready: list[list[Trace]] = []  # complete groups, oldest first
        self._complete: set[str] = set()  # ids of every group completed so far
        self._cond = asyncio.Condition()
        self._interrupted = 0  # the latest get `call` number interrupted (calls count from 1)
        self.counts: Counter[str] = Counter(received=0, rejected=0, groups_ready=0, groups_taken=0)
        self.errors: list[str] = []  # latest rejection reasons
        self._max_errors_kept = max_errors_kept

    async def put(self, trace: Trace | dict[str, Any]) -> str | None:
        """Add one trace; returns why it was rejected (also recorded) if it is malformed, None if
        it was taken."""
        try:
            if isinstance(trace, dict):
                trace = Trace.from_dict(trace)
            elif not isinstance(trace, Trace):
                raise TraceError(f"expected a Trace or a dict, got {type(trace).__name__}")
            trace.check_vocab(self.vocab_sizes)
        except (TraceError, TypeError) as e:
            self.counts["rejected"] += 1
            self.errors = (self.errors + [str(e)])[-self._max_errors_kept :]
            return str(e)
        self.counts["received"] += 1
        self.counts[f"status_{trace.status}"] += 1
        group = self._partial.setdefault(trace.group, [])
        group.append(trace)
        if len(group) >= self.group_size:
            del self._partial[trace.group]
            self._complete.add(trace.group)
            async with self._cond:
                self._ready.append(group)
                self.counts["groups_ready"] += 1
                self._cond.notify_all()
        return None

    async def get(self, num_groups: int, timeout_s: float | None = None, call: int = 0) -> list[list[Trace]]:
        """Block until `num_groups` complete groups are ready, then take them.

        Returns early, with whatever complete groups there are (possibly none), when
        `timeout_s` passes or `interrupt(call)` is called with this get's `call` number
        (or a later one), before or during the wait: a caller that knows no more traces
        are coming ends the wait without losing the groups it takes. (Ray may run an
        async actor's calls out of order, so the interrupt names its get.)
        """
        async with self._cond:
            try:
                await asyncio.wait_for(
                    self._cond.wait_for(lambda: len(self._ready) >= num_groups or call <= self._interrupted), timeout_s
                )
            except TimeoutError:
                pass
            taken, self._ready = self._ready[:num_groups], self._ready[num_groups:]
        self.counts["groups_taken"] += len(taken)
        return taken

    async def reopen(self, groups: list[str]) -> list[str]:
        """Groups of a worker that died are run again: drop their partial traces (counted as
        `discarded`) and return those already complete (not to be run twice)."""
        for g in groups:
            self.counts["discarded"] += len(self._partial.pop(g, []))
        return [g for g in groups if g in self._complete]

    async def interrupt(self, call: int) -> None:
        """End the wait of `get` number `call` (and of any earlier one)."""
        async with self._cond:
            self._interrupted = max(self._interrupted, call)
            self._cond.notify_all()

    async def stats(self) -> dict[str, Any]:
        return {
            **self.counts,
            "groups_waiting": len(self._ready),
            "groups_partial": len(self._partial),
            "last_errors": list(self.errors[-3:]),
        }
