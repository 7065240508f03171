"""The gateway's HTTP/1.1 connections: uvicorn's h11 protocol with the limits uvicorn lacks.

uvicorn bounds a request head's size (`h11_max_incomplete_event_size`: h11 refuses a head it holds
unfinished past it, a 400 and the connection closed; a head that arrives whole in one read, up to
asyncio's 256 KiB, is parsed) and closes a connection idle *between* requests
(`timeout_keep_alive`), but (rewards review #12, each checked over a real socket):

- a connection that never sends a whole request head is kept forever: idle from its start, or a
  half-sent request line or headers (200 such were all still open after 40 s), or half of a
  second request (its first byte stops the keep-alive timer). Here a connection must send a whole
  head within `head_timeout_s` of its start or of the end of its previous response, else it is
  closed (after a 408 if it had sent part of one).
- a request answered before its body was read (a 413, a 429) leaves the client sending the rest,
  which uvicorn reads and drops for as long as it comes. Here that lasts at most
  `head_timeout_s` from the response, then the connection is closed (nginx's lingering close: the
  client reads the answer, rather than losing it to a reset).
- `limit_concurrency` answers a *request* 503 past its limit, but accepts every connection and
  keeps its file descriptor for as long as the client holds it. Here a connection past
  `max_connections` is answered 503 and closed at once.

A half-sent body is the app's to bound (the gateway reads bodies under a deadline: a 408).
"""

from __future__ import annotations

import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def _raw_response(status: str, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 response with an OpenAI-style JSON error body, closing the connection."""
    body = json.dumps({"error": {"message": message, "type": "server_error", "param": None, "code": code}}).encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        f"connection: close\r\n\r\n"
    )
    return head.encode() + body


class BoundedH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request head (and on the rest of a request
    already answered), and a cap on connections."""

    def __init__(self, *args, head_timeout_s: float, max_connections: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.head_timeout_s = head_timeout_s
        self.max_connections = max_connections
        self._deadline = None  # closes the connection, while it waits for a head or lingers

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            message = f"the gateway holds its limit of {self.max_connections} connections; try again"
            transport.write(_raw_response("503 Service Unavailable", message, "too_many_connections"))
            transport.close()
            return
        self._arm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE:  # a new request begins (its head's clock runs from then)
            if self._deadline is None:
                self._arm()
        elif self.conn.our_state is not h11.DONE:  # a head is in and the app answers it: no deadline
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():  # waiting for the next head, or for the rest of this request
            self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.head_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:  # part of a head came
            message = f"the request's head did not arrive whole within {self.head_timeout_s} s"
            self.transport.write(_raw_response("408 Request Timeout", message, "request_timeout"))
        elif self.conn.their_state is not h11.IDLE and self.conn.our_state is not h11.DONE:
            return  # the app is answering a request (its body has a deadline of its own)
        self.transport.close()
