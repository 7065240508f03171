"""Two agents written with the OpenAI Agents SDK (`openai-agents`), as a program you already have
would be: a solver with a calculator tool that may hand the question off to a checker. It runs
on the SDK's default model API (the Responses API) against one OpenAI-compatible base URL where
each agent's model name is its role. Nothing here knows about tracerl.

A function `await agent(task, base_url, api_key)` (task.prompt is the question); `build_agents`
makes the two agents on a client, for running them on a conversation of your own. Trained with
tracerl (harnesses/programs/openai_agent.py, docs/frameworks.md):

    python scripts/train.py experiment=smollm2_agents_sdk   # conf/harness/agents_sdk.yaml
"""

from __future__ import annotations

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


async def agent(task, base_url: str, api_key: str) -> str:
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    run_config = RunConfig(tracing_disabled=True)  # the SDK's tracing uploads to OpenAI
    result = await Runner.run(build_agents(client), task.prompt, max_turns=MAX_TURNS, run_config=run_config)
    return str(result.final_output)
