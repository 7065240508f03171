"""The Responses API's conversion to and from chat completions (rollout/gateway/responses.py): input
items to messages, what is refused and why, a chat result to a Response and its events, and output
items that come back as input continuing the reply exactly. Over a real engine and the `openai`
SDK: tests/rollout/agents/test_gateway.py."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from rollout.gateway.messages import RequestError, normalize
from rollout.gateway.responses import chat_request, input_messages, response_events, response_object

pytestmark = pytest.mark.unit

CALL = {"id": "call_ab_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}


def chat_result(content, tool_calls=None, finish="stop"):
    message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-x-1",
        "created": 7,
        "model": "solver",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    }


def test_input_items_become_the_chat_messages_a_client_would_have_sent():
    assert input_messages("Hi") == [{"role": "user", "content": "Hi"}]
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is 1+2?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me add."}]},
        {"type": "function_call", "call_id": "call_ab_0", "name": "add", "arguments": '{"a": 1, "b": 2}'},
        {"type": "function_call_output", "call_id": "call_ab_0", "output": "3"},
        {"type": "function_call", "call_id": "c2", "name": "add", "arguments": "{}"},
    ]
    c2 = {"id": "c2", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    assert input_messages(items) == [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "What is 1+2?"},
        {"role": "assistant", "content": "Let me add.", "tool_calls": [CALL]},  # the call joins its message
        {"role": "tool", "tool_call_id": "call_ab_0", "content": "3"},
        {"role": "assistant", "content": "", "tool_calls": [c2]},  # after a tool message: a message of its own
    ]
    for bad, where in (
        ([{"type": "reasoning", "summary": []}], "input[0]: items of type 'reasoning' are not supported"),
        ([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}], "input[0].content must be"),
        ([{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}], "needs call_id, name and"),
        ([], "input must be a string or a non-empty list"),
    ):
        with pytest.raises(RequestError, match=re.escape(where)):
            input_messages(bad)


def test_what_the_learner_cannot_reproduce_or_the_gateway_does_not_do_is_refused_by_name():
    ok = {"model": "solver", "input": "Hi", "store": True, "metadata": {"k": "v"}, "text": {"format": {"type": "text"}}}
    assert chat_request(ok, None) == {"messages": [{"role": "user", "content": "Hi"}], "n": 1}
    for extra, message in (
        ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text=.* structured output"),
        ({"truncation": "auto"}, "truncation=auto .* would drop history"),
        ({"background": True}, "background=True is not supported"),
        ({"tools": [{"type": "web_search"}]}, "built-in tools"),
        ({"frequency_penalty": 0.5}, "frequency_penalty is not supported"),
        ({"instructions": 3}, "instructions must be a string"),
    ):
        with pytest.raises(RequestError, match=message) as e:
            chat_request({**ok, **extra}, None)
        assert e.value.param == next(iter(extra)) and e.value.status == 400


def test_a_continued_response_keeps_its_conversation_and_does_not_repeat_its_instructions():
    first = chat_request({"input": "Hi", "instructions": "Be brief.", "max_output_tokens": 9, "temperature": 0.5}, None)
    assert first == {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "n": 1,
        "max_tokens": 9,
        "temperature": 0.5,
    }
    history = first["messages"] + [{"role": "assistant", "content": "Hello."}]
    same = chat_request({"input": "Again", "instructions": "Be brief."}, history)
    assert same["messages"] == history + [{"role": "user", "content": "Again"}]
    other = chat_request({"input": "Again", "instructions": "Be long."}, history)
    assert other["messages"] == history + [
        {"role": "system", "content": "Be long."},
        {"role": "user", "content": "Again"},
    ]


def test_a_response_resent_as_input_continues_the_reply_the_gateway_recorded():
    """The Agents SDK resends a response's output items as input: they must normalize to the reply
    the chat path recorded (text and call ids), so the next call extends its ids."""
    result = chat_result("Let me add.", [CALL])
    response = response_object(result, {"input": "What is 1+2?"}, "resp_s_0")
    assert [o["type"] for o in response["output"]] == ["message", "function_call"]
    assert response["output"][1]["call_id"] == "call_ab_0" and response["status"] == "completed"
    assert response["usage"]["input_tokens"] == 5 and response["usage"]["output_tokens"] == 3
    resent = [{"role": "user", "content": "What is 1+2?"}, *response["output"]]
    recorded = [{"role": "user", "content": "What is 1+2?"}, result["choices"][0]["message"]]
    assert normalize(input_messages(json.loads(json.dumps(resent)))) == normalize(recorded)
    calls_only = response_object(chat_result(None, [CALL]), {}, "resp_s_1")
    assert [o["type"] for o in calls_only["output"]] == ["function_call"]
    assert normalize(input_messages(calls_only["output"])) == normalize(
        [{"role": "assistant", "content": None, "tool_calls": [CALL]}]
    )
    cut = response_object(chat_result("1 2 3", finish="length"), {}, "resp_s_2")
    assert cut["status"] == "incomplete" and cut["incomplete_details"] == {"reason": "max_output_tokens"}


def test_the_stream_is_the_responses_event_sequence_ending_in_the_whole_response():
    response = response_object(chat_result("Hi.", [CALL]), {}, "resp_s_0")

    async def collect():
        return [e async for e in response_events(response)]

    events = [json.loads(e.split("data: ", 1)[1]) for e in asyncio.run(collect())]
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[4]["delta"] == "Hi." and events[10]["arguments"] == CALL["function"]["arguments"]
    assert events[-1]["response"] == response and events[0]["response"]["status"] == "in_progress"
