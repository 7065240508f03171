"""compaction: a long step-by-step task under a context budget; the agent summarises and restarts.

The agent works in steps ("Continue." after each) until it writes an <answer> tag or has taken
`max_steps` steps. Before a step after which there would be no room left to summarise, it is
asked for a summary of its progress instead (one more turn of the same conversation), and work
continues in a NEW conversation that holds only the task and that summary. Compaction is just
a sequence boundary: the trace keeps every sequence, and the trace reward trains all of them.
No sequence is longer than `budget_tokens`; each turn generates at most `reply_tokens`.

Trace shape, 1 agent (`solver`), with c = info["compactions"], s = info["steps"]:
  s + c sequences in c + 1 segments. A segment is one conversation whose turns continue each
  other (parent = the previous turn) and merge into one training row; a segment after a
  compaction starts a fresh context (parent None, prompt = task + summary), so it never merges
  with the one before it. Every segment but the last ends with its summary turn.
Reward: the task's verifier on the last step's text (shared).
"""

from __future__ import annotations

from harnesses.base import Agents, Conversation, HarnessResult, Task

START = (
    "{prompt}\nWork step by step, one short step per reply. When you know the result, write it as the instruction says."
)
RESUME = (
    "{prompt}\nYou were working on this step by step and ran out of room. Your summary of "
    "the work so far:\n{summary}\n\nContinue, one short step per reply."
)
CONTINUE = "Continue."
SUMMARISE = "Your context is almost full. Summarise the work so far in a few sentences: what is known and what is left."


async def compaction(
    task: Task, agents: Agents, budget_tokens: int = 512, max_steps: int = 8, reply_tokens: int = 64
) -> HarnessResult:
    solver = agents["solver"]
    # the summary request after a reply cut at reply_tokens (the template closes that turn too)
    summary_turn = len(solver.format.continuation([], [{"role": "user", "content": SUMMARISE}]))

    def room_to_summarise_after(chat: Conversation, message: str) -> bool:
        return len(chat.prompt_ids(message)) + reply_tokens + summary_turn + reply_tokens <= budget_tokens

    chat, message = solver.conversation(), START.format(prompt=task.prompt)
    text, compactions, steps = "", 0, 0
    while steps < max_steps:
        if not room_to_summarise_after(chat, message):
            if not chat.num_tokens:  # a fresh context: the task (and summary) alone leave no room
                raise ValueError(
                    f"compaction: budget_tokens={budget_tokens} leaves no room for a step and a "
                    f"summary after {'the task prompt' if not compactions else 'a summary'}; "
                    f"raise it"
                )
            summary = await chat.reply(SUMMARISE, max_tokens=reply_tokens)
            chat, message = solver.conversation(), RESUME.format(prompt=task.prompt, summary=summary.strip())
            compactions += 1
            continue
        text = await chat.reply(message, max_tokens=reply_tokens)
        steps += 1
        if "<answer>" in text.lower():
            break
        message = CONTINUE
    return HarnessResult(
        reward=task.score(text), info={"compactions": compactions, "steps": steps, "answer": task.answer}
    )
