"""The Responses API (`POST .../v1/responses`, the OpenAI Agents SDK's default) as the gateway's chat
completions: a request becomes a chat request, the chat result becomes a Response, and its stream
the Responses events.

What is taken: `input` as a string or a list of items (messages with text parts, `function_call` and
`function_call_output` items, as clients resend a conversation), `instructions` (a system message
first), `previous_response_id` (the gateway keeps each response's whole conversation in the session:
the new input continues it; the same instructions again are not repeated, other ones are added as a
system message after the conversation rather than put in place of the first), function `tools` and
`tool_choice` auto/none, `max_output_tokens`, `temperature`, `stream`. Fields that do not change
what is sampled are accepted and have no effect (`store`, `metadata`, `user`, `parallel_tool_calls`,
`service_tier`, `prompt_cache_key`, `safety_identifier`, `text` with the plain text format, an empty
`include`, `truncation: disabled`). Everything else is refused with an OpenAI-style 400 naming it:
what the learner cannot reproduce (structured output, `top_p` < 1, a forced tool), what would cut
the history the learner trains on (`truncation: auto`), and what this gateway does not implement
(built-in tools, images and files, `background`, reasoning items, stored prompts, conversations).

The conversation a chat request carries is the one the chat completions path compares with earlier
calls, so a resent or continued conversation extends the earlier call's ids token-exact there
(rollout/gateway/prompts.py): output items come back as input items with the same text and call ids.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from rollout.gateway.messages import RequestError
from rollout.gateway.sessions import Session

# Responses fields with no effect on what is sampled: accepted, with the values that are a no-op
_IGNORED = ("store", "metadata", "user", "parallel_tool_calls", "service_tier", "prompt_cache_key", "safety_identifier")
_NEUTRAL = {
    "text": (None, {}, {"format": {"type": "text"}}),
    "include": (None, []),
    "truncation": (None, "disabled"),
    "background": (None, False),
    "reasoning": (None, {}),
    "max_tool_calls": (None,),
    "prompt": (None,),
    "conversation": (None,),
    "top_logprobs": (None, 0),
}
_WHY = {
    "text": "structured output needs constrained decoding, which the learner cannot reproduce; use the text format",
    "truncation": "'auto' would drop history the learner trains on; leave it 'disabled'",
    "reasoning": "this model has no reasoning settings",
}
_TAKEN = {"model", "input", "instructions", "previous_response_id", "tools", "tool_choice", "stream"}
_TAKEN |= {"max_output_tokens", "temperature", "top_p", *_IGNORED, *_NEUTRAL}
_TEXT_PARTS = ("input_text", "output_text", "text")


def _text(content: Any, where: str) -> str:
    """A message item's content as text: a string or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") in _TEXT_PARTS for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise RequestError(f"{where}.content must be a string or a list of text parts (no images or files)", where)


def input_messages(items: Any) -> list[dict]:
    """The request's `input` as chat messages: a string is one user message; a `function_call`
    item joins the assistant message just before it (or starts one), a `function_call_output`
    is a tool message."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise RequestError("input must be a string or a non-empty list of items", "input")
    out: list[dict] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            if item.get("role") not in ("system", "developer", "user", "assistant"):
                raise RequestError(f"{where} needs a role of system, developer, user or assistant", where)
            out.append({"role": item["role"], "content": _text(item.get("content"), where)})
        elif kind == "function_call":
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
                raise RequestError(f"{where}: a function_call needs call_id, name and arguments as strings", where)
            call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"]}}
            call["function"]["arguments"] = item["arguments"]
            if not out or out[-1]["role"] != "assistant":
                out.append({"role": "assistant", "content": ""})
            out[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else _text(output, where)
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": content})
        else:
            raise RequestError(
                f"{where}: items of type {str(kind)[:40]!r} are not supported (message, function_call and "
                f"function_call_output are)",
                where,
            )
    return out


def chat_tools(tools: Any) -> list[dict] | None:
    """Function tools in the chat format; any other kind (built-in tools) is refused."""
    if not tools:
        return None
    if not isinstance(tools, list) or not all(
        isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("name"), str) for t in tools
    ):
        raise RequestError(
            "tools must be a list of {type: function, name, description, parameters}: built-in tools "
            "(web search, file search, computer use, code interpreter) are not supported",
            "tools",
        )
    return [
        {
            "type": "function",
            "function": {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None},
        }
        for t in tools
    ]


def chat_request(body: dict, history: list[dict] | None) -> dict:
    """The chat completions request a Responses request makes: `history` (the conversation of its
    previous_response_id) + `instructions` + its input."""
    unknown = sorted(set(body) - _TAKEN)
    if unknown:
        raise RequestError(f"{unknown[0]} is not supported by tracerl's gateway; leave it out", unknown[0])
    for key, neutral in _NEUTRAL.items():
        if body.get(key) not in neutral:
            why = _WHY.get(key, "tracerl's gateway does not implement it")
            raise RequestError(f"{key}={str(body[key])[:100]} is not supported: {why}", key)
    messages = list(history or [])
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise RequestError("instructions must be a string", "instructions")
    # continuing a response, the same instructions are its first message already; other ones are
    # added, not put in place of the old (which would end the token-exact continuation)
    if instructions is not None and not (messages and messages[0] == {"role": "system", "content": instructions}):
        messages.append({"role": "system", "content": instructions})
    messages += input_messages(body.get("input"))
    chat = {"messages": messages, "n": 1}
    tools = chat_tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    for key, chat_key in (("tool_choice", "tool_choice"), ("max_output_tokens", "max_tokens")):
        if body.get(key) is not None:
            chat[chat_key] = body[key]
    for key in ("temperature", "top_p"):
        if body.get(key) is not None:
            chat[key] = body[key]
    return chat


def response_object(result: dict, body: dict, response_id: str) -> dict:
    """The Response of a chat completions result (one choice): a message item for its text, a
    function_call item per tool call; `incomplete` when max_output_tokens cut it."""
    [choice] = result["choices"]
    message, output = choice["message"], []
    if message.get("content"):
        part = {"type": "output_text", "text": message["content"], "annotations": []}
        output.append(
            {
                "type": "message",
                "id": f"msg_{response_id[5:]}",
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
        )
    for k, call in enumerate(message.get("tool_calls") or []):
        fn = call["function"]
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{response_id[5:]}_{k}",
                "call_id": call["id"],
                "name": fn["name"],
                "arguments": fn["arguments"],
                "status": "completed",
            }
        )
    cut = choice["finish_reason"] == "length"
    usage = result["usage"]
    return {
        "id": response_id,
        "object": "response",
        "created_at": result["created"],
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "model": result["model"],
        "output": output,
        "instructions": body.get("instructions"),
        "previous_response_id": body.get("previous_response_id"),
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "metadata": body.get("metadata") or {},
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
    }


def response_events(response: dict) -> AsyncIterator[str]:
    """The Response as the Responses API's server-sent events, whole items at once (the engine
    answers a request once it is complete): created, each item added / its text or arguments /
    done, completed."""

    def item_events(index: int, item: dict) -> list[dict]:
        where = {"output_index": index, "item_id": item["id"]}
        start = {**item, "status": "in_progress"}
        if item["type"] == "message":
            start["content"] = []
        events = [{"type": "response.output_item.added", "output_index": index, "item": start}]
        if item["type"] == "message":
            part = item["content"][0]
            empty = {**part, "text": ""}
            events += [
                {"type": "response.content_part.added", **where, "content_index": 0, "part": empty},
                {"type": "response.output_text.delta", **where, "content_index": 0, "delta": part["text"]},
                {"type": "response.output_text.done", **where, "content_index": 0, "text": part["text"]},
                {"type": "response.content_part.done", **where, "content_index": 0, "part": part},
            ]
        else:
            events += [
                {"type": "response.function_call_arguments.delta", **where, "delta": item["arguments"]},
                {"type": "response.function_call_arguments.done", **where, "arguments": item["arguments"]},
            ]
        return events + [{"type": "response.output_item.done", "output_index": index, "item": item}]

    async def events():
        opening = {**response, "status": "in_progress", "output": [], "usage": None}
        sequence = [{"type": "response.created", "response": opening}]
        sequence.append({"type": "response.in_progress", "response": opening})
        for index, item in enumerate(response["output"]):
            sequence += item_events(index, item)
        done = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        sequence.append({"type": done, "response": response})
        for n, event in enumerate(sequence):
            yield f"event: {event['type']}\ndata: {json.dumps({**event, 'sequence_number': n})}\n\n"

    return events()


def to_chat(session: Session, role: str, body: dict) -> dict:
    """The chat request a Responses request asks for, continuing its previous_response_id's conversation."""
    return chat_request(body, session.history(role, body.get("previous_response_id")))


def reply(session: Session, role: str, body: dict, chat: dict, result: dict) -> tuple[dict, AsyncIterator[str] | None]:
    """The chat result as a Response (and its events, streamed); the response's conversation is
    kept for a later request's previous_response_id."""
    response_id = f"resp_{session.id}_{len(session.responses)}"
    message = result["choices"][0]["message"]
    session.responses[response_id] = (role, chat["messages"] + [{**message, "content": message["content"] or ""}])
    response = response_object(result, body, response_id)
    return response, response_events(response) if body.get("stream") else None
