"""A child process that runs a function on untrusted input: the second wall around task verifiers.

Task verifiers read model output, and some reasoning-gym verifiers evaluate it
(countdown hands the answer to SymPy's `parse_expr`, i.e. `eval`). The first
wall is the task's answer grammar (harnesses/tasks/reasoning_gym.py): such an
answer reaches the verifier only as a re-printed whitelist expression. This
sandbox is the second: should code run in a verifier anyway, it runs in a
child process that

* is killed past `timeout_s` per call (the caller gets a `SandboxError`: one
  failed trace, never a dead rollout worker) and dies with its parent
  (PR_SET_PDEATHSIG);
* when started as root, runs as `tracerl-sandbox`, a system user that owns
  nothing of the worker's (scripts/setup.sh creates it; else `nobody`), with
  every mount read-only but its own working directory: it can neither write
  the worker's files (project sources, the venv, a `.pth` there) nor read
  root's 0600 files. The import path stays readable even in root's 0700 home
  (pyenv, uv): that folder is masked by an empty tmpfs into which only the
  import path is bound back, read-only (harnesses/verifiers/sandbox_isolation.py);
* is PID 1 of its own PID namespace, with its own /proc: `close()` kills it,
  and the kernel kills whatever it started with it;
* has a seccomp filter that kills it on a foreign syscall ABI (i386
  `int 0x80`, x32) and refuses fork, clone and exec; RLIMIT_AS, RLIMIT_CPU
  (for its whole life; the parent replaces it before it is spent),
  RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_NPROC = 0 and PR_SET_NO_NEW_PRIVS;
* has an empty environment (no tokens, no PYTHONPATH), its own empty
  temporary working directory (removed when the child stops), and no network
  (its own empty network namespace);
* speaks length-prefixed JSON to the parent, never pickle: a reply can carry
  only plain data (tuples come back as lists), its size is bounded, and it is
  read against a deadline; a malformed, too deep or late reply kills the
  child. Requests (parent -> child) are pickled: that direction is trusted.

A rule the machine cannot keep (not root, no namespaces, no seccomp for this
CPU) is listed in `Sandbox.isolation["gaps"]` and logged once per process;
docs/harnesses.md says what each costs. It is not a jail: the child still
sees the files that others may read, and can use up to its limits of CPU and
memory. Calls are serialised (one child per Sandbox); after a kill the next
child starts and warms up on a background thread, so the caller that hit the
limit does not also wait for the imports.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import json
import logging
import os
import pickle
import queue
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from harnesses.verifiers.sandbox_isolation import isolate

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">Q")  # the byte length of the message that follows
MAX_REPLY_BYTES = 16 << 20
_warned: set[str] = set()  # the isolation gaps this process has logged


class SandboxError(RuntimeError):
    """The sandboxed call ran out of time or memory, raised, or crashed or garbled its process."""


class Sandbox:
    def __init__(
        self,
        timeout_s: float = 2.0,
        memory_bytes: int = 4 << 30,
        warmup: Callable[[], Any] | None = None,
        startup_s: float = 120.0,
        cpu_s: int = 600,
        file_bytes: int = 16 << 20,
        open_files: int = 64,
        allow_fork: bool = False,
    ):
        """`warmup`: a module-level function a new child runs first, within `startup_s` (the
        imports the calls need), so that every call proper gets only `timeout_s`. `cpu_s`: the
        CPU seconds one child may use in its life (it is replaced at half). `allow_fork`: let the
        child start processes (no RLIMIT_NPROC, no seccomp rule against fork, clone and exec;
        foreign ABIs still kill it): for the test that what it starts dies with it."""
        self.timeout_s = timeout_s
        self.memory_bytes = memory_bytes
        self.warmup = warmup
        self.startup_s = startup_s
        self.limits = {
            "memory_bytes": memory_bytes,
            "cpu_s": cpu_s,
            "file_bytes": file_bytes,
            "open_files": open_files,
            "allow_fork": allow_fork,
        }
        # What the last child managed: user, network_isolated, processes, read_only_files,
        # no_new_processes, pid (its server's), and gaps (the rules it could not keep, in words).
        self.isolation: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._child: _Child | None = None
        self._next: concurrent.futures.Future | None = None  # a child starting in the background
        atexit.register(_close_ref, weakref.ref(self))

    def call(self, fn: Callable, *args: Any) -> Any:
        """`fn(*args)` in the child; `fn` must be a module-level function (it is pickled by name)
        and return plain JSON data. An exception `fn` raises comes back as SandboxError with its
        type and message."""
        with self._lock:
            child = self._ready_child()
            try:
                ok, value = child.call(fn, args, self.timeout_s)
            except SandboxError:
                self._replace_in_background()
                raise
        if not ok:
            raise SandboxError(f"{fn.__name__} failed: {value}")
        return value

    def prewarm(self) -> None:
        """Start a child in the background now, so that the first call need not wait for it."""
        with self._lock:
            if self._child is None and self._next is None:
                self._replace_in_background()

    def close(self) -> None:
        with self._lock:
            if self._next is not None:
                pending, self._next = self._next, None
                pending.add_done_callback(lambda f: f.exception() is None and f.result().stop())
            if self._child is not None:
                self._child.stop()
                self._child = None

    def _ready_child(self) -> _Child:
        child = self._child
        if child is not None and child.alive() and child.cpu_seconds() < self.limits["cpu_s"] / 2:
            return child
        if child is not None:
            child.stop()
            self._child = None
        if self._next is None:
            self._replace_in_background()
        pending, self._next = self._next, None
        try:  # the child's own start is bounded by startup_s; the slack covers the process start
            self._child = pending.result(timeout=self.startup_s + 30)
        except concurrent.futures.TimeoutError:
            pending.add_done_callback(lambda f: f.exception() is None and f.result().stop())
            raise SandboxError(f"the sandbox process did not start within {self.startup_s + 30}s") from None
        self.isolation = self._child.isolation
        return self._child

    def _replace_in_background(self) -> None:
        if self._child is not None:
            self._child.stop()
            self._child = None
        self._next = _start_child(self.limits, self.warmup, self.startup_s)


def _start_child(limits: dict, warmup: Callable[[], Any] | None, startup_s: float) -> concurrent.futures.Future:
    """A new `_Child`, started and warmed up on this process's starter thread."""
    global _starter_started
    with _starter_lock:
        if not _starter_started:
            # One daemon thread that lives as long as the process starts every child: the
            # parent-death signal fires when the *thread* that forked the child exits, and interpreter
            # exit must not wait for a warm-up (a thread pool's workers would).
            _starter_started = True
            threading.Thread(target=_starter_loop, name="sandbox-start", daemon=True).start()
    future: concurrent.futures.Future = concurrent.futures.Future()
    _starter_jobs.put((future, limits, warmup, startup_s))
    return future


def _starter_loop() -> None:
    while True:
        future, limits, warmup, startup_s = _starter_jobs.get()
        try:
            future.set_result(_Child(limits, warmup, startup_s))
        except BaseException as e:  # noqa: BLE001 - handed to whichever call waits for it
            future.set_exception(e)


_starter_jobs: queue.SimpleQueue = queue.SimpleQueue()
_starter_lock = threading.Lock()
_starter_started = False


def _close_ref(ref: weakref.ref) -> None:
    box = ref()
    if box is not None:
        box.close()


class _Child:
    """One sandbox process: its pipes, its working directory, and the request/reply framing."""

    def __init__(self, limits: dict, warmup: Callable[[], Any] | None, startup_s: float):
        self.cwd = tempfile.mkdtemp(prefix="tracerl-sandbox-")
        # The parent's import path travels as an argument (not PYTHONPATH: the environment is
        # empty); "" is the parent's working directory, which the child does not share.
        path = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
        config = json.dumps({**limits, "path": path, "parent": os.getpid()})
        boot = (
            "import json, sys; c = json.loads(sys.argv[1]); sys.path[:] = c['path']; "
            "from harnesses.verifiers.sandbox import _serve; _serve(c)"
        )
        env = {
            "HOME": self.cwd,
            "TMPDIR": self.cwd,
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }  # one thread each: RLIMIT_NPROC = 0 forbids more
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", boot, config],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=self.cwd,
            env=env,
            bufsize=0,
            start_new_session=True,  # its own process group, which stop() kills whole
        )
        # pidfds: whether the process ended, without reaping it (while unreaped, its number still
        # names its process group), and a kill that cannot hit a recycled PID.
        self._waiter, self._server = _pidfd(self.proc.pid), None
        self.server_pid = self.proc.pid  # the process that serves (PID 1 of its namespace, if any)
        os.set_blocking(self.proc.stdin.fileno(), False)
        try:
            self.isolation = self._read(time.monotonic() + startup_s, "the sandbox's start")
            if self.isolation.get("pid", self.proc.pid) != self.proc.pid:
                self.server_pid = self.isolation["pid"]
                self._server = _pidfd(self.server_pid)
            _warn_gaps_once(self.isolation)
            if warmup is not None:
                ok, value = self.call(warmup, (), startup_s)
                if not ok:
                    raise SandboxError(f"the sandbox's warm-up {warmup.__name__} failed: {value}")
        except BaseException:
            self.stop()
            raise

    def alive(self) -> bool:
        if self._waiter is not None:
            return not select.select([self._waiter], [], [], 0)[0]
        return self.proc.poll() is None

    def cpu_seconds(self) -> float:
        try:
            with open(f"/proc/{self.server_pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
        except (OSError, IndexError, ValueError):
            return 0.0

    def call(self, fn: Callable, args: tuple, limit: float) -> tuple[bool, Any]:
        if select.select([self.proc.stdout], [], [], 0)[0]:  # a reply no call asked for: not ours
            self._fail("the sandbox process wrote outside a call and was killed")
        deadline = time.monotonic() + limit
        request = pickle.dumps((fn, args))
        what = getattr(fn, "__name__", "the call")
        self._write(_HEADER.pack(len(request)) + request, deadline, what, limit)
        reply = self._read(deadline, what, limit)
        if not (isinstance(reply, dict) and isinstance(reply.get("ok"), bool) and "value" in reply):
            self.stop()
            raise SandboxError(f"{what}: the sandbox process sent a malformed reply and was killed")
        return reply["ok"], reply["value"]

    def _write(self, data: bytes, deadline: float, what: str, limit: float = 0.0) -> None:
        view, fd = memoryview(data), self.proc.stdin.fileno()
        while view:
            if not select.select([], [fd], [], max(0.0, deadline - time.monotonic()))[1]:
                self._fail(f"{what} ran past its {limit}s limit and was killed")
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                continue
            except OSError:
                self._fail(f"{what} crashed its sandbox process")

    def _read(self, deadline: float, what: str, limit: float = 0.0) -> Any:
        (size,) = _HEADER.unpack(self._read_exactly(_HEADER.size, deadline, what, limit))
        if size > MAX_REPLY_BYTES:
            self._fail(
                f"{what}: the sandbox process sent a reply of {size} bytes (the limit is "
                f"{MAX_REPLY_BYTES}) and was killed"
            )
        try:
            return json.loads(self._read_exactly(size, deadline, what, limit))
        except (UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: nested too deep
            self._fail(f"{what}: the sandbox process sent a malformed reply and was killed")

    def _read_exactly(self, size: int, deadline: float, what: str, limit: float) -> bytes:
        """`size` bytes of the reply, all of them before `deadline` (a child that writes one byte
        and hangs does not hang the caller)."""
        chunks, fd = [], self.proc.stdout.fileno()
        while size:
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                self._fail(f"{what} ran past its {limit}s limit and was killed")
            chunk = os.read(fd, min(size, 1 << 20))
            if not chunk:
                self._fail(f"{what} crashed its sandbox process ({self._cause_of_death()})")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def _cause_of_death(self) -> str:
        """The signal that ended the server, from the waiter's exit status (128 + the signal, as a
        shell reports it, when the waiter outlived a server in a PID namespace)."""
        try:  # it exits as soon as the server does; a server that only closed its end is not dead
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "its reply channel closed"
        number = -code if code < 0 else code - 128 if self._server is not None and code > 128 else 0
        causes = {
            signal.SIGSYS: "a system call its seccomp filter forbids",
            signal.SIGKILL: "killed: out of memory?",
            signal.SIGXCPU: "its CPU time limit",
            signal.SIGXFSZ: "its file size limit",
        }
        if number:
            name = signal.Signals(number).name if number in signal.valid_signals() else f"signal {number}"
            return f"{name}: {causes.get(number, 'killed')}"
        return f"it exited with status {code}"

    def _fail(self, message: str) -> None:
        self.stop()
        raise SandboxError(message)

    def stop(self) -> None:
        """Kill the child and everything it started, and wait until they are gone: its process
        group, and its server, PID 1 of a PID namespace whose end the kernel waits for until every
        other process in it has died. Safe to call twice."""
        if self.proc.returncode is None:  # not reaped: the number is still its group's
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        if self._server is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._server, signal.SIGKILL)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # stuck in the kernel (D state): leave it, it is SIGKILLed
            log.warning("sandbox process %d did not exit within 30s of SIGKILL", self.proc.pid)
        if self._server is not None and not select.select([self._server], [], [], 30)[0]:
            log.warning("sandbox process %d did not exit within 30s of SIGKILL", self.server_pid)
        for fd in (self._waiter, self._server):
            if fd is not None:
                os.close(fd)
        self._waiter = self._server = None
        for pipe in (self.proc.stdin, self.proc.stdout):
            pipe.close()
        shutil.rmtree(self.cwd, ignore_errors=True)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # Linux < 5.3: fall back to waiting on the waiter alone
        return None


def _warn_gaps_once(isolation: dict) -> None:
    """Log each rule the sandbox cannot keep on this machine, once per process."""
    for gap in isolation.get("gaps", []):
        if gap not in _warned:
            _warned.add(gap)
            log.warning(
                "the verifier sandbox is weaker on this machine: %s (docs/harnesses.md, 'The verifier sandbox')", gap
            )


# ---- the child ---------------------------------------------------------------------------


def _serve(config: dict) -> None:
    """The child: isolate itself, say how, then run each (fn, args) request, replying in JSON."""
    replies, requests = os.dup(1), os.dup(0)
    os.dup2(2, 1)  # C-level writes to stdout land in stderr, not in the reply channel
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.stdout, sys.stdin = sys.stderr, None
    isolation = isolate(config, (replies, requests))
    _send(replies, isolation)
    while True:
        header = _recv(requests, _HEADER.size)
        if header is None:  # the parent is gone
            return
        request = _recv(requests, _HEADER.unpack(header)[0])
        if request is None:
            return
        fn, args = pickle.loads(request)
        try:
            reply = {"ok": True, "value": fn(*args)}
        except BaseException as e:  # noqa: BLE001 - every failure goes back to the caller
            reply = {"ok": False, "value": f"{type(e).__name__}: {e}"}
        try:
            _send(replies, reply)
        except (TypeError, ValueError, RecursionError) as e:
            _send(replies, {"ok": False, "value": f"the result is not plain JSON data: {e}"})


def _send(fd: int, message: Any) -> None:
    data = json.dumps(message).encode()
    data = _HEADER.pack(len(data)) + data
    while data:
        data = data[os.write(fd, data) :]


def _recv(fd: int, size: int) -> bytes | None:
    chunks = []
    while size:
        chunk = os.read(fd, size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)
