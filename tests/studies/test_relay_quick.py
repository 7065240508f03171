"""studies/relay/pilot.py, the relay experiment's pilot gate. The published pilots (docs/results/relay_pilot/
ops1 and ops2) are recomputed from their committed per-item files, every evaluation reused: the
script must give their committed pilot.json again. One condition is evaluated fresh on the tiny
model (scripts/evaluate.py, 8 stories; in the background lane), as the pilot ran each: its items
and meta are what the gate reads, and a second call reuses them. (Each evaluation is an engine and
a worker of its own, ~20 CPU-s: the other two conditions differ from this one only in overrides.)
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from studies.items import read_items
from studies.relay.pilot import CONDITIONS, QUICK, ROOT, gate, main, run_condition
from tests import lane
from trainer.config import compose

pytestmark = pytest.mark.studies  # make test-studies, not make test (each test has its tier below)

PILOTS = ROOT / "docs" / "results" / "relay_pilot"


@pytest.mark.unit
@pytest.mark.parametrize("ops", [1, 2])
def test_a_published_pilot_is_what_the_script_makes_of_its_items(ops, tmp_path, capsys):
    published = PILOTS / f"ops{ops}"
    out = tmp_path / "out"
    out.mkdir()
    for name in CONDITIONS:
        for suffix in (".items.jsonl.gz", ".meta.json"):
            shutil.copy(published / f"{name}{suffix}", out)
    main(["--operations", str(ops), "--out", str(out), "--work", str(tmp_path / "work")])
    assert capsys.readouterr().out.count("evaluated already") == 3  # nothing evaluated again
    pilot = json.loads((out / "pilot.json").read_text())
    assert pilot == json.loads((published / "pilot.json").read_text())
    items = {name: read_items(out / f"{name}.items.jsonl.gz") for name in CONDITIONS}
    assert pilot["gate"] == gate(items["single"], items["team"]) and pilot["items"] == len(items["team"])
    for name, recs in items.items():  # the same stories in the same order, each condition its overrides
        assert [r["id"] for r in recs] == [r["id"] for r in items["team"]], name
        assert pilot["evaluations"][name]["overrides"][: len(CONDITIONS[name])] == CONDITIONS[name]
    team_max = compose("train", CONDITIONS["team"]).sampling.max_tokens  # the single agent gets the team's calls
    assert f"sampling.max_tokens={(ops + 1) * team_max}" in pilot["evaluations"]["single"]["overrides"]
    assert all(set(r["tokens_by_role"]) <= {"reader"} for r in items["oracle"])  # exact arithmetic: no calculator


OUT = Path(tempfile.gettempdir()) / f"tracerl-relay-condition-{os.getpid()}"
OVERRIDES = [*CONDITIONS["team"], "task.params.operations=1", *QUICK]
LANE_TESTS = {"test_a_condition_evaluated_fresh_writes_the_items_the_gate_reads": "relay_condition"}


def lane_jobs() -> dict[str, lane.Job]:
    code = f"from tests.studies.test_relay_quick import fresh_condition; fresh_condition({str(OUT)!r})"
    return {"relay_condition": lane.Job(["-c", code], 900)}


def fresh_condition(out: str) -> None:
    """The lane's job: the team condition evaluated, then asked for again; a JSON line of both."""
    out_dir, work = Path(out) / "out", Path(out) / "work"
    for d in (out_dir, work):  # as main makes them
        d.mkdir(parents=True)
    first = run_condition("team", OVERRIDES, out_dir, work, timeout_s=600)
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        again = run_condition("team", OVERRIDES, out_dir, work, timeout_s=600)
    print(json.dumps({"items": first, "again": again, "said": said.getvalue()}))


@pytest.mark.e2e
def test_a_condition_evaluated_fresh_writes_the_items_the_gate_reads():
    """The background lane's job (fresh_condition): scripts/evaluate.py on the team condition, then
    the same call again."""
    try:
        r = lane.result("relay_condition")
        recs = r["items"]
        assert [x["id"] for x in recs] == [f"story_sum/eval/{i}" for i in range(8)]
        assert all(set(x["tokens_by_role"]) <= {"reader", "calculator"} and "reward" in x for x in recs), recs[0]
        meta = json.loads((OUT / "out" / "team.meta.json").read_text())
        assert meta["overrides"] == OVERRIDES and len(meta["commit"]) == 40 and meta["wall_s"] > 0
        assert read_items(OUT / "out" / "team.items.jsonl.gz") == recs
        assert r["again"] == recs and "evaluated already" in r["said"]
    finally:
        shutil.rmtree(OUT, ignore_errors=True)
