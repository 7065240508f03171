"""Two agents written with the OpenAI Agents SDK (`openai-agents`), as a program you already have
would be: a solver with a calculator tool that may hand the question off to a checker. It runs
on the SDK's default model API (the Responses API) against one OpenAI-compatible base URL where
each agent's model name is its role. Nothing here knows about tracerl.

A function `await agent(task, base_url, api_key)` (task.prompt is the question); `agent_reviewed`,
where an answer the solver gives itself goes to the checker as a second run, so the checker always
answers last; `build_agents` makes the two agents on a client, for running them on a conversation of
your own. Trained with tracerl (harnesses/programs/openai_agent.py, docs/frameworks.md):

    python scripts/train.py experiment=smollm2_agents_sdk   # conf/harness/agents_sdk.yaml
    python scripts/train.py experiment=smollm2_agents_sdk \
        harness.options.agent=examples.agents_sdk_handoff.agent_reviewed
"""

from __future__ import annotations

import json

from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, function_tool
from openai import AsyncOpenAI

from examples.calculator_agent import calculator as evaluate  # the hardened evaluator: model text never raises

MAX_TURNS = 4

SOLVER = "Solve the problem. Use the calculator for arithmetic, or hand off to the checker."
CHECKER = "Check the proposed answer and give the final one in <answer></answer> tags."


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses."""
    return evaluate(expression)


def build_agents(client: AsyncOpenAI) -> Agent:
    """The solver, which may hand off to the checker; each agent's model is its role's name on `client`."""
    checker = Agent(name="checker", instructions=CHECKER, model=OpenAIResponsesModel("checker", client))
    return Agent(
        name="solver",
        instructions=SOLVER,
        model=OpenAIResponsesModel("solver", client),
        tools=[calculator],
        handoffs=[checker],
    )


def worked_call(call_id: str, name: str, arguments: dict) -> list[dict]:
    """A function call and its output as Responses API input items: the calculator's result, or for
    the SDK's handoff tool (transfer_to_checker) the SDK's transfer message."""
    output = evaluate(arguments["expression"]) if name == "calculator" else json.dumps({"assistant": "checker"})
    return [
        {"type": "function_call", "call_id": call_id, "name": name, "arguments": json.dumps(arguments)},
        {"type": "function_call_output", "call_id": call_id, "output": output},
    ]


def worked(k: int, expression: str) -> list[dict]:
    """One worked example: the question, a calculator call, a handoff, and the checker's answer."""
    return [
        {"role": "user", "content": f"What is {expression}?"},
        *worked_call(f"c{k}", "calculator", {"expression": expression}),
        *worked_call(f"h{k}", "transfer_to_checker", {}),
        {"role": "assistant", "content": f"<answer>{evaluate(expression)}</answer>"},
    ]


# Two worked examples: what makes a small model (SmolLM2-135M) use the tool and the handoff.
EXAMPLES = [*worked(1, "12 + 30"), *worked(2, "7 * 8")]


async def run(items: str | list[dict], base_url: str, api_key: str, review: bool = False):
    """The solver on `items` (a question, or Responses API input items), at most MAX_TURNS calls.
    With `review`, a run that did not end with the checker (the solver answered itself) is followed
    by a run of the checker on that run's whole conversation (its `to_input_list()`): the SDK's way
    of chaining agents in code. The last run's result."""
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    run_config = RunConfig(tracing_disabled=True)  # the SDK's tracing uploads to OpenAI
    solver = build_agents(client)
    result = await Runner.run(solver, items, max_turns=MAX_TURNS, run_config=run_config)
    if not review or result.last_agent.name == "checker":
        return result
    [checker] = solver.handoffs
    return await Runner.run(checker, result.to_input_list(), max_turns=MAX_TURNS, run_config=run_config)


async def agent(task, base_url: str, api_key: str) -> str:
    return str((await run(task.prompt, base_url, api_key)).final_output)


async def agent_with_examples(task, base_url: str, api_key: str) -> str:
    """`agent` after the two worked EXAMPLES (harness.options.agent=examples.agents_sdk_handoff.agent_with_examples)."""
    items = [*EXAMPLES, {"role": "user", "content": task.prompt}]
    return str((await run(items, base_url, api_key)).final_output)


async def agent_reviewed(task, base_url: str, api_key: str) -> str:
    """`agent`, with every answer the checker's (harness.options.agent=examples.agents_sdk_handoff.agent_reviewed):
    untaught, SmolLM2-135M never hands off, so a team trained from it never trains the checker."""
    return str((await run(task.prompt, base_url, api_key, review=True)).final_output)
