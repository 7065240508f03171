"""An OpenAI-compatible chat endpoint for agents tracerl did not write, recording every call token-exact.

An agent written against the `openai` package (or any framework that speaks
its chat API) trains unmodified: a harness opens a session on the rollout
worker's `Gateway` and gives the agent a base URL per role,

    http://127.0.0.1:PORT/s/<session>/<role>/v1

serving `POST .../chat/completions` (with `stream=true` too) and
`GET .../models`; `POST .../reward` (`{"reward": r}`) lets the agent report
its own reward. Every completion is a call of that role's `Agent`, so it becomes a
`Sequence` of the session's trace, with its role, policy, version and
sampling temperature, exactly as for harnesses written against `Agent`.

Token-exact histories. Chat APIs resend the whole message list every turn.
When a request's messages are an earlier call's messages + the reply this
gateway returned for it (+ new messages), the prompt is that call's prompt +
completion ids + the template's continuation for the new messages (what
`Conversation` does): generated text is never re-tokenized, and the trainer
merges the calls into one row. Any other history (rewritten, truncated, or a
reply the agent edited) is rendered fresh and starts a new row. Both are
counted (`extended`, `fresh`: `rollout/gateway_extended`, `rollout/gateway_fresh`).

Tools. Tool definitions and tool calls go through the chat template when it
renders them; otherwise the gateway describes the tools in the system
message and asks for `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
(the Hermes convention many templates use natively). Tool calls are parsed
out of the generated text either way.

Sampling honesty. `temperature`, `max_tokens` / `max_completion_tokens`,
`stop`, `n` and `seed` (ignored: calls are seeded from the run's seed) are
taken; settings whose distribution the learner cannot reproduce (`top_p` < 1,
`logit_bias`, penalties, structured outputs, a forced tool choice) are
refused with an OpenAI-style 400 error that says why, as are fields the
gateway does not implement (`logprobs`, `chat_template_kwargs`, ...).
`max_tokens` is clamped to the context the prompt leaves (the agent's
`max_model_len`), and a prompt that does not fit is a 400, as in vLLM's server.

Model and agent text is hostile input (issue 26). Each session has its own
key: every request needs `Authorization: Bearer <Session.api_key>` (the
harness hands it to the agent), else a 401. A body over `max_body_bytes` is
a 413, read no further. Tool calls are found with `str.find`, in time linear
in the text. Every error is an OpenAI-style JSON body: the request's fault a
4xx; an engine failure a 503 (`engine_unavailable`) and a gateway bug a 500,
both kept on the session (`Session.failure`) so that the harness raises them
when its agent is done: the worker runs an episode an engine failed again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from rollout.agents.client import Agent
from rollout.orchestration.router import EngineError

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 8 * 2**20  # a request body larger than this is refused (413) before it is read whole
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_TOOL_PROMPT = ("You can call the functions below. To call one, reply with only\n<tool_call>\n"
                '{"name": "<function name>", "arguments": {<arguments as JSON>}}\n</tool_call>\n'
                "and you will get its result in the next message.\nFunctions:\n")


class RequestError(Exception):
    """A request the gateway refuses: becomes an OpenAI-style error response."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.param, self.status, self.code = param, status, code

    def response(self):
        return _error(str(self), self.status, self.param, self.code)


def _error(message: str, status: int, param: str | None = None, code: str | None = None):
    """An error response with OpenAI's body, which SDKs parse into their exception's message."""
    from starlette.responses import JSONResponse

    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status)


# ---- messages ------------------------------------------------------------------------------

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
                msg["tool_calls"] = [{"id": c.get("id"), "name": c["function"]["name"],
                                      "arguments": c["function"].get("arguments") or "{}"} for c in calls]
                if not all(isinstance(c["arguments"], str) for c in msg["tool_calls"]):
                    raise TypeError
            except (AttributeError, KeyError, TypeError):
                raise RequestError(f"{where}.tool_calls must be a list of {{id, function: {{name, arguments}}}} "
                                   f"with arguments a JSON string", where) from None
        out.append(msg)
    return out


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
        yield start, end + len(_CLOSE), text[start + len(_OPEN):end].strip()
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
        calls.append({"id": f"call_{session[:8]}_{counter + len(calls)}", "name": name,
                      "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)})
    content = ("".join(kept) + text[last:]).strip() if calls else text
    return (content or None) if calls else content, calls


# ---- sessions ------------------------------------------------------------------------------

@dataclass
class _Call:
    history: list[dict]  # the request's messages + the reply returned (normalized)
    ids: list[int]  # its prompt + completion ids
    index: int  # its sequence in the trace


@dataclass
class _Role:
    agent: Agent
    calls: list[_Call] = field(default_factory=list)


@dataclass
class Session:
    """One harness run's endpoint: a base URL per role; what the agent reported as its reward."""

    id: str
    base: str  # http://host:port/s/<id>
    roles: dict[str, _Role]
    api_key: str  # every request must carry it as `Authorization: Bearer <api_key>`
    reward: float | None = None
    failure: Exception | None = None  # the first engine failure (EngineError) or gateway bug of a request
    extended: int = 0  # calls whose prompt continued an earlier call's ids
    fresh: int = 0  # calls rendered from their messages
    tool_calls: int = 0

    def base_url(self, role: str) -> str:
        return f"{self.base}/{role}/v1"

    def reward_url(self, role: str) -> str:
        return f"{self.base_url(role)}/reward"

    def counts(self) -> dict[str, int]:
        return {"gateway_extended": self.extended, "gateway_fresh": self.fresh, "gateway_tool_calls": self.tool_calls}

    def raise_failure(self) -> None:
        """Raise what failed a request of this session, if anything did, once the agent is done
        (it may have swallowed the error): an EngineError as itself, so that the worker runs the
        episode again (rollout.retries); a gateway bug as a RuntimeError that names it."""
        if isinstance(self.failure, EngineError):
            raise self.failure
        if self.failure is not None:
            raise RuntimeError(f"the gateway failed a request of this run: {type(self.failure).__name__}: "
                               f"{self.failure}") from self.failure


def _quiet_server(config):
    """A uvicorn server that leaves signal handling alone (it runs in a Ray actor's event loop)."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            yield

    return Server(config)


class Gateway:
    """The endpoint of one rollout worker process; `await Gateway.shared()` starts it on first use."""

    _shared: Gateway | None = None
    _starting: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    def __init__(self, host: str = "127.0.0.1", max_body_bytes: int = MAX_BODY_BYTES):
        self.host = host
        self.max_body_bytes = max_body_bytes
        self.port = 0
        self.sessions: dict[str, Session] = {}
        self._server = None
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def serving(self) -> bool:
        """Up, and in the event loop that is running now."""
        loop = asyncio.get_running_loop()
        return self._loop is loop and self._task is not None and not self._task.done()

    @classmethod
    async def shared(cls, start_timeout_s: float = 30.0) -> Gateway:
        """This process's gateway, started in the running event loop the first time (the episodes
        that ask at once wait for the one start)."""
        loop = asyncio.get_running_loop()
        if cls._starting is None or cls._starting[0] is not loop:
            cls._starting = (loop, asyncio.Lock())
        async with cls._starting[1]:
            if cls._shared is None or not cls._shared.serving:
                gateway = cls()
                await gateway.start(start_timeout_s)
                cls._shared = gateway
        return cls._shared

    async def start(self, timeout_s: float = 30.0) -> None:
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app(), log_level="warning", access_log=False, timeout_keep_alive=30,
                                lifespan="off")
        self._server = _quiet_server(config)
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.ensure_future(self._server.serve(sockets=[sock]))
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if self._task.done():
                raise RuntimeError(f"the gateway did not start: {self._task.exception()!r}")
            if time.monotonic() > deadline:
                self._task.cancel()
                raise TimeoutError(f"the gateway did not start listening on {self.host} within {timeout_s} s")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._task, 10)

    @contextlib.contextmanager
    def session(self, agents: dict[str, Agent]):
        """A session for one harness run: its `base_url(role)` for each of `agents`' roles, and the
        `api_key` its requests must carry."""
        sid = secrets.token_hex(12)
        session = Session(sid, f"http://{self.host}:{self.port}/s/{sid}", {r: _Role(a) for r, a in agents.items()},
                          api_key=secrets.token_urlsafe(32))
        self.sessions[sid] = session
        try:
            yield session
        finally:
            del self.sessions[sid]

    # ---- HTTP ----------------------------------------------------------------------------

    def app(self):
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.routing import Route

        async def http_error(request, e):  # unknown paths and methods: JSON too
            return _error(str(e.detail), e.status_code)

        return Starlette(routes=[
            Route("/s/{session}/{role}/v1/chat/completions", self._answering(self._chat), methods=["POST"]),
            Route("/s/{session}/{role}/v1/models", self._answering(self._models), methods=["GET"]),
            Route("/s/{session}/{role}/v1/reward", self._answering(self._reward), methods=["POST"]),
        ], exception_handlers={HTTPException: http_error})

    def _answering(self, handler):
        """`handler` with whatever it raises answered as an OpenAI-style error: a RequestError as
        the one it describes; an engine failure as a 503 and anything else as a 500, both kept
        on the session for its harness to raise when the agent is done."""
        async def endpoint(request):
            try:
                return await handler(request)
            except RequestError as e:
                return e.response()
            except EngineError as e:
                self._fail(request, e)
                return _error(f"the model's engine failed this request ({e}); tracerl runs the episode again",
                              503, code="engine_unavailable")
            except Exception as e:
                log.exception("gateway request %s failed", request.url.path)
                self._fail(request, e)
                return _error(f"internal error of the tracerl gateway: {type(e).__name__}: {e}", 500)

        return endpoint

    def _fail(self, request, e: Exception) -> None:
        session = self.sessions.get(request.path_params.get("session"))
        if session is not None and session.failure is None:
            session.failure = e

    def _lookup(self, request) -> tuple[Session, str]:
        session = self.sessions.get(request.path_params["session"])
        if session is None:
            raise RequestError("unknown session: this URL's harness run has ended (or never began)", status=404)
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), session.api_key.encode()):
            raise RequestError("missing or wrong API key: send this session's key as 'Authorization: Bearer <key>' "
                               "(the harness gives the agent its api_key argument, or OPENAI_API_KEY)",
                               status=401, code="invalid_api_key")
        role = request.path_params.get("role")
        if role is not None and role not in session.roles:
            raise RequestError(f"role {role!r} is not in this run; its roles are {sorted(session.roles)}", status=404)
        return session, role

    async def _models(self, request):
        from starlette.responses import JSONResponse

        session, role = self._lookup(request)
        policy = session.roles[role].agent.policy
        return JSONResponse({"object": "list", "data": [{"id": policy, "object": "model", "owned_by": "tracerl"}]})

    async def _reward(self, request):
        from starlette.responses import JSONResponse

        session, _ = self._lookup(request)
        reward = (await _json(request, self.max_body_bytes)).get("reward")
        if type(reward) not in (int, float) or reward != reward or abs(reward) == float("inf"):
            raise RequestError("reward must be a finite number", "reward")
        session.reward = float(reward)
        return JSONResponse({"reward": session.reward})

    async def _chat(self, request):
        from starlette.responses import JSONResponse, Response, StreamingResponse

        session, role = self._lookup(request)
        body = await _json(request, self.max_body_bytes)
        result = await _unless_disconnected(request, self.complete(session, role, body))
        if result is None:  # the client left: its generations were aborted, nothing was recorded
            return Response(status_code=499)
        if body.get("stream"):
            return StreamingResponse(_sse(result, body), media_type="text/event-stream")
        return JSONResponse(result)

    # ---- completions ---------------------------------------------------------------------

    async def complete(self, session: Session, role: str, body: dict) -> dict:
        """One chat completion request of `role` in `session`: its prompt ids (continued or fresh),
        one Agent call per choice, the OpenAI response body."""
        sampling = _sampling(body)
        n = sampling.pop("n")
        tools = _tools(body)
        messages = normalize(body.get("messages"))
        slot = session.roles[role]
        fmt = slot.agent.format
        prompt, parent = _prompt(slot, messages, tools)
        context = slot.agent.max_model_len
        if context is not None:  # as vLLM's server: refuse a prompt that does not fit, clamp max_tokens to the rest
            if len(prompt) >= context:
                raise RequestError(f"This model's maximum context length is {context} tokens; your messages are "
                                   f"{len(prompt)} tokens. Shorten them.", "messages", code="context_length_exceeded")
            sampling["max_tokens"] = min(sampling.get("max_tokens", slot.agent.sampling.max_tokens),
                                         context - len(prompt))
        if parent is None:
            session.fresh += n
        else:
            session.extended += n
        outs = await asyncio.gather(*(slot.agent.generate(prompt, parent=parent, **sampling) for _ in range(n)))
        choices, completion_tokens = [], 0
        for i, (c, index) in enumerate(outs):
            text = fmt.decode(c.completion_ids)
            content, calls = parse_tool_calls(text, session.id, session.tool_calls) if tools else (text, [])
            session.tool_calls += len(calls)
            reply = {"role": "assistant", "content": content or ""}
            if calls:
                reply["tool_calls"] = calls
            slot.calls.append(_Call(messages + [reply], prompt + c.completion_ids, index))
            completion_tokens += len(c.completion_ids)
            message = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = [{"id": t["id"], "type": "function",
                                          "function": {"name": t["name"], "arguments": t["arguments"]}}
                                         for t in calls]
            finish = "tool_calls" if calls else ("length" if c.finish_reason == "length" else "stop")
            choices.append({"index": i, "message": message, "finish_reason": finish, "logprobs": None})
        return {"id": f"chatcmpl-{session.id}-{len(slot.calls)}", "object": "chat.completion",
                "created": int(time.time()), "model": slot.agent.policy, "choices": choices,
                "usage": {"prompt_tokens": len(prompt) * n, "completion_tokens": completion_tokens,
                          "total_tokens": len(prompt) * n + completion_tokens}}


def _prompt(slot: _Role, messages: list[dict], tools: list[dict] | None) -> tuple[list[int], int | None]:
    """The prompt ids of a request and the sequence it continues: the latest earlier call whose
    history + reply the messages extend, else none (rendered fresh). A template that cannot render
    the messages (it raised, or the tools nest too deep) is the request's fault: a 400."""
    from jinja2 import TemplateError

    fmt = slot.agent.format
    try:
        for call in reversed(slot.calls):
            k = len(call.history)
            if len(messages) > k and messages[:k] == call.history:
                return call.ids + fmt.continuation(call.ids, _template_messages(messages[k:], fmt, None)), call.index
        return fmt.render(_template_messages(messages, fmt, tools), tools=_native_tools(fmt, tools)), None
    except (TemplateError, TypeError, ValueError, RecursionError) as e:
        raise RequestError(f"the chat template could not render these messages: {type(e).__name__}: {e}",
                           "messages") from None


async def _unless_disconnected(request, work):
    """Await `work`, unless the client disconnects first: then it is cancelled (its engine requests
    are aborted, see rollout/orchestration/router.py) and None is returned."""
    work = asyncio.ensure_future(work)

    async def gone():
        while (await request.receive())["type"] != "http.disconnect":
            pass

    left = asyncio.ensure_future(gone())
    try:
        await asyncio.wait([work, left], return_when=asyncio.FIRST_COMPLETED)
    finally:
        left.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
    return work.result() if not work.cancelled() else None


async def _json(request, limit: int) -> dict:
    """The request's JSON object body, read no further than `limit` bytes (else a 413)."""
    too_large = RequestError(f"the request body is over the gateway's limit of {limit} bytes", status=413)
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():  # a chunked body has no length: count as it comes
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, RecursionError):  # RecursionError: nested too deep
        raise RequestError("the request body is not JSON (or nests too deep)") from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


# Settings that change the sampled distribution in ways the learner does not reproduce, and the
# values that leave it alone (absent, or one of these).
_REFUSED = {"top_p": (1,), "logit_bias": ({},), "presence_penalty": (0,), "frequency_penalty": (0,),
            "repetition_penalty": (1,), "min_p": (0,), "top_k": (-1, 0), "response_format": ({"type": "text"},),
            "guided_json": (), "guided_regex": (), "guided_choice": (), "guided_grammar": (),
            "structured_outputs": (), "min_tokens": (0,), "bad_words": ([],), "allowed_token_ids": ()}
# Fields this gateway does not implement (rather than answer as if they had been taken).
_UNIMPLEMENTED = {"logprobs": (False,), "top_logprobs": (0,), "chat_template_kwargs": ({},),
                  "continue_final_message": (False,), "add_generation_prompt": (True,), "echo": (False,)}


def _sampling(body: dict) -> dict:
    """The Agent.generate keyword arguments of a request (+ n), or a RequestError saying why not."""
    for key, neutral in _REFUSED.items():
        value = body.get(key)
        if value is not None and value not in neutral:
            raise RequestError(f"{key}={str(value)[:100]} is not supported: the learner scores each token under "
                               f"the model's full distribution at the sampling temperature, and cannot reproduce "
                               f"{key}; leave it out", key)
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
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise RequestError("stop must be a string or a list of strings", "stop")
        out["stop"] = stop
    n = body.get("n", 1)
    if type(n) is not int or not 1 <= n <= 16:
        raise RequestError("n must be an integer in [1, 16]", "n")
    out["n"] = n
    return out


def _tools(body: dict) -> list[dict] | None:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise RequestError(f"tool_choice={choice!r} is not supported: forcing a call needs constrained decoding, "
                           f"which the learner cannot reproduce; use 'auto'", "tool_choice")
    if not tools or choice == "none":
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("type") == "function"
                                              and isinstance(t.get("function"), dict)
                                              and isinstance(t["function"].get("name"), str) for t in tools):
        raise RequestError("tools must be a list of {type: function, function: {name, description, parameters}}",
                           "tools")
    return tools


def _native_tools(fmt, tools: list[dict] | None) -> list[dict] | None:
    """The tools to hand the chat template, if it renders tools itself."""
    return tools if tools and fmt.renders_tools else None


def _template_messages(messages: list[dict], fmt, tools: list[dict] | None) -> list[dict]:
    """Messages as the chat template takes them. A template that does not render tools gets them
    as text: the tool list in the system message, each tool call as a <tool_call> block."""
    native = fmt.renders_tools
    out = []
    for m in messages:
        msg = {"role": m["role"], "content": m["content"]}
        if m.get("tool_calls"):
            if native:
                msg["tool_calls"] = [{"id": c["id"], "type": "function",
                                      "function": {"name": c["name"], "arguments": _arguments(c)}}
                                     for c in m["tool_calls"]]
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
        raise RequestError(f"the arguments of tool call {call['name']!r} are not JSON: {call['arguments'][:200]!r}",
                           "messages") from None


def _sse(result: dict, body: dict):
    """The response as server-sent chat.completion.chunk events (whole choices: the engine answers
    a request once it is complete)."""
    async def events():
        base = {"id": result["id"], "object": "chat.completion.chunk", "created": result["created"],
                "model": result["model"]}
        for choice in result["choices"]:
            msg = choice["message"]
            delta: dict[str, Any] = {"role": "assistant", "content": msg["content"]}
            if msg.get("tool_calls"):
                delta["tool_calls"] = [{"index": k, **t} for k, t in enumerate(msg["tool_calls"])]
            yield _event({**base, "choices": [{"index": choice["index"], "delta": delta, "finish_reason": None}]})
            yield _event({**base, "choices": [{"index": choice["index"], "delta": {},
                                               "finish_reason": choice["finish_reason"]}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            yield _event({**base, "choices": [], "usage": result["usage"]})
        yield "data: [DONE]\n\n"

    return events()


def _event(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"
