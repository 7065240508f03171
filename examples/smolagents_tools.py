"""An agent written with smolagents (`smolagents`), as a program you already have would be: a
ToolCallingAgent with a calculator tool on an OpenAI-compatible server (`OpenAIModel`, its model name
the role, `solver`). Nothing here knows about tracerl.

smolagents is synchronous: the agent runs on a thread (`asyncio.to_thread`), so the caller's event
loop stays free. Its model asks for `tool_choice="auto"`: smolagents' default, "required", forces a
call, which needs constrained decoding the learner cannot reproduce (the gateway refuses it, a 400).

A function `await agent(task, base_url, api_key)` (task.prompt is the question). Trained with
tracerl (harnesses/programs/openai_agent.py, docs/frameworks.md):

    python scripts/train.py experiment=smollm2_smolagents   # conf/harness/smolagents.yaml
"""

from __future__ import annotations

import asyncio
import importlib.resources

import yaml
from smolagents import LogLevel, OpenAIModel, ToolCallingAgent, tool

from examples.calculator_agent import calculator as evaluate  # the hardened evaluator: model text never raises

MAX_STEPS = 2  # tool-calling steps; past them smolagents asks the model once more for a final answer
# smolagents' own prompts with a short system prompt: its default (about 1,000 SmolLM2 tokens of
# examples with notional tools) would take half of a small model's 2,048-token context
PROMPTS = yaml.safe_load(importlib.resources.files("smolagents.prompts").joinpath("toolcalling_agent.yaml").read_text())
PROMPTS["system_prompt"] = (
    "Solve the task. Call the calculator tool for arithmetic, then call the final_answer tool with the answer."
    "{% if custom_instructions %}\n{{ custom_instructions }}{% endif %}"
)


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses.

    Args:
        expression: the expression, e.g. "3 * (4 + 5)".
    """
    return evaluate(expression)


def solve(question: str, base_url: str, api_key: str) -> str:
    model = OpenAIModel(
        "solver", api_base=base_url, api_key=api_key, client_kwargs={"max_retries": 0}, tool_choice="auto"
    )
    solver = ToolCallingAgent(
        tools=[calculator],
        model=model,
        prompt_templates=PROMPTS,
        max_steps=MAX_STEPS,
        instructions="Give the final answer in <answer></answer> tags.",
        verbosity_level=LogLevel.OFF,
    )
    return str(solver.run(question))


async def agent(task, base_url: str, api_key: str) -> str:
    return await asyncio.to_thread(solve, task.prompt, base_url, api_key)
