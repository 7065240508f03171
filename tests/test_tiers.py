"""The tier check in tests/conftest.py: a test with no tier, or two, fails collection by name."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
TESTS = """
import pytest

@pytest.mark.unit
def test_one():
    pass

def test_none():
    pass

@pytest.mark.unit
@pytest.mark.e2e
def test_two():
    pass
"""


def test_a_test_without_exactly_one_tier_fails_collection_naming_it(tmp_path):
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n")
    (tmp_path / "test_x.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    unit: u\n    integration: i\n    e2e: e\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "unit"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "test_x.py::test_none: no tier" in out and "test_x.py::test_two: e2e + unit" in out, out
    assert "test_one" not in out.split("exactly one of the marks")[1], out
