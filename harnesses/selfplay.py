"""selfplay: one policy plays both sides of a two-player game with a verifiable outcome.

The game is Nim: a pile of stones (its size comes from the task id, `min_stones` to
`max_stones`); players alternate taking 1, 2 or 3; whoever takes the last stone wins. A reply
whose first number is not a legal move forfeits the game. The task's text is not used: the
task only seeds the starting pile, so any task source works.

Trace shape, 2 agents (player_a moves first, player_b), m = info["moves"] sequences in
alternating order; each player's turns continue its own conversation (parent = its previous
turn) and merge into one training row per player.
Reward: zero-sum per agent, +1 for the winner and -1 for the loser; agent_rewards holds the
players that moved (a player_b that never moved, because player_a forfeited its first move, has
no sequence to credit). The trace reward is 0. Train with `algorithm=grpo_per_agent`
(per-agent rewards, per-role baselines).
"""

from __future__ import annotations

import re
import zlib

from harnesses.base import HarnessResult

RULES = (
    "We play Nim. There are {stones} stones. Players take turns removing 1, 2 or 3 stones; "
    "whoever takes the last stone wins. You are player {name}."
)
ASK = "There are {stones} stones left.{last} How many do you take? Reply with 1, 2 or 3."
_FIRST_NUMBER = re.compile(r"\d+")


def parse_move(text: str, stones: int) -> int | None:
    """The first number in `text` if it is a legal move, else None."""
    m = _FIRST_NUMBER.search(text)
    move = int(m.group()) if m else None
    return move if move in (1, 2, 3) and move <= stones else None


async def selfplay(task, agents, min_stones: int = 5, max_stones: int = 15, max_moves: int = 30) -> HarnessResult:
    stones = min_stones + zlib.crc32(str(task.id).encode()) % (max_stones - min_stones + 1)
    roles = ("player_a", "player_b")
    chats = {r: agents[r].conversation(system=RULES.format(stones=stones, name=r[-1].upper())) for r in roles}
    last_move, moves, winner, forfeit = None, 0, None, False
    while winner is None and moves < max_moves:
        role, other = roles[moves % 2], roles[(moves + 1) % 2]
        last = f" Your opponent took {last_move}." if last_move else ""
        move = parse_move(await chats[role].reply(ASK.format(stones=stones, last=last)), stones)
        moves += 1
        if move is None:
            winner, forfeit = other, True
        else:
            stones -= move
            last_move = move
            if stones == 0:
                winner = role
    moved = roles[: min(moves, 2)]
    if winner is None:  # cannot happen with legal moves and max_moves >= max_stones; kept as a draw
        rewards = dict.fromkeys(moved, 0.0)
    else:
        rewards = {r: 1.0 if r == winner else -1.0 for r in moved}
    return HarnessResult(reward=0.0, agent_rewards=rewards, info={"moves": moves, "winner": winner, "forfeit": forfeit})
