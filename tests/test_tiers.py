"""The tier check in tests/conftest.py: a test with no tier, or two, fails collection by name."""

import pytest

from tests.conftest import run_bare_python

pytestmark = pytest.mark.unit

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
    rc, out = run_bare_python(
        ["-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "unit"], tmp_path
    )
    assert rc != 0, out
    assert "test_x.py::test_none: no tier" in out and "test_x.py::test_two: e2e + unit" in out, out
    assert "test_one" not in out.split("exactly one of the marks")[1], out
