"""The suite's budget in yardsticks (tests/yardstick.py): a time over its budget says so."""

import pytest

from tests.yardstick import BUDGETS, line

pytestmark = pytest.mark.unit


def test_a_phase_over_its_budget_says_over_and_one_within_says_within():
    assert line("make test", 1200.0, 2.0) == "make test: 1200 s (20.0 min) = 600 yardsticks (budget 600: within)"
    assert line("make test", 1203.0, 2.0).endswith("= 602 yardsticks (budget 600: OVER)")
    assert line(".ci/run", 1900.0, 2.0).endswith(f"(budget {BUDGETS['.ci/run']}: OVER)")
    assert line("make lint", 60.0, 2.0) == "make lint: 60 s (1.0 min) = 30 yardsticks"
