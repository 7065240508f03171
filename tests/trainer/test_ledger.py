"""The run's ledger (trainer/ledger.py): every submitted group ends once, trained, stale or failed."""

import pytest

from rollout.trace import Sequence, Trace
from trainer.ledger import Ledger

pytestmark = pytest.mark.unit


def group(slot: int, statuses=("ok", "ok")) -> list[Trace]:
    seq = Sequence([1, 2], [3], [-0.1], "solver", "main", 0)
    return [
        Trace(
            id=f"t/{slot}#{k}",
            group=f"t/{slot}",
            sequences=[seq],
            status=s,
            info={"slot": slot},
            error="boom" if s == "failed" else None,
        )
        for k, s in enumerate(statuses)
    ]


def test_every_group_ends_once_and_the_counts_add_up():
    ledger = Ledger()
    ledger.submit([0, 1, 2, 3])
    assert ledger.balanced and ledger.metrics()["faults/ledger_open"] == 4
    taken = ledger.admit([group(0), group(1, ("failed", "failed")), group(2)])
    ledger.settle(stale_ids={"t/2#0", "t/2#1"})
    c = ledger.counts
    assert len(taken) == 3 and (c["trained"], c["failed"], c["stale"]) == (1, 1, 1)
    assert ledger.open == {3} and ledger.balanced


def test_a_group_that_comes_twice_is_not_trained_twice():
    ledger = Ledger()
    ledger.submit([0, 1])
    assert len(ledger.admit([group(0), group(0), group(9)])) == 1  # a copy, and a slot never submitted
    ledger.settle(set())
    assert ledger.counts["duplicated"] == 2 and not ledger.balanced
    assert ledger.metrics()["faults/ledger_balanced"] == 0.0


def test_the_ledger_survives_a_checkpoint():
    ledger = Ledger()
    ledger.submit([0, 1, 2])
    ledger.admit([group(0)])
    ledger.settle(set())
    again = Ledger(ledger.state())  # what trainer_state.json keeps
    assert again.open == {1, 2} and again.counts == ledger.counts
    again.admit([group(1), group(2)])
    again.settle(set())
    assert again.summary() == {
        "submitted": 3,
        "trained": 3,
        "stale": 0,
        "failed": 0,
        "duplicated": 0,
        "open": 0,
        "balanced": True,
    }
    with pytest.raises(AssertionError, match="slot 1 submitted again while still open"):
        ledger.submit([1])
