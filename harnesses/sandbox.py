"""A child process that runs a function on untrusted input under a time and a memory limit.

Task verifiers read model output, and some evaluate it (reasoning-gym's
countdown hands the answer to SymPy's `parse_expr`): an answer such as
`9**9**9**9` would take the caller's CPU and memory with it. `Sandbox.call`
runs the function in a child process instead: past `timeout_s` the child is
killed (and a new one started on the next call), past `memory_bytes`
(RLIMIT_AS) its allocations fail; either way the caller gets a `SandboxError`
— one failed trace, never a dead rollout worker. Verifiers take milliseconds;
the limit is short because the call blocks its caller (a harness scores on the
worker's event loop).

The child is a fresh interpreter (`python -m harnesses.sandbox`, not a fork of
a threaded Ray worker, nor a spawn that re-runs the caller's main script); it
serves calls one at a time over its stdin/stdout, pickled.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import resource
import select
import signal
import subprocess
import sys
import threading
from typing import Any, Callable


class SandboxError(RuntimeError):
    """The sandboxed call ran out of time or memory, raised, or crashed its process."""


class Sandbox:
    def __init__(self, timeout_s: float = 2.0, memory_bytes: int = 4 << 30,
                 warmup: Callable[[], Any] | None = None, startup_s: float = 120.0):
        """`warmup`: a module-level function a new child runs first, within `startup_s` (the
        imports the calls need), so that every call proper gets only `timeout_s`."""
        self.timeout_s = timeout_s
        self.memory_bytes = memory_bytes
        self.warmup = warmup
        self.startup_s = startup_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None

    def call(self, fn: Callable, *args: Any) -> Any:
        """`fn(*args)` in the child; `fn` must be a module-level function (it is pickled by name).
        An exception `fn` raises comes back as SandboxError with its type and message."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            ok, value = self._call(fn, args, self.timeout_s)
        if not ok:
            raise SandboxError(f"{fn.__name__} failed: {value}")
        return value

    def _call(self, fn: Callable, args: tuple, limit: float) -> tuple[bool, Any]:
        try:
            pickle.dump((fn, args), self._proc.stdin)
            self._proc.stdin.flush()
            ready, _, _ = select.select([self._proc.stdout], [], [], limit)
            if not ready:
                self._stop()
                raise SandboxError(f"{fn.__name__} ran past its {limit}s limit and was killed")
            return pickle.load(self._proc.stdout)
        except (EOFError, OSError, pickle.UnpicklingError):
            self._stop()
            raise SandboxError(f"{fn.__name__} crashed its sandbox process (memory limit "
                               f"{self.memory_bytes >> 20} MiB?)") from None

    def _start(self) -> None:
        self._proc = subprocess.Popen([sys.executable, "-m", "harnesses.sandbox", str(self.memory_bytes)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        if self.warmup is not None:
            ok, value = self._call(self.warmup, (), self.startup_s)
            if not ok:
                raise SandboxError(f"the sandbox's warm-up {self.warmup.__name__} failed: {value}")

    def _stop(self) -> None:
        self._proc.kill()
        self._proc.wait(timeout=30)
        self._proc = None


def _serve(memory_bytes: int) -> None:
    """The child's loop: run each (fn, args) read from stdin, write back (ok, result or error)."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    try:  # Linux: die with the parent, even mid-call (a killed worker leaves no runaway verifier)
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (AttributeError, OSError):
        pass
    if os.getppid() == 1:  # the parent died before prctl took effect
        return
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a print inside fn must not corrupt the reply channel
    while True:
        try:
            fn, args = pickle.load(requests)
        except EOFError:  # the parent is gone
            return
        try:
            reply = (True, fn(*args))
        except BaseException as e:  # noqa: BLE001 - every failure goes back to the caller
            reply = (False, f"{type(e).__name__}: {e}")
        pickle.dump(reply, replies)
        replies.flush()


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
