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
out of the generated text either way (rollout/agents/tool_calls.py).

Sampling honesty. `temperature`, `max_tokens` / `max_completion_tokens`,
`stop`, `n` and `seed` (ignored: calls are seeded from the run's seed) are
taken; settings whose distribution the learner cannot reproduce (`top_p` < 1,
`logit_bias`, penalties, structured outputs, a forced tool choice) are
refused with an OpenAI-style 400 error that says why, as are fields the
gateway does not implement (`logprobs`, `chat_template_kwargs`, ...).
`max_tokens` is clamped to the context the prompt leaves (the agent's
`max_model_len`), and a prompt that does not fit is a 400, as in vLLM's server. The request checks,
message normalisation and the SSE stream are rollout/agents/messages.py; this module serves and keeps sessions.

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
from typing import TYPE_CHECKING

from rollout.agents.messages import RequestError, error_response, normalize, request_tools, sampling_args, sse_events
from rollout.agents.tool_calls import native_tools, parse_tool_calls, template_messages
from rollout.orchestration.router import EngineError

if TYPE_CHECKING:  # the Agent's module imports this one (an Agent hands its harness the gateway)
    from rollout.agents.client import Agent

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 8 * 2**20  # a request body larger than this is refused (413) before it is read whole


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
            raise RuntimeError(
                f"the gateway failed a request of this run: {type(self.failure).__name__}: {self.failure}"
            ) from self.failure


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
        config = uvicorn.Config(
            self.app(), log_level="warning", access_log=False, timeout_keep_alive=30, lifespan="off"
        )
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
        session = Session(
            sid,
            f"http://{self.host}:{self.port}/s/{sid}",
            {r: _Role(a) for r, a in agents.items()},
            api_key=secrets.token_urlsafe(32),
        )
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
            return error_response(str(e.detail), e.status_code)

        return Starlette(
            routes=[
                Route("/s/{session}/{role}/v1/chat/completions", self._answering(self._chat), methods=["POST"]),
                Route("/s/{session}/{role}/v1/models", self._answering(self._models), methods=["GET"]),
                Route("/s/{session}/{role}/v1/reward", self._answering(self._reward), methods=["POST"]),
            ],
            exception_handlers={HTTPException: http_error},
        )

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
                return error_response(
                    f"the model's engine failed this request ({e}); tracerl runs the episode again",
                    503,
                    code="engine_unavailable",
                )
            except Exception as e:
                log.exception("gateway request %s failed", request.url.path)
                self._fail(request, e)
                return error_response(f"internal error of the tracerl gateway: {type(e).__name__}: {e}", 500)

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
            raise RequestError(
                "missing or wrong API key: send this session's key as 'Authorization: Bearer <key>' "
                "(the harness gives the agent its api_key argument, or OPENAI_API_KEY)",
                status=401,
                code="invalid_api_key",
            )
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
            return StreamingResponse(sse_events(result, body), media_type="text/event-stream")
        return JSONResponse(result)

    # ---- completions ---------------------------------------------------------------------

    async def complete(self, session: Session, role: str, body: dict) -> dict:
        """One chat completion request of `role` in `session`: its prompt ids (continued or fresh),
        one Agent call per choice, the OpenAI response body."""
        sampling = sampling_args(body)
        n = sampling.pop("n")
        tools = request_tools(body)
        messages = normalize(body.get("messages"))
        slot = session.roles[role]
        fmt = slot.agent.format
        prompt, parent = _prompt(slot, messages, tools)
        context = slot.agent.max_model_len
        if context is not None:  # as vLLM's server: refuse a prompt that does not fit, clamp max_tokens to the rest
            if len(prompt) >= context:
                raise RequestError(
                    f"This model's maximum context length is {context} tokens; your messages are "
                    f"{len(prompt)} tokens. Shorten them.",
                    "messages",
                    code="context_length_exceeded",
                )
            sampling["max_tokens"] = min(
                sampling.get("max_tokens", slot.agent.sampling.max_tokens), context - len(prompt)
            )
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
                message["tool_calls"] = [
                    {"id": t["id"], "type": "function", "function": {"name": t["name"], "arguments": t["arguments"]}}
                    for t in calls
                ]
            finish = "tool_calls" if calls else ("length" if c.finish_reason == "length" else "stop")
            choices.append({"index": i, "message": message, "finish_reason": finish, "logprobs": None})
        return {
            "id": f"chatcmpl-{session.id}-{len(slot.calls)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": slot.agent.policy,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt) * n,
                "completion_tokens": completion_tokens,
                "total_tokens": len(prompt) * n + completion_tokens,
            },
        }


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
                return call.ids + fmt.continuation(call.ids, template_messages(messages[k:], fmt, None)), call.index
        return fmt.render(template_messages(messages, fmt, tools), tools=native_tools(fmt, tools)), None
    except (TemplateError, TypeError, ValueError, RecursionError) as e:
        raise RequestError(
            f"the chat template could not render these messages: {type(e).__name__}: {e}", "messages"
        ) from None


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
