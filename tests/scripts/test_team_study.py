"""The team study's presets (conf/experiment/study_*.yaml) and scripts/team_study.py's own logic.

Each preset composes and validates, changes from its reference exactly what its arm is about, and
holds out questions no training draw repeats. The arms themselves run on the tiny model in
tests/trainer/test_team_study_quick.py.
"""

from __future__ import annotations

import dataclasses

import pytest

from harnesses.base import normalize_question
from harnesses.programs.solver_verifier import SOLVER_SYSTEM
from rollout.config import make_task_source
from rollout.trace import Trace
from scripts.team_study import ARMS, QUICK, game_stats, grad_spikes, pick_arms
from trainer.checks import validate
from trainer.config import compose

pytestmark = pytest.mark.unit


def flat(cfg, prefix: str = "") -> dict:
    """A config as {dotted key: value}."""
    out = {}
    for k, v in (dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else cfg).items():
        if isinstance(v, dict):  # an empty one adds no key
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def changed(arm: str, reference: str = "team_shared") -> set[str]:
    a, b = (
        flat(compose("train", [f"experiment=study_{arm}"])),
        flat(compose("train", [f"experiment=study_{reference}"])),
    )
    return {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_each_arm_composes_validates_and_holds_out_unseen_questions(arm):
    for extra in ([], QUICK):
        cfg = compose("train", [f"experiment={ARMS[arm].preset}", "seed=2", *extra])
        validate(cfg)
        assert cfg.run_dir == f"runs/team_study/{arm}"
    source = make_task_source(cfg.task, cfg.seed)
    held_out = {normalize_question(t.question) for t in source.eval_tasks()}
    assert len(held_out) == cfg.eval.size == cfg.task.eval_size
    trained = {normalize_question(source.train_task(i).question) for i in range(3000)}
    assert not held_out & trained


def test_each_arm_changes_only_what_it_is_about():
    run_dir = {"run_dir"}
    assert changed("team_full") == run_dir | {
        "agents.verifier",
        "policies.critic.trainable",
        "policies.critic.engine.cpu_cores",
        "engine.cpu_cores",
        "learner.micro_batch_tokens",
    }
    lora = changed("team_lora")
    assert {"agents.solver", "agents.verifier", "learner.lr"} <= lora
    assert all(
        k in run_dir | {"agents.solver", "agents.verifier", "learner.lr"} or k.startswith("policies.") for k in lora
    )
    assert changed("credit_global") == run_dir | {
        "algorithm.advantage.per_agent_rewards",
        "algorithm.advantage.role_baseline",
    }
    assert changed("credit_per_agent", "credit_global") == run_dir | {
        "algorithm.advantage.role_baseline",
        "algorithm.advantage.normalize_per_agent",
    }
    assert changed("selfplay_no_role_baseline", "selfplay") == run_dir | {"algorithm.advantage.role_baseline"}
    single = changed("single_agent")
    assert single == run_dir | {
        "harness._target_",
        "harness.name",
        "harness.roles",
        "harness.options.verdicts",
        "harness.options.system",
        "agents.verifier",
        "trainer.groups_per_step",
    }


def test_the_single_agent_answers_as_the_teams_solver_with_six_times_the_traces():
    single, team = (
        compose("train", ["experiment=study_single_agent"]),
        compose("train", ["experiment=study_team_shared"]),
    )
    assert single.harness.options["system"] == SOLVER_SYSTEM
    assert single.trainer.groups_per_step == 6 * team.trainer.groups_per_step  # ~ the team's generated tokens
    assert (single.task, single.sampling, single.eval, single.trainer.steps) == (
        team.task,
        team.sampling,
        team.eval,
        team.trainer.steps,
    )


def test_arms_are_picked_by_question_or_name():
    assert [a.name for a in pick_arms("credit")] == ["credit_global", "credit_per_agent"]
    assert [a.name for a in pick_arms("team_lora,team")] == ["team_lora", "team_shared", "team_full", "single_agent"]
    assert len(pick_arms("all")) == len(ARMS)
    with pytest.raises(ValueError, match="'teams' is not all, a question"):
        pick_arms("teams")


def test_gradient_spikes_are_counted_against_the_median():
    assert grad_spikes([1.0, 1.2, 0.9, 5.0, 1.1]) == {"max": 5.0, "median": 1.1, "spikes": 1}
    assert grad_spikes([]) == {"max": None, "median": None, "spikes": 0}


def game(winner, forfeit: bool, moves: int, first_player_wins: bool, stones: int = 24) -> Trace:
    """A Nim trace's info as harnesses/programs/selfplay.py writes it (its sequences do not matter here)."""
    info = {
        "moves": moves,
        "winner": winner,
        "forfeit": forfeit,
        "first_player_wins": first_player_wins,
        "stones": stones,
    }
    return Trace(id=f"g{moves}", group="g", sequences=[], info=info)


def test_a_games_summary_counts_illegal_moves_perfect_play_winners_and_one_stone_games():
    games = [
        game("player_b", True, 1, True),  # a forfeits a won position: an illegal move, not as theory
        game("player_a", False, 5, True),  # a wins its won position
        game("player_b", False, 6, False, stones=6),  # b wins a lost-for-a position, one stone a move
        game(None, False, 24, False, stones=40),  # cut at max_moves: no winner, not as theory
    ]
    assert game_stats(games) == {"games": 4, "forfeits": 0.25, "moves": 9.0, "as_theory": 0.5, "one_a_move": 0.25}
    assert game_stats([Trace(id="q", group="q", sequences=[], info={"draft_score": 1.0})]) is None
