"""Rewards an agent reports through the gateway are opt-in, take a key of their own and lie in
harness.reward_range; so does every harness's reward (rewards review #6, #18). Real engine,
tokenizer, gateway over HTTP and RolloutWorker; the learner's half is tests/trainer/test_advantages.py."""

import asyncio
import json
import sys

import httpx
import pytest
from hydra.errors import ConfigCompositionException
from openai import AsyncOpenAI

from harnesses.base import REWARD_RANGE
from rollout.config import GenerateJobConfig, HarnessConfig, RolloutConfig, SamplingConfig, TaskConfig
from rollout.gateway.sessions import GatewayLimits, RewardRefused
from tests.conftest import EASY_CHAIN_SUM
from tests.rollout.agents.test_gateway import gateway_run  # noqa: F401 (the fixture)

OPENAI_AGENT = "harnesses.programs.openai_agent.openai_agent"


async def _answer(base_url, api_key, prompt):
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        r = await client.chat.completions.create(
            model="main", max_tokens=4, messages=[{"role": "user", "content": prompt}]
        )
    return r.choices[0].message.content


async def self_rewarding_agent(task, base_url, api_key):
    """What a model with a shell tool can do: post 1.0 to the reward URL with the key it can read."""
    answer = await _answer(base_url, api_key, task.prompt)
    async with httpx.AsyncClient(timeout=60) as http:
        r = await http.post(f"{base_url}/reward", json={"reward": 1.0}, headers={"Authorization": f"Bearer {api_key}"})
    return f"{r.status_code} {answer}"


@pytest.mark.integration
def test_an_agent_cannot_reward_itself_unless_the_harness_opts_in(run_harness):
    """rewards review #6: by default the chat key posts no reward (a 403, and the trace fails
    naming harness.options.agent_reward, rather than train on a reward the verifier did not give);
    before, 200 and the trace's reward was the agent's 1.0."""
    with pytest.raises(RewardRefused, match=r"harness.options.agent_reward is false"):
        run_harness(OPENAI_AGENT, ["agent"], agent="tests.rollout.agents.test_gateway_rewards.self_rewarding_agent")


@pytest.mark.integration
def test_a_command_agent_sees_a_reward_key_only_when_the_harness_opts_in(run_harness):
    """rewards review #6: OPENAI_API_KEY and TRACERL_REWARD_URL were in every command agent's
    environment, and that key posted rewards. Now no reward URL or key by default; opted in, a
    reward key of its own (the chat key gets a 401 at the reward route: tests/rollout/agents/test_gateway.py)."""
    show = [sys.executable, "-c", "import os, json; print(json.dumps(dict(os.environ)))"]
    _, _, result = run_harness(OPENAI_AGENT, ["agent"], command=show)
    env = json.loads(result.info["answer"])
    assert "OPENAI_API_KEY" in env and not {"TRACERL_REWARD_URL", "TRACERL_REWARD_KEY"} & set(env)
    _, _, result = run_harness(OPENAI_AGENT, ["agent"], command=show, agent_reward=True)
    env = json.loads(result.info["answer"])
    assert env["TRACERL_REWARD_KEY"] not in ("", env["OPENAI_API_KEY"])
    assert env["TRACERL_REWARD_URL"] == env["OPENAI_BASE_URL"] + "/reward"


BAD_REWARDS = {  # raw JSON bodies
    "1e308": b'{"reward": 1e308}',  # the review's: NaN advantages for its whole group
    "past the range": b'{"reward": 1000001}',
    "-1e7": b'{"reward": -1e7}',
    "NaN": b'{"reward": NaN}',
    "Infinity": b'{"reward": Infinity}',
    "401 digits": b'{"reward": 1' + b"0" * 400 + b"}",  # rewards review #18: float() overflowed, a 500
    "a string": b'{"reward": "high"}',
    "true": b'{"reward": true}',
    "none": b"{}",
}


@pytest.mark.integration
@pytest.mark.parametrize("name", list(BAD_REWARDS))
def test_a_reward_that_is_not_a_number_in_range_is_a_400_and_fails_the_trace(gateway_run, name):
    """rewards review #6 and #18: 1e308 was taken (200), a 401-digit integer was a 500 "gateway
    bug". Each is a 400 naming `reward` and the range, the reward stays unset, and the session's
    failure (raised by the harness when the agent is done) says why."""

    async def post(session, client, k):
        async with httpx.AsyncClient(timeout=60) as http:
            return await http.post(
                session.reward_url("solver"),
                content=BAD_REWARDS[name],
                headers={"Authorization": f"Bearer {session.reward_key}", "Content-Type": "application/json"},
            )

    [(_, session, r)] = gateway_run(post, agent_reward=True)
    assert r.status_code == 400 and r.json()["error"]["param"] == "reward", r.text
    assert "harness.reward_range [-1e+06, 1e+06]" in r.json()["error"]["message"]
    assert session.reward is None and isinstance(session.failure, RewardRefused)
    with pytest.raises(RewardRefused, match=r"reward must be a number in harness.reward_range"):
        session.raise_failure()


@pytest.mark.integration
def test_the_range_is_the_gateways_and_its_ends_are_in_it(gateway_run):
    """With reward_range (0, 1): 1 and 0 are taken, 1.5 is refused naming [0, 1]."""

    async def post(session, client, k):
        auth = {"Authorization": f"Bearer {session.reward_key}"}
        async with httpx.AsyncClient(timeout=60) as http:
            return [
                (await http.post(session.reward_url("solver"), json={"reward": r}, headers=auth)).status_code
                for r in (1, 0, 1.5)
            ]

    [(_, session, codes)] = gateway_run(post, agent_reward=True, limits=GatewayLimits(reward_range=(0.0, 1.0)))
    assert codes == [200, 200, 400] and session.reward == 0.0
    assert "[0, 1]" in str(session.failure)


async def overreporting_agent(task, base_url, api_key, reward_key):
    """Reports 2.0, outside the run's harness.reward_range [0, 1]."""
    answer = await _answer(base_url, api_key, task.prompt)
    async with httpx.AsyncClient(timeout=60) as http:
        r = await http.post(
            f"{base_url}/reward", json={"reward": 2.0}, headers={"Authorization": f"Bearer {reward_key}"}
        )
    return f"{r.status_code} {answer}"


async def five(task, agents):
    """A harness whose reward is outside the run's harness.reward_range [0, 1]."""
    await agents["solver"].chat(task.prompt, max_tokens=2)
    return 5.0


def _worker(engine, tiny_path, harness: HarnessConfig):
    from rollout.orchestration.worker import RolloutWorker

    cfg = GenerateJobConfig(
        harness=harness,
        agents={"solver": "main"},
        task=TaskConfig(name="chain_sum", params=EASY_CHAIN_SUM),
        rollout=RolloutConfig(concurrency=1, group_size=1, timeout_s=60.0),
        sampling=SamplingConfig(max_tokens=4),
    )
    return RolloutWorker(0, cfg, {"main": [engine]}, {"main": (tiny_path, None)}, buffer=None)


@pytest.mark.integration
def test_a_rollout_worker_fails_a_trace_whose_reward_is_outside_harness_reward_range(engine, tiny_path):
    """rewards review #6: nothing bounded a harness's reward (a finite 1e308 voided a step). A
    RolloutWorker with harness.reward_range [0, 1]: a harness returning 5.0 and an agent reporting
    2.0 (its gateway refuses it: a 400) each give a failed trace that says why."""
    plain = HarnessConfig(
        _target_="tests.rollout.agents.test_gateway_rewards.five",
        name="five",
        roles=["solver"],
        reward_range=[0.0, 1.0],
    )
    agent = HarnessConfig(
        _target_=OPENAI_AGENT,
        name="openai_agent",
        roles=["solver"],
        options={"agent": "tests.rollout.agents.test_gateway_rewards.overreporting_agent", "agent_reward": True},
        reward_range=[0.0, 1.0],
    )
    for harness, error in (
        (plain, "harness returned reward = 5, outside harness.reward_range [0, 1]"),
        (agent, "the gateway refused the agent's reward: reward must be a number in harness.reward_range [0, 1]"),
    ):
        worker = _worker(engine, tiny_path, harness)
        trace = asyncio.run(worker.episode(worker.tasks.train_task(0), "g", 0))
        assert trace.status == "failed" and error in trace.error, trace.error
        assert trace.reward == 0.0 and len(trace.sequences) == 1


@pytest.mark.unit
@pytest.mark.parametrize(
    ("overrides", "msg"),
    [
        (["harness.reward_range=[1,0]"], r"harness.reward_range=\[1.0, 0.0\] must be \[low, high\]"),
        (["harness.reward_range=[0]"], r"harness.reward_range=\[0.0\] must be \[low, high\]"),
        (["harness.reward_range=[0,inf]"], r"harness.reward_range=\[0.0, inf\] must be \[low, high\]: finite"),
        (["harness=openai_agent", "harness.options.agent_reward=yes"], r"harness.options.agent_reward='yes'"),
        (
            [
                "harness=openai_agent",
                "harness.options.agent=tests.rollout.agents.test_gateway_rewards.self_rewarding_agent",
                "harness.options.agent_reward=true",
            ],
            r"harness.options.agent_reward=true: the agent function .* must take a reward_key",
        ),
    ],
)
def test_reward_settings_are_checked_at_start_naming_the_key(overrides, msg):
    from trainer.checks import validate
    from trainer.config import compose

    with pytest.raises((ValueError, ConfigCompositionException), match=msg):
        validate(compose("train", overrides))


@pytest.mark.unit
def test_the_default_range_is_one_place():
    assert tuple(HarnessConfig().reward_range) == REWARD_RANGE == GatewayLimits().reward_range
