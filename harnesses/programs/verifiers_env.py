"""verifiers_env: a verifiers environment's own rollout, unmodified, through the gateway; its rubric's reward.

With task=verifiers (harnesses/tasks/verifiers_env.py) each task is one row of an installed verifiers
environment. This harness loads the environment (cached per process), points a verifiers
`OpenAIChatCompletionsClient` at the gateway (an `AsyncOpenAI` on the role's URL, the session's key,
no retries) and calls the environment's `run_rollout` on the row: its own rollout (single-turn,
multi-turn with its env responses, tool calls with its tools) and its own rubric, as prime-rl runs it.
Every model call goes through the gateway, which records it token-exact: a turn that resends the
conversation so far extends the previous sequence (`gateway_extended`), else it is a fresh one
(`gateway_fresh`).

The reward is the rubric's (`output["reward"]`); its metrics, the stop condition and the last
assistant message go into the trace's info. A rollout the model ended (an empty reply: verifiers'
`InvalidModelResponseError`) is scored as verifiers scores it. A request the gateway or the engine
failed fails the trace: an engine failure as itself (the worker runs the episode again), any other
model-call error (`ModelError`, e.g. a sampling setting the gateway refuses, named in the message) as
a RuntimeError, as does a rollout past `timeout_s`.

Options: `role` (default: the only role), the role whose URL the client gets and whose name is the
request's `model`; `sampling` (a dict) the rollout's sampling arguments beside the environment's own
(`env.sampling_args`; unset: the run's `sampling`); `timeout_s` for the whole rollout.

Trace shape: the environment's; one role, every model call a sequence.
"""

from __future__ import annotations

import asyncio
import copy
import functools
from typing import Any

from harnesses.base import Agents, HarnessResult, Task, option_role, register_options_check
from harnesses.tasks.verifiers_env import VerifiersTask, load_env

# verifiers' errors that are the model's doing (an empty or malformed reply): the rollout ends and is
# scored. Any other error from a model call is the gateway's or the engine's, and fails the trace.
MODEL_ENDED = ("EmptyModelResponseError", "InvalidModelResponseError")


async def verifiers_env(
    task: Task,
    agents: Agents,
    role: str | None = None,
    sampling: dict | None = None,
    timeout_s: float = 600.0,
) -> HarnessResult:
    if not isinstance(task, VerifiersTask):
        raise ValueError(
            f"harness verifiers_env runs a verifiers environment's rows: it needs task=verifiers "
            f"(harnesses/tasks/verifiers_env.py), not {type(task).__name__}"
        )
    role = option_role(agents, role, "that plays the environment")
    env = load_env(task.env_id, task.env_args)
    import verifiers as vf
    from openai import AsyncOpenAI

    sampling_args: dict[str, Any] = {**copy.deepcopy(env.sampling_args), **(sampling or {})}
    gateway = await agents[role].gateway()
    with gateway.session(dict(agents)) as session:
        client = vf.OpenAIChatCompletionsClient(
            AsyncOpenAI(base_url=session.base_url(role), api_key=session.api_key, max_retries=0, timeout=timeout_s)
        )
        try:
            output = await asyncio.wait_for(
                env.run_rollout(copy.deepcopy(task.row), client, role, sampling_args), timeout_s
            )
        except TimeoutError:
            session.raise_failure()
            raise RuntimeError(f"the environment's rollout ran past harness.options.timeout_s={timeout_s}") from None
        except Exception:
            session.raise_failure()  # an engine failure the rollout then failed on: the episode runs again
            raise
        finally:
            await client.close()
        session.raise_failure()  # verifiers keeps a failed model call in its state and ends the rollout
        counts = session.counts()
    error = output.get("error")
    if error is not None and error.get("error") not in MODEL_ENDED:
        raise RuntimeError(f"the environment's rollout failed: {error.get('error_chain_repr') or error}")
    return HarnessResult(
        reward=float(output["reward"]),
        info={
            "env_id": task.env_id,
            "answer": _last_assistant(output.get("completion"))[-2000:],
            "metrics": {k: float(v) for k, v in (output.get("metrics") or {}).items()},
            "stop_condition": output.get("stop_condition"),
            "is_truncated": bool(output.get("is_truncated")),
            "env_error": None if error is None else error.get("error"),
            **counts,
        },
    )


def _last_assistant(completion: Any) -> str:
    """The last assistant message's text in the rollout's output completion (verifiers' message
    objects, or dicts)."""
    for message in reversed(completion or []):
        field = message.get if isinstance(message, dict) else functools.partial(getattr, message)
        if field("role", None) == "assistant":
            content = field("content", None)
            if isinstance(content, list):  # content parts
                return "".join(
                    str(p.get("text", "") if isinstance(p, dict) else getattr(p, "text", "")) for p in content
                )
            return content if isinstance(content, str) else ""
    return ""


def check_options(options: dict) -> None:
    """At start: a positive timeout and sampling arguments as a mapping."""
    if not float(options.get("timeout_s", 600.0)) > 0:
        raise ValueError("harness.options.timeout_s must be > 0")
    sampling = options.get("sampling")
    if sampling is not None and not isinstance(sampling, dict):
        raise ValueError(f"harness.options.sampling={sampling!r} must be a mapping of sampling arguments")


register_options_check(verifiers_env, check_options)
