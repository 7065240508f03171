"""TextArena games as tasks (harnesses/tasks/textarena.py), the textarena_game harness playing them
(harnesses/programs/textarena_game.py) with scripted players and on the real engine, and its presets
(conf/harness/textarena.yaml, conf/task/textarena*.yaml, conf/experiment/textarena*.yaml)."""

from __future__ import annotations

import asyncio
import pickle
import random
import re
from types import SimpleNamespace

import pytest

from harnesses.base import as_result
from harnesses.programs.textarena_game import OUT_OF_RETRIES, game_summary, textarena_game
from harnesses.tasks.textarena import DEFAULT_PARAMS, Game, TextArenaGames, tictactoe_best_cells
from rollout.config import make_task_source
from trainer.checks import validate
from trainer.config import compose

HARNESS = "harnesses.programs.textarena_game.textarena_game"


# ---- the task source -----------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("env_id", ["TicTacToe-v0", "KuhnPoker-v0"])
def test_games_are_held_out_by_seed(env_id):
    src = TextArenaGames("textarena", {"env_id": env_id}, eval_size=32)
    held_out = [t.seed for t in src.eval_tasks()]
    assert len(set(held_out)) == 32, "held-out seeds are distinct"
    trained = [src.train_task(i) for i in range(3000)]
    assert not {t.seed for t in trained} & set(held_out), "no held-out seed is ever a training seed"
    assert {t.env_id for t in trained} == {env_id} and all(t.opening == [] for t in trained)
    again = TextArenaGames("textarena", {"env_id": env_id}, eval_size=32)
    assert [t.seed for t in again.eval_tasks()] == held_out and again.train_task(7) == src.train_task(7)
    assert TextArenaGames("textarena", {"env_id": env_id}, eval_size=32, seed=1).train_task(0) != src.train_task(0)
    task = src.train_task(3)
    assert pickle.loads(pickle.dumps(task)) == task and task.score("[4]") == 0.0 and task.answer is None


def board(opening):
    """The TicTacToe position `opening` reaches (seat 0 plays O, moving first)."""
    cells = ["."] * 9
    for i, move in enumerate(opening):
        cells[int(move.strip("[]"))] = "OX"[i % 2]
    return "".join(cells)


@pytest.mark.unit
def test_openings_are_held_out_by_position():
    src = TextArenaGames("textarena", {"opening_moves": 2}, eval_size=16)
    held_out = [tuple(t.opening) for t in src.eval_tasks()]
    assert len(set(held_out)) == 16 and all(len(o) == 2 for o in held_out)
    trained = {tuple(src.train_task(i).opening) for i in range(1000)}
    assert not trained & set(held_out)
    assert len(trained) == 72 - 16, "every other two-move opening is trained on"
    three = TextArenaGames("textarena", {"opening_moves": 3}, eval_size=32)
    boards = {board(t.opening) for t in three.eval_tasks()}
    assert len(boards) == 32, "one held-out item per position, whatever the order of its moves"
    assert not {board(three.train_task(i).opening) for i in range(1000)} & boards
    with pytest.raises(ValueError, match="only 9 distinct questions .* fewer than task.eval_size=10"):
        TextArenaGames("textarena", {"opening_moves": 1}, eval_size=10).eval_tasks()


@pytest.mark.unit
@pytest.mark.parametrize(
    "params, msg",
    [
        (
            {"env": "TicTacToe-v0"},
            r"task.params.env is not a textarena parameter; known: \['env_id', 'opening_moves'\]",
        ),
        ({"env_id": "TicTacToe-v9"}, "task.params.env_id='TicTacToe-v9' is not a TextArena environment id"),
        ({"env_id": "Chess-v0"}, r"task.params.env_id='Chess-v0': not a game whose legal moves tracerl knows; one of"),
        ({"opening_moves": -1}, "task.params.opening_moves=-1 must be an integer >= 0"),
        ({"opening_moves": "2"}, "task.params.opening_moves='2' must be an integer >= 0"),
    ],
)
def test_bad_task_params_fail_naming_the_key(params, msg):
    with pytest.raises(ValueError, match=msg):
        TextArenaGames("textarena", params, eval_size=4)


@pytest.mark.unit
@pytest.mark.parametrize(
    "override, msg",
    [
        ("harness.options.opponent_random=-1", r"harness.options.opponent_random=-1 must be a number >= 0"),
        ("harness.options.opponent_self=0", "opponent_self, opponent_frozen and opponent_random are all 0"),
        ("harness.options.max_retries=-1", r"harness.options.max_retries=-1 must be an integer >= 0"),
        ("harness.options.max_replies=0", r"harness.options.max_replies=0 must be an integer >= 1"),
        ("harness.options.illegal_penalty=-0.5", r"harness.options.illegal_penalty=-0.5 must be a number >= 0"),
        ("harness.options.move_hint=[1]", r"harness.options.move_hint=\[1\] must be a string"),
        ("harness.options.env_id=Chess", "harness.options.env_id='Chess' is not a TextArena environment id"),
        ("task.params.env_id=Nim", "task.params.env_id='Nim' is not a TextArena environment id"),
    ],
)
def test_bad_options_fail_the_config_check_naming_the_key(override, msg):
    with pytest.raises(ValueError, match=msg):
        validate(compose("train", ["harness=textarena", "task=textarena", override]))


@pytest.mark.unit
def test_task_presets_list_the_default_params():
    cfg = compose("train", ["task=textarena"])
    assert cfg.task.params == DEFAULT_PARAMS and isinstance(make_task_source(cfg.task, cfg.seed), TextArenaGames)
    assert compose("train", ["task=textarena_kuhn"]).task.params == {**DEFAULT_PARAMS, "env_id": "KuhnPoker-v0"}


@pytest.mark.unit
def test_experiments_differ_only_in_the_role_baseline():
    for game in ("tictactoe", "kuhn"):
        on, off = (compose("train", [f"experiment=textarena_{game}{s}"]) for s in ("", "_no_role_baseline"))
        assert on.algorithm.advantage.role_baseline and not off.algorithm.advantage.role_baseline
        off.algorithm.advantage.role_baseline, off.run_dir = True, on.run_dir
        assert off == on
        assert on.agents["opponent"] == "frozen" and "opponent" in on.harness.roles


# ---- a game: its own random state, legal moves, TicTacToe's minimax ------------------------------


@pytest.mark.unit
def test_a_game_plays_on_its_own_random_state():
    """KuhnPoker deals each round from Python's global random: a game plays the same deals whatever
    else draws from it between its moves, and leaves the global state as it found it."""

    def deals(disturb):
        game, cards = Game("KuhnPoker-v0", 11), []
        while not game.done:
            cards.append(dict(game.state.game_state["player_cards"]))
            state = random.getstate()
            assert game.step(game.legal_moves()[0])  # check or fold: every round ends at once or next move
            assert random.getstate() == state, "the global random state is untouched"
            if disturb:
                random.random()
        return cards

    assert deals(False) == deals(True)


@pytest.mark.unit
@pytest.mark.parametrize("env_id", ["TicTacToe-v0", "KuhnPoker-v0"])
def test_random_moves_are_always_legal(env_id):
    rng = random.Random(0)
    lengths = set()
    for seed in range(60):
        game = Game(env_id, seed)
        while not game.done:
            moves = game.legal_moves()
            assert moves and game.step(rng.choice(moves)), (seed, moves)
        assert sorted(game.outcome().values()) in ([-1.0, 1.0], [0.0, 0.0])
        lengths.add(game.state.turn)
    assert len(lengths) > 1


@pytest.mark.unit
def test_an_invalid_move_is_refused_and_the_same_seat_moves_again():
    game = Game("TicTacToe-v0", 0)
    assert game.step("[4]") and game.player == 1
    for bad in ("[4]", "four", "[9]", "[4]"):  # TextArena would end the game at the second one
        assert not game.step(bad) and game.player == 1 and not game.done
    assert game.step("[0]") and game.player == 0


@pytest.mark.unit
def test_tictactoe_best_cells():
    game = Game("TicTacToe-v0", 0)
    assert tictactoe_best_cells(game.env.env) == set(range(9)), "every first move draws under perfect play"
    for move in ("[0]", "[4]", "[1]"):  # O: 0 1, X: 4; X must block at 2 (and then draws)
        game.step(move)
    assert tictactoe_best_cells(game.env.env) == {2}
    game.step("[8]")  # X does not block: O wins at 2 at once, or at 3 or 6 by a double threat
    assert tictactoe_best_cells(game.env.env) == {2, 3, 6}


# ---- the harness with scripted players -----------------------------------------------------------


class Player:
    """A scripted stand-in for an agent (the harness uses only `conversation`, `reply`, `prompt_ids`
    and a few properties): `strategy(game_text, legal)` picks its reply; it keeps what it was told."""

    def __init__(self, strategy, trainable=True):
        self.strategy, self.trainable, self.told = strategy, trainable, []
        self.policy = "main" if trainable else "frozen"
        self.max_model_len, self.sampling = None, None

    def conversation(self, system=None):
        return self

    def prompt_ids(self, content=None, role="user"):
        return []

    async def reply(self, content):
        self.told.append(content)
        return self.strategy(content)


def available(text):
    return re.findall(r"'(\[\w+\])'", text.rsplit("Available Moves:", 1)[-1].rsplit("available actions are:", 1)[-1])


def first_legal(text):
    return available(text)[0]


def play(task, p0, p1, opponent=None, **options):
    agents = {"player_0": p0, "player_1": p1}
    if opponent is not None:
        agents["opponent"] = opponent
    return as_result(asyncio.run(textarena_game(task, agents, **options)))


@pytest.mark.unit
def test_an_invalid_move_is_retried_then_played_for_the_player_and_never_decides_the_game():
    src = TextArenaGames("textarena", eval_size=8)
    for task in src.eval_tasks():
        p0, p1 = Player(lambda t: "I pass"), Player(first_legal)
        result = play(task, p0, p1)
        info = result.info
        assert info["illegal"]["player_0"] == 2 * info["forced"]["player_0"] > 0, "each turn: a try, a retry"
        assert info["illegal"]["player_1"] == info["forced"]["player_1"] == 0
        assert info["moves"] >= 5 and info["truncated"] is None, "the game went on to a real end"
        outcome = info["outcome"]
        assert sum(outcome.values()) == 0 and info["winner"] in (None, *(r for r, v in outcome.items() if v > 0))
        assert result.agent_rewards == {r: outcome[r] - 0.1 * info["illegal"][r] for r in outcome}
        assert result.reward == 0.5 and info["opponent"] == "self" and info["learner"] is None
        assert "attempted an invalid move" in p0.told[1] and OUT_OF_RETRIES in p0.told[2]
        assert info["metrics"]["illegal_rate"] == info["illegal"]["player_0"] / info["replies"]
    hinted = Player(lambda t: "I pass")
    play(src.eval_tasks()[0], hinted, Player(first_legal), move_hint="Reply like [4].")
    assert len(hinted.told) > 2 and all(t.endswith("\n\nReply like [4].") for t in hinted.told)
    retried = play(src.eval_tasks()[0], Player(lambda t: "I pass"), Player(first_legal), max_retries=0)
    assert retried.info["illegal"]["player_0"] == retried.info["forced"]["player_0"]


class Minimax(Player):
    """Perfect TicTacToe from the text it is sent: its mark from the rules, the board from the last one shown."""

    def __init__(self):
        super().__init__(self.move)
        self.mark = None

    def move(self, text):
        self.mark = self.mark or ("X" if "you will be 'X'" in text else "O")
        rows = text.rsplit("Current Board:", 1)[1].split("Available")[0].strip().split("---+---+---")
        cells = [c.strip() for row in rows for c in row.strip().split("|")]
        board = [[c if c in "XO" else "" for c in cells[r * 3 : r * 3 + 3]] for r in range(3)]
        env = SimpleNamespace(
            state=SimpleNamespace(game_state={"board": board}, current_player_id=int(self.mark == "X"))
        )
        return f"[{min(tictactoe_best_cells(env))}]"


@pytest.mark.unit
def test_the_random_opponent_plays_legal_moves_and_minimax_never_loses_to_it():
    seats = set()
    for task in TextArenaGames("textarena", {"opening_moves": 1}, eval_size=8).eval_tasks():
        result = play(task, Minimax(), Minimax(), opponent_self=0, opponent_random=1)
        info, learner = result.info, result.info["learner"]
        assert info["opponent"] == "random" and info["seats"][learner] == learner
        other = ({"player_0", "player_1"} - {learner}).pop()
        assert info["seats"][other] == "random" and info["illegal"] == {"player_0": 0, "player_1": 0}
        assert info["forced"] == {"player_0": 0, "player_1": 0} and info["optimal"][learner][0] > 0
        assert info["outcome"][learner] >= 0, "minimax never loses"
        assert list(result.agent_rewards) == [learner], "the random seat has no sequences to credit"
        assert result.reward == (info["outcome"][learner] + 1) / 2
        assert info["metrics"]["optimal_move_rate"] == 1.0 and info["metrics"]["win_vs_random"] in (0.0, 1.0)
        seats.add(learner)
    assert seats == {"player_0", "player_1"}, "the learner takes either seat"


@pytest.mark.unit
def test_the_opponent_mixture_is_drawn_per_game_from_its_seed():
    tasks = TextArenaGames("textarena", eval_size=48).eval_tasks()
    frozen = Player(first_legal, trainable=False)
    options = {"opponent_self": 0.5, "opponent_frozen": 0.25, "opponent_random": 0.25}
    infos = [play(t, Player(first_legal), Player(first_legal), frozen, **options).info for t in tasks]
    assert {i["opponent"] for i in infos} == {"self", "frozen", "random"}
    again = [play(t, Player(first_legal), Player(first_legal), frozen, **options).info for t in tasks[:8]]
    assert again == infos[:8], "a game depends only on its task"
    for info in infos:
        if info["opponent"] == "frozen":
            assert sorted(info["seats"].values()) == sorted([info["learner"], "opponent"])
    summary = game_summary(infos)
    n = {k: sum(i["opponent"] == k for i in infos) for k in ("frozen", "random")}
    assert summary["win_vs_frozen/n"] == n["frozen"] and summary["win_vs_random/n"] == n["random"]
    assert summary["game_length/n"] == 48


@pytest.mark.unit
def test_a_frozen_opponent_needs_its_role_on_a_frozen_policy():
    task = TextArenaGames("textarena", eval_size=1).eval_tasks()[0]
    with pytest.raises(ValueError, match=r"opponent_frozen=1 needs the role 'opponent' .* \+agents.opponent=frozen"):
        play(task, Player(first_legal), Player(first_legal), opponent_frozen=1)
    with pytest.raises(ValueError, match="agents.opponent=main is a trained policy"):
        play(task, Player(first_legal), Player(first_legal), Player(first_legal), opponent_frozen=1)
    with pytest.raises(ValueError, match=r"harness.options.env_id='KuhnPoker-v0' but the task is a game of"):
        play(task, Player(first_legal), Player(first_legal), env_id="KuhnPoker-v0")


# ---- on the real engine (the tiny model) ---------------------------------------------------------


def extends(seq, earlier):
    head = earlier.prompt_ids + earlier.completion_ids
    return seq.prompt_ids[: len(head)] == head


@pytest.mark.integration
def test_tictactoe_selfplay_on_the_engine(run_harness):
    """Roles, one conversation per seat (each turn continues that seat's last), zero-sum outcome,
    the tiny model's invalid replies counted and penalised but not deciding the game."""
    task = TextArenaGames("textarena", eval_size=1).eval_tasks()[0]
    # (the fixture's agents do not know the context, so the harness cannot stop a game at it: a cap instead)
    _, seqs, result = run_harness(HARNESS, ["player_0", "player_1"], task=task, max_replies=6)
    info = result.info
    assert {s.agent for s in seqs} == {"player_0", "player_1"} and len(seqs) == info["replies"]
    for role in ("player_0", "player_1"):
        own = [i for i, s in enumerate(seqs) if s.agent == role]
        assert seqs[own[0]].parent is None
        for prev, i in zip(own, own[1:]):
            assert seqs[i].parent == prev and extends(seqs[i], seqs[prev]), "a seat's turns continue its history"
    outcome = info["outcome"]
    assert sum(outcome.values()) == 0
    assert result.agent_rewards == pytest.approx({r: outcome[r] - 0.1 * info["illegal"][r] for r in outcome})
    assert sum(info["illegal"].values()) > 0, "the tiny model writes no moves"
    # TextArena would end the game at a seat's second invalid reply in a row; here a move is played for it
    assert sum(info["forced"].values()) >= 1 and info["moves"] >= 2 and info["truncated"] == "max_replies"


@pytest.mark.integration
def test_kuhn_poker_against_the_frozen_opponent_on_the_engine(run_harness):
    task = TextArenaGames("textarena", {"env_id": "KuhnPoker-v0"}, eval_size=1).eval_tasks()[0]
    options = {"opponent_self": 0, "opponent_frozen": 1, "max_replies": 6}
    _, seqs, result = run_harness(
        HARNESS, ["player_0", "player_1", "opponent"], frozen=("opponent",), task=task, **options
    )
    info = result.info
    learner = info["learner"]
    assert info["opponent"] == "frozen" and {s.agent for s in seqs} == {learner, "opponent"}
    assert all(s.trainable == (s.agent == learner) for s in seqs)
    assert set(result.agent_rewards) == {learner, "opponent"}
    assert result.reward == (info["outcome"][learner] + 1) / 2
