"""selfplay: one policy plays both sides of a two-player game with a verifiable outcome.

The game is Nim (the subtraction game): a pile of stones; players alternate taking 1 to
`max_take`; whoever takes the last stone wins. A reply whose first number is not a legal move
forfeits the game. The starting position comes from the task: a task with `stones` and
`max_take` (task=nim, harnesses/tasks/games.py: held out by position) is played as it is; any other
task only seeds the pile (`min_stones` to `max_stones`, from its id) with max_take 3, so any
task source works.

Trace shape, 2 agents (player_a moves first, player_b), m = info["moves"] sequences in
alternating order; each player's turns continue its own conversation (parent = its previous
turn) and merge into one training row per player.
Reward: zero-sum per agent, +1 for the winner and -1 for the loser; agent_rewards holds the
players that moved (a player_b that never moved, because player_a forfeited its first move, has
no sequence to credit). The trace reward is 0. Train with `algorithm=grpo_per_agent`
(per-agent rewards, per-role baselines).
info: moves, winner (None for a game cut at max_moves), forfeit, the starting stones and
max_take, and first_player_wins: whether player_a wins the position under perfect play
(stones % (max_take + 1) != 0; then taking stones % (max_take + 1) is the winning move).
"""

from __future__ import annotations

import re
import zlib

from harnesses.base import Agents, HarnessResult, Task

RULES = (
    "We play Nim. There are {stones} stones. Players take turns removing 1 to {max_take} stones; "
    "whoever takes the last stone wins. You are player {name}."
)
ASK = "There are {stones} stones left.{last} How many do you take? Reply with a number from 1 to {max_take}."
_FIRST_NUMBER = re.compile(r"\d+")
MAX_MOVE_DIGITS = 6  # a longer number is no legal move (and int() refuses more than 4,300 digits)


def parse_move(text: str, stones: int, max_take: int = 3) -> int | None:
    """The first number in `text` if it is a legal move (1..max_take, at most `stones`), else None
    (a forfeit)."""
    m = _FIRST_NUMBER.search(text)
    if m is None or len(m.group()) > MAX_MOVE_DIGITS:
        return None
    move = int(m.group())
    return move if 1 <= move <= min(max_take, stones) else None


def start_position(task: Task, min_stones: int, max_stones: int) -> tuple[int, int]:
    """(stones, max_take): the task's own position if it has one, else a pile from its id and 3."""
    stones, max_take = getattr(task, "stones", None), getattr(task, "max_take", None)
    if stones is not None and max_take is not None:
        return int(stones), int(max_take)
    return min_stones + zlib.crc32(str(task.id).encode()) % (max_stones - min_stones + 1), 3


async def selfplay(
    task: Task, agents: Agents, min_stones: int = 5, max_stones: int = 15, max_moves: int = 40
) -> HarnessResult:
    start, max_take = start_position(task, min_stones, max_stones)
    stones = start
    roles = ("player_a", "player_b")
    chats = {
        r: agents[r].conversation(system=RULES.format(stones=stones, max_take=max_take, name=r[-1].upper()))
        for r in roles
    }
    last_move, moves, winner, forfeit = None, 0, None, False
    while winner is None and moves < max_moves:
        role, other = roles[moves % 2], roles[(moves + 1) % 2]
        last = f" Your opponent took {last_move}." if last_move else ""
        reply = await chats[role].reply(ASK.format(stones=stones, last=last, max_take=max_take))
        move = parse_move(reply, stones, max_take)
        moves += 1
        if move is None:
            winner, forfeit = other, True
        else:
            stones -= move
            last_move = move
            if stones == 0:
                winner = role
    moved = roles[: min(moves, 2)]
    if winner is None:  # only when max_moves < the starting pile: a draw
        rewards = dict.fromkeys(moved, 0.0)
    else:
        rewards = {r: 1.0 if r == winner else -1.0 for r in moved}
    info = {
        "moves": moves,
        "winner": winner,
        "forfeit": forfeit,
        "stones": start,
        "max_take": max_take,
        "first_player_wins": start % (max_take + 1) != 0,
    }
    return HarnessResult(reward=0.0, agent_rewards=rewards, info=info)
