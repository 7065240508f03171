"""textarena_game: a TextArena two-player game (TicTacToe-v0, KuhnPoker-v0, ...) played by our agents.

Seats 0 and 1 of the game are the roles `player_0` and `player_1`. Which game: the task's (task=textarena,
harnesses/tasks/textarena.py: a seed, and maybe an opening, held out by seed or by opening); any other
task plays `env_id` (default TicTacToe-v0) from a seed hashed from its id.

The opponent, drawn per game from the game's seed (so a GRPO group, which repeats one task, meets
one opponent) with the weights `opponent_self`, `opponent_frozen`, `opponent_random`:
- self: both seats are the trained roles `player_0` and `player_1` (self-play);
- frozen: the learner takes one seat (drawn) under its seat's role, the other seat is the role
  `opponent`, which must be mapped to a frozen policy (`+agents.opponent=frozen`: the base weights);
- random: the learner takes one seat, the other plays a uniformly random legal move (a program,
  no model; only games whose legal moves harnesses/tasks/textarena.py knows).

Each seat played by a model keeps one conversation: its turn's user message is what the game sent
it since its last turn (the rules first; the game's descriptions of moves and the board, the last
board only; no player's raw reply text: its own is in its history already, the opponent's could
leak hidden information; then `move_hint`, if set, e.g. "Reply with your move only, e.g. [4]."), and its
sequences merge into one training row per seat.

Legality apart from outcome (issue 44 item 4). TextArena's two-player rule is: an invalid move gets
one retry, a second invalid move in a row loses the game. Here an invalid move never decides the
game: the env's message ("attempted an invalid move ... resubmit") goes back to the player, who
retries, up to `max_retries` times; then a random legal move is played for it (counted as forced)
and the game goes on. Each invalid reply costs its player `illegal_penalty`, off its game reward.

Rewards: per agent, each model seat's game reward (+1 win, -1 loss, 0 draw: zero-sum; a game cut at
`max_replies` model replies, or when a seat's conversation would not fit its context, is a draw)
minus `illegal_penalty` x its invalid replies; a frozen opponent's under `opponent` (never trained).
Train with `algorithm=grpo_per_agent` (per-role baselines). The trace reward is the learner's
points against a fixed opponent (1 win, 0.5 draw, 0 loss; 0.5 in self-play), so that evaluating with
the opponent fixed (`harness.options.opponent_self=0 harness.options.opponent_random=1`) reports the
score rate as `reward` and the win rate as `success` / pass@1.

info: env_id, seed, opponent, learner (the learner's seat role; None in self-play), seats (seat role
-> who played it: the role, `opponent` or `random`), winner (a seat role, None for a draw), outcome,
illegal, forced (per seat role), moves (legal moves in the game, the opening's included), replies
(model calls), opening (its moves), truncated (None, "max_replies" or "context"), for TicTacToe
optimal (seat role -> [minimax-optimal moves, moves judged], the model seats' own moves) and
metrics: numbers to average over traces (`game_summary`): win_vs_<opponent> and points_vs_<opponent>
(not in self-play), illegal_rate and optimal_move_rate (the trained seats'), game_length.
"""

from __future__ import annotations

import random
import zlib
from typing import Any

from harnesses.base import Agent, Agents, HarnessResult, Task, register_options_check
from harnesses.tasks.textarena import DEFAULT_PARAMS, Game, check_env_id, tictactoe_best_cells

ROLES = ("player_0", "player_1")  # seat i's trained role
OPPONENT = "opponent"  # the role a frozen opponent plays under
OUT_OF_RETRIES = "You are out of retries: a random legal move was played for you."


async def textarena_game(
    task: Task,
    agents: Agents,
    env_id: str | None = None,
    opponent_self: float = 1.0,
    opponent_frozen: float = 0.0,
    opponent_random: float = 0.0,
    max_retries: int = 1,
    illegal_penalty: float = 0.1,
    max_replies: int = 60,
    move_hint: str | None = None,
) -> HarnessResult:
    env_id, seed, opening = game_of(task, env_id)
    weights = {"self": opponent_self, "frozen": opponent_frozen, "random": opponent_random}
    check_agents(agents, weights)
    rng = random.Random(f"textarena_game/{env_id}/{seed}")
    kind = draw_opponent(rng, weights)
    learner = None if kind == "self" else rng.randrange(2)
    players: dict[int, Agent | None] = {s: agents[ROLES[s]] for s in (0, 1)}
    if learner is not None:
        players[1 - learner] = agents[OPPONENT] if kind == "frozen" else None
    game = Game(env_id, seed)
    for move in opening:
        if not game.step(move):
            raise ValueError(f"task {task.id}: opening move {move!r} is not legal in {env_id} (seed {seed})")
    state = play_state(players)
    judge = tictactoe_best_cells if type(game.env.env).__name__ == "TicTacToeEnv" else None
    await play(game, players, state, rng, max_retries, max_replies, judge, move_hint)
    return result(game, players, state, env_id, seed, opening, kind, learner, illegal_penalty)


def game_of(task: Task, env_id: str | None) -> tuple[str, int, list[str]]:
    """(env_id, seed, opening) of the game `task` names, or of `env_id` from a seed of its id."""
    task_env = getattr(task, "env_id", None)
    if task_env is not None:
        if env_id is not None and env_id != task_env:
            raise ValueError(
                f"harness.options.env_id={env_id!r} but the task is a game of {task_env!r} "
                f"(task.params.env_id); set one of them"
            )
        seed, opening = getattr(task, "seed", None), getattr(task, "opening", [])
        return str(task_env), int(seed if seed is not None else zlib.crc32(str(task.id).encode())), list(opening)
    return env_id or DEFAULT_PARAMS["env_id"], zlib.crc32(str(task.id).encode()), []


def check_agents(agents: Agents, weights: dict[str, float]) -> None:
    missing = [r for r in ROLES if r not in agents]
    if missing:
        raise ValueError(f"agents: harness textarena_game needs roles {list(ROLES)}; add agents.{missing[0]}=main")
    if weights["frozen"] > 0:
        if OPPONENT not in agents:
            raise ValueError(
                f"harness.options.opponent_frozen={weights['frozen']} needs the role {OPPONENT!r} on a frozen "
                f"policy: add +agents.{OPPONENT}=frozen and {OPPONENT} to harness.roles"
            )
        if agents[OPPONENT].trainable:
            raise ValueError(
                f"agents.{OPPONENT}={agents[OPPONENT].policy} is a trained policy; the frozen opponent "
                f"must be a frozen one (agents.{OPPONENT}=frozen)"
            )


def draw_opponent(rng: random.Random, weights: dict[str, float]) -> str:
    x = rng.random() * sum(weights.values())
    for kind, w in weights.items():
        if x < w:
            return kind
        x -= w
    return next(k for k, w in reversed(weights.items()) if w > 0)  # x at the top edge


def play_state(players: dict[int, Agent | None]) -> dict[str, Any]:
    """What a game counts per seat, and the seats' conversations."""
    return {
        "chats": {s: a.conversation() for s, a in players.items() if a is not None},
        "replies": [0, 0],
        "illegal": [0, 0],
        "forced": [0, 0],
        "misses": [0, 0],  # invalid replies in a row, this turn
        "optimal": [[0, 0], [0, 0]],  # [optimal, judged] per seat
        "truncated": None,
    }


async def play(
    game: Game,
    players: dict[int, Agent | None],
    state: dict[str, Any],
    rng: random.Random,
    max_retries: int,
    max_replies: int,
    judge: Any,
    move_hint: str | None = None,
) -> None:
    """Play `game` to its end (or until cut: state["truncated"])."""
    while not game.done:
        seat, messages = game.observe()
        agent = players[seat]
        if agent is None:  # the random player
            if not game.step(rng.choice(game.legal_moves())):
                raise AssertionError(f"{game.env_id}: a move from legal_moves() was refused")
            continue
        if sum(state["replies"]) >= max_replies:
            state["truncated"] = "max_replies"
            return
        chat, content = state["chats"][seat], render(messages)
        if move_hint:
            content = f"{content}\n\n{move_hint}"
        limit = agent.max_model_len
        if limit is not None and len(chat.prompt_ids(content)) + agent.sampling.max_tokens > limit:
            state["truncated"] = "context"
            return
        best = judge(game.env.env) if judge is not None else None
        before = board_cells(game) if judge is not None else None
        reply = await chat.reply(content)
        state["replies"][seat] += 1
        if game.step(reply):
            state["misses"][seat] = 0
            if best is not None and before is not None:
                [cell] = [i for i, (a, b) in enumerate(zip(before, board_cells(game))) if a != b]
                state["optimal"][seat][0] += cell in best
                state["optimal"][seat][1] += 1
            continue
        state["illegal"][seat] += 1
        state["misses"][seat] += 1
        if state["misses"][seat] > max_retries:
            game.tell(seat, OUT_OF_RETRIES)
            if not game.step(rng.choice(game.legal_moves())):
                raise AssertionError(f"{game.env_id}: a move from legal_moves() was refused")
            state["forced"][seat] += 1
            state["misses"][seat] = 0


def render(messages: list[tuple[int, str, Any]]) -> str:
    """A seat's new messages as one user turn: no player's reply text, the last board only."""
    from textarena import ObservationType

    kept = [(text, kind) for sender, text, kind in messages if kind != ObservationType.PLAYER_ACTION]
    boards = [i for i, (_, kind) in enumerate(kept) if kind == ObservationType.GAME_BOARD]
    text = "\n\n".join(t.strip() for i, (t, _) in enumerate(kept) if i not in boards[:-1] and t.strip())
    return text or "Your move."


def board_cells(game: Game) -> list[str]:
    return [c for row in game.state.game_state["board"] for c in row]


def result(
    game: Game,
    players: dict[int, Agent | None],
    state: dict[str, Any],
    env_id: str,
    seed: int,
    opening: list[str],
    kind: str,
    learner: int | None,
    illegal_penalty: float,
) -> HarnessResult:
    outcome = game.outcome() if game.done else {0: 0.0, 1: 0.0}  # a cut game is a draw
    role = {s: (ROLES[s] if learner in (None, s) else OPPONENT if players[s] is not None else None) for s in (0, 1)}
    agent_rewards = {
        str(role[s]): outcome[s] - illegal_penalty * state["illegal"][s]
        for s in (0, 1)
        if role[s] is not None and state["replies"][s] > 0
    }
    winner = next((ROLES[s] for s in (0, 1) if outcome[s] > 0), None)
    points = 0.5 if learner is None else (outcome[learner] + 1) / 2
    trained = [s for s in (0, 1) if learner in (None, s)]
    replies = sum(state["replies"][s] for s in trained)
    metrics: dict[str, float] = {"game_length": float(game.state.turn)}
    if learner is not None:
        metrics[f"win_vs_{kind}"] = float(outcome[learner] > 0)
        metrics[f"points_vs_{kind}"] = points
    if replies:
        metrics["illegal_rate"] = sum(state["illegal"][s] for s in trained) / replies
    info: dict[str, Any] = {
        "env_id": env_id,
        "seed": seed,
        "opponent": kind,
        "learner": None if learner is None else ROLES[learner],
        "seats": {ROLES[s]: role[s] or "random" for s in (0, 1)},
        "winner": winner,
        "outcome": {ROLES[s]: outcome[s] for s in (0, 1)},
        "illegal": {ROLES[s]: state["illegal"][s] for s in (0, 1)},
        "forced": {ROLES[s]: state["forced"][s] for s in (0, 1)},
        "moves": int(game.state.turn),
        "replies": sum(state["replies"]),
        "opening": opening,
        "truncated": state["truncated"],
    }
    if type(game.env.env).__name__ == "TicTacToeEnv":
        info["optimal"] = {ROLES[s]: state["optimal"][s] for s in (0, 1) if players[s] is not None}
        judged = sum(state["optimal"][s][1] for s in trained)
        if judged:
            metrics["optimal_move_rate"] = sum(state["optimal"][s][0] for s in trained) / judged
    info["metrics"] = metrics
    return HarnessResult(reward=points, agent_rewards=agent_rewards or None, info=info)


def game_summary(infos: list[dict[str, Any]]) -> dict[str, float]:
    """The mean of each info["metrics"] number over the traces that have it, and how many have it
    (`<name>/n`): e.g. the win rate against a random opponent over an evaluation's traces."""
    values: dict[str, list[float]] = {}
    for info in infos:
        for key, value in (info.get("metrics") or {}).items():
            values.setdefault(key, []).append(float(value))
    out: dict[str, float] = {}
    for key, vs in sorted(values.items()):
        out[key], out[f"{key}/n"] = sum(vs) / len(vs), float(len(vs))
    return out


def check_options(options: dict) -> None:
    weights = {
        k: options.get(k, d) for k, d in (("opponent_self", 1.0), ("opponent_frozen", 0.0), ("opponent_random", 0.0))
    }
    for key, w in weights.items():
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not w >= 0:
            raise ValueError(f"harness.options.{key}={w!r} must be a number >= 0 (a relative weight)")
    if sum(weights.values()) <= 0:
        raise ValueError(
            "harness.options: opponent_self, opponent_frozen and opponent_random are all 0; give one a weight"
        )
    for key, low in (("max_retries", 0), ("max_replies", 1)):
        value = options.get(key, low)
        if type(value) is not int or value < low:
            raise ValueError(f"harness.options.{key}={value!r} must be an integer >= {low}")
    penalty = options.get("illegal_penalty", 0.0)
    if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or not penalty >= 0:
        raise ValueError(f"harness.options.illegal_penalty={penalty!r} must be a number >= 0")
    hint = options.get("move_hint")
    if hint is not None and not isinstance(hint, str):
        raise ValueError(f"harness.options.move_hint={hint!r} must be a string (or null: none)")
    if options.get("env_id") is not None:
        check_env_id(options["env_id"], "harness.options.env_id")


register_options_check(textarena_game, check_options)
