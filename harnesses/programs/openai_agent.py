"""openai_agent: train an agent written against the OpenAI chat API, unmodified.

The agent talks to the rollout worker's gateway (rollout/gateway/server.py), which
records every call token-exact; the agents this harness gets hand it over
(`agent.gateway()`: harnesses do not import rollout/). It runs one of two ways
(`harness.options`):

- `agent: package.module.function`: an async Python function
  `agent(task, base_url, api_key) -> answer` (with `agent_reward`, also a
  `reward_key` keyword argument), called in the worker's process
  (it must use an async client: a sync one blocks the event loop the gateway
  answers on, and waits for itself until its own timeout);
- `command: "python my_agent.py"`: a subprocess, in its own process group,
  the task's prompt on stdin and its answer on stdout (at most
  `MAX_ANSWER_BYTES`: more fails the trace and kills it).

`api_key` is the session's own key (a new one per episode): every request to
the gateway must carry it. The agent's output is hostile input, and so is the
agent: a command does not inherit the worker's environment (its secrets, RAY_*
addresses). It gets only `ENV_ALLOWED` and `LC_*` from the worker, the names
listed in `env` (an option: e.g. `env: [HF_HOME]`), and what the harness sets:
`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `TRACERL_BASE_URLS` (every role's URL
as JSON) and `TRACERL_BASE_URL` (the session's one URL, where a request's
`model` names its role: for multi-agent programs configured by model name).
It dies with the worker (PR_SET_PDEATHSIG; its own children do only if they
set it too, or when the group is killed).

`role` (default: the only role) is the one whose URL the agent gets as its
base URL; with `url: session` the agent gets the session's one URL instead,
where each request's `model` names its role (a multi-agent program written
with a framework that picks agents' models by name). The reward is the task's verifier on the answer. With
`agent_reward: true` the agent may report it instead: POST `{"reward": r}` to
`<base URL>/reward` with the session's reward key, a key of its own (the
chat key gets a 401 there): a function agent gets it as `reward_key`, a
command as `TRACERL_REWARD_KEY` (and `TRACERL_REWARD_URL`). Then whatever can
read the command's environment can set the reward: a shell or code tool the
model drives inherits it, or reads /proc/<agent pid>/environ (deleting the
variable does not clear that); opt in only for agents whose model runs no
such tool. Off (the default), the route answers 403. A reward the
gateway refuses (off, not a number, outside `harness.reward_range`) fails the
trace. An agent past `timeout_s` is killed with its whole process group and
the trace fails; so does a command that exits non-zero (its stderr's tail is
the error). A request the model's engine failed (the agent got a 503) makes
the episode run again (rollout.retries), whatever the agent did with the error.

Trace shape: whatever the agent does; every call a sequence.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import os
import shlex
import signal
import sys

from harnesses.base import Agents, HarnessResult, Task, load_object, option_role, register_options_check

# The worker's variables a command agent sees (plus LC_* and the names in harness.options.env).
ENV_ALLOWED = ("PATH", "HOME", "LANG", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV")
MAX_ANSWER_BYTES = 2**20  # a command's stdout (its answer)
STDERR_TAIL_BYTES = 64 * 2**10  # of a command's stderr, the tail kept for the error message


async def openai_agent(
    task: Task,
    agents: Agents,
    agent: str | None = None,
    command: str | list[str] | None = None,
    role: str | None = None,
    timeout_s: float = 300.0,
    env: list[str] | None = None,
    agent_reward: bool = False,
    url: str = "role",
) -> HarnessResult:
    if url == "role":
        role = option_role(agents, role, "whose URL is the agent's OPENAI_BASE_URL")
    else:
        role = role or next(iter(agents))
    gateway = await agents[role].gateway()  # the worker's endpoint, handed in with the agents
    # a dict, as Gateway.session takes: a harness gets its agents as a read-only Mapping
    with gateway.session(dict(agents), agent_reward=agent_reward) as session:
        own_url = role if url == "role" else None  # None: the session's URL
        base_url = session.base_url(own_url)
        try:
            if command is not None:
                own = {
                    "OPENAI_BASE_URL": base_url,
                    "OPENAI_API_KEY": session.api_key,
                    "TRACERL_BASE_URLS": json.dumps({r: session.base_url(r) for r in agents}),
                    "TRACERL_BASE_URL": session.base_url(),
                }
                if session.reward_key is not None:  # the session has one exactly when agent_reward is set
                    own |= {"TRACERL_REWARD_URL": session.reward_url(own_url), "TRACERL_REWARD_KEY": session.reward_key}
                answer = await run_command(command, task.prompt, agent_env(own, env or ()), timeout_s)
            else:
                keys = {"reward_key": session.reward_key} if agent_reward else {}
                answer = await _run_function(_agent_function(agent), task, base_url, session.api_key, keys, timeout_s)
        except Exception:
            session.raise_failure()  # an engine failure the agent then failed on: the episode runs again
            raise
        session.raise_failure()  # the agent may have carried on past a failed request (or a refused reward)
        if not isinstance(answer, str):
            raise ValueError(f"the agent returned {type(answer).__name__}, not its answer as a string")
        reward = session.reward if session.reward is not None else task.score(answer)
        return HarnessResult(
            reward=reward,
            info={
                "answer": answer[-2000:],
                "reward_from": ("agent" if session.reward is not None else "verifier"),
                **session.counts(),
            },
        )


async def _run_function(fn, task: Task, base_url: str, api_key: str, keys: dict, timeout_s: float):
    try:
        return await asyncio.wait_for(fn(task, base_url, api_key, **keys), timeout_s)
    except TimeoutError:
        raise TimeoutError(f"the agent ran past harness.options.timeout_s={timeout_s}") from None


def agent_env(own: dict[str, str], names=()) -> dict[str, str]:
    """A command agent's environment: the allowed and the named variables of the worker's, and `own`."""
    passed = {k: v for k, v in os.environ.items() if k in ENV_ALLOWED or k.startswith("LC_") or k in names}
    return {**passed, **own}


@functools.cache
def _agent_function(path: str):
    """The agent function at `path`, imported once per worker process."""
    return load_object(path, "harness.options.agent")


def check_options(options: dict) -> None:
    """At start: exactly one of `agent` / `command`, the agent importable (and taking `reward_key`
    with `agent_reward`), a positive timeout, `agent_reward` true or false."""
    agent, command = options.get("agent"), options.get("command")
    agent_reward = options.get("agent_reward", False)
    if not isinstance(agent_reward, bool):
        raise ValueError(f"harness.options.agent_reward={agent_reward!r} must be true or false")
    if (agent is None) == (command is None):
        raise ValueError(
            "harness.options: set exactly one of agent (an async function's dotted path) or command (a program to run)"
        )
    if agent is not None:
        fn = _agent_function(agent)
        if not asyncio.iscoroutinefunction(fn):
            raise ValueError(f"harness.options.agent={agent!r} must be an async function (task, base_url, api_key)")
        if agent_reward and not _takes(fn, reward_key=""):
            raise ValueError(
                f"harness.options.agent_reward=true: the agent function {agent!r} must take a reward_key "
                f"argument, (task, base_url, api_key, reward_key): the key it reports its reward with"
            )
    elif command is not None:
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not argv:
            raise ValueError("harness.options.command is empty")
    if not float(options.get("timeout_s", 300.0)) > 0:
        raise ValueError("harness.options.timeout_s must be > 0")
    if options.get("url", "role") not in ("role", "session"):
        raise ValueError(
            f"harness.options.url={options['url']!r} must be role (the role's own URL) or session (one URL, "
            f"each request's model naming its role)"
        )
    if options.get("api_key") is not None:
        raise ValueError(
            "harness.options.api_key is gone: the gateway makes a key per episode and hands it to "
            "the agent (its api_key argument, or OPENAI_API_KEY); remove the option"
        )
    names = options.get("env") or ()
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise ValueError(
            f"harness.options.env={names!r} must be a list of environment variable names to pass to the agent command"
        )


def _takes(fn, **keywords) -> bool:
    try:
        inspect.signature(fn).bind(None, None, None, **keywords)
    except TypeError:
        return False
    return True


register_options_check(openai_agent, check_options)


async def run_command(command: str | list[str], stdin: str, env: dict[str, str], timeout_s: float) -> str:
    """Run `command` in its own process group with `stdin` and exactly `env`, return its stdout.
    Past `timeout_s`, past MAX_ANSWER_BYTES of stdout, or if the caller is cancelled, the whole
    group is killed (no orphans) before this returns; if the worker dies, the command does too."""
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable  # the worker's interpreter: the run's environment
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        start_new_session=True,
        preexec_fn=_die_with_parent(os.getpid()),
    )
    try:
        out, err, _, _ = await asyncio.wait_for(
            asyncio.gather(
                _read_bounded(proc.stdout, proc.pid),
                _read_tail(proc.stderr),
                _feed(proc.stdin, stdin.encode()),
                proc.wait(),
            ),
            timeout_s,
        )
    except TimeoutError:
        raise TimeoutError(
            f"the agent command ran past harness.options.timeout_s={timeout_s} and was killed with its process group"
        ) from None
    finally:  # the group goes, whether the agent finished, hung, flooded or was cancelled: no orphans
        _kill_group(proc.pid)
        if proc.returncode is None:
            await proc.wait()
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip()[-1500:]
        raise RuntimeError(f"the agent command exited with {proc.returncode}: {tail}")
    return out.decode(errors="replace").strip()


async def _read_bounded(stream, pid: int) -> bytes:
    """The command's stdout, up to MAX_ANSWER_BYTES. Past it the group is killed and the pipe read
    to its end, discarding: a pipe left unread stays open (asyncio stops reading a full one) and
    the process's wait() never returns."""
    chunks, size = [], 0
    while chunk := await stream.read(65536):
        size += len(chunk)
        if size <= MAX_ANSWER_BYTES:
            chunks.append(chunk)
        elif chunks:
            _kill_group(pid)
            chunks = []
    if size > MAX_ANSWER_BYTES:
        raise RuntimeError(
            f"the agent command wrote more than {MAX_ANSWER_BYTES} bytes to stdout (its answer "
            f"goes there; logs belong on stderr) and was killed with its process group"
        )
    return b"".join(chunks)


async def _read_tail(stream) -> bytes:
    tail = b""
    while chunk := await stream.read(65536):
        tail = (tail + chunk)[-STDERR_TAIL_BYTES:]
    return tail


async def _feed(pipe, data: bytes) -> None:
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # an agent that does not read its stdin
        pipe.write(data)
        await pipe.drain()
        pipe.close()


def _die_with_parent(parent: int):
    """A preexec_fn: the child gets SIGKILL when the worker dies (Linux PR_SET_PDEATHSIG), so a
    killed or OOM-killed worker leaves no agent behind. The signal follows the thread that forked
    (the worker's event loop thread, which lives as long as the worker)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork: the child only calls it

    def preexec():
        prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the worker died before prctl took effect
            os._exit(1)

    return preexec


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
