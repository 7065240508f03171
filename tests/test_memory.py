"""The suite's memory budget in tests/conftest.py: the sampled peak in the terminal summary, and a
test marked `needs_memory_gb(n)` that fails naming the test, its need and what was available when
the machine does not have it (rather than being killed by Ray's memory monitor)."""

import pytest

from tests.conftest import run_bare_python

pytestmark = pytest.mark.unit

CONFTEST = """
import tests.conftest
from tests.conftest import pytest_configure, pytest_runtest_setup, pytest_terminal_summary  # noqa: F401

tests.conftest.MEMORY_WAIT_S = 1
"""
TESTS = """
import pytest

@pytest.mark.needs_memory_gb(0.01)
def test_small():
    pass

@pytest.mark.needs_memory_gb(100000)
def test_huge():
    pass
"""


def test_a_test_needing_more_memory_than_there_is_fails_naming_it_and_the_peak_is_reported(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_x.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    needs_memory_gb(n): m\n")
    rc, out = run_bare_python(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA"], tmp_path)
    assert rc == 1 and "1 passed, 1 error" in out, out
    assert "PASSED test_x.py::test_small" in out, out
    assert "test_x.py::test_huge needs 100000 GiB of memory available to start (+ " in out, out
    assert "after 1 s of waiting" in out, out
    assert "sampled peak used memory (MemTotal - MemAvailable, every 1 s" in out, out
