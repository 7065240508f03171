"""Tool calls as text (the Hermes convention many chat templates use natively): tools described in the
system message for a template that does not render them, tool calls written as `<tool_call>{json}</tool_call>`
blocks, and parsed back out of generated text in time linear in the text."""

from __future__ import annotations

import json
from typing import Any

from rollout.gateway.messages import RequestError

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_TOOL_PROMPT = (
    "You can call the functions below. To call one, reply with only\n<tool_call>\n"
    '{"name": "<function name>", "arguments": {<arguments as JSON>}}\n</tool_call>\n'
    "and you will get its result in the next message.\nFunctions:\n"
)


def _call_text(call: dict) -> str:
    try:
        arguments = json.loads(call["arguments"])
    except (TypeError, ValueError, RecursionError):
        arguments = call["arguments"]
    return "<tool_call>\n" + json.dumps({"name": call["name"], "arguments": arguments}) + "\n</tool_call>"


def _tool_blocks(text: str):
    """(start, end, stripped inner text) of each `<tool_call>...</tool_call>` block, found with
    str.find: linear in the text. (The regex `<tool_call>\\s*(.*?)\\s*</tool_call>` this replaces
    backtracked cubically: `<tool_call>` + 2,000 spaces of model output took ~8 s on the worker's
    event loop, which no deadline can pre-empt.)"""
    pos = 0
    while (start := text.find(_OPEN, pos)) != -1:
        end = text.find(_CLOSE, start + len(_OPEN))
        if end == -1:  # no close after this opening, so none after any later one: stop, do not rescan
            return
        yield start, end + len(_CLOSE), text[start + len(_OPEN) : end].strip()
        pos = end + len(_CLOSE)


def parse_tool_calls(text: str, session: str, counter: int) -> tuple[str | None, list[dict]]:
    """Split generated text into its content and the tool calls in it (`<tool_call>{json}</tool_call>`).
    A block that is not a JSON object with a name stays in the content."""
    calls, kept, last = [], [], 0
    for start, end, inner in _tool_blocks(text):
        try:
            obj = json.loads(inner)
            name, arguments = obj["name"], obj.get("arguments", {})
            if not isinstance(name, str):
                raise TypeError
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            continue
        kept.append(text[last:start])
        last = end
        calls.append(
            {
                "id": f"call_{session[:8]}_{counter + len(calls)}",
                "name": name,
                "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
            }
        )
    content = ("".join(kept) + text[last:]).strip() if calls else text
    return (content or None) if calls else content, calls


def native_tools(fmt, tools: list[dict] | None) -> list[dict] | None:
    """The tools to hand the chat template, if it renders tools itself."""
    return tools if tools and fmt.renders_tools else None


def template_messages(messages: list[dict], fmt, tools: list[dict] | None) -> list[dict]:
    """Messages as the chat template takes them. A template that does not render tools gets them
    as text: the tool list in the system message, each tool call as a <tool_call> block."""
    native = fmt.renders_tools
    out = []
    for m in messages:
        msg = {"role": m["role"], "content": m["content"]}
        if m.get("tool_calls"):
            if native:
                msg["tool_calls"] = [
                    {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": _arguments(c)}}
                    for c in m["tool_calls"]
                ]
            else:
                blocks = [_call_text(c) for c in m["tool_calls"]]
                msg["content"] = "\n".join([m["content"], *blocks] if m["content"] else blocks)
        out.append(msg)
    if tools and not native:
        described = _TOOL_PROMPT + "\n".join(json.dumps(t["function"]) for t in tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + described}
        else:
            out.insert(0, {"role": "system", "content": described})
    return out


def _arguments(call: dict) -> Any:
    """A tool call's arguments as the JSON value a template that renders tool calls takes."""
    try:
        return json.loads(call["arguments"])
    except (ValueError, RecursionError):
        raise RequestError(
            f"the arguments of tool call {call['name']!r} are not JSON: {call['arguments'][:200]!r}", "messages"
        ) from None
