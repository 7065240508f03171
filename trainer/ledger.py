"""The run's ledger: every group the driver submits ends exactly once, trained, dropped as stale, or
failed (DESIGN.md, invariant 10), whatever failed on the way.

A group is named by its slot, the task index the driver submitted (rollout workers write it into
each trace's info["slot"]; step k's slots are a function of k, trainer/steps.py::step_tasks). The
loop tells the ledger what it submits (`submit`), lets it admit the groups it took before it trains
them (`admit`: a group whose slot is not open, never submitted or already ended, is left out and
counted `duplicated`, and logged as the bug it is), and says how each admitted group ended
(`settle`). Its counts are cumulative over the run's lineage: a checkpoint keeps them with the
slots still open, a resume (or the in-run rebuild of a dead learner) restores them, so that at
the end of every run

    trained + stale + failed == submitted,   open == 0,   duplicated == 0

The loop logs them each step as `faults/ledger_*` and summary.json keeps them under "ledger".
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rollout.trace import Trace

log = logging.getLogger(__name__)

OUTCOMES = ("trained", "stale", "failed")


class Ledger:
    def __init__(self, state: dict | None = None):
        """`state`: what `state()` returned at a checkpoint (None: a fresh run)."""
        state = state or {}
        self.open: set[int] = set(state.get("open", []))  # slots submitted, not ended
        self.counts: Counter[str] = Counter({k: 0 for k in ("submitted", *OUTCOMES, "duplicated")})
        self.counts.update(state.get("counts", {}))
        self._admitted: list[list[Trace]] = []  # taken this step, not yet settled

    def state(self) -> dict:
        """What a checkpoint keeps (JSON)."""
        return {"open": sorted(self.open), "counts": dict(self.counts)}

    def submit(self, slots: list[int]) -> None:
        for slot in slots:
            if slot in self.open:
                raise AssertionError(f"ledger: slot {slot} submitted again while still open")
            self.open.add(slot)
            self.counts["submitted"] += 1

    def admit(self, groups: list[list[Trace]]) -> list[list[Trace]]:
        """The groups that may be trained: those of an open slot (which closes). A group of a slot
        not open (a second copy of a group: never to be trained twice) is left out, counted and
        logged. A group whose traces carry no slot (a checkpoint of an older tracerl) is admitted."""
        admitted = []
        for group in groups:
            slot = group[0].info.get("slot") if group else None
            if slot is not None and slot not in self.open:
                self.counts["duplicated"] += 1
                log.error(
                    f"[train] ledger: a group of slot {slot} (task {group[0].info.get('task')!r}) came again after it "
                    f"had ended, or was never submitted: left out, not trained twice"
                )
                continue
            self.open.discard(slot)
            admitted.append(group)
        self._admitted.extend(admitted)
        return admitted

    def settle(self, stale_ids: set[str]) -> None:
        """How each admitted group ended: failed (every trace failed), stale (every trace that did not
        fail was left out for staleness: `stale_ids`), else trained."""
        for group in self._admitted:
            alive = [t for t in group if t.status != "failed"]
            if not alive:
                self.counts["failed"] += 1
            elif all(t.id in stale_ids for t in alive):
                self.counts["stale"] += 1
            else:
                self.counts["trained"] += 1
        self._admitted = []

    @property
    def balanced(self) -> bool:
        """Every submitted group ended once or is still open, and none came twice."""
        ended = sum(self.counts[k] for k in OUTCOMES)
        return ended + len(self.open) == self.counts["submitted"] and self.counts["duplicated"] == 0

    def metrics(self) -> dict[str, float]:
        return {
            **{f"faults/ledger_{k}": float(v) for k, v in sorted(self.counts.items())},
            "faults/ledger_open": float(len(self.open)),
            "faults/ledger_balanced": float(self.balanced),
        }

    def summary(self) -> dict:
        return {**dict(self.counts), "open": len(self.open), "balanced": self.balanced}
