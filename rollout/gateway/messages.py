"""The gateway's requests, checked and shaped (rollout/gateway/server.py serves them): OpenAI-style errors,
messages in one normal form, the sampling settings the learner can reproduce (and the refusal of the
others), the tool list, and the streamed response as server-sent events."""

from __future__ import annotations

import json
from typing import Any

# vLLM checks every stop string after every generated token, on the engine's shared output loop:
# 300,000 of them cost 36-66 ms a token (rewards review #11). OpenAI's API takes at most 4.
MAX_STOP = 16
MAX_STOP_CHARS = 256


class RequestError(Exception):
    """A request the gateway refuses: becomes an OpenAI-style error response."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.param, self.status, self.code = param, status, code

    def response(self):
        return error_response(str(self), self.status, self.param, self.code)


def error_response(message: str, status: int, param: str | None = None, code: str | None = None):
    """An error response with OpenAI's body, which SDKs parse into their exception's message."""
    from starlette.responses import JSONResponse

    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status_code=status)


def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, None, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise RequestError(f"{where}.content must be a string or a list of text parts (no images or audio)", where)


def normalize(messages: Any) -> list[dict]:
    """The request's messages in the one form they are compared and rendered in:
    {"role", "content"} (+ "tool_calls": [{"id", "name", "arguments"}] on assistant turns)."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise RequestError(f"{where} needs a role of system, developer, user, assistant or tool", where)
        msg = {"role": "system" if m["role"] == "developer" else m["role"], "content": _text(m.get("content"), where)}
        calls = m.get("tool_calls") or []
        if calls:
            try:
                msg["tool_calls"] = [
                    {
                        "id": c.get("id"),
                        "name": c["function"]["name"],
                        "arguments": c["function"].get("arguments") or "{}",
                    }
                    for c in calls
                ]
                if not all(isinstance(c["arguments"], str) for c in msg["tool_calls"]):
                    raise TypeError
            except (AttributeError, KeyError, TypeError):
                raise RequestError(
                    f"{where}.tool_calls must be a list of {{id, function: {{name, arguments}}}} "
                    f"with arguments a JSON string",
                    where,
                ) from None
        out.append(msg)
    return out


def text_chars(messages: list[dict], tools: list[dict] | None = None) -> int:
    """The characters of the messages' contents (less white space at either end, which templates may
    trim) and of every key and string in `tools`: text a chat template renders verbatim, so a lower
    bound on the characters of the rendered prompt."""
    chars = sum(len(m["content"].strip()) for m in messages)
    stack: list[Any] = [tools] if tools else []
    while stack:  # no recursion: tools may nest as deep as the body's JSON
        value = stack.pop()
        if isinstance(value, str):
            chars += len(value)
        elif isinstance(value, dict):
            chars += sum(len(k) for k in value if isinstance(k, str))
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return chars


# Settings that change the sampled distribution in ways the learner does not reproduce, and the
# values that leave it alone (absent, or one of these).
_REFUSED = {
    "top_p": (1,),
    "logit_bias": ({},),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "repetition_penalty": (1,),
    "min_p": (0,),
    "top_k": (-1, 0),
    "response_format": ({"type": "text"},),
    "guided_json": (),
    "guided_regex": (),
    "guided_choice": (),
    "guided_grammar": (),
    "structured_outputs": (),
    "min_tokens": (0,),
    "bad_words": ([],),
    "allowed_token_ids": (),
}
# Fields this gateway does not implement (rather than answer as if they had been taken).
_UNIMPLEMENTED = {
    "logprobs": (False,),
    "top_logprobs": (0,),
    "chat_template_kwargs": ({},),
    "continue_final_message": (False,),
    "add_generation_prompt": (True,),
    "echo": (False,),
}


def sampling_args(body: dict) -> dict:
    """The Agent.generate keyword arguments of a request (+ n), or a RequestError saying why not."""
    for key, neutral in _REFUSED.items():
        value = body.get(key)
        if value is not None and value not in neutral:
            raise RequestError(
                f"{key}={str(value)[:100]} is not supported: the learner scores each token under "
                f"the model's full distribution at the sampling temperature, and cannot reproduce "
                f"{key}; leave it out",
                key,
            )
    for key, neutral in _UNIMPLEMENTED.items():
        value = body.get(key)
        if value is not None and value not in neutral:
            raise RequestError(f"{key}={str(value)[:100]} is not supported by tracerl's gateway; leave it out", key)
    if not isinstance(body.get("stream_options") or {}, dict):
        raise RequestError("stream_options must be an object", "stream_options")
    out: dict[str, Any] = {}
    temperature = body.get("temperature")
    if temperature is not None:
        if type(temperature) not in (int, float) or not 0 <= temperature <= 2:
            raise RequestError("temperature must be a number in [0, 2]", "temperature")
        out["temperature"] = float(temperature)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        if type(max_tokens) is not int or max_tokens < 1:
            raise RequestError("max_tokens must be a positive integer", "max_tokens")
        out["max_tokens"] = max_tokens
    stop = body.get("stop")
    if stop is not None:
        stop = [stop] if isinstance(stop, str) else stop
        if (
            not isinstance(stop, list)
            or len(stop) > MAX_STOP
            or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stop)
        ):
            raise RequestError(
                f"stop must be a string or a list of at most {MAX_STOP} strings of 1 to {MAX_STOP_CHARS} characters",
                "stop",
            )
        out["stop"] = stop
    n = body.get("n", 1)
    if type(n) is not int or not 1 <= n <= 16:
        raise RequestError("n must be an integer in [1, 16]", "n")
    out["n"] = n
    return out


def request_tools(body: dict) -> list[dict] | None:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise RequestError(
            f"tool_choice={choice!r} is not supported: forcing a call needs constrained decoding, "
            f"which the learner cannot reproduce; use 'auto'",
            "tool_choice",
        )
    if not tools or choice == "none":
        return None
    if not isinstance(tools, list) or not all(
        isinstance(t, dict)
        and t.get("type") == "function"
        and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
        for t in tools
    ):
        raise RequestError(
            "tools must be a list of {type: function, function: {name, description, parameters}}", "tools"
        )
    return tools


def sse_events(result: dict, body: dict):
    """The response as server-sent chat.completion.chunk events (whole choices: the engine answers
    a request once it is complete)."""

    async def events():
        base = {
            "id": result["id"],
            "object": "chat.completion.chunk",
            "created": result["created"],
            "model": result["model"],
        }
        for choice in result["choices"]:
            msg = choice["message"]
            delta: dict[str, Any] = {"role": "assistant", "content": msg["content"]}
            if msg.get("tool_calls"):
                delta["tool_calls"] = [{"index": k, **t} for k, t in enumerate(msg["tool_calls"])]
            yield _event({**base, "choices": [{"index": choice["index"], "delta": delta, "finish_reason": None}]})
            yield _event(
                {**base, "choices": [{"index": choice["index"], "delta": {}, "finish_reason": choice["finish_reason"]}]}
            )
        if (body.get("stream_options") or {}).get("include_usage"):
            yield _event({**base, "choices": [], "usage": result["usage"]})
        yield "data: [DONE]\n\n"

    return events()


def _event(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"
