"""Game positions as tasks (harnesses/tasks/games.py), the selfplay harness playing them
(harnesses/programs/selfplay.py), and the issue-31 self-play presets (conf/experiment/study_selfplay*.yaml)."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import re

import pytest

from harnesses.base import as_result, normalize_question
from harnesses.programs.selfplay import parse_move, selfplay
from harnesses.tasks.games import DEFAULT_PARAMS, NimPosition, NimPositions
from rollout.config import make_task_source
from trainer.checks import validate
from trainer.config import compose

PRESETS = ("study_selfplay", "study_selfplay_no_role_baseline")


# ---- NimPositions ------------------------------------------------------------------------------


@pytest.mark.unit
def test_positions_are_deterministic_and_pickle():
    a, b = NimPositions("nim", eval_size=32), NimPositions("nim", eval_size=32)
    assert [t.question for t in a.eval_tasks()] == [t.question for t in b.eval_tasks()]
    assert [a.train_task(i) for i in range(50)] == [b.train_task(i) for i in range(50)]
    assert NimPositions("nim", eval_size=32, seed=1).train_task(0) != NimPositions("nim", eval_size=32).train_task(0)
    task = a.train_task(3)
    assert pickle.loads(pickle.dumps(task)) == task
    assert task.question == f"Nim: {task.stones} stones, take 1 to {task.max_take} per move"
    assert task.answer is None and task.score(str(task.stones % (task.max_take + 1))) == 0.0


@pytest.mark.unit
def test_positions_cover_the_params_range():
    src = NimPositions("nim", eval_size=0)
    tasks = [src.train_task(i) for i in range(2000)]
    assert {t.stones for t in tasks} == set(range(DEFAULT_PARAMS["min_stones"], DEFAULT_PARAMS["max_stones"] + 1))
    assert {t.max_take for t in tasks} == set(range(DEFAULT_PARAMS["min_take"], DEFAULT_PARAMS["max_take"] + 1))


@pytest.mark.unit
def test_held_out_positions_are_distinct_and_never_trained_on():
    src = NimPositions("nim", eval_size=32)
    held_out = [(t.stones, t.max_take) for t in src.eval_tasks()]
    assert len(set(held_out)) == len(held_out) == 32
    questions = {normalize_question(t.question) for t in src.eval_tasks()}
    trained = {(t.stones, t.max_take) for t in map(src.train_task, range(5000))}
    assert not trained & set(held_out)
    assert len(trained) == 108 - 32, "every other position is trained on"
    assert all(normalize_question(src.train_task(i).question) not in questions for i in range(5000))


@pytest.mark.unit
def test_a_space_too_small_for_the_held_out_set_fails_naming_the_fix():
    small = {"min_stones": 5, "max_stones": 12, "min_take": 3, "max_take": 3}  # 8 positions
    with pytest.raises(ValueError, match=r"8 positions, and task.eval_size=8 holds out all of them; lower"):
        NimPositions("nim", small, eval_size=8)
    assert len(NimPositions("nim", small, eval_size=7).eval_tasks()) == 7
    with pytest.raises(ValueError, match="20 positions, and task.eval_size=24 holds out all of them"):
        validate(compose("train", ["experiment=study_selfplay", "task.params.max_stones=9"]))


@pytest.mark.unit
@pytest.mark.parametrize(
    "params, msg",
    [
        ({"max_stonez": 9}, "task.params.max_stonez is not a nim parameter"),
        ({"min_stones": 9, "max_stones": 5}, "need 1 <= min_stones <= max_stones, got 9 and 5"),
        ({"min_take": 0}, "need 1 <= min_take <= max_take, got 0 and 4"),
    ],
)
def test_bad_params_fail_naming_the_key(params, msg):
    with pytest.raises(ValueError, match=msg):
        NimPositions("nim", params, eval_size=4)


@pytest.mark.unit
def test_task_yaml_lists_the_default_params():
    """conf/task/nim.yaml lists every param (so `task.params.<key>=` overrides work) at its default."""
    cfg = compose("train", ["task=nim"])
    assert cfg.task.params == DEFAULT_PARAMS
    assert isinstance(make_task_source(cfg.task, cfg.seed), NimPositions)


# ---- the selfplay harness on a position --------------------------------------------------------


class Player:
    """A scripted stand-in for an agent (the harness sees only `conversation` and `reply`): it plays
    `strategy(stones, max_take)` and keeps what it was told."""

    def __init__(self, strategy):
        self.strategy, self.systems, self.asks = strategy, [], []

    def conversation(self, system=None):
        self.systems.append(system)
        return self

    async def reply(self, content):
        self.asks.append(content)
        stones = int(re.search(r"There are (\d+) stones left", content).group(1))
        max_take = int(re.search(r"from 1 to (\d+)", content).group(1))
        return str(self.strategy(stones, max_take))


def perfect(stones, max_take):
    return stones % (max_take + 1) or 1  # leave a multiple of max_take + 1; else stall


def play(task, a=perfect, b=perfect, **options):
    agents = {"player_a": Player(a), "player_b": Player(b)}
    return as_result(asyncio.run(selfplay(task, agents, **options))), agents


@pytest.mark.unit
def test_selfplay_plays_the_tasks_position_and_perfect_play_wins_where_it_should():
    src = NimPositions("nim", eval_size=32)
    for task in src.eval_tasks():
        result, agents = play(task)
        info = result.info
        assert (info["stones"], info["max_take"]) == (task.stones, task.max_take)
        assert info["first_player_wins"] == (task.stones % (task.max_take + 1) != 0)
        assert info["winner"] == ("player_a" if info["first_player_wins"] else "player_b"), task.question
        assert not info["forfeit"] and result.agent_rewards[info["winner"]] == 1.0 and result.reward == 0.0
        assert f"There are {task.stones} stones" in agents["player_a"].systems[0]
        assert f"1 to {task.max_take} stones" in agents["player_b"].systems[0]
        assert agents["player_a"].asks[0].startswith(f"There are {task.stones} stones left.")


@pytest.mark.unit
def test_selfplay_forfeits_an_illegal_move_of_the_tasks_limit():
    task = NimPosition("nim/train/0", "Nim: 20 stones, take 1 to 2 per move", "", stones=20, max_take=2)
    result, _ = play(task, a=lambda s, k: 3)  # legal under the old fixed limit of 3, not here
    assert (result.info["moves"], result.info["winner"], result.info["forfeit"]) == (1, "player_b", True)
    assert result.agent_rewards == {"player_a": -1.0}


@pytest.mark.unit
def test_selfplay_without_a_position_seeds_the_pile_from_the_task_id():
    @dataclasses.dataclass
    class Plain:
        id: str

    piles = set()
    for i in range(40):
        result, _ = play(Plain(f"chain_sum/train/{i}"))
        assert result.info["max_take"] == 3 and 5 <= result.info["stones"] <= 15
        piles.add(result.info["stones"])
    assert len(piles) > 5
    assert play(Plain("x"), min_stones=30, max_stones=30)[0].info["stones"] == 30


@pytest.mark.unit
@pytest.mark.parametrize(
    "reply, stones, max_take, move",
    [("4", 9, 4, 4), ("4", 9, 3, None), ("I take 2", 9, 2, 2), ("3", 2, 4, None), ("1", 1, 2, 1), ("0", 5, 4, None)],
)
def test_parse_move_with_max_take(reply, stones, max_take, move):
    assert parse_move(reply, stones, max_take) == move


@pytest.mark.unit
def test_a_move_of_thousands_of_digits_forfeits():
    """rewards review #15: a reply of 4,401 digits raised ValueError in int() (Python's 4,300-digit
    limit), so the trace failed and the player who wrote it escaped its -1."""
    huge = "0" * 4400 + "1"
    assert parse_move(huge, 5, 3) is None and parse_move(f"I take 2, not {huge}", 5, 3) == 2
    task = NimPosition("nim/train/0", "Nim: 20 stones, take 1 to 3 per move", "", stones=20, max_take=3)
    result, _ = play(task, a=lambda s, k: huge)
    assert (result.info["winner"], result.info["forfeit"]) == ("player_b", True)
    assert result.agent_rewards == {"player_a": -1.0}


@pytest.mark.integration
def test_selfplay_on_a_nim_position_against_the_engine(run_harness):
    task = NimPositions("nim", eval_size=4).eval_tasks()[0]
    _, seqs, result = run_harness("harnesses.programs.selfplay.selfplay", ["player_a", "player_b"], task=task)
    assert len(seqs) == result.info["moves"] >= 1
    assert (result.info["stones"], result.info["max_take"]) == (task.stones, task.max_take)


# ---- the issue-31 presets ----------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("preset", PRESETS)
def test_selfplay_presets_are_one_policy_on_both_seats_with_per_agent_rewards(preset):
    cfg = compose("train", [f"experiment={preset}"])
    validate(cfg)
    assert cfg.model.name == "smollm2_135m" and cfg.harness.name == "selfplay" and cfg.task.name == "nim"
    assert set(cfg.agents.values()) == {"main"} and cfg.trainable_policies() == ["main"]
    adv = cfg.algorithm.advantage
    assert adv.per_agent_rewards and not adv.normalize_per_agent
    assert adv.role_baseline == (preset == "study_selfplay")
    assert cfg.task.eval_size == cfg.eval.size == 24  # held out unseen: tests/studies/test_team_study.py
    # a game takes at most a move per stone: no game of the preset's piles is cut at max_moves
    assert cfg.task.params["max_stones"] <= cfg.harness.options["max_moves"]
