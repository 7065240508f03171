"""TraceBuffer: where finished traces wait for the trainer (a Ray actor).

Rollout workers `put` traces as they finish; the trainer `get`s whole groups
(all `group_size` traces of one task instance, needed by group baselines such
as GRPO). A malformed trace is rejected at the door with the reason, counted,
and never reaches the trainer. Failed traces still complete their group (the
trainer sees and counts them) so a crashing harness cannot stall a group.

Every group is released once, whatever is retried. A group is keyed by its slot:
the task index the driver submitted (one per submission; a task source that wraps
around gives two slots the same task id), else its group id. A put is idempotent
by trace id (a repeat replaces, counted `repeated`), a put to a slot already
complete is dropped (`late`) unless a newer call made it (the slot submitted anew),
and every put carries the epoch of the worker call that made it: `reopen(slots,
epoch)` (a rerun of a call that failed, which may still be running: Ray's "actor
unavailable") and `reset(epoch)` (the driver rolled back to a checkpoint) fence
off every older call's later puts (`fenced`).
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter, OrderedDict
from typing import Any

from rollout.trace import Trace, TraceError

Slot = int | str  # a submitted task index, or a group id


class TraceBuffer:
    """Holds traces by group and releases complete groups in completion order."""

    def __init__(self, group_size: int, vocab_sizes: dict[str, int] | None = None, max_errors_kept: int = 20):
        """`vocab_sizes`: policy -> vocabulary size; a sequence's ids must fall inside its policy's."""
        self.group_size = group_size
        self.vocab_sizes = dict(vocab_sizes or {})
        self._partial: dict[Slot, dict[str, Trace]] = OrderedDict()  # slot -> trace id -> trace
        self._ready: list[list[Trace]] = []  # complete groups, oldest first
        self._complete: dict[Slot, int] = {}  # slot -> the epoch that completed it (since the last reset)
        self._floors: dict[Slot, int] = {}  # slot -> the oldest epoch whose puts it still takes
        self._floor = 0  # the oldest epoch any group takes (reset)
        self._cond = asyncio.Condition()
        self._interrupted = 0  # the latest get `call` number interrupted (calls count from 1)
        self.counts: Counter[str] = Counter(received=0, rejected=0, groups_ready=0, groups_taken=0)
        self.errors: list[str] = []  # latest rejection reasons
        self._max_errors_kept = max_errors_kept

    async def put(self, trace: Trace | dict[str, Any], epoch: int = 0, slot: int | None = None) -> str | None:
        """Add one trace of submission `slot` (None: its group id), made by a worker call of `epoch`;
        returns why it was rejected (also recorded) if it is malformed, None otherwise: taken, or
        dropped as a repeat of what the buffer holds (`late`: its slot is complete; `fenced`: a
        newer call reran its slot)."""
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
        key = trace.group if slot is None else slot
        if key in self._complete:
            if epoch <= self._complete[key]:
                self.counts["late"] += 1
                return None
            del self._complete[key]  # a newer call: the slot submitted anew (not a rerun), a new group
        if epoch < max(self._floor, self._floors.get(key, 0)):
            self.counts["fenced"] += 1
            return None
        self.counts["received"] += 1
        group = self._partial.setdefault(key, {})
        if trace.id in group:
            self.counts["repeated"] += 1
        else:
            self.counts[f"status_{trace.status}"] += 1
        group[trace.id] = trace
        if len(group) >= self.group_size:
            del self._partial[key]
            self._complete[key] = epoch
            async with self._cond:
                self._ready.append(list(group.values()))
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

    async def reopen(self, slots: list[Slot], epoch: int = 0) -> list[Slot]:
        """The slots of a worker call that failed run again in a call of `epoch`: drop their partial
        traces (counted as `discarded`), refuse every older call's later puts to them, and return
        those already complete (not to be run twice)."""
        for g in slots:
            self.counts["discarded"] += len(self._partial.pop(g, {}))
            self._floors[g] = max(self._floors.get(g, 0), epoch)
        return [g for g in slots if g in self._complete]

    async def reset(self, epoch: int) -> None:
        """Forget every group (partial, complete, not taken) and refuse the puts of calls older than
        `epoch`: the driver rolled back to a checkpoint and submits those groups again."""
        async with self._cond:
            self.counts["discarded"] += sum(map(len, self._partial.values())) + sum(map(len, self._ready))
            self._partial, self._ready, self._complete, self._floors = OrderedDict(), [], {}, {}
            self._floor = max(self._floor, epoch)

    async def interrupt(self, call: int) -> None:
        """End the wait of `get` number `call` (and of any earlier one)."""
        async with self._cond:
            self._interrupted = max(self._interrupted, call)
            self._cond.notify_all()

    async def stats(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            **self.counts,
            "groups_waiting": len(self._ready),
            "groups_partial": len(self._partial),
            "last_errors": list(self.errors[-3:]),
        }
