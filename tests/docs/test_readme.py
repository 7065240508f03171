"""The README's newcomer path, run as written: its blocks marked `<!-- runnable -->` (a harness
file, its config, the command that trains it) are copied verbatim into a scratch repository root
and the command runs there. If the README's example breaks, this fails."""

import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from tests import lane

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BLOCK = re.compile(r"<!-- runnable:? ?(\S*) -->\n```(\w+)\n(.*?)```", re.S)
OUT = Path(tempfile.gettempdir()) / f"tracerl-readme-{os.getpid()}"
LANE_TESTS = {"test_readme_harness_with_two_roles_and_a_frozen_third_trains": "readme"}


def lane_jobs() -> dict[str, lane.Job]:
    """The README's command runs in the background lane (tests/lane_jobs.py readme), a Ray of its own."""
    from tests.lane_jobs import job

    return {"readme": job("readme", OUT)}


def runnable_blocks() -> list[tuple[str, str, str]]:
    """(file, language, text) of every fenced block right after a `<!-- runnable[: file] -->` line:
    a block with a file is written there, one without is run."""
    return BLOCK.findall(README.read_text())


def scratch_root(tmp_path: Path) -> Path:
    """A directory that looks like the repository root (its packages, scripts, conf and .venv
    linked in), where the README's files are written as a newcomer would write them."""
    for name in ("rollout", "trainer", "harnesses", "scripts", "conf", "examples"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))  # the venv running the tests
    return tmp_path


@pytest.mark.unit
def test_readme_is_short_and_its_runnable_blocks_are_a_harness_a_config_and_a_command():
    assert len(README.read_text().splitlines()) <= 250
    blocks = [(file, lang) for file, lang, _ in runnable_blocks()]
    assert blocks == [("my_harness.py", "python"), ("my_conf/harness/coached.yaml", "yaml"), ("", "bash")], blocks


@pytest.mark.unit
def test_docs_links_point_at_files_that_exist():
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for target in re.findall(r"\]\(([^)#]+)\)", page.read_text()):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.name} links {target}, which does not exist"


@pytest.mark.e2e
def test_readme_harness_with_two_roles_and_a_frozen_third_trains():
    """The README's files in a scratch root and its command run there: the lane's job (a Ray, two
    engines and learner ranks of its own, beside the main tests), whose run this test reads."""
    try:
        proc = lane.result("readme")
        assert proc["returncode"] == 0, proc["stdout"][-2000:] + proc["stderr"][-4000:]
        check_readme_run(Path(proc["run"]))
    finally:
        shutil.rmtree(OUT, ignore_errors=True)


def check_readme_run(run: Path) -> None:
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["trainable_policies"] == ["main"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/main/loss" in r] == [1, 2, 3]
    steps = [r for r in rows if "rollout/traces" in r]  # an evaluation has a row of its own
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["rollout/failed"] == 0 and r["rollout/sequences_per_trace"] == 4 for r in steps)
    from rollout.trace import read_jsonl

    trace = next(read_jsonl(run / "eval" / "step_3.jsonl"))
    assert [(s.agent, s.policy, s.trainable) for s in trace.sequences] == [
        ("coach", "frozen", False),
        ("solver", "main", True),
        ("critic", "main", True),
        ("solver", "main", True),
    ]
    assert trace.sequences[3].parent == 1  # the solver's second turn continues its first: one row
