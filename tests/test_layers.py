"""The top-level packages are layers, imports point down only: trainer > rollout > harnesses.

harnesses/ are the user's plugins, rollout/ runs them, trainer/ drives rollout/. The graph is
grimp's (import-linter's library), which sees every import statement, including the lazy ones
inside functions and those under TYPE_CHECKING; `make lint` checks the same rule with
import-linter's `layers` contract (pyproject.toml, [tool.importlinter])."""

import grimp
import pytest

pytestmark = pytest.mark.unit

LAYERS = ("trainer", "rollout", "harnesses")  # highest first


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph(*LAYERS, cache_dir=None)


def test_no_import_goes_up_the_layers(graph):
    upward = [
        f"{i['importer']} -> {i['imported']} (line {line['line_number']}: {line['line_contents']})"
        for k, lower in enumerate(LAYERS)
        for higher in LAYERS[:k]
        for i in graph.find_matching_direct_imports(import_expression=f"{lower}.** -> {higher}.**")
        for line in graph.get_import_details(importer=i["importer"], imported=i["imported"])
    ]
    assert not upward, (
        "imports that go up the layers trainer > rollout > harnesses (hand the lower layer "
        "what it needs instead, as the rollout worker hands harnesses the gateway):\n" + "\n".join(upward)
    )


def test_the_graph_counts_lazy_imports(graph):
    """An import inside a function is an edge too (trainer/evaluation.py imports the fleet lazily)."""
    [detail] = graph.get_import_details(importer="trainer.evaluation", imported="rollout.orchestration.fleet")
    assert detail["line_contents"].startswith("from rollout.orchestration.fleet import")
    assert graph.direct_import_exists(importer="trainer.evaluation", imported="rollout.orchestration.fleet")


def test_scripts_import_only_installed_packages():
    """scripts/ run against the installed packages (pip install .): no sys.path edits, nothing from tests/."""
    import ast
    from pathlib import Path

    found = []
    for path in sorted((Path(__file__).resolve().parents[1] / "scripts").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", None) == "sys":
                found.append(f"{path.name}:{node.lineno}: sys.path")
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            found += [f"{path.name}:{node.lineno}: imports {n}" for n in names if n.split(".")[0] == "tests"]
    assert not found, found
