"""An agent written only against the `openai` package, as an agent you already have would be.

It answers a question over a few turns, with a calculator tool it may call:
the model's reply either calls the tool (the result goes back as a `tool`
message) or answers; if the answer lacks `<answer>` tags it is asked once
more for them. Nothing here knows about tracerl.

Two ways to run it:
- a program: `python examples/calculator_agent.py` reads the question on
  stdin, talks to OPENAI_BASE_URL with OPENAI_API_KEY, prints its answer;
- a function: `await agent(task, base_url, api_key)` (task.prompt is the question).

Trained with tracerl (harnesses/programs/openai_agent.py):
    python scripts/train.py experiment=smollm2_openai_agent
"""

from __future__ import annotations

import ast
import asyncio
import json
import math
import operator
import os
import sys

from openai import AsyncOpenAI

SYSTEM = "Solve the problem. You may use the calculator for arithmetic."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
# The model writes the argument: a longer one is refused unread. 1000 characters bound an integer result
# to about 1000 digits (no power operator) and the evaluation's recursion to a few hundred levels.
MAX_EXPRESSION_CHARS = 1000


def calculator(expression: str) -> str:
    """The value of an arithmetic expression, or what is wrong with it: model-written text never
    raises here (a 310-digit literal, a 5,000-term sum, 1e400)."""

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError("only numbers, + - * / and parentheses")

    expression = str(expression)
    if len(expression) > MAX_EXPRESSION_CHARS:
        return f"error: {len(expression)} characters (the limit is {MAX_EXPRESSION_CHARS})"
    try:
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ArithmeticError, RecursionError, MemoryError) as e:
        return f"error: {e or type(e).__name__}"
    if isinstance(result, float):
        if not math.isfinite(result):
            return "error: the result is too large"
        return str(int(result)) if result.is_integer() else str(result)
    return str(result)


async def solve(client: AsyncOpenAI, question: str, max_turns: int = 3, max_tokens: int = 128) -> str:
    model = (await client.models.list()).data[0].id
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    reply = None
    for _ in range(max_turns):
        response = await client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, max_tokens=max_tokens
        )
        reply = response.choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (ValueError, AttributeError):
                expression = call.function.arguments
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculator(expression)})
    if "<answer>" not in (reply.content or ""):
        messages.append({"role": "user", "content": "Give your final answer as <answer>...</answer>."})
        response = await client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens)
        reply = response.choices[0].message
    return reply.content or ""


async def agent(task, base_url: str, api_key: str, question: str | None = None) -> str:
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        return await solve(client, task.prompt if question is None else question)


def main() -> None:
    question = sys.stdin.read()
    print(asyncio.run(agent(None, os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], question)))


if __name__ == "__main__":
    main()
