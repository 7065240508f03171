"""The user-function verifier: `task.params.verifier=package.module:function`.

`function(completion, answer, metadata) -> float` is the user's code reading model output,
which is hostile input: it runs in a sandbox process (harnesses/verifiers/sandbox.py) with bounded
time and memory and no network. It is imported when the task source is built (a missing
module or function, or a signature that does not take the three arguments, is a
ValueError before Ray starts), and in the sandbox on its first call.
"""

from __future__ import annotations

import importlib
import inspect
import math
from dataclasses import dataclass
from typing import Any

from harnesses.base import load_object
from harnesses.verifiers.base import KEY, Verifier
from harnesses.verifiers.sandbox import Sandbox


@dataclass
class UserFunction(Verifier):
    """`function(completion, answer, metadata) -> float` of `package.module:function`, in a sandbox
    process (harnesses/verifiers/sandbox.py): user code reading hostile text runs with bounded time and
    memory; past `timeout_s` (the first call includes the module's import) the trace fails."""

    name = "function"
    needs_answer = False
    target: str = ""
    timeout_s: float = 5.0

    def check(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"{KEY}_options.timeout_s={self.timeout_s} must be > 0")
        module, _, function = self.target.partition(":")
        fn = load_object(f"{module}.{function}", KEY)
        try:
            inspect.signature(fn).bind("completion", "answer", {})
        except (TypeError, ValueError) as e:
            raise ValueError(f"{KEY}={self.target!r} must take (completion, answer, metadata): {e}") from None

    def score(self, text: str, gold: str | None, metadata: dict[str, Any], question: str | None = None) -> float:
        reward = _sandbox(self.timeout_s).call(_call_user_function, self.target, text, gold, metadata)
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not 0 <= reward <= 1:
            raise ValueError(f"{KEY}={self.target!r} returned {reward!r}; a reward is a number in [0, 1]")
        return float(reward)


_SANDBOXES: dict[float, Sandbox] = {}  # one per process and timeout: user functions run there


def _sandbox(timeout_s: float) -> Sandbox:
    if timeout_s not in _SANDBOXES:
        _SANDBOXES[timeout_s] = Sandbox(timeout_s=timeout_s)
    return _SANDBOXES[timeout_s]


def _call_user_function(target: str, text: str, gold: str | None, metadata: dict[str, Any]) -> Any:
    """In the sandbox: import and call the user's function; its reward as a float (a non-finite one as
    text, which the caller refuses)."""
    module, _, function = target.partition(":")
    reward = getattr(importlib.import_module(module), function)(text, gold, metadata)
    reward = float(reward) if not isinstance(reward, (bool, str)) else reward
    return reward if not isinstance(reward, float) or math.isfinite(reward) else repr(reward)
