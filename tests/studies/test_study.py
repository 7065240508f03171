"""A study driver's jobs (studies/study.py): a script run in its own process group under a deadline
(finished, failed, timed out, nothing of it left), the checkout's provenance, a run's evaluation
steps. The relay presets' steps are tested in tests/studies/test_relay_runs.py.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from studies.study import eval_steps, provenance, run_script

pytestmark = [pytest.mark.unit, pytest.mark.studies]  # the tier; `studies`: make test-studies, not make test

ROOT = Path(__file__).resolve().parents[2]


def test_a_script_finishes_fails_or_times_out_and_its_process_group_is_ended(tmp_path):
    (tmp_path / "ok.py").write_text("print('hello')")
    (tmp_path / "bad.py").write_text("raise SystemExit(3)")
    # a child of the script that would outlive it: the group's end takes it too
    (tmp_path / "slow.py").write_text(
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "open('child.pid', 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    outcome, wall_s = run_script(["ok.py"], tmp_path / "logs" / "ok.log", 30, tmp_path)
    assert outcome == "finished" and wall_s >= 0 and (tmp_path / "logs" / "ok.log").read_text() == "hello\n"
    assert run_script(["bad.py"], tmp_path / "bad.log", 30, tmp_path)[0] == "failed"
    outcome, wall_s = run_script(["slow.py"], tmp_path / "slow.log", 5, tmp_path)
    assert outcome == "timed out" and 5 <= wall_s < 60
    assert ended(int((tmp_path / "child.pid").read_text())), "the script's child outlived its group"


def ended(pid: int) -> bool:
    """The process is gone or a zombie within 10 s: a killed process takes a moment to exit on a
    busy box (it is not ours to wait for: the script's child, reparented)."""
    for _ in range(100):
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def test_provenance_is_the_commit_and_the_uncommitted_code():
    prov = provenance(ROOT, ("trainer",))
    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert prov["commit"] == git and all(p.startswith("trainer/") for p in prov["dirty"])
    assert prov["dirty"] == sorted(prov["dirty"])


def test_a_run_evaluates_at_the_start_every_eval_every_and_the_last_step():
    assert eval_steps(["experiment=smoke", "trainer.steps=7", "trainer.eval_every=3"]) == [0, 3, 6, 7]
    assert eval_steps(["experiment=smoke", "trainer.steps=4", "trainer.eval_every=0"]) == [0, 4]
