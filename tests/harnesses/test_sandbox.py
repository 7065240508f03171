"""The verifier sandbox (harnesses/sandbox.py) as a wall: a real child process runs the module-level
helpers below, and each test checks what the child can see or do, or that a garbled, late or
hostile reply fails the call (SandboxError) without hanging or corrupting the caller."""

from __future__ import annotations

import math
import os
import socket
import sys
import time

import pytest

from harnesses.sandbox import Sandbox, SandboxError

pytestmark = pytest.mark.unit

MARKER = "TRACERL_SANDBOX_TEST_MARKER"


# ---- helpers the child runs (module-level: pickled by name) ------------------------------


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


# ---- tests -------------------------------------------------------------------------------


@pytest.fixture
def box():
    sandbox = Sandbox(timeout_s=2.0, memory_bytes=1 << 30)
    yield sandbox
    sandbox.close()


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
