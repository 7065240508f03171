"""No function of the library or the scripts is longer than 60 lines (STYLE.md: a function reads as
the steps it takes; `trainer/loop.py` train was back to 104 before issue 41 split it), and no module of
the product over 500 (a module is one responsibility: when the 60-line rule held, the size moved into
modules, `learner.py` 623 and the gateway 610 lines, before they were split)."""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rollout", "trainer", "harnesses", "scripts", "studies", "tools")
PRODUCT = ("rollout", "trainer", "harnesses")  # the wheel
MAX_LINES = 60
MAX_MODULE_LINES = 500


def long_functions(source: str, path: str) -> list[str]:
    """`path:line name (n lines)` of each function or method in `source` over MAX_LINES lines, its
    decorators left out and its docstring counted."""
    return [
        f"{path}:{node.lineno} {node.name} ({length} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (length := node.end_lineno - node.lineno + 1) > MAX_LINES
    ]


def test_no_function_is_over_60_lines():
    files = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
    assert len(files) > 100, "the packages were not found"
    found = [line for p in files for line in long_functions(p.read_text(), str(p.relative_to(ROOT)))]
    assert not found, "split these into the steps they take:\n  " + "\n  ".join(found)


def test_a_function_of_61_lines_is_named():
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    assert long_functions(f"def short():\n{body[: body.rindex(chr(10))]}\n", "a.py") == []
    assert long_functions(f"async def long():\n{body}\n", "a.py") == ["a.py:1 long (61 lines)"]


def test_no_product_module_is_over_500_lines():
    files = sorted(p for package in PRODUCT for p in (ROOT / package).rglob("*.py"))
    assert len(files) > 80, "the packages were not found"
    found = [
        f"{p.relative_to(ROOT)} ({n} lines)" for p in files if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not found, "split these by responsibility:\n  " + "\n  ".join(found)
