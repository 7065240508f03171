"""python -m studies.team on the tiny model (`--quick`: 2 steps of 2 groups of 4, 8 held-out
items, one seed), so that the presets and the script cannot rot: one arm per kind of run trains
(QUICK_ARMS: a team of two adapters, the single agent, self-play; the arms left out differ from one
of them only in the preset's overrides (team_full: full weights, which tests/trainer/test_policies.py
trains; team_shared and the credit arms: the advantage's flags, which tests/trainer/test_advantages.py
covers), every arm's preset composes and validates in tests/studies/test_team_study.py, and the
script treats every arm and every swap alike: each one more costs a run's start, ~40 CPU-s), each
kind of control runs (the single agent transplanted into the team, its vote matched in tokens
(--quick: 2 samples), roles' weights swapped, the seats of a game), every evaluation's per-item
files are written, and the analysis read from them (contrasts over seeds, run-vs-run sign tests
with Holm, each team evaluation's revision, verdict confusion matrix, missing verdicts and
truncation) reaches the table, its JSON and the curves. Not a learning result: the numbers are the
tiny model's. The run goes in the background lane (tests/lane.py) from the session's start.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from studies.items import read_condition
from studies.team.arms import ARMS, run_seed
from tests import lane

pytestmark = [pytest.mark.e2e, pytest.mark.studies]  # the tier; `studies`: make test-studies, not make test

OUT = Path(tempfile.gettempdir()) / f"tracerl-team-study-quick-{os.getpid()}"
# at nice 10 beside the suite (alone: ~4 min; 600 s in the lane with other sessions' jobs on the box, 2026-12-06).
# The controls cost less than before the per-item rewrite: the seats and the vote no longer evaluate the
# untrained model again, which pays for the transplant (those evaluate.py calls: 112 s -> 86 s, load < 5)
DEADLINE_S = 1200
# one arm per kind of run: the other team arms are team_lora's run with other preset overrides,
# selfplay is selfplay_no_role_baseline's (named as an arm: `selfplay` alone is the question, both
# self-play arms)
QUICK_ARMS = ("team_lora", "single_agent", "selfplay_no_role_baseline")
SELFPLAY = QUICK_ARMS[-1]


LANE_TESTS = {"test_every_arm_trains_the_controls_run_and_the_analysis_reads_the_per_item_files": "team_study"}


def lane_jobs() -> dict[str, lane.Job]:
    args = ["-m", "studies.team", "--quick", "--seeds", "1", "--arms", ",".join(QUICK_ARMS), "--out", str(OUT)]
    return {"team_study": lane.Job(args, DEADLINE_S)}


TEAM = ("team_lora",)  # the quick arm compared with the single agent
ITEMS = 8  # eval.size of --quick


def check_files(results: Path) -> None:
    """Every evaluation's per-item files: each run's at steps 0 and 2, each control's."""
    for arm in QUICK_ARMS:
        for step in (0, 2):
            recs, meta = read_condition(results / arm / "seed1", f"step_{step}")
            assert len(recs) == ITEMS and meta["run_seed"] == run_seed(1, ARMS[arm].preset), meta
            assert all(("draft_score" in r) == ARMS[arm].team or r["failed"] for r in recs), arm
    controls = results / "controls" / "seed1"
    for name in ("transplant", "vote_k2", "team_lora_swap"):
        recs, meta = read_condition(controls, name)
        assert len(recs) == ITEMS and meta["seed"] == 1, name
    assert all("votes" in r for r in read_condition(controls, "vote_k2")[0])
    for seat in ("player_a", "player_b"):
        name = f"{SELFPLAY}_as_{seat}"
        assert all("game" in r or r["failed"] for r in read_condition(controls, name)[0]), name
    matched = json.loads((controls / "matched_votes.json").read_text())
    assert set(matched) == set(TEAM), matched
    for m in matched.values():  # --quick votes over 2 samples; the rule's k from the tokens is beside it
        assert m["k"] == 2 and m["condition"] == "controls/vote_k2" and m["tokens_team"] > 0, m
        assert m["k_rule"] >= 1 and abs(m["k_rule"] - m["tokens_team"] / m["tokens_single"]) <= 0.501, m


def check_analysis(a: dict) -> None:
    fam = a["team_vs_controls"]  # one seed: no test over seeds, a CI over items; per seed, run vs run
    assert set(fam) == {f"{arm}_vs_{c}" for arm in TEAM for c in ("single_agent", "vote", "transplant")}, fam
    for name, c in fam.items():
        assert c["seeds"] == [1] and c["p"] is None and c["ci_points"][0] <= c["mean_points"] <= c["ci_points"][1]
        t = c["run_vs_run"]["1"]
        assert t["better"] + t["worse"] <= ITEMS and t["p"] <= t["p_holm"] <= 1, (name, t)
    assert {"transplant_vs_single_agent", "team_lora_swap_vs_team_lora"} <= set(a["secondary"])
    assert a["harness_untrained"]["untrained_team_vs_untrained_single_agent"]["seeds"] == [1], a["harness_untrained"]
    evals = {(e["condition"], e["step"]): e for e in a["team_evals"]}
    expected = {(arm, step) for arm in TEAM for step in (0, 2)}
    expected |= {("transplant", None), ("team_lora_swap", None)}
    assert set(evals) == expected, sorted(evals, key=str)
    for e in evals.values():  # the confusion matrix holds every evaluated item once
        assert sum(n for d in e["confusion"].values() for n in d.values()) == e["items"] == ITEMS - e["failed"], e
        assert e["fixes"] + e["breaks"] <= e["changed"] <= e["items"], e
        missing = sum(d["none"] for d in e["confusion"].values())
        assert e["missing_verdict"] == round(missing / e["items"], 4) and 0 <= e["truncated"] <= 1, e
        right = sum(e["confusion"]["right"].values())
        assert e["draft"] == round(right / e["items"], 4) and e["best_constant"] >= 0.5, e


def test_every_arm_trains_the_controls_run_and_the_analysis_reads_the_per_item_files():
    try:
        summary = lane.result("team_study")
        assert summary["arms"] == list(QUICK_ARMS) and summary["runs"] == len(QUICK_ARMS), summary
        assert not summary["failed"] and set(QUICK_ARMS) < set(ARMS), summary
        assert set(summary["controls"].values()) == {"done"} and len(summary["controls"]) == 5, summary
        rows = {r["arm"]: r for r in json.loads((OUT / "team_study.json").read_text())["runs"]}
        assert set(rows) == set(QUICK_ARMS)
        for name, r in rows.items():
            assert r["seed"] == 1 and r["run_seed"] == run_seed(1, ARMS[name].preset) and r["wall_s"] > 0, r
            assert r["generated_tokens"] > 0 and r["trained_tokens"] >= 0, r
            assert len(r["curve"]) == 2 and r["paired"]["questions"] > 0, r
            if ARMS[name].question != "selfplay":
                assert 0 <= r["before"] <= 1 and 0 <= r["after"] <= 1, r
        for seat in ("player_a", "player_b"):  # both seats against the untrained model
            # (the tiny model's player_a may forfeit before b moves)
            assert seat in rows[SELFPLAY] and "player_a" in rows[SELFPLAY][seat]["forfeits"], rows[SELFPLAY]
        assert rows[SELFPLAY]["player_a"]["paired_roles"]["player_a"]["questions"] > 0, rows[SELFPLAY]
        games = rows[SELFPLAY]["games"]  # the held-out games in short, before and after
        assert games["before"]["games"] == games["after"]["games"] == rows[SELFPLAY]["paired"]["questions"], games
        assert 0 <= games["after"]["forfeits"] <= 1 and games["after"]["moves"] >= 1, games
        check_files(Path(summary["results"]))
        check_analysis(json.loads((OUT / "team_study.json").read_text())["analysis"])
        table = (OUT / "team_study.md").read_text()
        assert all((f"| {name} | 1 (" in table) == (name in QUICK_ARMS) for name in ARMS), table
        for words in ("run vs run", "Holm", "Every team evaluation", "games lost by an illegal move"):
            assert words in table, words
        assert (OUT / "curves.png").stat().st_size > 1000
    finally:
        shutil.rmtree(OUT, ignore_errors=True)
