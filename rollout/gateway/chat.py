"""Chat completions (`POST .../v1/chat/completions`) as Agent calls: a request's prompt ids (continued
token-exact from an earlier call of its role, or rendered fresh: rollout/gateway/prompts.py), one
`Agent.generate` per choice, and the OpenAI response body or its server-sent chunks.

A wire protocol is a module with two functions, which the server (rollout/gateway/server.py,
`PROTOCOLS`) calls around `complete`: `to_chat(session, role, body)`, the chat completion request
the body asks for, and `reply(session, role, body, chat, result)`, the protocol's response body and,
for a streamed request, its events. This module is the chat protocol itself; rollout/gateway/responses.py
the Responses API; a third protocol is one more module of the same two functions.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from rollout.gateway.messages import normalize, request_tools, sampling_args, sse_events
from rollout.gateway.prompts import Call, prompt_ids, too_long
from rollout.gateway.sessions import Session
from rollout.gateway.tool_calls import parse_tool_calls

OffLoop = Callable[..., Awaitable]  # runs a function on the gateway's render threads


def to_chat(session: Session, role: str, body: dict) -> dict:
    return body


def reply(session: Session, role: str, body: dict, chat: dict, result: dict) -> tuple[dict, AsyncIterator[str] | None]:
    return result, sse_events(result, body) if body.get("stream") else None


async def complete(session: Session, role: str, body: dict, model: str | None, off_loop: OffLoop) -> dict:
    """One chat completion request of `role` in `session`: its prompt ids (continued or fresh), one
    Agent call per choice, the OpenAI response body (its `model`: `model`, else the role's policy)."""
    sampling = sampling_args(body)
    n = sampling.pop("n")
    tools = request_tools(body)
    messages = normalize(body.get("messages"))
    slot = session.roles[role]
    prompt, parent = await prompt_ids(slot.calls, slot.agent, messages, tools, off_loop)
    context = slot.agent.max_model_len
    if context is not None:  # as vLLM's server: refuse a prompt that does not fit, clamp max_tokens to the rest
        if len(prompt) >= context:
            raise too_long(context, f"{len(prompt)} tokens")
        sampling["max_tokens"] = min(sampling.get("max_tokens", slot.agent.sampling.max_tokens), context - len(prompt))
    if parent is None:
        session.fresh += n
    else:
        session.extended += n
    outs = await asyncio.gather(*(slot.agent.generate(prompt, parent=parent, **sampling) for _ in range(n)))
    choices, completion_tokens = [], 0
    for i, (c, index) in enumerate(outs):
        reply, message = _messages(session, slot.agent.format.decode(c.completion_ids), bool(tools))
        slot.calls.append(Call(messages + [reply], prompt + c.completion_ids, index))
        completion_tokens += len(c.completion_ids)
        finish = "tool_calls" if reply.get("tool_calls") else ("length" if c.finish_reason == "length" else "stop")
        choices.append({"index": i, "message": message, "finish_reason": finish, "logprobs": None})
    return {
        "id": f"chatcmpl-{session.id}-{len(slot.calls)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model or slot.agent.policy,
        "choices": choices,
        "usage": {
            "prompt_tokens": len(prompt) * n,
            "completion_tokens": completion_tokens,
            "total_tokens": len(prompt) * n + completion_tokens,
        },
    }


def _messages(session: Session, text: str, tools: bool) -> tuple[dict, dict]:
    """A generated text as the reply the session keeps (what a resent history must match) and as the
    response's message; tool calls parsed out of it where the request offered tools."""
    content, calls = parse_tool_calls(text, session.id, session.tool_calls) if tools else (text, [])
    session.tool_calls += len(calls)
    reply: dict = {"role": "assistant", "content": content or ""}
    message: dict = {"role": "assistant", "content": content}
    if calls:
        reply["tool_calls"] = calls
        message["tool_calls"] = [
            {"id": t["id"], "type": "function", "function": {"name": t["name"], "arguments": t["arguments"]}}
            for t in calls
        ]
    return reply, message
