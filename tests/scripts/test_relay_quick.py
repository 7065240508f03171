"""scripts/relay.py --quick: the pilot gate's three untrained evaluations on the tiny model (8 items
each), as the pilot ran them, end to end. Its first call (three evaluations, each its own Ray and
engine: ~1.5 min) runs in the background lane (tests/lane.py) from the session's start; the test
checks what it wrote, and that a second call reuses every evaluation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from scripts.relay import CONDITIONS, ROOT, gate
from tests import lane
from trainer.results import read_items

pytestmark = pytest.mark.e2e

OUT = Path(tempfile.gettempdir()) / f"tracerl-relay-quick-{os.getpid()}"
CMD = ["scripts/relay.py", "--operations", "1", "--quick", "--out", str(OUT / "out"), "--work", str(OUT / "work")]
DEADLINE_S = 900  # at nice 10 beside the suite (alone: ~1.5 min)


def lane_jobs() -> dict[str, tuple[list[str], float]]:
    return {"relay_quick": (CMD, DEADLINE_S)}


def test_the_quick_pilot_writes_each_conditions_items_and_a_gate_that_reads_them():
    summary = lane.result("relay_quick")
    assert summary["operations"] == 1 and summary["items"] == 8, summary
    pilot = json.loads((OUT / "out" / "pilot.json").read_text())
    items = {name: read_items(OUT / "out" / f"{name}.items.jsonl.gz") for name in CONDITIONS}
    assert [r["id"] for r in items["team"]] == [f"story_sum/eval/{i}" for i in range(8)]
    for name, recs in items.items():
        assert [r["id"] for r in recs] == [r["id"] for r in items["team"]]
        assert pilot["accuracy"][name] == round(sum(r["reward"] for r in recs) / 8, 4)
        assert pilot["evaluations"][name]["overrides"][: len(CONDITIONS[name])] == CONDITIONS[name]
    assert pilot["gate"] == gate(items["single"], items["team"])
    assert "sampling.max_tokens=48" in pilot["evaluations"]["single"]["overrides"]  # 2 calls of 24
    assert all(r["tokens"] <= 48 for r in items["single"]) and all(r["tokens"] <= 48 for r in items["team"])
    assert all(set(r["tokens_by_role"]) <= {"reader"} for r in items["oracle"])
    second = subprocess.run([sys.executable, *CMD], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0 and second.stdout.count("evaluated already") == 3, second.stdout[-2000:]
    assert json.loads((OUT / "out" / "pilot.json").read_text()) == pilot
