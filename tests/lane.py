"""The background lane: long script runs that a few tests check, started when the session starts.

The suite leaves about a third of this 2-core box idle (waits on process starts, deadlines and
restarts); scripts that take minutes and need nothing from the suite (the quick benches, the
team study's quick arms) run there instead, one at a time at nice 10, in the order launched.
tests/conftest.py::pytest_collection_finish launches the jobs the selected tests ask for; each
such test waits for its own job's result (`result`), bounded by the job's deadline. Those tests
run last: once the first of them waits, the main tests are done and the box is the lane's, so a
second worker takes the next queued job (one script run keeps about one core busy: its process
starts, imports and Ray's start are mostly serial). The jobs' runs join one Ray cluster the lane
starts (TRACERL_RAY_ADDRESS, rollout/orchestration/cluster.py start_ray) instead of each starting
and stopping its own.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import queue
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]


class Job(NamedTuple):
    """`python <args>` from the repository root, ended at its deadline. `own_ray`: it starts a Ray of
    its own, as a user's command does (the fault runs must: they strike actors by name), instead of
    joining the lane's cluster."""

    args: list[str]
    deadline_s: float
    own_ray: bool = False


_jobs: dict[str, concurrent.futures.Future] = {}
_queue: queue.SimpleQueue = queue.SimpleQueue()  # (name, Job, future) in launch order; None ends a worker
_workers: list[threading.Thread] = []
WORKERS_AT_THE_END = 2  # the box's cores
# the second worker takes a job only while the machine uses less: a script run of the tiny model
# (its Ray, engine, learner ranks) takes ~3-4 GiB, and the suite's budget is a peak of 12 GiB
SECOND_JOB_BELOW_GIB = 8.0
_since = time.monotonic()  # the session's start (this module is imported at collection)
walls: dict[str, tuple[float, float]] = {}  # job -> (its start, seconds into the session; its wall seconds)
# The lane's Ray cluster: a process that starts it and prints its address and the auth settings its
# start chose (Ray enables token auth for a local cluster when ~/.ray/auth_token exists: a job joins
# with them), then holds it until its stdin closes (at `stop`, or when this session dies). Logical
# CPUs: placement tokens for any job's asks.
CLUSTER = """
import json, os, sys, ray
from rollout.config import RayConfig
from rollout.orchestration.cluster import start_ray
start_ray(RayConfig(address="local", num_cpus=32))
auth = {k: v for k, v in os.environ.items() if k.startswith("RAY_AUTH")}
print(json.dumps({"TRACERL_RAY_ADDRESS": ray.get_runtime_context().gcs_address, **auth}), flush=True)
sys.stdin.read()
ray.shutdown()
"""
CLUSTER_START_S = 180
_cluster: dict = {}  # "proc": the holder, "env": what a job joins it with, or "error": why jobs start their own


def script_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def start_cluster() -> None:
    """Start the lane's Ray cluster (at nice 10, as its jobs). If it is not up within
    CLUSTER_START_S, the jobs start their own Ray each, and the lane's summary line says why."""
    env = {k: v for k, v in script_env().items() if k != "TRACERL_RAY_ADDRESS"}
    proc = subprocess.Popen(
        ["nice", "-n", "10", sys.executable, "-c", CLUSTER],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    _cluster["proc"] = proc
    ready, _, _ = select.select([proc.stdout], [], [], CLUSTER_START_S)
    line = proc.stdout.readline().strip() if ready else ""
    if line:
        _cluster["env"] = json.loads(line)
    else:
        _cluster["error"] = f"its Ray cluster did not start within {CLUSTER_START_S} s (exit {proc.poll()})"
        stop_cluster()


def stop_cluster() -> None:
    proc = _cluster.pop("proc", None)
    if proc is None:
        return
    proc.stdin.close()  # the holder shuts its cluster down and exits
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=60)


def run_script(job: Job, name: str | None = None) -> dict:
    """Run the job at nice 10, in the lane's cluster unless it has its own Ray; its last output
    line, parsed as JSON. A non-zero exit or a last line that is not JSON fails with the output's
    tail. `name`: its wall time is kept in `walls` under it."""
    t0 = time.monotonic()
    env = script_env() if job.own_ray else {**script_env(), **_cluster.get("env", {})}
    proc = subprocess.run(
        ["nice", "-n", "10", sys.executable, *job.args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=job.deadline_s,
    )
    if name is not None:
        walls[name] = (t0 - _since, time.monotonic() - t0)
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, tail
    lines = proc.stdout.strip().splitlines()
    assert lines, tail
    return json.loads(lines[-1])


def meminfo_gib() -> tuple[float, float]:
    """(total, available) GiB of the machine, from /proc/meminfo (available: what can be had
    without swapping, page cache included)."""
    kib = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, value = line.split(":", 1)
        kib[key] = int(value.split()[0])
    return kib["MemTotal"] / 2**20, kib["MemAvailable"] / 2**20


def room_for_a_second_job() -> bool:
    total, available = meminfo_gib()
    return total - available < SECOND_JOB_BELOW_GIB


def work(second: bool = False) -> None:
    """A worker of the lane: the queued jobs, in order, until a None. The second stops when the
    machine has no room for another job (the first goes on). The first starts the lane's cluster."""
    if not second:
        start_cluster()
    while not (second and not room_for_a_second_job()) and (job := _queue.get()) is not None:
        name, spec, future = job
        if future.set_running_or_notify_cancel():  # False: dropped by `stop`
            try:
                future.set_result(run_script(spec, name))
            except BaseException as e:  # the waiting test raises it
                future.set_exception(e)


def add_worker() -> None:
    thread = threading.Thread(target=work, args=(bool(_workers),), name=f"lane-{len(_workers)}", daemon=True)
    thread.start()
    _workers.append(thread)


def launch(jobs: dict[str, Job | tuple[list[str], float]]) -> None:
    """Queue each job (name -> Job, or (script args, deadline seconds)) in the lane, in the order given."""
    if not _workers:
        add_worker()
    for name, spec in jobs.items():
        _jobs[name] = concurrent.futures.Future()
        _queue.put((name, Job(*spec), _jobs[name]))


def launched() -> bool:
    return bool(_workers)


def queued(name: str) -> bool:
    """Whether this session's lane runs the job `name`."""
    return name in _jobs


def result(name: str) -> dict:
    """The job's parsed last line, once it has run (its own deadline bounds the wait). The first
    call widens the lane to WORKERS_AT_THE_END: the tests that wait run after the main ones."""
    while 0 < len(_workers) < WORKERS_AT_THE_END:
        add_worker()
    return _jobs[name].result()


def stop() -> str:
    """At the session's end: jobs not started yet are dropped, running ones are waited for. A line
    of what the lane ran: each job's start (seconds into the session) and wall seconds."""
    for future in _jobs.values():
        future.cancel()  # only those not started
    for _ in _workers:
        _queue.put(None)
    for thread in _workers:
        thread.join()
    stop_cluster()
    jobs = ", ".join(f"{n} {start:.0f}+{wall:.0f}s" for n, (start, wall) in walls.items())
    cluster = f"; {_cluster['error']}: each job started its own" if "error" in _cluster else ""
    return f"background lane (job start+wall): {jobs or 'none ran'}{cluster}"
