"""The one driver both studies (studies/team/, studies/relay/) stand on: a script of ours run in
its own process group under a deadline, the provenance of the checkout it runs from, the steps a
run evaluates at, the arm x seed a run is and the controls of a seed, a study's log line and its
--arms parsing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from studies.items import head_commit
from trainer.config import compose

ROOT = Path(__file__).resolve().parents[1]  # the checkout: the scripts run from it
CODE = ("harnesses", "rollout", "trainer", "scripts", "conf", "studies")  # what provenance lists uncommitted changes of


def logger(name: str) -> Callable[[str], None]:
    """A study's log: each line `[name] msg`, flushed."""

    def log(msg: str) -> None:
        print(f"[{name}] {msg}", flush=True)

    return log


def pick_arms(spec: str, choices: dict[str, list[str]], refused: str) -> list[str]:
    """--arms: comma-separated words, each one of `choices` (a word -> the arms it names: an arm,
    its alias, a group), the arms in order without repeats. An unknown word is a ValueError
    `--arms: 'word' is <refused>`."""
    names: list[str] = []
    for word in (w.strip() for w in spec.split(",")):
        if word not in choices:
            raise ValueError(f"--arms: {word!r} is {refused}")
        names += choices[word]
    return list(dict.fromkeys(names))


# ---- the runs and controls of a study ---------------------------------------------------------


class Seeded:
    """One arm x seed of a study (its `arm_name`, `seed`, `out`, `results`): its run dir
    OUT/<arm>/seed<s>, its per-item files RESULTS/<arm>/seed<s>, its label."""

    arm_name: str
    seed: int
    out: Path  # where the run dirs go
    results: Path  # where the per-item files go

    @property
    def label(self) -> str:
        return f"{self.arm_name} seed {self.seed}"

    @property
    def dir(self) -> Path:
        return self.out / self.arm_name / f"seed{self.seed}"

    @property
    def docs(self) -> Path:
        return self.results / self.arm_name / f"seed{self.seed}"


def controls_dirs(out: Path, results: Path, seed: int) -> tuple[Path, Path]:
    """A seed's controls: their evaluations' reports and logs (OUT/controls/seed<s>) and their
    per-item files (RESULTS/controls/seed<s>)."""
    return out / "controls" / f"seed{seed}", results / "controls" / f"seed{seed}"


def try_control(name: str, seed: int, evaluate: Callable[[], object], log: Callable[[str], None]) -> str:
    """One control of a seed: `done`, or `FAILED: why` (logged) when it raises a RuntimeError; the
    seed's other controls go on."""
    try:
        evaluate()
        return "done"
    except RuntimeError as e:
        log(f"seed {seed} {name}: FAILED: {e}")
        return f"FAILED: {e}"


# ---- a script of ours -----------------------------------------------------------------------------


def run_script(args: list[str], log_path: Path, timeout_s: float, cwd: Path) -> tuple[str, float]:
    """`python <args>` from `cwd`, its output to `log_path`: (finished | failed | timed out, wall
    seconds). Its process group (the job's Ray and engines) is ended on a timeout, and when the
    caller stops (Ctrl-C, SIGTERM: an exception out of the wait), so that nothing of it outlives
    the attempt."""
    code, wall = _run(args, log_path, timeout_s, cwd)
    return ("timed out" if code is None else "finished" if code == 0 else "failed"), wall


def run(args: list[str], log_path: Path, timeout_s: float, cwd: Path = ROOT) -> float:
    """run_script to completion: its wall seconds; a failure or an overrun raises naming the log."""
    code, wall = _run(args, log_path, timeout_s, cwd)
    if code is None:
        raise RuntimeError(f"{args[0]} ran past {timeout_s:.0f} s; its output: {log_path}")
    if code:
        raise RuntimeError(f"{args[0]} exited {code}; its output: {log_path}")
    return wall


def _run(args: list[str], log_path: Path, timeout_s: float, cwd: Path) -> tuple[int | None, float]:
    """(exit code, None past the deadline; wall seconds) of run_script."""
    t0 = time.perf_counter()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, *args], cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            end_group(proc)
    return code, round(time.perf_counter() - t0, 1)


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
