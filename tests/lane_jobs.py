"""Script runs that main tests read, run in the background lane (tests/lane.py) instead of in the
middle of the suite: `python -c "from tests.lane_jobs import ...; ...(out)"` from the repository
root; each prints one JSON line (the run's exit code and output: its test asserts them). They start
a Ray of their own, as a user's command does (not the lane's cluster).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.lane import Job

ROOT = Path(__file__).resolve().parents[1]
RUN_S = 600  # each run's deadline; its lane job's is longer (the job waits for the run)
JOB_S = 900


def job(function: str, out: Path) -> Job:
    """A lane job that calls `function(out)` of this module."""
    return Job(["-c", f"from tests.lane_jobs import {function}; {function}({str(out)!r})"], JOB_S, own_ray=True)


def report(proc: subprocess.CompletedProcess, **fields) -> None:
    print(json.dumps({"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr, **fields}))


def smoke_run(out: str) -> None:
    """`make smoke`'s run as a user starts it: scripts/train.py experiment=smoke into `out`."""
    args = ["scripts/train.py", "experiment=smoke", f"run_dir={out}", "trainer.rollouts_every=10"]
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=RUN_S)
    report(proc)


def readme(out: str) -> None:
    """The README's runnable blocks written into a scratch repository root `out` and its command
    run there (tests/docs/test_readme.py)."""
    from tests.docs.test_readme import runnable_blocks, scratch_root

    Path(out).mkdir(parents=True)
    root = scratch_root(Path(out))
    blocks = runnable_blocks()
    for file, _, text in blocks[:-1]:
        (root / file).parent.mkdir(parents=True, exist_ok=True)
        (root / file).write_text(text)
    command = blocks[-1][2]
    proc = subprocess.run(
        ["bash", "-c", command],
        cwd=root,
        env={**os.environ, "WANDB_MODE": "offline"},
        capture_output=True,
        text=True,
        timeout=RUN_S,
    )
    report(proc, run=str(root / re.search(r"run_dir=(\S+)", command)[1]))
