"""python -m studies.relay --quick: the relay experiment's main-run pipeline end to end on the tiny
model (one seed, the three arms trained 2 steps with an evaluation after each, the four controls on
their weights, 8 stories, the analysis), as the main runs will go. Its first call (three train.py
runs and four evaluate.py runs, each its own Ray: ~10 min on a loaded 2-core box) runs in the
background lane (tests/lane.py) from the session's start; the test checks what it wrote, and that a
second call keeps every run and control. Not a learning result: the numbers are the tiny model's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from studies.contrasts import accuracy
from studies.items import read_items
from studies.relay.controls import CONTROLS, vote_k
from studies.relay.runs import ARMS, QUICK, Run
from studies.study import ROOT
from tests import lane
from trainer import checkpoint

pytestmark = [pytest.mark.e2e, pytest.mark.studies]  # the tier; `studies`: make test-studies, not make test

OUT = Path(tempfile.gettempdir()).resolve() / f"tracerl-relay-runs-quick-{os.getpid()}"
CMD = ["-m", "studies.relay", "all", "--quick", "--out", str(OUT / "runs"), "--results", str(OUT / "results")]
DEADLINE_S = 2400  # at nice 10 beside the suite (alone, on a 2-core box shared with 3 others: ~15 min)
IDS = [f"story_sum/eval/{i}" for i in range(8)]


LANE_TESTS = {"test_the_quick_pipeline_trains_each_arm_runs_each_control_and_analyzes_them": "relay_runs_quick"}


def lane_jobs() -> dict[str, lane.Job]:
    return {"relay_runs_quick": lane.Job(CMD, DEADLINE_S)}


def check_run(arm: str) -> tuple[list[dict], dict]:
    """A trained arm's per-item files agree with its run dir; its last evaluation's items."""
    run = Run(arm, 1, OUT / "runs", OUT / "results", quick=True)
    status = json.loads((run.docs / "status.json").read_text())
    assert status["state"] == "finished" and status["attempts"][-1]["outcome"] == "finished", status
    assert status["overrides"] == run.overrides() and f"run_dir={run.dir}" in run.overrides()
    summary = json.loads((run.dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run.dir / "metrics.jsonl").read_text().splitlines()]
    steps = {}
    for step in (0, 1, 2):
        steps[step] = read_items(run.docs / f"step_{step}.items.jsonl.gz")
        meta = json.loads((run.docs / f"step_{step}.meta.json").read_text())
        assert [r["id"] for r in steps[step]] == IDS and meta["step"] == step and meta["steps"] == 2, meta
        assert meta["commit"] == status["attempts"][-1]["commit"] and meta["overrides"] == run.overrides()
        trained = [r for r in rows if "rollout/generated_tokens" in r and r["step"] <= step]
        assert meta["generated_tokens"] == sum(r["rollout/generated_tokens"] for r in trained)
        assert (meta["generated_tokens"] > 0) == (step > 0) and len(trained) == step
    # the files hold the run's own evaluations: the accuracies its summary gives
    assert (accuracy(steps[0]), accuracy(steps[2])) == (summary["initial_eval_reward"], summary["final_eval_reward"])
    return steps[2], status


def test_the_quick_pipeline_trains_each_arm_runs_each_control_and_analyzes_them():
    summary = lane.result("relay_runs_quick")
    assert summary["error"] is None and summary["runs"] == {f"{a}/seed1": "finished" for a in ARMS.values()}
    assert summary["controls"] == {f"{c}/seed1": "done" for c in CONTROLS}, summary
    finals = {arm: check_run(arm)[0] for arm in ARMS.values()}
    for arm in ARMS.values():  # every control evaluated: each run keeps its last checkpoint only
        run_dir = Run(arm, 1, OUT / "runs", OUT / "results", quick=True).dir
        assert [d.name for d in checkpoint.complete(run_dir)] == ["step_000002"], arm
    assert all(r["tokens"] <= 48 for r in finals["single_agent"]) and "expression" in finals["team_lora"][0]
    controls = OUT / "results" / "controls" / "seed1"
    items = {name: read_items(controls / f"{name}.items.jsonl.gz") for name in CONTROLS}
    metas = {name: json.loads((controls / f"{name}.meta.json").read_text()) for name in CONTROLS}
    for name, (arm, overrides) in CONTROLS.items():
        assert [r["id"] for r in items[name]] == IDS, name
        assert (
            metas[name]["overrides"][: len(overrides)] == overrides and metas[name]["overrides"][-len(QUICK) :] == QUICK
        )
        assert metas[name]["model"] == str(OUT / "runs" / arm / "seed1") and metas[name]["checkpoint"] == "step_000002"
    k_rule = vote_k(finals["team_lora"], finals["single_agent"])[0]
    assert (metas["vote"]["k_rule"], metas["vote"]["k"]) == (k_rule, max(k_rule, 2))
    assert f"harness.options.k={metas['vote']['k']}" in metas["vote"]["overrides"]
    assert all(
        len(r["answers"]) == metas["vote"]["k"] and r["tokens"] <= 48 * metas["vote"]["k"] for r in items["vote"]
    )
    assert all(set(r["tokens_by_role"]) <= {"reader"} for r in items["oracle"])  # exact arithmetic: no calculator
    assert all("expression" in r for name in ("transplant", "swap") for r in items[name])
    analysis = json.loads((OUT / "results" / "analysis.json").read_text())
    assert analysis["seeds"]["in"] == [1] and not analysis["verdict"]["final"]
    assert (
        analysis["verdict"]["text"].startswith("pending: 1 of 8") and summary["verdict"] == analysis["verdict"]["text"]
    )
    c_a = analysis["primary"]["C_vs_A"]
    assert c_a["p"] is None and c_a["mean_points"] == round(
        100 * (accuracy(finals["team_lora"]) - accuracy(finals["single_agent"])), 3
    )
    assert (OUT / "results" / "analysis.md").read_text().count("| team_lora | ") >= 3  # steps 0, 1, 2
    attempts = {arm: check_run(arm)[1]["attempts"] for arm in ARMS.values()}
    second = subprocess.run([sys.executable, *CMD], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert second.stdout.count("finished already") == 3 and second.stdout.count("evaluated already") == 4
    assert {arm: check_run(arm)[1]["attempts"] for arm in ARMS.values()} == attempts  # nothing ran again
