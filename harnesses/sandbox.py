"""A child process that runs a function on untrusted input: the second wall around task verifiers.

Task verifiers read model output, and some reasoning-gym verifiers evaluate it
(countdown hands the answer to SymPy's `parse_expr`, i.e. `eval`). The first
wall is the task's answer grammar (harnesses/reasoning_gym_tasks.py): such an
answer reaches the verifier only as a re-printed whitelist expression. This
sandbox is the second: should code run in a verifier anyway, it runs in a
child process that

* is killed past `timeout_s` per call (the caller gets a `SandboxError`: one
  failed trace, never a dead rollout worker) and dies with its parent
  (PR_SET_PDEATHSIG);
* has an empty environment (no tokens, no PYTHONPATH), its own empty
  temporary working directory (removed when the child stops), RLIMIT_AS,
  RLIMIT_CPU (for its whole life; the parent replaces it before it is spent),
  RLIMIT_FSIZE, RLIMIT_NOFILE and RLIMIT_NPROC = 0 (no fork, no thread, no
  daemon that outlives a kill), and PR_SET_NO_NEW_PRIVS;
* has no network: its own empty network namespace (`unshare(CLONE_NEWNET)`
  as root, else inside a new user namespace); where neither works it says so
  once in the log, and keeps the network;
* when started as root, runs as `nobody` (so it cannot read root's files,
  such as Ray's session token, and RLIMIT_NPROC holds: root ignores it); if
  the interpreter's import path is not readable by `nobody`, it stays root in
  a new user namespace instead (NPROC then holds, root's files stay readable);
* speaks length-prefixed JSON to the parent, never pickle: a reply can carry
  only plain data (tuples come back as lists), its size is bounded, and it is
  read against a deadline; a malformed or late reply kills the child.
  Requests (parent -> child) are pickled: that direction is trusted.

It is not a jail: the child still sees the file system (readable files are
readable, `nobody`-writable places are writable), can use up to its limits
of CPU and memory, and, as a non-root child, can read the processes of its own
user. Calls are serialised (one child per Sandbox); after a kill the next
child starts and warms up on a background thread, so the caller that hit the
limit does not also wait for the imports.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import ctypes
import json
import logging
import os
import pickle
import queue
import resource
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

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">Q")  # the byte length of the message that follows
MAX_REPLY_BYTES = 16 << 20
_NOBODY = 65534
_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
_warned_network = False


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
    ):
        """`warmup`: a module-level function a new child runs first, within `startup_s` (the
        imports the calls need), so that every call proper gets only `timeout_s`. `cpu_s`: the
        CPU seconds one child may use in its life (it is replaced at half)."""
        self.timeout_s = timeout_s
        self.memory_bytes = memory_bytes
        self.warmup = warmup
        self.startup_s = startup_s
        self.limits = {"memory_bytes": memory_bytes, "cpu_s": cpu_s, "file_bytes": file_bytes, "open_files": open_files}
        self.isolation: dict[str, Any] = {}  # what the last child managed (network, user, ...)
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
            "from harnesses.sandbox import _serve; _serve(c)"
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
        )
        os.set_blocking(self.proc.stdin.fileno(), False)
        try:
            self.isolation = self._read(time.monotonic() + startup_s, "the sandbox's start")
            _warn_network_once(self.isolation)
            if warmup is not None:
                ok, value = self.call(warmup, (), startup_s)
                if not ok:
                    raise SandboxError(f"the sandbox's warm-up {warmup.__name__} failed: {value}")
        except BaseException:
            self.stop()
            raise

    def alive(self) -> bool:
        return self.proc.poll() is None

    def cpu_seconds(self) -> float:
        try:
            with open(f"/proc/{self.proc.pid}/stat", "rb") as f:
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
        except (UnicodeDecodeError, ValueError):
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
                self._fail(f"{what} crashed its sandbox process (out of memory, CPU time or file size?)")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def _fail(self, message: str) -> None:
        self.stop()
        raise SandboxError(message)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # stuck in the kernel (D state): leave it, it is SIGKILLed
            log.warning("sandbox process %d did not exit within 30s of SIGKILL", self.proc.pid)
        for pipe in (self.proc.stdin, self.proc.stdout):
            pipe.close()
        shutil.rmtree(self.cwd, ignore_errors=True)


def _warn_network_once(isolation: dict) -> None:
    global _warned_network
    if not isolation.get("network_isolated") and not _warned_network:
        _warned_network = True
        log.warning(
            "the verifier sandbox has network access (no network namespace: %s)", isolation.get("network_error")
        )


# ---- the child ---------------------------------------------------------------------------


def _serve(config: dict) -> None:
    """The child: isolate itself, say how, then run each (fn, args) request, replying in JSON."""
    replies, requests = os.dup(1), os.dup(0)
    os.dup2(2, 1)  # C-level writes to stdout land in stderr, not in the reply channel
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.stdout, sys.stdin = sys.stderr, None
    isolation = _isolate(config)
    if os.getppid() != config["parent"]:  # the parent died before PR_SET_PDEATHSIG took effect
        return
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
        except (TypeError, ValueError) as e:
            _send(replies, {"ok": False, "value": f"the result is not plain JSON data: {e}"})


def _isolate(config: dict) -> dict:
    """Cut the child off as far as the platform allows; returns what it managed."""
    libc = ctypes.CDLL(None, use_errno=True)
    info: dict[str, Any] = {"network_isolated": False, "user": "unchanged"}
    if libc.unshare(_CLONE_NEWNET) == 0:
        info["network_isolated"] = True
    elif os.geteuid() != 0 and libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) == 0:
        info["network_isolated"], info["user"] = True, "user namespace"
    else:
        info["network_error"] = os.strerror(ctypes.get_errno())
    for limit, value in (
        (resource.RLIMIT_AS, config["memory_bytes"]),
        (resource.RLIMIT_FSIZE, config["file_bytes"]),
        (resource.RLIMIT_NOFILE, config["open_files"]),
        (resource.RLIMIT_NPROC, 0),
    ):
        resource.setrlimit(limit, (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (config["cpu_s"], config["cpu_s"] + 5))
    if os.geteuid() == 0:
        info["user"] = _drop_root(libc, config["path"])
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    # Root ignores RLIMIT_NPROC (even in a user namespace): a seccomp filter refuses new processes
    # and threads to everyone.
    info["no_new_processes"] = _forbid_new_processes(libc)
    # After the credentials change: changing them clears the parent-death signal.
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    return info


def _drop_root(libc: ctypes.CDLL, path: list[str]) -> str:
    """Become `nobody` if it can still import what the parent imports; else shed root's powers
    in a new user namespace (root ignores RLIMIT_NPROC; a namespaced root does not)."""
    if all(_readable_by_others(p) for p in path if os.path.exists(p)):
        os.chown(".", _NOBODY, _NOBODY)
        os.setgroups([])
        os.setgid(_NOBODY)
        os.setuid(_NOBODY)
        return "nobody"
    if libc.unshare(_CLONE_NEWUSER) == 0:
        return "user namespace"
    return "root"


# seccomp: refuse clone/fork/vfork/clone3/execve/execveat with EPERM (x86-64 and aarch64 numbers).
_AUDIT_ARCH_SYSCALLS = {
    "x86_64": (0xC000003E, (56, 57, 58, 59, 322, 435)),
    "aarch64": (0xC00000B7, (220, 221, 281, 435)),
}
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_SECCOMP_RET_ALLOW, _SECCOMP_RET_ERRNO_EPERM = 0x7FFF0000, 0x00050000 | 1


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def _forbid_new_processes(libc: ctypes.CDLL) -> bool:
    arch = _AUDIT_ARCH_SYSCALLS.get(os.uname().machine)
    if arch is None:
        return False
    audit_arch, numbers = arch
    ld_w_abs, jeq_k, ret_k = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K
    n = len(numbers)
    program = [
        (ld_w_abs, 0, 0, 4),  # seccomp_data.arch
        (jeq_k, 0, n + 1, audit_arch),  # another ABI (e.g. x32): allow, as before
        (ld_w_abs, 0, 0, 0),
    ]  # seccomp_data.nr
    program += [(jeq_k, n - i, 0, nr) for i, nr in enumerate(numbers)]  # a match jumps to EPERM
    program += [(ret_k, 0, 0, _SECCOMP_RET_ALLOW), (ret_k, 0, 0, _SECCOMP_RET_ERRNO_EPERM)]
    filters = (_SockFilter * len(program))(*program)
    prog = _SockFprog(len(program), filters)
    return libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) == 0


def _readable_by_others(path: str) -> bool:
    path = os.path.abspath(path)
    need = 0o005 if os.path.isdir(path) else 0o004  # read (and search, for folders: x) ...
    while True:
        if os.stat(path).st_mode & need != need:
            return False
        need = 0o005  # ... and search on every folder above
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


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
