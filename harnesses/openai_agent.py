"""openai_agent: train an agent written against the OpenAI chat API, unmodified.

The agent talks to the rollout worker's gateway (rollout/gateway.py), which
records every call token-exact. It runs one of two ways (`harness.options`):

- `agent: package.module.function`: an async Python function
  `agent(task, base_url, api_key) -> answer`, called in the worker's process;
- `command: "python my_agent.py"`: a subprocess, in its own process group,
  with `OPENAI_BASE_URL` / `OPENAI_API_KEY` (and `TRACERL_REWARD_URL`,
  `TRACERL_BASE_URLS`: every role's URL as JSON) in its environment, the
  task's prompt on stdin and its answer on stdout.

`role` (default: the only role) is the one whose URL the agent gets as its
base URL. The reward is what the agent POSTed to `<base URL>/reward`
(`{"reward": r}`), else the task's verifier on the answer. An agent past
`timeout_s` is killed with its whole process group and the trace fails; so
does a command that exits non-zero (its stderr's tail is the error).

Trace shape: whatever the agent does; every call a sequence.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shlex
import signal
import sys

from harnesses.base import HarnessResult, load_object


async def openai_agent(task, agents, agent: str | None = None, command: str | list[str] | None = None,
                       role: str | None = None, timeout_s: float = 300.0, api_key: str = "tracerl") -> HarnessResult:
    from rollout.gateway import Gateway

    role = _role(agents, role)
    gateway = await Gateway.shared()
    with gateway.session(agents) as session:
        base_url = session.base_url(role)
        if command is not None:
            env = {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key,
                   "TRACERL_REWARD_URL": session.reward_url(role),
                   "TRACERL_BASE_URLS": json.dumps({r: session.base_url(r) for r in agents})}
            answer = await run_command(command, task.prompt, env, timeout_s)
        else:
            fn = _agent_function(agent)
            try:
                answer = await asyncio.wait_for(fn(task, base_url, api_key), timeout_s)
            except asyncio.TimeoutError:
                raise TimeoutError(f"the agent ran past harness.options.timeout_s={timeout_s}") from None
        if not isinstance(answer, str):
            raise ValueError(f"the agent returned {type(answer).__name__}, not its answer as a string")
        reward = session.reward if session.reward is not None else task.score(answer)
        return HarnessResult(reward=reward, info={"answer": answer[-2000:], "reward_from": (
            "agent" if session.reward is not None else "verifier"), **session.counts()})


@functools.lru_cache(maxsize=None)
def _agent_function(path: str):
    """The agent function at `path`, imported once per worker process."""
    return load_object(path, "harness.options.agent")


def _role(agents, role: str | None) -> str:
    if role is None:
        if len(agents) != 1:
            raise ValueError(f"harness.options.role: the run has roles {sorted(agents)}; name the one whose "
                             f"URL is the agent's OPENAI_BASE_URL")
        return next(iter(agents))
    if role not in agents:
        raise ValueError(f"harness.options.role={role!r} is not a role of this run: {sorted(agents)}")
    return role


def check_options(options: dict) -> None:
    """At start: exactly one of `agent` / `command`, the agent importable, a positive timeout."""
    agent, command = options.get("agent"), options.get("command")
    if (agent is None) == (command is None):
        raise ValueError("harness.options: set exactly one of agent (an async function's dotted path) "
                         "or command (a program to run)")
    if agent is not None:
        fn = _agent_function(agent)
        if not asyncio.iscoroutinefunction(fn):
            raise ValueError(f"harness.options.agent={agent!r} must be an async function (task, base_url, api_key)")
    else:
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not argv:
            raise ValueError("harness.options.command is empty")
    if not float(options.get("timeout_s", 300.0)) > 0:
        raise ValueError("harness.options.timeout_s must be > 0")


openai_agent.check_options = check_options


async def run_command(command: str | list[str], stdin: str, env: dict[str, str], timeout_s: float) -> str:
    """Run `command` in its own process group with `stdin`, return its stdout. Past `timeout_s`, or
    if the caller is cancelled, the whole group is killed (no orphans) before this returns."""
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable  # the worker's interpreter: the run's environment
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **env}, start_new_session=True)
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), timeout_s)
    except asyncio.TimeoutError:
        raise TimeoutError(f"the agent command ran past harness.options.timeout_s={timeout_s} and was killed "
                           f"with its process group") from None
    finally:  # the group goes, whether the agent finished, hung or was cancelled: no orphans
        _kill_group(proc.pid)
        if proc.returncode is None:
            await proc.wait()
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip()[-1500:]
        raise RuntimeError(f"the agent command exited with {proc.returncode}: {tail}")
    return out.decode(errors="replace").strip()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
