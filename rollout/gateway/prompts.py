"""A gateway request's prompt ids: continued from an earlier call's ids or rendered fresh, on the
gateway's threads, and refused unrendered when its text cannot fit the model's context.

Rendering (Jinja) and tokenizing a request are CPU work in proportion to its text: done on the
event loop, one 5 MiB message stalled every session, engine router and Ray call of the worker
for 15 s (rewards review #8). They run on the gateway's render threads (the tokenizer releases
the GIL while it encodes; ChatFormat is thread-safe), and before any of it the request's
characters bound its tokens from below: no token of the model's vocabulary spells more than
`max_token_chars` characters, so text of c characters is at least c / max_token_chars tokens,
and a request that cannot fit is refused without being rendered (review #7: nor does it reach the
continuation cache). The bound holds for a chat template that renders message text verbatim
(trimmed at most); one that drops text (Qwen3's drops earlier turns' reasoning) may see a request
refused whose rendering would fit, only when that text is over max_token_chars x the context.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rollout.gateway.messages import RequestError, text_chars
from rollout.gateway.tool_calls import native_tools, template_messages

if TYPE_CHECKING:
    from rollout.agents.chat_format import ChatFormat
    from rollout.agents.client import Agent


@dataclass
class Call:
    """An earlier completion of a role, which a later request's messages may continue."""

    history: list[dict]  # the request's messages + the reply returned (normalized)
    ids: list[int]  # its prompt + completion ids
    index: int  # its sequence in the trace


OffLoop = Callable[..., Awaitable]  # off_loop(fn, *args): fn(*args) on a thread, awaited


async def prompt_ids(
    calls: list[Call], agent: Agent, messages: list[dict], tools: list[dict] | None, off_loop: OffLoop
) -> tuple[list[int], int | None]:
    """The prompt ids of a request and the sequence it continues: the latest earlier call whose
    history + reply the messages extend, else none (rendered fresh). A request whose text cannot
    fit `agent.max_model_len` is a 400 before any of it is rendered."""
    fmt = agent.format
    call = next(
        (c for c in reversed(calls) if len(messages) > len(c.history) and messages[: len(c.history)] == c.history),
        None,
    )
    new = messages[len(call.history) :] if call else messages
    context = agent.max_model_len
    if context is not None:
        per_token = await off_loop(max_token_chars, fmt)
        # the tool list the gateway writes into the system message (a template that renders tools may not)
        described = [t["function"] for t in tools] if tools and call is None and not fmt.renders_tools else None
        at_least = (len(call.ids) if call else 0) + -(-text_chars(new, described) // per_token)
        if at_least >= context:
            raise too_long(
                context, f"at least {at_least} tokens (no token of this model spells more than {per_token} characters)"
            )
    if call is not None:
        return call.ids + await off_loop(_continuation, fmt, call.ids, new), call.index
    return await off_loop(_render, fmt, messages, tools), None


def too_long(context: int, size: str) -> RequestError:
    return RequestError(
        f"This model's maximum context length is {context} tokens; your messages are {size}. Shorten them.",
        "messages",
        code="context_length_exceeded",
    )


# Of each chat format, the most characters one token spells (computed once, on a render thread).
_TOKEN_CHARS: weakref.WeakKeyDictionary[ChatFormat, int] = weakref.WeakKeyDictionary()


def max_token_chars(fmt: ChatFormat) -> int:
    """The most characters any one token of `fmt`'s vocabulary decodes to, bounded by its string's
    length (a byte-level BPE token's string holds one character per byte; a special token's is its
    text), so that text of c characters takes at least c / max_token_chars(fmt) tokens. SmolLM2: 81
    (a newline and 80 spaces); the tiny model: 13 (`<|endoftext|>`)."""
    if fmt not in _TOKEN_CHARS:
        tokens = fmt.tok.convert_ids_to_tokens(list(range(len(fmt.tok))))
        _TOKEN_CHARS[fmt] = max(1, max(len(t) for t in tokens if t))
    return _TOKEN_CHARS[fmt]


def _template_errors(fn):
    """A template that cannot render the messages (it raised, or the tools nest too deep) is the
    request's fault: a 400."""

    @functools.wraps(fn)
    def rendering(*args):
        from jinja2 import TemplateError

        try:
            return fn(*args)
        except (TemplateError, TypeError, ValueError, RecursionError) as e:
            raise RequestError(
                f"the chat template could not render these messages: {type(e).__name__}: {e}", "messages"
            ) from None

    return rendering


@_template_errors
def _render(fmt: ChatFormat, messages: list[dict], tools: list[dict] | None) -> list[int]:
    return fmt.render(template_messages(messages, fmt, tools), tools=native_tools(fmt, tools))


@_template_errors
def _continuation(fmt: ChatFormat, ids: list[int], messages: list[dict]) -> list[int]:
    return fmt.continuation(ids, template_messages(messages, fmt, None))
