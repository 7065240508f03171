"""The gateway and the openai_agent harness treat agent and model text as hostile input (issue 26):
a linear tool-call parser, a per-session key, a body limit, max_tokens within the context, JSON
errors only, engine failures that retry the episode, command agents with a bare environment,
bounded output, and no life after their worker. Real engine, tokenizer and gateway over HTTP."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from openai import APIStatusError, AsyncOpenAI, BadRequestError
from transformers import AutoTokenizer

from rollout.agents.chat_format import ChatFormat
from rollout.agents.client import Agent, TraceRecorder
from rollout.config import SamplingConfig
from rollout.engine.engine import EngineError
from rollout.gateway.server import Gateway
from rollout.gateway.tool_calls import parse_tool_calls
from rollout.orchestration.router import Router
from tests.rollout.agents.test_gateway import gateway_run  # noqa: F401 (the fixture)

ROOT = Path(__file__).resolve().parents[3]  # the repository
HI = [{"role": "user", "content": "hi"}]


@pytest.mark.unit
@pytest.mark.timeout(60)  # a hang guard, not a measurement (tools/bench/tool_parser.py times it)
def test_tool_call_parsing_of_degenerate_output():
    """Degenerate model output parses to the right answer; the old regex's backtracking took
    ~8 s on `<tool_call>` + 2,000 spaces and never ends on 100,000 (it fails here by the guard)."""
    spaces = "<tool_call>" + " " * 100_000
    assert parse_tool_calls(spaces, "s", 0) == (spaces, [])
    unclosed = "<tool_call>\n" * 10_000
    assert parse_tool_calls(unclosed, "s", 0) == (unclosed, [])
    empty = "<tool_call>" + "\n" * 100_000 + "</tool_call>"
    assert parse_tool_calls(empty, "s", 0) == (empty, [])
    padded = "<tool_call>" + " " * 50_000 + '{"name": "f", "arguments": {}}' + "\n" * 50_000 + "</tool_call> done"
    assert parse_tool_calls(padded, "s", 3) == ("done", [{"id": "call_s_3", "name": "f", "arguments": "{}"}])
    nested = "<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>"  # json.loads: RecursionError
    assert parse_tool_calls(nested, "s", 0) == (nested, [])


@pytest.mark.integration
def test_every_route_needs_the_session_key(gateway_run):
    """Without the key, with a wrong one, or another session's: 401 with OpenAI's error body, on
    the chat, models and reward routes (which takes the reward key, not the chat key); the reward
    stays unset. With it: answered."""

    async def knock(session, client, k):
        url, others = session.base_url("solver"), []
        async with httpx.AsyncClient(timeout=60) as http:
            for headers in (
                {},
                {"Authorization": "Bearer wrong"},
                {"Authorization": session.api_key},
                {"Authorization": f"Bearer {session.api_key}x"},
            ):
                others += [
                    await http.post(f"{url}/chat/completions", json={"messages": HI}, headers=headers),
                    await http.get(f"{url}/models", headers=headers),
                    await http.post(f"{url}/reward", json={"reward": 1.0}, headers=headers),
                ]
            chat_key = {"Authorization": f"Bearer {session.api_key}"}
            others.append(await http.post(f"{url}/reward", json={"reward": 1.0}, headers=chat_key))
            reward = session.reward
            ok = await http.post(
                f"{url}/reward", json={"reward": 0.5}, headers={"Authorization": f"Bearer {session.reward_key}"}
            )
        return others, reward, ok

    [(rec, session, (refused, reward, ok))] = gateway_run(knock, agent_reward=True)
    assert [r.status_code for r in refused] == [401] * 13 and reward is None and rec.sequences == []
    assert all(r.json()["error"]["code"] == "invalid_api_key" for r in refused)
    assert ok.status_code == 200 and session.reward == 0.5


@pytest.mark.integration
def test_an_oversized_or_too_deep_body_is_a_json_error(gateway_run):
    """A body over the limit is a 413 whether it states its length or streams it in chunks; JSON
    nested 100,000 deep is a 400 (json raised RecursionError: a bare 500 before)."""

    async def send(session, client, k):
        url = f"{session.base_url('solver')}/chat/completions"
        auth = {"Authorization": f"Bearer {session.api_key}", "Content-Type": "application/json"}
        big = b'{"messages": "' + b"x" * (9 * 2**20) + b'"}'

        async def chunks():
            for i in range(0, len(big), 2**20):
                yield big[i : i + 2**20]

        async with httpx.AsyncClient(timeout=60) as http:
            return [
                await http.post(url, content=big, headers=auth),
                await http.post(url, content=chunks(), headers=auth),
                await http.post(url, content=b"[" * 100_000 + b"]" * 100_000, headers=auth),
            ]

    [(_, _, (stated, streamed, deep))] = gateway_run(send)
    assert (stated.status_code, streamed.status_code, deep.status_code) == (413, 413, 400)
    assert "limit" in stated.json()["error"]["message"] and "limit" in streamed.json()["error"]["message"]
    assert deep.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.integration
def test_max_tokens_is_clamped_to_the_context_and_a_prompt_that_does_not_fit_is_refused(gateway_run):
    """max_model_len 64: max_tokens=100000 generates exactly the context the prompt leaves (it was
    the engine's ValueError, a bare 500); a prompt over 64 tokens is a 400, as in vLLM's server."""

    async def ask(session, client, k):
        r = await client.chat.completions.create(model="main", messages=HI, max_tokens=100_000)
        with pytest.raises(BadRequestError) as e:
            await client.chat.completions.create(model="main", messages=[{"role": "user", "content": "hi " * 100}])
        return r, e.value

    [(rec, _, (r, refused))] = gateway_run(ask, max_model_len=64, ignore_eos=True)
    assert r.usage.completion_tokens == 64 - r.usage.prompt_tokens and r.choices[0].finish_reason == "length"
    [seq] = rec.sequences
    assert len(seq.prompt_ids) + len(seq.completion_ids) == 64
    assert refused.code == "context_length_exceeded" and "64" in refused.body["message"]


TOOL_TEMPLATE = (  # renders tools and tool calls itself (arguments as JSON), refuses a leading tool turn
    "{%- if tools %}{{ '<|im_start|>system\\nTools: ' + (tools | tojson) + '<|im_end|>\\n' }}{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' and loop.first %}{{ raise_exception('a conversation cannot open with a tool turn') }}"
    "{%- endif %}{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') }}"
    "{%- for c in m.tool_calls or [] %}{{ '<tool_call>' + (c.function.arguments | tojson) + '</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.mark.integration
def test_unrenderable_requests_are_400s_not_bare_500s(gateway_run, tiny_path):
    """With a chat template that renders tool calls: arguments that are not JSON, and messages the
    template refuses (raise_exception), are the request's fault: 400 with OpenAI's error body."""
    tok = AutoTokenizer.from_pretrained(tiny_path)
    tok.chat_template = TOOL_TEMPLATE
    fmt = ChatFormat(tok)
    assert fmt.renders_tools
    call = {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{not json"}}

    async def ask(session, client, k):
        errors = []
        for messages in (
            [
                *HI,
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "4"},
            ],
            [{"role": "tool", "tool_call_id": "c1", "content": "4"}],
        ):
            with pytest.raises(BadRequestError) as e:
                await client.chat.completions.create(model="main", messages=messages, max_tokens=2)
            errors.append(e.value.body["message"])
        return errors

    [(rec, _, (arguments, template))] = gateway_run(ask, fmt=fmt)
    assert "not JSON" in arguments and "cannot open with a tool turn" in template and rec.sequences == []


class FailingRouter(Router):
    """A router over real engines whose first `failures` requests fail with `error`."""

    def __init__(self, engines: list, error: Exception, failures: int = 1):
        super().__init__(engines)
        self.error, self.failures = error, failures

    async def generate(self, key, prompt_ids, sampling, seed=None):
        if self.failures > 0:
            self.failures -= 1
            raise self.error
        return await super().generate(key, prompt_ids, sampling, seed)


async def carrying_on_agent(task, base_url, api_key):
    """An agent that answers even when its request failed (with the error it got)."""
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        try:
            r = await client.chat.completions.create(
                model="main", messages=[{"role": "user", "content": task.prompt}], max_tokens=4
            )
        except APIStatusError as e:
            return f"{e.status_code} {e.body}"
    return r.choices[0].message.content


@pytest.mark.integration
def test_an_engine_failure_in_a_gateway_request_runs_the_episode_again(engine, tiny_path):
    """A RolloutWorker (plain, in this process) whose policy's first request raises EngineError:
    the agent gets a 503 `engine_unavailable` and carries on, but the harness raises the failure,
    so the worker runs the episode again (before: a bare 500, the degraded answer kept)."""
    from rollout.config import GenerateJobConfig, HarnessConfig, RolloutConfig, TaskConfig
    from rollout.orchestration.worker import RolloutWorker
    from tests.conftest import EASY_CHAIN_SUM

    harness = HarnessConfig(
        _target_="harnesses.programs.openai_agent.openai_agent",
        name="openai_agent",
        roles=["solver"],
        options={"agent": "tests.rollout.agents.test_gateway_hostile.carrying_on_agent"},
    )
    cfg = GenerateJobConfig(
        harness=harness,
        agents={"solver": "main"},
        task=TaskConfig(name="chain_sum", params=EASY_CHAIN_SUM),
        rollout=RolloutConfig(concurrency=1, group_size=1, timeout_s=60.0, retries=1),
        sampling=SamplingConfig(max_tokens=4),
    )
    worker = RolloutWorker(0, cfg, {"main": [engine]}, {"main": (tiny_path, None)}, buffer=None)
    backend = worker.routers["main"] = FailingRouter([engine], EngineError("engine 0 died"))
    trace = asyncio.run(worker.episode(worker.tasks.train_task(0), "g", 0))
    assert backend.failures == 0 and trace.status in ("ok", "truncated"), trace.error
    assert trace.info["attempts"] == 2 and len(trace.sequences) == 1 and worker.counts["episodes_retried"] == 1


async def greedy_agent(task, base_url, api_key):
    """An agent that asks for far more tokens than any context holds."""
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        r = await client.chat.completions.create(
            model="main", max_tokens=100000, messages=[{"role": "user", "content": task.prompt}]
        )
    return f"{r.usage.prompt_tokens} {r.usage.completion_tokens}"


@pytest.mark.integration
def test_a_rollout_worker_clamps_agents_to_its_models_context(engine, tiny_path):
    """The worker hands each Agent its policy's model.max_model_len (48 here), so an agent's
    max_tokens=100000 is clamped to the context its prompt leaves instead of failing the request."""
    from rollout.config import GenerateJobConfig, HarnessConfig, ModelConfig, RolloutConfig, TaskConfig
    from rollout.orchestration.worker import RolloutWorker
    from tests.conftest import EASY_CHAIN_SUM

    harness = HarnessConfig(
        _target_="harnesses.programs.openai_agent.openai_agent",
        name="openai_agent",
        roles=["solver"],
        options={"agent": "tests.rollout.agents.test_gateway_hostile.greedy_agent"},
    )
    cfg = GenerateJobConfig(
        model=ModelConfig(name="tiny", max_model_len=48),
        harness=harness,
        agents={"solver": "main"},
        task=TaskConfig(name="chain_sum", params=EASY_CHAIN_SUM, instruction=""),
        rollout=RolloutConfig(concurrency=1, group_size=1, timeout_s=60.0),
        sampling=SamplingConfig(max_tokens=4),
    )
    worker = RolloutWorker(0, cfg, {"main": [engine]}, {"main": (tiny_path, None)}, buffer=None)
    trace = asyncio.run(worker.episode(worker.tasks.train_task(0), "g", 0))
    assert trace.status != "failed", trace.error
    prompt_tokens, completion_tokens = map(int, trace.info["answer"].split())
    assert 0 < completion_tokens <= 48 - prompt_tokens and prompt_tokens < 48


@pytest.mark.integration
def test_a_gateway_bug_is_a_json_500_and_fails_the_trace_by_name(engine, tiny_tokenizer):
    """Any other exception in a request: the agent gets a JSON 500 naming it, and the harness fails
    the trace with it even though the agent carried on."""
    from harnesses.programs.openai_agent import openai_agent

    class Task:
        prompt = "What is 2 + 2?"

        def score(self, answer):
            return 0.0

    rec = TraceRecorder("bug")
    agent = Agent(
        "solver",
        "main",
        FailingRouter([engine], ZeroDivisionError("boom")),
        ChatFormat(tiny_tokenizer),
        rec,
        SamplingConfig(max_tokens=4),
        gateway=Gateway.shared,
    )
    with pytest.raises(RuntimeError, match="the gateway failed a request of this run: ZeroDivisionError: boom"):
        asyncio.run(
            openai_agent(Task(), {"solver": agent}, agent="tests.rollout.agents.test_gateway_hostile.carrying_on_agent")
        )


@pytest.mark.integration
def test_a_command_agent_sees_only_the_allowed_environment(run_harness, monkeypatch):
    monkeypatch.setenv("SECRET_X", "hunter2")
    monkeypatch.setenv("NAMED_Y", "1")
    show = [sys.executable, "-c", "import os, json; print(json.dumps(sorted(os.environ)))"]
    _, _, result = run_harness("harnesses.programs.openai_agent.openai_agent", ["agent"], command=show)
    names = json.loads(result.info["answer"])
    assert "SECRET_X" not in names and "NAMED_Y" not in names and not any(n.startswith("RAY_") for n in names)
    assert {"PATH", "OPENAI_BASE_URL", "OPENAI_API_KEY"} <= set(names)
    _, _, result = run_harness("harnesses.programs.openai_agent.openai_agent", ["agent"], command=show, env=["NAMED_Y"])
    assert "NAMED_Y" in json.loads(result.info["answer"])  # named in harness.options.env


@pytest.mark.integration
def test_a_command_agent_that_floods_stdout_fails_the_trace_and_is_killed(run_harness, tmp_path):
    pid = tmp_path / "pid"
    flood = [
        sys.executable,
        "-c",
        f"import os, sys, time; open({str(pid)!r}, 'w').write(str(os.getpid())); "
        f"sys.stdout.write('x' * 2_000_000); sys.stdout.flush(); time.sleep(300)",
    ]
    with pytest.raises(RuntimeError, match="more than 1048576 bytes to stdout"):
        run_harness("harnesses.programs.openai_agent.openai_agent", ["agent"], command=flood, timeout_s=120.0)
    assert not _alive(int(pid.read_text()))


@pytest.mark.unit
def test_a_command_agent_dies_with_its_worker(tmp_path):
    """A process running an agent command (as a worker does) is SIGKILLed: the agent dies with it
    (PR_SET_PDEATHSIG) instead of living on as an orphan."""
    pid = tmp_path / "pid"
    agent = [sys.executable, "-c", f"import os, time; open({str(pid)!r}, 'w').write(str(os.getpid())); time.sleep(300)"]
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import asyncio, sys; from harnesses.programs.openai_agent import "
            f"run_command; asyncio.run(run_command({agent!r}, '', {{}}, 300))",
        ],
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 60
        while not (pid.exists() and pid.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        agent_pid = int(pid.read_text())
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _alive(agent_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = _alive(agent_pid)
    if alive:
        os.kill(agent_pid, signal.SIGKILL)
    assert not alive, "the agent outlived its worker"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie is dead, only not yet reaped by its parent
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.integration
def test_a_session_key_opens_only_its_own_session(engine, tiny_tokenizer):
    async def main():
        gateway = Gateway()
        await gateway.start()
        try:
            agents = [
                Agent(
                    "solver",
                    "main",
                    Router([engine]),
                    ChatFormat(tiny_tokenizer),
                    TraceRecorder(f"k{i}"),
                    SamplingConfig(max_tokens=2),
                )
                for i in range(2)
            ]
            with gateway.session({"solver": agents[0]}) as a, gateway.session({"solver": agents[1]}) as b:
                async with httpx.AsyncClient(timeout=60) as http:
                    return (
                        await http.get(
                            f"{a.base_url('solver')}/models", headers={"Authorization": f"Bearer {b.api_key}"}
                        )
                    ).status_code
        finally:
            await gateway.stop()

    assert asyncio.run(main()) == 401
