"""TextArena two-player games as tasks (task=textarena, harness=textarena): game seeds, held out by seed.

An item is one game of `task.params.env_id` (a TextArena id, e.g. `TicTacToe-v0`, `KuhnPoker-v0`)
from a seed: the seed the env is reset with (KuhnPoker's deals come from it) and that the harness
draws its own choices from (the opponent, the learner's seat, a random player's moves). The
question names the seed, so TaskSource's held-out-by-content logic holds out seeds: no held-out
seed is ever a training seed, and the held-out seeds are distinct. With `opening_moves: k > 0`
each game starts after k random legal moves drawn from its seed, and the question names the
position the opening reaches instead (TicTacToe: its board; other games: the moves): then
positions are held out, and a held-out position is never a training start (TicTacToe: 9
positions after one move, 72 after two, 252 after three).

Beside the source, what the harness and the tests share about the games: `Game` (one env, played
with its own random state: TextArena seeds and draws from Python's global `random`, which
concurrent episodes in one worker would otherwise interleave), the games whose legal moves are
known (`LEGAL_MOVES`, for the random player and the move played for a player out of retries)
and TicTacToe's minimax (`tictactoe_best_cells`, for the optimal-move rate).

The game, not a text, decides the outcome, so an item's `score` is 0.0 for any text.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from harnesses.base import TaskSource

DEFAULT_PARAMS: dict[str, Any] = {"env_id": "TicTacToe-v0", "opening_moves": 0}
SEED_RANGE = 2**31  # game seeds are drawn from [0, SEED_RANGE)


def _tictactoe_moves(env: Any) -> list[str]:
    board = env.state.game_state["board"]
    return [f"[{r * 3 + c}]" for r in range(3) for c in range(3) if board[r][c] == ""]


def _kuhn_moves(env: Any) -> list[str]:
    tree = env.state.game_state["current_legal_action_tree"]
    return [f"[{action}]" for action in tree] if isinstance(tree, dict) else []


# The games whose legal moves this module knows, by TextArena env class: one function of the
# unwrapped env a game needs (every variant id of that class, e.g. KuhnPoker-v0-short, works).
LEGAL_MOVES: dict[str, Callable[[Any], list[str]]] = {"TicTacToeEnv": _tictactoe_moves, "KuhnPokerEnv": _kuhn_moves}


def _tictactoe_position(env: Any) -> str:
    rows = ("".join(c or "." for c in row) for row in env.state.game_state["board"])
    return "the board " + "/".join(rows)


# A position in words, for the games where different move orders reach one position (TicTacToe):
# the question of a game with an opening, so that openings are held out by the position they reach.
POSITIONS: dict[str, Callable[[Any], str]] = {"TicTacToeEnv": _tictactoe_position}


def _textarena() -> Any:
    try:
        import textarena
    except ImportError:
        raise ImportError(
            "TextArena games need the textarena package: pip install textarena==0.7.4 (tracerl's envs extra)"
        ) from None
    return textarena


def check_env_id(env_id: Any, key: str) -> None:
    """`env_id` is a registered TextArena two-player game this module can play; a ValueError
    naming the config `key` otherwise."""
    _textarena()
    from textarena.envs.registration import ENV_REGISTRY

    if not isinstance(env_id, str) or env_id not in ENV_REGISTRY:
        raise ValueError(f"{key}={env_id!r} is not a TextArena environment id (e.g. TicTacToe-v0, KuhnPoker-v0)")
    # by the registered class name: some envs' modules do not even import (Chess-v0 on Python 3.11)
    if _entry_class(ENV_REGISTRY[env_id].entry_point) not in LEGAL_MOVES:
        known = sorted(
            k
            for k, spec in ENV_REGISTRY.items()
            if _entry_class(spec.entry_point) in LEGAL_MOVES and not k.endswith(("-raw", "-train"))
        )
        raise ValueError(f"{key}={env_id!r}: not a game whose legal moves tracerl knows; one of {known}")


def _entry_class(entry_point: Any) -> str:
    return entry_point.rpartition(":")[2] if isinstance(entry_point, str) else getattr(entry_point, "__name__", "")


def _unwrapped(env: Any) -> Any:
    ta = _textarena()
    while isinstance(env, ta.Wrapper):  # observation wrappers resend the whole history each turn
        env = env.env
    return env


@contextmanager
def _random_state(state: tuple | None) -> Iterator[list]:
    """Run a block on the global `random` with `state` (None: as it is), hand back the state it
    left (out[0]) and restore the global one."""
    saved = random.getstate()
    out: list = [None]
    if state is not None:
        random.setstate(state)
    try:
        yield out
    finally:
        out[0] = random.getstate()
        random.setstate(saved)


class Game:
    """One two-player TextArena game, reset from `seed`. Every env call runs on the game's own
    random state (TextArena's `reset` seeds the global `random` and KuhnPoker deals from it at
    each round), so a game plays the same whatever runs beside it, and leaves the global state
    alone. TextArena's own invalid-move rule (a second invalid move in a row loses the game) is
    switched off: the harness decides what an invalid move costs."""

    def __init__(self, env_id: str, seed: int):
        ta = _textarena()
        # the env's own action handling (a reply without brackets is bracketed), its history not resent
        self.env = ta.wrappers.ActionFormattingWrapper(_unwrapped(ta.make(env_id)))
        self.env_id = env_id
        self._legal = LEGAL_MOVES[type(self.env.env).__name__]
        self._rng: tuple | None = None
        with self._own_random():
            self.env.reset(num_players=2, seed=seed)
        self.state.error_allowance = 1 << 30  # TextArena's retry-then-lose rule off

    @contextmanager
    def _own_random(self) -> Iterator[None]:
        with _random_state(self._rng) as out:
            yield
        self._rng = out[0]

    @property
    def state(self) -> Any:
        return self.env.env.state

    @property
    def player(self) -> int:
        """The seat to move: 0 or 1."""
        return int(self.state.current_player_id)

    @property
    def done(self) -> bool:
        return bool(self.state.done)

    def legal_moves(self) -> list[str]:
        return self._legal(self.env.env)

    def observe(self) -> tuple[int, list[tuple[int, str, Any]]]:
        """(seat to move, the messages it was sent since it last moved); the queue is emptied."""
        return self.env.get_observation()

    def tell(self, seat: int, message: str) -> None:
        """A game message to one seat (it reads it with its next observation)."""
        ta = _textarena()
        self.state.add_observation(message=message, observation_type=ta.ObservationType.GAME_ADMIN, to_id=seat)

    def step(self, action: str) -> bool:
        """Play `action` for the seat to move; whether the env took it as a legal move."""
        with self._own_random():
            self.env.step(action)
        return self.state.error_count == 0  # an invalid move counts up; a legal one resets it

    def outcome(self) -> dict[int, float]:
        """Each seat's game reward (+1 / -1 for a win / loss, 0 each for a draw); {} while it runs."""
        rewards = self.state.rewards
        return {int(pid): float(r) for pid, r in rewards.items()} if rewards else {}


@functools.lru_cache(maxsize=1 << 14)
def _tictactoe_value(board: str, mark: str) -> int:
    """Minimax value of a 3x3 `board` (9 chars of 'X', 'O', '.') for `mark`, to move: +1 win, 0 draw, -1 loss."""
    other = "X" if mark == "O" else "O"
    if _line(board, other):
        return -1
    empty = [i for i, c in enumerate(board) if c == "."]
    if not empty:
        return 0
    return max(-_tictactoe_value(board[:i] + mark + board[i + 1 :], other) for i in empty)


_LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


def _line(board: str, mark: str) -> bool:
    return any(board[a] == board[b] == board[c] == mark for a, b, c in _LINES)


def tictactoe_best_cells(env: Any) -> set[int]:
    """The cells whose minimax value is the best for the player to move on a TicTacToe env's board
    (Player 0 plays 'O', Player 1 'X')."""
    board = "".join(c or "." for row in env.state.game_state["board"] for c in row)
    mark = "X" if env.state.current_player_id == 1 else "O"
    other = "O" if mark == "X" else "X"
    values = {i: -_tictactoe_value(board[:i] + mark + board[i + 1 :], other) for i, c in enumerate(board) if c == "."}
    best = max(values.values(), default=0)
    return {i for i, v in values.items() if v == best}


# ---- the task source ---------------------------------------------------------------------------


@dataclass
class TextArenaGame:
    id: str
    question: str
    prompt: str
    env_id: str  # the TextArena environment
    seed: int  # the env's reset seed, and the harness's draws
    opening: list[str] = field(default_factory=list)  # moves played before the players take over
    answer: str | None = None

    def score(self, text: str) -> float:
        return 0.0  # the game decides (per-agent rewards from the harness), not a text


class TextArenaGames(TaskSource):
    """Games of `task.params.env_id` from seeds (DEFAULT_PARAMS for any key not given); with
    `opening_moves` > 0 each starts after that many random legal moves."""

    def setup(self) -> None:
        unknown = sorted(set(self.params) - set(DEFAULT_PARAMS))
        if unknown:
            raise ValueError(f"task.params.{unknown[0]} is not a textarena parameter; known: {sorted(DEFAULT_PARAMS)}")
        p = {**DEFAULT_PARAMS, **self.params}
        check_env_id(p["env_id"], "task.params.env_id")
        opening = p["opening_moves"]
        if type(opening) is not int or opening < 0:
            raise ValueError(f"task.params.opening_moves={opening!r} must be an integer >= 0")
        self.env_id, self.opening_moves = str(p["env_id"]), opening

    def draw(self, split: str, index: int, task_id: str) -> TextArenaGame:
        stream = self.seed if split == "train" else self.eval_seed
        seed = random.Random(f"textarena/{stream}/{index}").randrange(SEED_RANGE)  # str seeds: every process alike
        opening, position = self._opening(seed)
        question = f"{self.env_id} from {position}" if opening else f"{self.env_id} game, seed {seed}"
        prompt = f"{question}\n{self.instruction}" if self.instruction else question
        return TextArenaGame(task_id, question, prompt, self.env_id, seed, opening)

    def _opening(self, seed: int) -> tuple[list[str], str]:
        """`opening_moves` random legal moves from the game's start (fewer if one more would end
        it), and the position they reach in words (POSITIONS; else the moves themselves)."""
        if not self.opening_moves:
            return [], ""
        game, rng, moves = Game(self.env_id, seed), random.Random(f"opening/{seed}"), []
        for _ in range(self.opening_moves):
            move = rng.choice(game.legal_moves())
            game.step(move)
            if game.done:
                break
            moves.append(move)
        if game.done:  # replay without the move that ended it
            game = Game(self.env_id, seed)
            for move in moves:
                game.step(move)
        position = POSITIONS.get(type(game.env.env).__name__)
        return moves, position(game.env.env) if position else "the opening " + " ".join(moves)
