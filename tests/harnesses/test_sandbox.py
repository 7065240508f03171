"""The verifier sandbox (harnesses/verifiers/sandbox.py) as a wall: a real child process runs the module-level
helpers below, and each test checks what the child can see or do, or that a garbled, late or
hostile reply fails the call (SandboxError) without hanging or corrupting the caller. The probes of
rewards review #4 (write the worker's files, read root's 0600 files, fork through the i386 ABI, x32,
a process that outlives close()) run against the real sandbox on this machine."""

from __future__ import annotations

import ctypes
import logging
import math
import mmap
import os
import platform
import select
import shutil
import signal
import socket
import sys
import sysconfig
import tempfile
import time

import pytest

from harnesses.verifiers import sandbox
from harnesses.verifiers.sandbox import Sandbox, SandboxError
from harnesses.verifiers.sandbox_isolation import SANDBOX_USER

pytestmark = pytest.mark.unit

MARKER = "TRACERL_SANDBOX_TEST_MARKER"


# ---- helpers the child runs (module-level: pickled by name) ------------------------------


def warm_up() -> None:
    """Each new child runs this first: importing this module (and pytest) to unpickle it then
    counts against the start's budget, not against a test's first 2 s call on a loaded machine."""


def child_environment() -> dict:
    return dict(os.environ)


def child_cwd() -> str:
    return os.getcwd()


def write_garbage_reply() -> None:
    """Write a reply frame whose body is not JSON on the reply channel (which descriptor that is,
    a verifier does not know: stdout and every other descriptor the child holds are tried), then
    hang."""
    body = b"\x80\x04 not json"
    frame = len(body).to_bytes(8, "big") + body
    for fd in [1, *range(3, 16)]:
        try:
            os.write(fd, frame)
        except OSError:
            pass
    time.sleep(60)


def write_one_byte_and_hang() -> None:
    for fd in [1, *range(3, 16)]:
        try:
            os.write(fd, b"\x00")
        except OSError:
            pass
    time.sleep(60)


def write_to_fd_1(n: int) -> int:
    """C-level write to descriptor 1 (what a C library's printf does), then an honest result."""
    os.write(1, b"\x00\x00\x00\x00\x00\x00\x00\x05hello from C\n")
    return n * 2


def sleep_s(seconds: float) -> str:
    time.sleep(seconds)
    return "slept"


def connect_to(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        return "connected"


def fork_a_child() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    return pid


def not_json() -> object:
    return {1, 2}


def python_path() -> list:
    return sys.path


def write_deep_json_reply() -> None:
    """A reply frame nested 100,000 deep (json.loads raises RecursionError on it) on every descriptor
    the child holds past stderr, then hang."""
    body = b"[" * 100_000
    frame = len(body).to_bytes(8, "big") + body
    for fd in range(3, 16):
        try:
            os.write(fd, frame)
        except OSError:
            pass
    time.sleep(60)


def try_to_append(path: str) -> str:
    try:
        with open(path, "a") as f:
            f.write("# written by the sandbox\n")
        return "written"
    except OSError as e:
        return f"refused: {e.strerror}"


def try_to_create(path: str) -> str:
    try:
        with open(path, "x"):
            return "created"
    except OSError as e:
        return f"refused: {e.strerror}"


def try_to_read(path: str) -> str:
    try:
        with open(path) as f:
            return f"read {f.read()!r}"
    except OSError as e:
        return f"refused: {e.strerror}"


def visible_processes() -> list:
    return sorted(int(name) for name in os.listdir("/proc") if name.isdigit())


# mov eax, 2 (i386 fork); int 0x80; test eax, eax; jnz ret; the new process: mov eax, 29 (i386
# pause); int 0x80; jmp back to the mov: it sleeps for ever in machine code, never back in Python.
FORK_I386 = bytes.fromhex("b802000000cd8085c07509b81d000000cd80ebf7c3")


def fork_i386() -> int:
    """fork through the i386 `int 0x80` ABI from a 64-bit process (rewards review #4): its pid, or
    an error."""
    code = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    code.write(FORK_I386)
    return ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(code)))()


def getpid_x32() -> str:
    """getpid by its x32 number (bit 30 set): what the kernel answered."""
    libc = ctypes.CDLL(None, use_errno=True)
    result = libc.syscall(0x40000000 | 39)
    return f"{result} ({os.strerror(ctypes.get_errno())})" if result < 0 else str(result)


def start_a_process_outside_the_group() -> str:
    """Fork a process that leaves the child's process group and session (setsid), and return once
    it has: killing the group would not reach it."""
    read_end, write_end = os.pipe()
    if os.fork() == 0:
        try:
            os.setsid()
            os.write(write_end, b"1")
            time.sleep(3600)
        finally:
            os._exit(0)
    os.close(write_end)
    return "started" if os.read(read_end, 1) == b"1" else "the process died"


# ---- tests -------------------------------------------------------------------------------


@pytest.fixture
def box():
    sandbox = Sandbox(timeout_s=2.0, memory_bytes=1 << 30, warmup=warm_up)
    yield sandbox
    sandbox.close()


@pytest.fixture
def open_folder():
    """A folder of the worker's that every user may enter (as a checkout or a venv is): what stops
    the child is then the files' own permissions, not the folder's."""
    folder = tempfile.mkdtemp(prefix="tracerl-sandbox-test-")
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder)


def test_the_child_sees_none_of_the_parents_environment(box, monkeypatch):
    monkeypatch.setenv(MARKER, "secret")
    env = box.call(child_environment)
    assert MARKER not in env
    assert not {"PATH", "PYTHONPATH", "RAY_ADDRESS"} & set(env), env
    # LC_CTYPE: the interpreter sets it itself (PEP 538 coerces the C locale to UTF-8).
    assert set(env) <= {"HOME", "TMPDIR", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "LC_CTYPE"}


def test_the_child_works_in_its_own_empty_directory_removed_at_stop(box):
    cwd = box.call(child_cwd)
    assert cwd != os.getcwd() and os.path.basename(cwd).startswith("tracerl-sandbox-")
    assert os.listdir(cwd) == []
    box.close()
    assert not os.path.exists(cwd)


def test_modules_under_the_repo_stay_importable_without_pythonpath(box):
    # This very module (tests/...) is imported by the child to run these helpers.
    assert any(os.path.isdir(os.path.join(p, "tests", "harnesses")) for p in box.call(python_path))


def test_a_reply_that_is_not_json_is_an_error_and_the_child_is_replaced(box):
    assert box.call(math.factorial, 4) == 24
    with pytest.raises(SandboxError, match="malformed reply"):
        box.call(write_garbage_reply)
    assert box.call(math.factorial, 5) == 120


def test_a_child_that_writes_one_byte_and_hangs_fails_at_the_deadline(box):
    with pytest.raises(SandboxError, match=r"write_one_byte_and_hang ran past its 2.0s limit and was killed"):
        box.call(write_one_byte_and_hang)
    assert box.call(math.factorial, 3) == 6


def test_a_c_level_write_to_stdout_does_not_corrupt_the_reply(box):
    assert box.call(write_to_fd_1, 21) == 42
    assert box.call(math.factorial, 5) == 120


def test_a_call_past_its_limit_is_killed_and_the_next_call_works(box):
    with pytest.raises(SandboxError, match=r"sleep_s ran past its 2.0s limit and was killed"):
        box.call(sleep_s, 30)
    assert box.call(sleep_s, 0) == "slept"


def test_results_must_be_plain_json(box):
    with pytest.raises(SandboxError, match="not plain JSON data"):
        box.call(not_json)
    assert box.call(math.factorial, 3) == 6


def test_errors_and_memory_exhaustion_come_back_as_sandbox_errors(box):
    assert box.call(math.factorial, 5) == 120
    with pytest.raises(SandboxError, match="factorial failed: ValueError"):
        box.call(math.factorial, -1)
    with pytest.raises(SandboxError, match="failed: MemoryError"):
        box.call(bytes, 2 << 30)  # 2 GiB under a 1 GiB limit
    assert box.call(math.factorial, 3) == 6


def test_the_child_cannot_fork(box):
    box.call(math.factorial, 1)
    if not box.isolation.get("no_new_processes"):
        pytest.skip(f"no seccomp filter on this platform: {box.isolation}")
    with pytest.raises(SandboxError, match="fork_a_child failed: PermissionError"):
        box.call(fork_a_child)


def test_the_child_has_no_network(box):
    box.call(math.factorial, 1)
    if not box.isolation.get("network_isolated"):
        pytest.skip(f"no network namespace on this platform: {box.isolation}")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname(), timeout=2):
            pass  # the parent can connect
        with pytest.raises(SandboxError, match="connect_to failed: (ConnectionRefusedError|OSError)"):
            box.call(connect_to, server.getsockname()[1])


def test_a_deep_json_reply_is_an_error_and_the_child_is_replaced(box):
    """rewards review #19: a reply nested too deep for json.loads (RecursionError) is a malformed
    reply: SandboxError, the child killed and replaced."""
    assert box.call(math.factorial, 4) == 24
    with pytest.raises(SandboxError, match="write_deep_json_reply: the sandbox process sent a malformed reply"):
        box.call(write_deep_json_reply)
    assert box.call(math.factorial, 5) == 120


def test_the_child_cannot_write_the_workers_files(box, open_folder):
    """rewards review #4: the child appended to a root-owned 0644 module and could plant a `.pth` in
    the venv's site-packages (run by every later Python process). Now: project sources, the venv
    and any 0644 file of the worker's are refused."""
    victim = os.path.join(open_folder, "victim_module.py")
    with open(victim, "w") as f:
        f.write("X = 1\n")
    os.chmod(victim, 0o644)
    planted = [
        os.path.join(sysconfig.get_paths()["purelib"], f"tracerl_sandbox_probe_{os.getpid()}.pth"),
        os.path.join(os.path.dirname(sandbox.__file__), f"_sandbox_probe_{os.getpid()}.py"),
    ]
    try:
        assert box.call(try_to_append, victim).startswith("refused")
        for path in planted:
            assert box.call(try_to_create, path).startswith("refused"), path
    finally:
        left = [path for path in planted if os.path.exists(path)]
        for path in left:
            os.remove(path)
    assert not left
    with open(victim) as f:
        assert f.read() == "X = 1\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="not root: the child runs as the worker's user (see isolation gaps)")
def test_the_child_runs_as_a_user_that_cannot_read_roots_files(box, open_folder):
    """rewards review #4: in "user namespace" mode the child read root's 0600 files. Now it runs as
    the sandbox user, and still imports from root's 0700 home (this box's pyenv)."""
    secret = os.path.join(open_folder, "token")
    with open(secret, "w") as f:
        f.write("secret")
    os.chmod(secret, 0o600)
    assert box.call(try_to_read, secret) == "refused: Permission denied"
    assert box.isolation["user"] in (SANDBOX_USER, "nobody"), box.isolation


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the i386 and x32 ABIs exist on x86-64 only")
def test_a_fork_through_the_i386_abi_starts_no_process(box):
    """rewards review #4: `fork` through `int 0x80` (the i386 ABI) got past the seccomp filter, which
    let every other ABI through, and past RLIMIT_NPROC. Now a foreign ABI kills the child at that
    system call: no process."""
    box.call(math.factorial, 1)
    try:
        result = box.call(fork_i386)
    except SandboxError as e:
        result = e
    if isinstance(result, int) and result > 0:  # the hole is open: do not leave the process behind
        os.kill(result, signal.SIGKILL)
    assert isinstance(result, SandboxError), f"fork through int 0x80 returned {result}"
    assert "SIGSYS: a system call its seccomp filter forbids" in str(result)
    assert box.call(math.factorial, 3) == 6


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the i386 and x32 ABIs exist on x86-64 only")
def test_an_x32_system_call_kills_the_child(box):
    """rewards review #4: x32 numbers (nr >= 0x40000000) passed the filter (the kernel here answers
    ENOSYS; one built with x32 would run them). Now the filter kills the child."""
    try:
        result = box.call(getpid_x32)
    except SandboxError as e:
        result = e
    assert isinstance(result, SandboxError), f"the x32 getpid returned {result}"
    assert "SIGSYS" in str(result)


def test_nothing_the_child_starts_outlives_close():
    """rewards review #4: a process the child forked (through the i386 ABI) was still alive after
    `Sandbox.close()`, with parent 1. With fork allowed (the only way left to start one), a process
    that also leaves the child's process group is gone when close() returns."""
    box = Sandbox(timeout_s=5.0, memory_bytes=1 << 30, warmup=warm_up, allow_fork=True)
    try:
        assert box.call(start_a_process_outside_the_group) == "started"
        if box.isolation["processes"] != "pid namespace":
            pytest.skip(f"no PID namespace here: {box.isolation['gaps']}")
        server = box.isolation["pid"]
        namespace = os.readlink(f"/proc/{server}/ns/pid")
        started = [pid for pid in _processes_in(namespace) if pid != server]
        assert started, "the child's process is not in its PID namespace"
        handles = [os.pidfd_open(pid) for pid in started]
    finally:
        box.close()
    assert all(select.select([handle], [], [], 0)[0] for handle in handles), "a process outlived close()"
    for handle in handles:
        os.close(handle)


def _processes_in(namespace: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and os.readlink(f"/proc/{name}/ns/pid") == namespace:
                found.append(int(name))
        except OSError:  # it ended while we looked
            pass
    return found


def test_the_child_sees_only_its_own_processes(box):
    box.call(math.factorial, 1)
    if box.isolation["processes"] != "pid namespace":
        pytest.skip(f"no PID namespace here: {box.isolation['gaps']}")
    assert box.call(visible_processes) == [1]


@pytest.mark.parametrize("dataset", ["polynomial_equations", "word_ladder"])
def test_a_reasoning_gym_verifier_scores_after_the_privileges_are_dropped(dataset):
    """Verifiers still run as the sandbox user: polynomial_equations (not a shipped task) imports
    SymPy modules lazily while it scores, word_ladder reads a data file and imports csv (from the
    interpreter's standard library, in root's 0700 home on this box) when its scorer is built;
    both happen in the child after it dropped root."""
    # (imported here: the child imports this module to run its helpers, and should not pay for it)
    from harnesses.tasks import reasoning_gym as reasoning_gym_tasks

    task = reasoning_gym_tasks.ReasoningGymTasks(dataset, size=100, eval_size=0).train_task(0)
    assert task.score(f"<answer>{task.answer}</answer>") == 1.0
    assert task.score("<answer>QQQQ</answer>") == 0.0
    if os.geteuid() == 0:
        assert reasoning_gym_tasks._SANDBOX.isolation["user"] in (SANDBOX_USER, "nobody")


def test_each_rule_the_machine_cannot_keep_is_logged_once(caplog, monkeypatch):
    monkeypatch.setattr(sandbox, "_warned", set())
    isolation = {"gaps": ["network: no network namespace (test), so the child can reach the network"]}
    with caplog.at_level(logging.WARNING, logger="harnesses.verifiers.sandbox"):
        sandbox._warn_gaps_once(isolation)
        sandbox._warn_gaps_once(isolation)
    assert [r.getMessage() for r in caplog.records] == [
        "the verifier sandbox is weaker on this machine: network: no network namespace (test), so the child can "
        "reach the network (docs/harnesses.md, 'The verifier sandbox')"
    ]


def test_the_isolation_report_names_what_the_child_got(box):
    box.call(math.factorial, 1)
    report = box.isolation
    assert set(report) >= {"user", "network_isolated", "processes", "read_only_files", "no_new_processes", "gaps"}
    assert all(isinstance(gap, str) for gap in report["gaps"])
    if os.geteuid() == 0 and platform.machine() in ("x86_64", "aarch64"):
        # the machines tracerl runs on (and CI): every rule kept, bar the user's name
        assert report["processes"] == "pid namespace" and report["read_only_files"] and report["no_new_processes"]
        assert [gap for gap in report["gaps"] if not gap.startswith(f"user: there is no {SANDBOX_USER}")] == []


def test_a_module_in_a_folder_others_may_not_enter_stays_importable(monkeypatch):
    """An import path of mode 0700 (a checkout cloned into `mktemp -d`, as CI does): the child, another
    user, still imports from it (bound back whole, the folder kept its mode and hid its modules)."""
    folder = tempfile.mkdtemp(prefix="tracerl-sandbox-closed-")  # mode 0700
    try:
        with open(os.path.join(folder, "tracerl_closed_mod.py"), "w") as f:
            f.write("def answer():\n    return 42\n")
        monkeypatch.syspath_prepend(folder)
        import tracerl_closed_mod

        box = Sandbox(timeout_s=5.0, memory_bytes=1 << 30, warmup=warm_up)
        try:
            assert box.call(tracerl_closed_mod.answer) == 42
        finally:
            box.close()
    finally:
        sys.modules.pop("tracerl_closed_mod", None)
        shutil.rmtree(folder)
