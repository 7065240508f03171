"""The OpenAI-compatible gateway (rollout/gateway/server.py) with the `openai` SDK against the real engine
(tiny model, its real tokenizer and chat template), and the openai_agent harness in a real worker.
Hostile input (issue 26): tests/rollout/agents/test_gateway_hostile.py."""

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest
from openai import APITimeoutError, AsyncOpenAI, BadRequestError, NotFoundError

from rollout.agents.chat_format import ChatFormat
from rollout.agents.client import Agent, TraceRecorder
from rollout.config import HarnessConfig, SamplingConfig
from rollout.gateway.server import Gateway
from rollout.gateway.tool_calls import parse_tool_calls
from rollout.orchestration.router import Router
from rollout.trace import Trace
from trainer.packing import build_rows, token_weights

ROOT = Path(__file__).resolve().parents[3]


class Question:  # what an agent function is given: a task with a prompt
    def __init__(self, prompt):
        self.prompt = prompt


@pytest.fixture(scope="module")
def gateway_run(engine, tiny_tokenizer):
    """`gateway_run(fn, traces=1, temperature=1.0, max_tokens=12, max_model_len=None, backend=None,
    fmt=None, limits=None, agent_reward=False, roles=("solver",), **sampling)`: opens a session per
    trace (with `agent_reward`) on a gateway with `limits` over the shared engine (or `backend`;
    an agent of policy "main" per role, the tiny model's chat format or `fmt`) and runs
    `fn(session, client, k)` for each at once, in this process's event loop with the gateway in it
    (the client has the session's key and the first role's URL). Returns [(recorder, session, result)]."""
    tiny_format = ChatFormat(tiny_tokenizer)

    def run(
        fn,
        traces=1,
        temperature=1.0,
        max_tokens=12,
        max_model_len=None,
        backend=None,
        fmt=None,
        limits=None,
        agent_reward=False,
        roles=("solver",),
        **sampling,
    ):
        async def main():
            gateway = Gateway(limits=limits)
            await gateway.start()
            try:

                async def one(k):
                    rec = TraceRecorder(f"gw-{k}")
                    agents = {
                        role: Agent(
                            role,
                            "main",
                            backend or Router([engine]),
                            fmt or tiny_format,
                            rec,
                            SamplingConfig(temperature=temperature, max_tokens=max_tokens, **sampling),
                            seed=3,
                            max_model_len=max_model_len,
                        )
                        for role in roles
                    }
                    with gateway.session(agents, agent_reward=agent_reward) as s:
                        async with AsyncOpenAI(base_url=s.base_url(roles[0]), api_key=s.api_key, max_retries=0) as c:
                            result = await fn(s, c, k)
                    return rec, s, result

                return await asyncio.gather(*(one(k) for k in range(traces)))
            finally:
                await gateway.stop()

        return asyncio.run(main())

    return run


def assert_extends(earlier, later):
    head = earlier.prompt_ids + earlier.completion_ids
    assert later.prompt_ids[: len(head)] == head and len(later.prompt_ids) > len(head)


@pytest.mark.integration
def test_example_agent_every_call_is_a_sequence_and_later_turns_extend_exactly(gateway_run, tiny_tokenizer):
    """examples/calculator_agent.py, unmodified, as a function: its calls (with tools) are the
    trace's sequences, each later one continuing the earlier one's ids; one training row."""
    from examples.calculator_agent import SYSTEM, agent

    question = "What is 3 + 4? Answer in <answer></answer> tags."
    [(rec, session, answer)] = gateway_run(lambda s, c, k: agent(Question(question), s.base_url("solver"), s.api_key))
    seqs = rec.sequences
    assert len(seqs) >= 2 and isinstance(answer, str)
    assert answer == ChatFormat(tiny_tokenizer).decode(seqs[-1].completion_ids)
    for earlier, later in zip(seqs, seqs[1:]):
        assert_extends(earlier, later)
    assert [s.parent for s in seqs] == [None] + list(range(len(seqs) - 1))
    assert session.fresh == 1 and session.extended == len(seqs) - 1
    first = tiny_tokenizer.decode(seqs[0].prompt_ids)
    assert SYSTEM in first and '"name": "calculator"' in first and question in first  # tools in the prompt
    assert tiny_tokenizer.decode(seqs[-1].prompt_ids).endswith(
        "<|im_start|>user\nGive your final answer as <answer>...</answer>.<|im_end|>\n<|im_start|>assistant\n"
    )
    trace = Trace("t", "g", seqs, reward=1.0)
    [row] = build_rows([trace], [[1.0] * len(seqs)], token_weights([trace], "token"))
    assert row.input_ids == seqs[-1].prompt_ids + seqs[-1].completion_ids


@pytest.mark.integration
def test_the_sessions_one_url_takes_each_requests_role_from_its_model(gateway_run):
    """Roles by model name: on the session's URL `model` names the role (its calls are that role's
    sequences, and a role's history extends token-exact there too); `models` lists the roles with
    their policies; an unknown or missing model is a 404 naming the roles, and runs nothing."""
    import httpx

    ask = [{"role": "user", "content": "Say one word."}]

    async def fn(session, client, k):
        url = session.base_url()
        async with AsyncOpenAI(base_url=url, api_key=session.api_key, max_retries=0) as one:
            models = [(m.id, m.model_extra["policy"]) for m in (await one.models.list()).data]
            first = await one.chat.completions.create(model="verifier", messages=ask)
            again = ask + [{"role": "assistant", "content": first.choices[0].message.content}]
            again.append({"role": "user", "content": "Another."})
            second = await one.chat.completions.create(model="verifier", messages=again)
            solver = await one.chat.completions.create(model="solver", messages=ask)
            with pytest.raises(NotFoundError) as unknown:
                await one.chat.completions.create(model="judge", messages=ask)
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {session.api_key}"}) as http:
            missing = await http.post(f"{url}/chat/completions", json={"messages": ask})
        return models, [first.model, second.model, solver.model], unknown.value, missing

    roles = ("solver", "verifier")
    [(rec, session, (models, answered_as, unknown, missing))] = gateway_run(fn, roles=roles)
    assert session.base_url() == session.base + "/v1" and session.base_url("solver") == session.base + "/solver/v1"
    assert models == [("solver", "main"), ("verifier", "main")]
    assert answered_as == ["verifier", "verifier", "solver"]
    assert [s.agent for s in rec.sequences] == ["verifier", "verifier", "solver"]
    assert_extends(rec.sequences[0], rec.sequences[1])
    assert session.extended == 1 and session.fresh == 2
    assert unknown.status_code == 404 and unknown.body["code"] == "model_not_found"
    assert "model 'judge' is not a role of this run" in unknown.message and "['solver', 'verifier']" in unknown.message
    assert missing.status_code == 404 and "model none is not a role" in missing.json()["error"]["message"]


@pytest.mark.integration
def test_the_responses_api_records_each_call_and_continues_token_exact(gateway_run, tiny_tokenizer):
    """POST /v1/responses through the `openai` SDK on the session's one URL: a response's text is
    the recorded call's; a request with previous_response_id, and one resending the whole
    conversation (the output items as input, as the Agents SDK does), each extend the earlier
    call's ids; the stream ends in the same kind of Response; an unknown previous response is a 404."""

    async def fn(session, client, k):
        async with AsyncOpenAI(base_url=session.base_url(), api_key=session.api_key, max_retries=0) as one:
            first = await one.responses.create(model="solver", instructions="Be brief.", input="Count to three.")
            follow = await one.responses.create(
                model="solver", instructions="Be brief.", input="And again?", previous_response_id=first.id
            )
            resent = [{"role": "user", "content": "Count to three."}, *(o.model_dump() for o in first.output)]
            resent.append({"role": "user", "content": "Once more?"})
            full = await one.responses.create(model="solver", instructions="Be brief.", input=resent)
            stream = await one.responses.create(model="solver", input="Say one word.", stream=True)
            kinds = [event.type async for event in stream]
            with pytest.raises(NotFoundError) as unknown:
                await one.responses.create(model="solver", input="Hi", previous_response_id="resp_nope")
        return first, follow, full, kinds, unknown.value

    [(rec, session, (first, follow, full, kinds, unknown))] = gateway_run(fn, roles=("solver",))
    seqs = rec.sequences
    assert len(seqs) == 4 and [s.agent for s in seqs] == ["solver"] * 4
    assert first.output_text == ChatFormat(tiny_tokenizer).decode(seqs[0].completion_ids)
    assert first.status in ("completed", "incomplete") and first.model == "solver"
    assert_extends(seqs[0], seqs[1])  # previous_response_id
    assert_extends(seqs[0], seqs[2])  # the whole conversation resent
    assert seqs[1].parent == seqs[2].parent == 0 and seqs[3].parent is None
    assert session.extended == 2 and session.fresh == 2
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    assert unknown.status_code == 404 and "previous_response_id 'resp_nope'" in unknown.message


async def three_turns(session, client, k, rewrite=False):
    """A plain SDK agent: three user turns, each reply appended as returned (or, with `rewrite`,
    the first reply edited before the third turn)."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Count to {k + 3}."}]
    for turn in range(3):
        if turn:
            messages.append({"role": "user", "content": f"And now turn {turn}?"})
        if rewrite and turn == 2:
            messages[2] = {"role": "assistant", "content": "(edited)"}
        r = await client.chat.completions.create(model="main", messages=messages, max_tokens=8)
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
    return messages


@pytest.mark.integration
def test_rows_equal_the_same_conversation_written_with_conversation(gateway_run, engine, tiny_tokenizer):
    """Greedy, so both ways generate the same tokens: the gateway's sequences and row equal those of
    the same turns written with `Conversation`; an edited history is rendered fresh and starts a
    new row (counted as fresh)."""
    [(rec, session, _)] = gateway_run(three_turns, temperature=0.0)
    assert session.extended == 2 and session.fresh == 1

    async def by_conversation():
        r = TraceRecorder("conv")
        agent = Agent(
            "solver",
            "main",
            Router([engine]),
            ChatFormat(tiny_tokenizer),
            r,
            SamplingConfig(temperature=0.0, max_tokens=8),
        )
        conv = agent.conversation(system="Be brief.")
        for text in ("Count to 3.", "And now turn 1?", "And now turn 2?"):
            await conv.reply(text)
        return r.sequences

    conv = asyncio.run(by_conversation())
    assert [(s.prompt_ids, s.completion_ids, s.parent) for s in rec.sequences] == [
        (s.prompt_ids, s.completion_ids, s.parent) for s in conv
    ]
    rows = [
        build_rows([Trace("t", "g", seqs)], [[1.0] * 3], token_weights([Trace("t", "g", seqs)], "token"))
        for seqs in (rec.sequences, conv)
    ]
    assert [(r.input_ids, r.weights) for r in rows[0]] == [(r.input_ids, r.weights) for r in rows[1]]
    assert len(rows[0]) == 1

    [(rec, session, _)] = gateway_run(lambda s, c, k: three_turns(s, c, k, rewrite=True), temperature=0.0)
    assert session.extended == 1 and session.fresh == 2
    seqs = rec.sequences
    assert seqs[2].parent is None and "(edited)" in tiny_tokenizer.decode(seqs[2].prompt_ids)
    trace = Trace("t", "g", seqs)
    rows = build_rows([trace], [[1.0] * 3], token_weights([trace], "token"))
    assert sorted(r.sequences for r in rows) == [[0, 1], [2]]


@pytest.mark.integration
def test_64_concurrent_sessions_on_one_gateway_never_mix(gateway_run, tiny_tokenizer):
    async def ask(session, client, k):
        messages = [{"role": "user", "content": f"Question number {k}."}]
        r = await client.chat.completions.create(model="main", messages=messages, max_tokens=4)
        messages += [
            {"role": "assistant", "content": r.choices[0].message.content},
            {"role": "user", "content": f"Again, number {k}."},
        ]
        r = await client.chat.completions.create(model="main", messages=messages, max_tokens=4, stream=True)
        return "".join([chunk.choices[0].delta.content or "" async for chunk in r if chunk.choices])

    runs = gateway_run(ask, traces=64, max_tokens=4)
    for k, (rec, session, streamed) in enumerate(runs):
        seqs = rec.sequences
        assert len(seqs) == 2 and session.extended == 1 and session.fresh == 1
        text = tiny_tokenizer.decode(seqs[1].prompt_ids)
        assert f"Question number {k}." in text and f"Again, number {k}." in text
        assert_extends(seqs[0], seqs[1])
        assert streamed == ChatFormat(tiny_tokenizer).decode(seqs[1].completion_ids)


@pytest.mark.integration
def test_unreproducible_sampling_is_refused_and_temperature_is_recorded(gateway_run):
    async def calls(session, client, k):
        refused = []
        for extra in (
            {"top_p": 0.9},
            {"logit_bias": {"5": 3}},
            {"presence_penalty": 0.5},
            {"tool_choice": "required", "tools": [{"type": "function", "function": {"name": "f"}}]},
            {"logprobs": True},
            {"top_logprobs": 2, "logprobs": False},
        ):
            with pytest.raises(BadRequestError) as e:
                await client.chat.completions.create(
                    model="main", messages=[{"role": "user", "content": "hi"}], **extra
                )
            refused.append(e.value.body)
        await client.chat.completions.create(
            model="main", messages=[{"role": "user", "content": "hi"}], temperature=1.0, max_tokens=3, top_p=1.0
        )
        return refused

    [(rec, _, refused)] = gateway_run(calls, temperature=0.7)
    assert [b["param"] for b in refused] == [
        "top_p",
        "logit_bias",
        "presence_penalty",
        "tool_choice",
        "logprobs",
        "top_logprobs",
    ]  # logprobs: not answered as null (review L4)
    assert all("not supported" in b["message"] for b in refused)
    [seq] = rec.sequences
    assert seq.temperature == 1.0 and len(seq.completion_ids) <= 3


@pytest.mark.integration
def test_a_client_that_leaves_has_its_generation_aborted(gateway_run, engine):
    """A client that disconnects mid-request (here: its own timeout) takes its generation with it:
    the engine aborts the request, and no sequence is recorded for an answer nobody read."""

    async def leave(session, client, k):
        before = await engine.info.remote()
        with pytest.raises(APITimeoutError):
            await client.with_options(timeout=0.5).chat.completions.create(
                model="main", messages=[{"role": "user", "content": "hi"}], max_tokens=1900
            )
        deadline = time.monotonic() + 10
        while (after := await engine.info.remote())["active"] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return before, after

    [(rec, _, (before, after))] = gateway_run(leave, ignore_eos=True)  # 1900 tokens take seconds
    assert after["active"] == 0, "the engine is still generating for a client that left"
    assert after["finished"] == before["finished"] and rec.sequences == []


@pytest.mark.unit
def test_tool_call_parsing():
    content, calls = parse_tool_calls('ok <tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>', "s", 0)
    assert content == "ok" and calls == [{"id": "call_s_0", "name": "add", "arguments": '{"a": 1}'}]
    assert parse_tool_calls("<tool_call>not json</tool_call>", "s", 0) == ("<tool_call>not json</tool_call>", [])
    assert parse_tool_calls("plain", "s", 0) == ("plain", [])


def tool_turn(k, expression, result):
    call = {
        "id": f"c{k}",
        "type": "function",
        "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})},
    }
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{k}", "content": result},
    ]


@pytest.mark.e2e
def test_a_tool_call_round_trips_through_the_template_token_exact(ray_cluster, engine_cfg):
    """SmolLM2-135M-Instruct (its chat template renders no tools: the gateway's text convention),
    shown two worked examples of calling the calculator, calls it for a new question (greedy):
    the reply is an OpenAI tool call; sent back with the tool's result, the next prompt is the
    first call's prompt + completion + the template's tool turn, token for token."""
    import ray

    from examples.calculator_agent import SYSTEM, TOOLS
    from rollout.config import ModelConfig
    from rollout.models import resolve_model
    from rollout.orchestration.cluster import spawn_engines

    path = resolve_model("smollm2_135m")
    [eng] = spawn_engines({"main": (path, ModelConfig(name="smollm2_135m"), engine_cfg)})["main"]
    fmt = ChatFormat.from_pretrained(path)
    examples = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is 12 + 30?"},
        *tool_turn(1, "12 + 30", "42"),
        {"role": "assistant", "content": "<answer>42</answer>"},
        {"role": "user", "content": "What is 7 * 8?"},
        *tool_turn(2, "7 * 8", "56"),
        {"role": "assistant", "content": "<answer>56</answer>"},
        {"role": "user", "content": "What is 17 * 23?"},
    ]

    async def main():
        gateway = Gateway()
        await gateway.start()
        rec = TraceRecorder("tools")
        agent = Agent("solver", "main", Router([eng]), fmt, rec, SamplingConfig(temperature=0.0, max_tokens=48))
        try:
            with gateway.session({"solver": agent}) as s:
                async with AsyncOpenAI(base_url=s.base_url("solver"), api_key=s.api_key, max_retries=0) as client:
                    messages = list(examples)
                    r = await client.chat.completions.create(model="main", messages=messages, tools=TOOLS)
                    first = r.choices[0]
                    messages.append(first.message.model_dump(exclude_none=True))
                    for call in first.message.tool_calls or []:
                        messages.append({"role": "tool", "tool_call_id": call.id, "content": "391"})
                    r = await client.chat.completions.create(model="main", messages=messages, tools=TOOLS)
                    return first, r.choices[0], s, rec.sequences
        finally:
            await gateway.stop()

    try:
        first, second, session, sequences = asyncio.run(main())
    finally:
        ray.get(eng.shutdown.remote(), timeout=60)
        ray.kill(eng)
    assert first.finish_reason == "tool_calls", first.message.content
    [call] = first.message.tool_calls
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {"expression": "17 * 23"}
    a, b = sequences
    assert session.fresh == 1 and session.extended == 1 and session.tool_calls == 1 and b.parent == 0
    head = a.prompt_ids + a.completion_ids
    assert b.prompt_ids[: len(head)] == head
    assert fmt.tok.decode(b.prompt_ids[len(head) :]) == "\n<|im_start|>tool\n391<|im_end|>\n<|im_start|>assistant\n"
    assert second.message.content is not None or second.message.tool_calls


@pytest.mark.integration
def test_openai_agent_harness_runs_the_example_as_a_subprocess_in_a_worker(run_worker):
    """examples/calculator_agent.py as a program (task on stdin, answer on stdout) in a real
    RolloutWorker: every trace ok, with the agent's calls as its sequences, the answer scored."""
    harness = HarnessConfig(
        _target_="harnesses.programs.openai_agent.openai_agent",
        name="openai_agent",
        roles=["solver"],
        options={"command": f"python {ROOT / 'examples' / 'calculator_agent.py'}", "timeout_s": 120.0},
    )
    stats, groups, _ = run_worker(harness, {"solver": "main"}, n_tasks=2, timeout_s=150.0, max_tokens=12)
    traces = [t for g in groups for t in g]
    assert len(traces) == 4 and stats["traces_failed"] == 0, [t.error for t in traces]
    for t in traces:
        assert len(t.sequences) >= 2 and t.info["gateway_extended"] == len(t.sequences) - 1
        assert t.info["reward_from"] == "verifier" and isinstance(t.info["answer"], str)
        for earlier, later in zip(t.sequences, t.sequences[1:]):
            assert_extends(earlier, later)


@pytest.mark.integration
def test_a_hanging_agent_command_is_killed_with_its_children_and_the_trace_fails(run_worker, tmp_path):
    pids = tmp_path / "pids"
    hang = (
        f"import os, subprocess, time; child = subprocess.Popen(['sleep', '300']); "
        f"open({str(pids)!r} + str(os.getpid()), 'w').write(str(child.pid)); time.sleep(300)"
    )
    harness = HarnessConfig(
        _target_="harnesses.programs.openai_agent.openai_agent",
        name="openai_agent",
        roles=["solver"],
        options={"command": [sys.executable, "-c", hang], "timeout_s": 3.0},
    )
    t0 = time.monotonic()
    stats, groups, _ = run_worker(harness, {"solver": "main"}, n_tasks=1, group_size=2, timeout_s=60.0)
    assert time.monotonic() - t0 < 60
    traces = [t for g in groups for t in g]
    assert len(traces) == 2 and all(t.status == "failed" and "timeout_s=3.0" in t.error for t in traces), [
        t.error for t in traces
    ]
    children = [int(p.read_text()) for p in tmp_path.glob("pids*")]
    parents = [int(p.name.removeprefix("pids")) for p in tmp_path.glob("pids*")]
    assert len(children) == 2
    time.sleep(0.5)
    for pid in children + parents:
        assert not _alive(pid), f"process {pid} outlived the timeout"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead, only not yet reaped by its parent
        return f.read().split()[2] != "Z"


async def reporting_agent(task, base_url, api_key, reward_key):
    """An agent function that reports its own reward, with its reward key (the chat key: a 401)."""
    import httpx

    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        r = await client.chat.completions.create(
            model="main", max_tokens=4, messages=[{"role": "user", "content": task.prompt}]
        )
    async with httpx.AsyncClient() as http:
        chat_key = {"Authorization": f"Bearer {api_key}"}
        assert (await http.post(f"{base_url}/reward", json={"reward": 1.0}, headers=chat_key)).status_code == 401
        reward_key = {"Authorization": f"Bearer {reward_key}"}
        (await http.post(f"{base_url}/reward", json={"reward": 0.25}, headers=reward_key)).raise_for_status()
    return r.choices[0].message.content


@pytest.mark.integration
def test_openai_agent_function_mode_takes_the_reward_the_agent_reports(run_harness):
    """Twice, each in a fresh event loop: the worker's shared gateway starts again in the new one."""
    for k in range(2):
        _, seqs, result = run_harness(
            "harnesses.programs.openai_agent.openai_agent",
            ["agent"],
            task_index=k,
            agent="tests.rollout.agents.test_gateway.reporting_agent",
            agent_reward=True,
        )
        assert len(seqs) == 1 and result.reward == 0.25 and result.info["reward_from"] == "agent"
        assert result.info["gateway_fresh"] == 1 and result.info["gateway_extended"] == 0
