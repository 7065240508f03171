"""scripts/team_study.py on the tiny model (`--quick`: 2 steps of 2 groups of 4, 8 held-out
items, one seed), so that the presets and the script cannot rot: one arm per code path trains
(QUICK_ARMS; the arms left out differ from one of them only in the advantage's flags, which
tests/trainer/test_advantages.py covers, and every arm's preset composes and validates in
tests/scripts/test_team_study.py), each kind of extra evaluation runs (roles' weights swapped, the
majority vote, the seats of a game), and the table, its JSON and the curves are written. Not a
learning result: the numbers are the tiny model's. The run goes in the background lane
(tests/lane.py) from the session's start.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from scripts.team_study import ARMS
from tests import lane

pytestmark = pytest.mark.e2e

OUT = Path(tempfile.gettempdir()) / f"tracerl-team-study-quick-{os.getpid()}"
DEADLINE_S = 1200  # at nice 10 beside the suite (alone: ~4 min)
# one arm per code path: team_shared and credit_global are credit_per_agent's run with other
# advantage flags, selfplay is selfplay_no_role_baseline's (named as an arm: `selfplay` alone is
# the question, both self-play arms)
QUICK_ARMS = ("team_lora", "team_full", "single_agent", "credit_per_agent", "selfplay_no_role_baseline")
SELFPLAY = QUICK_ARMS[-1]


def lane_jobs() -> dict[str, tuple[list[str], float]]:
    args = ["scripts/team_study.py", "--quick", "--seeds", "1", "--arms", ",".join(QUICK_ARMS), "--out", str(OUT)]
    return {"team_study": (args, DEADLINE_S)}


def test_every_arm_trains_and_reaches_the_table():
    try:
        summary = lane.result("team_study")
        assert summary["arms"] == list(QUICK_ARMS) and summary["runs"] == len(QUICK_ARMS), summary
        assert not summary["failed"] and set(QUICK_ARMS) < set(ARMS), summary
        rows = {r["arm"]: r for r in json.loads((OUT / "team_study.json").read_text())}
        assert set(rows) == set(QUICK_ARMS)
        for name, r in rows.items():
            assert r["seed"] == 1 and r["wall_s"] > 0, r
            assert r["generated_tokens"] > 0 and r["trained_tokens"] >= 0, r
            assert len(r["curve"]) == 2 and r["paired"]["questions"] > 0, r
            if ARMS[name].question != "selfplay":
                assert 0 <= r["before"] <= 1 and 0 <= r["after"] <= 1, r
        # each role's own reward where the harness gives one (verdicts; the players of a game)
        assert set(rows["credit_per_agent"]["roles"]) == {"solver", "verifier"}, rows["credit_per_agent"]
        for name in ("team_lora", "team_full"):  # the roles' weights swapped, on the same questions
            swap = rows[name]["swap"]
            assert swap["vs_run_final"]["questions"] == rows[name]["paired"]["questions"], swap
            assert set(swap["roles"]) == {"solver", "verifier"}, swap
        vote = rows["single_agent"]["vote"]  # 3 samples a question: more tokens than one greedy answer
        assert vote["generated_tokens_per_item"] > rows["single_agent"]["eval_generated_tokens_per_item"], vote
        assert 0 <= vote["untrained_reward"] <= 1 and vote["paired"]["questions"] > 0, vote
        for name in ("team_lora", "team_full", "credit_per_agent"):
            assert rows[name]["vs_single"]["questions"] > 0 and "vs_vote" in rows[name], name
        for seat in ("player_a", "player_b"):  # both seats against the untrained model
            # (the tiny model's player_a may forfeit before b moves)
            assert seat in rows[SELFPLAY] and "player_a" in rows[SELFPLAY][seat]["forfeits"], rows[SELFPLAY]
        assert rows[SELFPLAY]["player_a"]["paired_roles"]["player_a"]["questions"] > 0, rows[SELFPLAY]
        games = rows[SELFPLAY]["games"]  # the held-out games in short, before and after
        assert games["before"]["games"] == games["after"]["games"] == rows[SELFPLAY]["paired"]["questions"], games
        assert 0 <= games["after"]["forfeits"] <= 1 and games["after"]["moves"] >= 1, games
        table = (OUT / "team_study.md").read_text()
        assert all((f"| {name} | 1 |" in table) == (name in QUICK_ARMS) for name in ARMS), table
        assert "games lost by an illegal move" in table, table
        assert (OUT / "curves.png").stat().st_size > 1000
    finally:
        shutil.rmtree(OUT, ignore_errors=True)
