"""debate: debaters argue over rounds, each seeing the others' last arguments; a judge decides.

Trace shape, with D = `debaters` (roles debater_a, debater_b, ...) and R = `rounds`:
  per round, each debater one sequence: round 1 opens its conversation with the task; later
    rounds continue it with the other debaters' previous arguments (parent = its previous
    turn), so each debater's R sequences merge into one training row;
  then 1 judge sequence on a fresh context (the question and every final argument).
  D*R + 1 sequences. Map `judge` to `frozen` to serve the judge without training it: its
  sequence is recorded with trainable=False and gets no gradient.
Reward: the task's verifier on the judge's answer. With `per_debater_rewards`, agent_rewards
also gives each debater the score of its own final argument, and the judge the judged score
(train with `algorithm=grpo_per_agent` to use them).
"""

from __future__ import annotations

import asyncio
import string

from harnesses.base import Agents, HarnessResult, Task

OPEN = "You are debater {name} in a debate. Solve the problem and state your answer.\n{prompt}"
REBUT = (
    "The other debaters said:\n{others}\n\nCheck their answers against yours, then give your "
    "final answer. {instruction}"
)
JUDGE = "Question: {question}\n\n{arguments}\n\nYou are the judge. Decide which answer is right. {instruction}"


def debater_roles(debaters: int) -> list[str]:
    return [f"debater_{string.ascii_lowercase[i]}" for i in range(debaters)]


async def debate(
    task: Task, agents: Agents, debaters: int = 2, rounds: int = 2, per_debater_rewards: bool = False
) -> HarnessResult:
    if not 2 <= debaters <= 26 or rounds < 1:
        raise ValueError(f"debate needs 2-26 debaters and >= 1 round; got {debaters}, {rounds}")
    roles = debater_roles(debaters)
    # the task's answer-format line ("Give the final answer as ..."), repeated where answers are asked for
    instruction = task.prompt[len(task.question) :].strip() if task.prompt.startswith(task.question) else ""
    chats = {r: agents[r].conversation() for r in roles}
    last: dict[str, str] = {}
    for k in range(rounds):

        def turn(role: str) -> str:
            if k == 0:  # noqa: B023 (called within this round)
                return OPEN.format(prompt=task.prompt, name=role[-1].upper())
            others = "\n".join(f"{o[-1].upper()}: {last[o]}" for o in roles if o != role)  # noqa: B023
            return REBUT.format(others=others, instruction=instruction)

        replies = await asyncio.gather(*(chats[r].reply(turn(r)) for r in roles))
        last = dict(zip(roles, replies))
    arguments = "\n".join(f"Debater {r[-1].upper()}: {last[r]}" for r in roles)
    verdict = await agents["judge"].chat(
        JUDGE.format(question=task.question, arguments=arguments, instruction=instruction)
    )
    reward = task.score(verdict)
    agent_rewards = None
    if per_debater_rewards:
        agent_rewards = {r: task.score(last[r]) for r in roles} | {"judge": reward}
    return HarnessResult(
        reward=reward, agent_rewards=agent_rewards, info={"debaters": debaters, "rounds": rounds, "answer": task.answer}
    )
