"""What a study's driver needs around the jobs it starts: a script of ours run in its own process
group under a deadline, the provenance of the checkout it runs from, and the steps a run evaluates
at. scripts/relay_runs.py drives its runs and controls with these (moved from it unchanged).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainer.config import compose
from trainer.results import head_commit


def run_script(args: list[str], log_path: Path, timeout_s: float, cwd: Path) -> tuple[str, float]:
    """`python <args>` from `cwd`, its output to `log_path`: (finished | failed | timed out, wall
    seconds). Its process group (the job's Ray and engines) is ended on a timeout, and when the
    caller stops (Ctrl-C, SIGTERM: an exception out of the wait), so that nothing of it outlives
    the attempt."""
    t0 = time.perf_counter()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, *args], cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            outcome = "finished" if proc.wait(timeout=timeout_s) == 0 else "failed"
        except subprocess.TimeoutExpired:
            outcome = "timed out"
        finally:
            end_group(proc)
    return outcome, round(time.perf_counter() - t0, 1)


def end_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the process's group (its own shutdown ends Ray), then SIGKILL to what is left."""
    for sig, grace_s in ((signal.SIGTERM, 60), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # the group is gone
            return
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass


def provenance(root: Path, code: tuple[str, ...]) -> dict:
    """The commit checked out at `root`, and the files under its `code` folders that differ from it
    or are not in it (git status): a shared checkout runs uncommitted work too, and records it."""
    lines = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=normal", "--", *code],
        cwd=root,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    return {"commit": head_commit(root), "dirty": sorted(line[3:] for line in lines if line.strip())}


def eval_steps(overrides: list[str]) -> list[int]:
    """The steps a run of these overrides evaluates at (trainer/loop.py: the start, every
    eval_every, the last)."""
    t = compose("train", overrides).trainer
    return sorted({0, t.steps} | (set(range(t.eval_every, t.steps + 1, t.eval_every)) if t.eval_every else set()))
