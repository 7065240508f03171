"""The gateway stays responsive (rewards review #7, #8, #11, #12): a request that cannot fit the
context is refused before it is rendered, rendering runs off the event loop, `stop` is bounded,
and its connections are bounded over real sockets (head size, a deadline for each head and body,
a connection cap, a per-session cap on requests in flight). Real tokenizer, engine and HTTP; the
event loop's worst stall is measured by tools/bench/gateway_stall.py."""

import asyncio
import threading

import httpx
import pytest
from openai import BadRequestError

from rollout.agents.chat_format import ChatFormat
from rollout.agents.client import Agent, TraceRecorder
from rollout.config import SamplingConfig
from rollout.gateway.server import Gateway
from rollout.gateway.sessions import GatewayLimits
from rollout.orchestration.router import Router
from tests.rollout.agents.test_gateway import gateway_run  # noqa: F401 (the fixture)

HI = [{"role": "user", "content": "hi"}]
BIG = "lorem ipsum " * 90_000  # ~1 MiB
WAIT_S = 20.0  # a hang guard, far above every limit set here (1 s): not a measurement


class WatchedFormat(ChatFormat):
    """The tiny model's ChatFormat, noting each render and continuation and the thread it ran on."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.calls: list[tuple[str, int]] = []

    def render(self, *args, **kwargs):
        self.calls.append(("render", threading.get_ident()))
        return super().render(*args, **kwargs)

    def continuation(self, *args, **kwargs):
        self.calls.append(("continuation", threading.get_ident()))
        return super().continuation(*args, **kwargs)


@pytest.mark.integration
def test_a_request_that_cannot_fit_is_refused_before_it_is_rendered(gateway_run, tiny_tokenizer):
    """rewards review #7 and #8: a 1 MiB message (fresh, or continuing a call; or 1 MiB of tool
    descriptions) with max_model_len 64 was rendered and tokenized, on the event loop, and its
    continuation cached, before the 400. Now its characters (13 a token at most, for the tiny
    vocabulary) refuse it unrendered, and the one request that fits is rendered on a render thread."""
    fmt = WatchedFormat(tiny_tokenizer)
    big_tool = {"type": "function", "function": {"name": "f", "description": BIG, "parameters": {}}}

    async def ask(session, client, k):
        r = await client.chat.completions.create(model="main", messages=HI, max_tokens=4)
        refusals = []
        for messages, tools in (
            ([{"role": "user", "content": BIG}], None),
            (
                [*HI, {"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": BIG}],
                None,
            ),
            (HI, [big_tool]),
        ):
            with pytest.raises(BadRequestError) as e:
                await client.chat.completions.create(
                    model="main", messages=messages, max_tokens=4, **({"tools": tools} if tools else {})
                )
            refusals.append(e.value)
        return threading.get_ident(), refusals

    [(rec, session, (loop_thread, refusals))] = gateway_run(ask, fmt=fmt, max_model_len=64)
    assert [name for name, _ in fmt.calls] == ["render"] and fmt.calls[0][1] != loop_thread
    assert all(e.code == "context_length_exceeded" and "at least" in e.body["message"] for e in refusals)
    assert len(rec.sequences) == 1 and session.fresh == 1 and session.extended == 0


@pytest.mark.integration
def test_stop_is_bounded_in_count_and_length(gateway_run):
    """rewards review #11: 300,000 stop strings reached the engine, which checks each after every
    token. At most 16 strings of 1 to 256 characters; more is a 400 naming `stop`."""

    async def ask(session, client, k):
        errors = []
        for stop in (["s"] * 17, ["s" * 257], [""]):
            with pytest.raises(BadRequestError) as e:
                await client.chat.completions.create(model="main", messages=HI, max_tokens=2, stop=stop)
            errors.append(e.value)
        r = await client.chat.completions.create(model="main", messages=HI, max_tokens=2, stop=["s" * 256] * 16)
        return errors, r

    [(rec, _, (errors, ok))] = gateway_run(ask)
    assert all(e.body["param"] == "stop" and "at most 16 strings" in e.body["message"] for e in errors)
    assert ok.choices and len(rec.sequences) == 1


# ---- transport over real sockets ------------------------------------------------------------

QUICK = GatewayLimits(head_timeout_s=1.0, body_timeout_s=1.0)


def serve(fn, limits: GatewayLimits, backend=None, tokenizer=None):
    """Run `fn(gateway, session)` against a started gateway with `limits` and one session (role
    "solver": `backend`, or none where nothing is generated, and the tiny model's format)."""

    async def main():
        gateway = Gateway(limits=limits)
        await gateway.start()
        try:
            agent = Agent("solver", "main", backend, ChatFormat(tokenizer), TraceRecorder("t"), SamplingConfig())
            with gateway.session({"solver": agent}) as session:
                return await fn(gateway, session)
        finally:
            await gateway.stop()

    return asyncio.run(main())


async def exchange(port: int, data: bytes) -> bytes | None:
    """Send `data` on a new connection and read until the server closes it: all it answered, or
    None if it still holds the connection open after WAIT_S."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        try:
            writer.write(data)
            await writer.drain()
        except ConnectionError:  # it closed while the request was still being sent
            pass
        try:
            return await asyncio.wait_for(reader.read(), WAIT_S)
        except TimeoutError:
            return None
        except ConnectionError:
            return b""
    finally:
        writer.close()


def _auth(session) -> bytes:
    return f"Authorization: Bearer {session.api_key}\r\nHost: x\r\n".encode()


@pytest.mark.integration
def test_a_request_head_over_the_limit_is_a_400_and_closes(tiny_tokenizer):
    """rewards review #12: httptools parsed a 64 MiB header (+120 MiB RSS). h11 refuses a head it
    holds incomplete past max_header_bytes (32 KiB): a 400, the connection closed. (h11 checks the
    bytes it holds of an unfinished head: a head that arrives whole in one read, up to asyncio's
    256 KiB, is parsed. 40 KiB that never ends: refused once read, with nothing left unread to
    reset the connection and lose the 400. 1 MiB at once: cut off at its first read.)"""

    async def send(gateway, session):
        head = b"GET /s/x/solver/v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40 * 2**10
        huge = b"GET /s/x/solver/v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 2**20 + b"\r\n\r\n"
        return await exchange(gateway.port, head), await exchange(gateway.port, huge)

    unfinished, huge = serve(send, QUICK, tokenizer=tiny_tokenizer)
    assert unfinished is not None and unfinished.startswith(b"HTTP/1.1 400"), unfinished and unfinished[:200]
    assert huge is not None and (huge == b"" or huge.startswith(b"HTTP/1.1 400")), huge[:200]


@pytest.mark.integration
def test_a_connection_that_sends_no_whole_head_in_time_is_closed(tiny_tokenizer):
    """rewards review #12: connections that sent half a request line were never closed (uvicorn's
    timeout_keep_alive runs only between requests, and a byte of the next request stops it).
    Idle from the start, half a request line, or half a second request after a whole first one:
    closed after head_timeout_s, with a 408 where part of a request came."""

    async def send(gateway, session):
        models = f"GET {session.base_url('solver')[len(f'http://127.0.0.1:{gateway.port}') :]}/models HTTP/1.1\r\n"
        whole = models.encode() + _auth(session) + b"\r\n"
        return await asyncio.gather(
            exchange(gateway.port, b""),
            exchange(gateway.port, b"POST /s/x/solver/v1/chat/comp"),
            exchange(gateway.port, whole + b"GET /s/x/solver/v1/mo"),
        )

    idle, half, second = serve(send, QUICK, tokenizer=tiny_tokenizer)
    assert idle == b""
    assert half is not None and half.startswith(b"HTTP/1.1 408") and b"request_timeout" in half
    assert second is not None and second.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 408" in second


@pytest.mark.integration
def test_a_body_that_does_not_arrive_in_time_is_a_408(tiny_tokenizer):
    """rewards review #12: a request whose body stops half-way held its connection (and the task
    reading it) for good. Past body_timeout_s: a JSON 408, and the connection closed once
    head_timeout_s passes without the rest. A body stated over the limit is answered 413 at once,
    and the connection closed the same way (the client reads the 413, not a reset)."""

    async def send(gateway, session):
        path = session.base_url("solver")[len(f"http://127.0.0.1:{gateway.port}") :]
        half = f"POST {path}/chat/completions HTTP/1.1\r\nContent-Length: 1000\r\n".encode() + _auth(session)
        over = f"POST {path}/chat/completions HTTP/1.1\r\nContent-Length: {9 * 2**20}\r\n".encode() + _auth(session)
        return await asyncio.gather(
            exchange(gateway.port, half + b"\r\n" + b'{"messages": '),
            exchange(gateway.port, over + b"\r\n" + b'{"messages": '),
        )

    slow, over = serve(send, QUICK, tokenizer=tiny_tokenizer)
    assert slow is not None and slow.startswith(b"HTTP/1.1 408"), slow
    assert b"did not arrive whole within 1.0 s" in slow
    assert over is not None and over.startswith(b"HTTP/1.1 413"), over


@pytest.mark.integration
def test_connections_past_the_limit_are_answered_503_and_closed(tiny_tokenizer):
    """rewards review #12: nothing bounded connections (each holds a file descriptor; uvicorn's
    limit_concurrency only answers a *request* 503 and keeps every connection). With
    max_connections 3 and 3 open, a 4th is answered 503 and closed at once; once one of the 3
    closes, a new one is served."""

    async def send(gateway, session):
        held = [await asyncio.open_connection("127.0.0.1", gateway.port) for _ in range(3)]
        await asyncio.sleep(0.1)  # let the server accept them
        past = await exchange(gateway.port, b"")
        held[0][1].close()
        await asyncio.sleep(0.1)
        again = await exchange(gateway.port, b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        for _, writer in held[1:]:
            writer.close()
        return past, again

    past, again = serve(send, GatewayLimits(max_connections=3), tokenizer=tiny_tokenizer)
    assert past is not None and past.startswith(b"HTTP/1.1 503") and b"too_many_connections" in past
    assert again is not None and again.startswith(b"HTTP/1.1 404")


class HeldRouter(Router):
    """A router over the real engine whose requests wait for `release` (set) before generating."""

    def __init__(self, engines, arrivals: int):
        super().__init__(engines)
        self.release, self.arrived, self.waiting, self.arrivals = asyncio.Event(), asyncio.Event(), 0, arrivals

    async def generate(self, key, prompt_ids, sampling, seed=None):
        self.waiting += 1
        if self.waiting == self.arrivals:
            self.arrived.set()
        await self.release.wait()
        return await super().generate(key, prompt_ids, sampling, seed)


@pytest.mark.integration
def test_a_session_past_its_requests_in_flight_is_a_429_naming_the_cap(engine, tiny_tokenizer):
    """rewards review #12: one session could hold any number of requests in flight (each n=16).
    With max_in_flight 2 and two requests held at the engine, a third is a 429 that names the cap;
    the two finish."""

    backend = HeldRouter([engine], arrivals=2)

    async def send(gateway, session):
        url = f"{session.base_url('solver')}/chat/completions"
        body = {"messages": HI, "max_tokens": 2}
        auth = {"Authorization": f"Bearer {session.api_key}"}
        async with httpx.AsyncClient(timeout=WAIT_S) as http:
            held = [asyncio.ensure_future(http.post(url, json=body, headers=auth)) for _ in range(2)]
            await asyncio.wait_for(backend.arrived.wait(), WAIT_S)
            try:
                third = await http.post(url, json=body, headers=auth)
            finally:
                backend.release.set()
            return third, await asyncio.gather(*held)

    third, held = serve(send, GatewayLimits(max_in_flight=2), backend=backend, tokenizer=tiny_tokenizer)
    assert third.status_code == 429 and third.json()["error"]["code"] == "rate_limit_exceeded"
    assert "already has 2 requests in flight" in third.json()["error"]["message"]
    assert [r.status_code for r in held] == [200, 200]
