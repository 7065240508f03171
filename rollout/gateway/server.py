"""An OpenAI-compatible chat endpoint for agents tracerl did not write, recording every call token-exact.

An agent written against the `openai` package (or any framework that speaks
its chat API) trains unmodified: a harness opens a session on the rollout
worker's `Gateway` and gives the agent a base URL per role,

    http://127.0.0.1:PORT/s/<session>/<role>/v1

or one base URL for the whole session, where each request's `model` names
its role (a multi-agent program configured with model names, as frameworks
are, needs only this one URL; an unknown or missing model is a 404 naming
the roles, and `GET .../models` lists them with their policies),

    http://127.0.0.1:PORT/s/<session>/v1

each serving `POST .../chat/completions` (with `stream=true` too),
`POST .../responses` (the Responses API, rollout/gateway/responses.py) and
`GET .../models`; `POST .../reward` (`{"reward": r}`) lets the agent report
its own reward where the harness opened the session with `agent_reward`
(with a key of its own, `Session.reward_key`; else a 403). Every completion
is a call of that role's `Agent`, so it becomes a `Sequence` of the
session's trace, with its role, policy, version and sampling temperature,
exactly as for harnesses written against `Agent`.

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
out of the generated text either way (rollout/gateway/tool_calls.py).

Sampling honesty. `temperature`, `max_tokens` / `max_completion_tokens`,
`stop`, `n` and `seed` (ignored: calls are seeded from the run's seed) are
taken; settings whose distribution the learner cannot reproduce (`top_p` < 1,
`logit_bias`, penalties, structured outputs, a forced tool choice) are
refused with an OpenAI-style 400 error that says why, as are fields the
gateway does not implement (`logprobs`, `chat_template_kwargs`, ...).
`max_tokens` is clamped to the context the prompt leaves (the agent's
`max_model_len`), and a prompt that does not fit is a 400, as in vLLM's server. The request checks,
message normalisation and the SSE stream are rollout/gateway/messages.py, the sessions sessions.py, each
wire protocol a module of its own (chat.py, responses.py: `PROTOCOLS`); this module serves them.

Model and agent text is hostile input (issue 26; rewards review #6-8, #11, #12,
#18). Each session has its own key: every request needs
`Authorization: Bearer <Session.api_key>` (the harness hands it to the agent),
else a 401. Tool calls are found with `str.find`, in time linear in the text.
The gateway never blocks its event loop on a request's size: a request whose
characters cannot fit the model's context is refused before it is rendered,
and rendering and tokenizing run on render threads (rollout/gateway/prompts.py;
tools/bench/gateway_stall.py measures the loop's worst stall). `stop` takes
at most 16 strings of 256 characters. `GatewayLimits` bounds the rest: a body
over `max_body_bytes` is a 413, read no further; a request head over
`max_header_bytes` a 400; a head or body that does not arrive in time is
dropped (a 408); connections past `max_connections` are answered 503 and
closed (rollout/gateway/transport.py); a session's requests past
`max_in_flight` at once are a 429. An agent-reported reward outside
`reward_range` (harness.reward_range), not a finite number, or sent to a run
that takes none, is refused and fails the trace (`RewardRefused`). Every
error is an OpenAI-style JSON body: the request's fault a 4xx; an engine
failure a 503 (`engine_unavailable`) and a gateway bug a 500, both kept on
the session (`Session.failure`) so that the harness raises them when its
agent is done: the worker runs an episode an engine failed again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import secrets
import socket
import time
from types import ModuleType
from typing import TYPE_CHECKING

from rollout.engine.engine import EngineError
from rollout.gateway import chat, responses
from rollout.gateway.messages import RequestError, error_response
from rollout.gateway.sessions import GatewayLimits, Role, Session

if TYPE_CHECKING:
    from rollout.agents.client import Agent

log = logging.getLogger(__name__)

# The wire protocols, by their path under a base URL: each module's `to_chat` and `reply` around one
# chat completion (rollout/gateway/chat.py says what a protocol module is).
PROTOCOLS: dict[str, ModuleType] = {"chat/completions": chat, "responses": responses}


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

    _shared: dict[GatewayLimits, Gateway] = {}
    _starting: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    def __init__(self, host: str = "127.0.0.1", limits: GatewayLimits | None = None):
        self.host = host
        self.limits = limits or GatewayLimits()
        self.port = 0
        self.sessions: dict[str, Session] = {}
        self._server = None
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def serving(self) -> bool:
        """Up, and in the event loop that is running now."""
        loop = asyncio.get_running_loop()
        return self._loop is loop and self._task is not None and not self._task.done()

    @classmethod
    async def shared(cls, limits: GatewayLimits | None = None, start_timeout_s: float = 30.0) -> Gateway:
        """This process's gateway with these limits, started in the running event loop the first
        time (the episodes that ask at once wait for the one start)."""
        limits = limits or GatewayLimits()
        loop = asyncio.get_running_loop()
        if cls._starting is None or cls._starting[0] is not loop:
            cls._starting = (loop, asyncio.Lock())
        async with cls._starting[1]:
            gateway = cls._shared.get(limits)
            if gateway is None or not gateway.serving:
                gateway = cls(limits=limits)
                await gateway.start(start_timeout_s)
                cls._shared[limits] = gateway
        return gateway

    async def start(self, timeout_s: float = 30.0) -> None:
        import uvicorn

        from rollout.gateway.transport import BoundedH11

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self.port = sock.getsockname()[1]
        limits = self.limits
        config = uvicorn.Config(
            self.app(),
            # h11, not httptools: it bounds a request head (httptools parsed a 64 MiB header)
            http=functools.partial(
                BoundedH11, head_timeout_s=limits.head_timeout_s, max_connections=limits.max_connections
            ),
            h11_max_incomplete_event_size=limits.max_header_bytes,
            timeout_keep_alive=limits.keep_alive_s,
            ws="none",
            log_level="warning",
            access_log=False,
            lifespan="off",
        )
        self._pool = concurrent.futures.ThreadPoolExecutor(limits.render_threads, thread_name_prefix="gateway-render")
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
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    @contextlib.contextmanager
    def session(self, agents: dict[str, Agent], agent_reward: bool = False):
        """A session for one harness run: its `base_url(role)` for each of `agents`' roles, and the
        `api_key` its requests must carry. `agent_reward`: the agent may report its reward
        (POST .../reward with the session's `reward_key`, a key of its own)."""
        sid = secrets.token_hex(12)
        session = Session(
            sid,
            f"http://{self.host}:{self.port}/s/{sid}",
            {r: Role(a) for r, a in agents.items()},
            api_key=secrets.token_urlsafe(32),
            reward_key=secrets.token_urlsafe(32) if agent_reward else None,
            reward_range=self.limits.reward_range,
            max_in_flight=self.limits.max_in_flight,
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

        routes = []
        for base in (
            "/s/{session}/{role}/v1",
            "/s/{session}/v1",
        ):  # a role's URL; the session's (`model` names the role)
            routes += [
                Route(f"{base}/{path}", self._answering(self._protocol(p)), methods=["POST"])
                for path, p in PROTOCOLS.items()
            ]
            routes += [
                Route(f"{base}/models", self._answering(self._models), methods=["GET"]),
                Route(f"{base}/reward", self._answering(self._reward), methods=["POST"]),
            ]
        return Starlette(routes=routes, exception_handlers={HTTPException: http_error})

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
        if session is not None:
            session.fail(e)

    def _lookup(self, request, key: str = "api_key") -> tuple[Session, str | None]:
        """The request's session and role (None on the session's own URL), once it shows the
        session's `key` (its api_key, or for the reward route its reward_key when it has one)."""
        session = self.sessions.get(request.path_params["session"])
        if session is None:
            raise RequestError("unknown session: this URL's harness run has ended (or never began)", status=404)
        expected = getattr(session, key) or session.api_key
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), expected.encode()):
            raise RequestError(
                "missing or wrong API key: send this session's key as 'Authorization: Bearer <key>' "
                "(the harness gives the agent its api_key argument, or OPENAI_API_KEY; the reward "
                "route takes its own key: reward_key, or TRACERL_REWARD_KEY)",
                status=401,
                code="invalid_api_key",
            )
        role = request.path_params.get("role")
        if role is not None and role not in session.roles:
            raise RequestError(f"role {role!r} is not in this run; its roles are {sorted(session.roles)}", status=404)
        return session, role

    async def _models(self, request):
        """A role's URL: its policy. The session's URL: its roles, the names its requests' `model` takes."""
        from starlette.responses import JSONResponse

        session, role = self._lookup(request)
        if role is not None:
            policy = session.roles[role].agent.policy
            return JSONResponse({"object": "list", "data": [{"id": policy, "object": "model", "owned_by": "tracerl"}]})
        data = [
            {"id": r, "object": "model", "owned_by": "tracerl", "policy": slot.agent.policy}
            for r, slot in session.roles.items()
        ]
        return JSONResponse({"object": "list", "data": data})

    async def _reward(self, request):
        """The agent's reward, if this run takes one (else a 403); one the gateway refuses (a 400 or
        403) also fails the trace, with the reason: it is never replaced by the verifier's."""
        from starlette.responses import JSONResponse

        session, _ = self._lookup(request, "reward_key")
        session.check_takes_reward()
        reward = session.take_reward((await _json(request, self.limits)).get("reward"))
        return JSONResponse({"reward": reward})

    def _protocol(self, protocol: ModuleType):
        """The endpoint of one wire protocol (`PROTOCOLS`): the request admitted, its body read, its
        role found, one chat completion unless the client leaves, the protocol's reply."""

        async def handler(request):
            from starlette.responses import JSONResponse, Response, StreamingResponse

            session, role = self._lookup(request)
            with session.admitted():
                body = await _json(request, self.limits)
                model = None  # a role's URL answers as its policy, the session's as the role asked for
                if role is None:
                    role = model = session.role_of(body.get("model"))
                asked = protocol.to_chat(session, role, body)
                work = chat.complete(session, role, asked, model, self._off_loop)
                result = await _unless_disconnected(request, work)
            if result is None:  # the client left: its generations were aborted, nothing was recorded
                return Response(status_code=499)
            out, events = protocol.reply(session, role, body, asked, result)
            if events is not None:
                return StreamingResponse(events, media_type="text/event-stream")
            return JSONResponse(out)

        return handler

    async def _off_loop(self, fn, *args):
        """`fn(*args)` on the gateway's render threads (the tokenizer releases the GIL while it works)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))


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


async def _json(request, limits: GatewayLimits) -> dict:
    """The request's JSON object body, read no further than `limits.max_body_bytes` (else a 413)
    and within `limits.body_timeout_s` (else a 408: a half-sent body holds nothing for long)."""
    limit = limits.max_body_bytes
    too_large = RequestError(f"the request body is over the gateway's limit of {limit} bytes", status=413)
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large
    chunks, size = [], 0
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            async for chunk in request.stream():  # a chunked body has no length: count as it comes
                size += len(chunk)
                if size > limit:
                    raise too_large
                chunks.append(chunk)
    except TimeoutError:
        raise RequestError(
            f"the request body did not arrive whole within {limits.body_timeout_s} s",
            status=408,
            code="request_timeout",
        ) from None
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, RecursionError):  # RecursionError: nested too deep
        raise RequestError("the request body is not JSON (or nests too deep)") from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body
