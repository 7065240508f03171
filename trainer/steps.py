"""Which groups each step trains, exactly once: a step's task slots (a function of the step alone),
their submission into the ledger and the fleet, the groups a step takes (held ones first, those an
engine failure cut short run again, then the fleet's next complete ones, as the ledger admits them),
and the traces no policy trained for staleness (trainer/ledger.py settles them)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rollout.orchestration.fleet import RolloutFleet
from rollout.trace import Trace
from trainer.config import LoopConfig
from trainer.ledger import Ledger

if TYPE_CHECKING:
    from trainer.policy import TrainedPolicy

log = logging.getLogger(__name__)


def step_tasks(step: int, groups_per_step: int) -> list[int]:
    """The task indices of `step`'s groups: a function of the step alone, so a resumed run
    sees the tasks the uninterrupted one would have."""
    return list(range(step * groups_per_step, (step + 1) * groups_per_step))


def submit_steps(fleet: RolloutFleet, ledger: Ledger, first: int, end: int, loop: LoopConfig) -> int:
    """Submit the groups of steps `first` .. `end - 1` (none past the last step), into the ledger;
    returns the first step not submitted."""
    for k in range(first, min(loop.steps, end)):
        slots = step_tasks(k, loop.groups_per_step)
        ledger.submit(slots)
        fleet.submit(slots)
    return max(first, min(loop.steps, end))


def step_traces(
    fleet: RolloutFleet, ledger: Ledger, held: list[list[Trace]], loop: LoopConfig
) -> tuple[list[Trace], list]:
    """One step's traces (the first held groups, those an engine failure cut short run again; else
    the fleet's next complete ones; as the ledger admits them: never a group twice) and the groups
    still held. In the order of their ids, not of arrival (which varies from run to run): the same
    groups pack into the same rows and micro-batches, so a resumed step repeats the uninterrupted
    run's arithmetic."""
    groups, held = held[: loop.groups_per_step], held[loop.groups_per_step :]
    if not groups:
        groups = fleet.take(loop.groups_per_step, loop.rollout_timeout_s)
    elif again := [g for g in groups if engine_failed(g)]:
        # held groups an engine failure cut short (kept with a checkpoint, they would fail the resumed
        # run the same way on every resume): run again, now that the engines are back
        log.warning(f"[train] {len(again)} held rollout groups failed for an engine: running them again")
        fleet.submit([g[0].info["slot"] for g in again])
        groups = [g for g in groups if not engine_failed(g)] + fleet.take(len(again), loop.rollout_timeout_s)
    groups = ledger.admit(groups)
    return sorted((tr for group in groups for tr in group), key=lambda tr: (tr.group, tr.id)), held


def engine_failed(group: list[Trace]) -> bool:
    """Whether a trace of `group` failed because an engine did (not the harness), and the group
    can be run again (it knows its slot)."""
    return any(t.info.get("engine_failed") for t in group) and "slot" in group[0].info


def stale_ids(traces: list[Trace], policies: dict[str, TrainedPolicy]) -> set[str]:
    """The traces no policy trained for staleness: every trained policy with sequences of its own
    in the trace left it out (the ledger's `stale`)."""
    out = set()
    for t in traces:
        owners = {s.policy for s in t.sequences if s.trainable and s.policy in policies}
        if owners and all(t.id in policies[p].stale_ids for p in owners):
            out.add(t.id)
    return out
