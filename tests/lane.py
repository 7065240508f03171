"""The background lane: long script runs that a few tests check, started when the session starts.

The suite leaves about a third of this 2-core box idle (waits on process starts, deadlines and
restarts); scripts that take minutes and need nothing from the suite (the quick benches, the
baselines' quick arms) run there instead, one at a time at nice 10, in the order launched.
tests/conftest.py::pytest_collection_finish launches the jobs the selected tests ask for; each
such test waits for its own job's result (`result`), bounded by the job's deadline.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_jobs: dict[str, concurrent.futures.Future] = {}
_pool: concurrent.futures.ThreadPoolExecutor | None = None


def run_script(args: list[str], deadline_s: float) -> dict:
    """Run `python <args>` from the repository root at nice 10; its last output line, parsed as
    JSON. A non-zero exit or a last line that is not JSON fails with the output's tail."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        ["nice", "-n", "10", sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=deadline_s,
    )
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, tail
    lines = proc.stdout.strip().splitlines()
    assert lines, tail
    return json.loads(lines[-1])


def launch(jobs: dict[str, tuple[list[str], float]]) -> None:
    """Queue each job (name -> (script args, deadline seconds)) in the lane, in the order given."""
    global _pool
    if _pool is None:
        _pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="lane")
    for name, (args, deadline_s) in jobs.items():
        _jobs[name] = _pool.submit(run_script, args, deadline_s)


def result(name: str) -> dict:
    """The job's parsed last line, once it has run (its own deadline bounds the wait)."""
    return _jobs[name].result()


def stop() -> None:
    """At the session's end: jobs not started yet are dropped, a running one is waited for."""
    if _pool is not None:
        _pool.shutdown(wait=True, cancel_futures=True)
