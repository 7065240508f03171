"""Fault injection on the real stack, shared by tests/trainer/test_faults.py, tests/trainer/test_loop.py
and tools/bench/faults.py: find a run's actor process by name, wait for a step of a run, and
kill or stop the process (and later clean up what Ray's restart left behind)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path

import psutil
import ray


def named_actors() -> set[str]:
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)}


def actor_process(
    prefix: str, method: str, before: set[str], timeout_s: float = 300, busy_s: float = 0.0
) -> psutil.Process:
    """The process of the actor named `prefix`<id> (engines are tracerl-engine-<policy>-<i>-<id>,
    workers tracerl-worker-<i>-<id>) that is not one of `before` (the session's shared engine is
    named so too), from its `method`'s answer {"pid": ...}; waits while Ray restarts the actor.
    `busy_s`: for up to that long, until the answer shows requests in flight (an engine's
    "active"), so that a fault cuts some short whatever the engine's speed."""
    [actor] = [
        a
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(prefix) and a["name"] not in before
    ]
    handle = ray.get_actor(actor["name"], namespace=actor["namespace"])
    deadline, busy_deadline = time.monotonic() + timeout_s, time.monotonic() + busy_s
    while True:
        try:
            answer = ray.get(getattr(handle, method).remote(), timeout=timeout_s)
        except ray.exceptions.ActorUnavailableError:  # restarting (e.g. after the watchdog's kill)
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)
            continue
        if answer.get("active", 1) > 0 or time.monotonic() > busy_deadline:
            return psutil.Process(answer["pid"])
        time.sleep(0.02)


def wait_for_step(run_dir: Path, step: int, timeout_s: float = 600, process=None) -> None:
    """Until run_dir's metrics have the row of training step `step`; TimeoutError past `timeout_s`,
    RuntimeError if `process` (a Popen running the run) ends first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the run ended (exit {process.returncode}) before step {step}")
        path = run_dir / "metrics.jsonl"
        if path.exists() and any(
            json.loads(line)["step"] >= step for line in path.read_text().splitlines() if '"rollout/reward"' in line
        ):
            return
        time.sleep(0.2)
    raise TimeoutError(f"step {step} never came")


class Injector:
    """A thread that, for each (after_step, actor prefix, pid method, "kill" | "suspend"), waits for
    the run's step `after_step`, half a second into the next step's rollout (an engine: once it has
    requests in flight) SIGKILLs or SIGSTOPs that actor's process; `injected` lists what it did,
    `errors` what stopped it. As a context manager it kills, on exit, every process it hit and their
    children (the engine cores of engine.core=process outlive a killed actor)."""

    def __init__(self, run_dir: Path, faults: list[tuple[int, str, str, str]]):
        self.run_dir, self.faults, self.before = Path(run_dir), faults, named_actors()
        self.injected: list[str] = []
        self.errors: list[str] = []
        self.hit: list[psutil.Process] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for after_step, prefix, method, how in self.faults:
            try:
                wait_for_step(self.run_dir, after_step)
                time.sleep(0.5)  # into the next step's rollout
                proc = actor_process(prefix, method, self.before, busy_s=30.0)
                self.hit.extend([proc, *proc.children(recursive=True)])
                getattr(proc, how)()
            except Exception as e:
                self.errors.append(f"{how} {prefix} after step {after_step}: {type(e).__name__}: {e}")
                return
            self.injected.append(prefix)

    def __enter__(self) -> Injector:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.hit:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        self.thread.join(timeout=1)
