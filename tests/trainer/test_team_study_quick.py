"""Every arm of scripts/team_study.py on the tiny model (`--quick`: 2 steps of 2 groups of 4, 8
held-out items, one seed), so that the presets and the script cannot rot: each arm trains, each
kind of extra evaluation runs (roles' weights swapped, the majority vote, the seats of a game;
once per code path, QUICK_NO_EXTRAS), and the table, its JSON and the curves are written. Not a
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

from scripts.team_study import ARMS, QUICK_NO_EXTRAS
from tests import lane

pytestmark = pytest.mark.e2e

OUT = Path(tempfile.gettempdir()) / f"tracerl-team-study-quick-{os.getpid()}"
DEADLINE_S = 1500  # at nice 10 beside the suite (alone: ~6 min)


def lane_jobs() -> dict[str, tuple[list[str], float]]:
    return {"team_study": (["scripts/team_study.py", "--quick", "--seeds", "1", "--out", str(OUT)], DEADLINE_S)}


def test_every_arm_trains_and_reaches_the_table():
    try:
        summary = lane.result("team_study")
        assert summary["arms"] == list(ARMS) and summary["runs"] == len(ARMS) and not summary["failed"], summary
        rows = {r["arm"]: r for r in json.loads((OUT / "team_study.json").read_text())}
        assert set(rows) == set(ARMS)
        for name, r in rows.items():
            assert r["seed"] == 1 and r["wall_s"] > 0, r
            assert r["generated_tokens"] > 0 and r["trained_tokens"] >= 0, r
            assert len(r["curve"]) == 2 and r["paired"]["questions"] > 0, r
            if ARMS[name].question != "selfplay":
                assert 0 <= r["before"] <= 1 and 0 <= r["after"] <= 1, r
        # each role's own reward where the harness gives one (verdicts; the players of a game)
        for name in ("credit_global", "credit_per_agent", "team_shared"):
            assert set(rows[name]["roles"]) == {"solver", "verifier"}, rows[name]
        for name in ("team_lora", "team_full"):  # the roles' weights swapped, on the same questions
            swap = rows[name]["swap"]
            assert swap["vs_run_final"]["questions"] == rows[name]["paired"]["questions"], swap
            assert set(swap["roles"]) == {"solver", "verifier"}, swap
        vote = rows["single_agent"]["vote"]  # 3 samples a question: more tokens than one greedy answer
        assert vote["generated_tokens_per_item"] > rows["single_agent"]["eval_generated_tokens_per_item"], vote
        assert 0 <= vote["untrained_reward"] <= 1 and vote["paired"]["questions"] > 0, vote
        for name in ("team_shared", "team_lora", "team_full", "credit_global", "credit_per_agent"):
            assert rows[name]["vs_single"]["questions"] > 0 and "vs_vote" in rows[name], name
        for seat in ("player_a", "player_b"):  # both seats against the untrained model
            # (the tiny model's player_a may forfeit before b moves)
            assert seat in rows["selfplay"] and "player_a" in rows["selfplay"][seat]["forfeits"], rows["selfplay"]
        assert rows["selfplay"]["player_a"]["paired_roles"]["player_a"]["questions"] > 0, rows["selfplay"]
        for name in ("selfplay", "selfplay_no_role_baseline"):  # the held-out games in short, before and after
            games = rows[name]["games"]
            assert games["before"]["games"] == games["after"]["games"] == rows[name]["paired"]["questions"], games
            assert 0 <= games["after"]["forfeits"] <= 1 and games["after"]["moves"] >= 1, games
        assert not any(key in rows[name] for name in QUICK_NO_EXTRAS for key in ("player_a", "player_b", "swap"))
        table = (OUT / "team_study.md").read_text()
        assert all(f"| {name} | 1 |" in table for name in ARMS), table
        assert "games lost by an illegal move" in table, table
        assert (OUT / "curves.png").stat().st_size > 1000
    finally:
        shutil.rmtree(OUT, ignore_errors=True)
