"""Imports point down only: between the top-level packages (trainer > rollout > harnesses) and between
rollout/'s rooms (orchestration > agents > engine > the lobby: config, trace, ...).

harnesses/ are the user's plugins, rollout/ runs them, trainer/ drives rollout/. Inside rollout/, the
orchestration drives the agents, which call the engines; every room may use the lobby, which imports no
room (docs/development.md). The graph is grimp's (import-linter's library), which sees every import
statement, including the lazy ones inside functions and those under TYPE_CHECKING; `make lint` checks the
same rules with import-linter's `layers` contracts (pyproject.toml, [tool.importlinter])."""

import tomllib
from pathlib import Path

import grimp
import pytest

pytestmark = pytest.mark.unit

LAYERS = ("trainer", "rollout", "harnesses")  # highest first
# rollout/'s rooms, highest first; `independent`: the rooms of a group do not import each other
ROOMS = (
    ("orchestration", "testing"),
    ("agents",),
    ("engine",),
    ("checks", "config", "log", "models", "placement", "stats", "trace", "viewer"),  # the lobby
)
INDEPENDENT = {("orchestration", "testing")}


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


def room_breaches(graph) -> list[str]:
    """Every import between two of rollout/'s rooms that goes up, or across an independent group."""
    rank = {room: k for k, group in enumerate(ROOMS) for room in group}
    found = []
    for i in graph.find_matching_direct_imports(import_expression="rollout.** -> rollout.**"):
        a, b = (i[side].split(".")[1] for side in ("importer", "imported"))
        if a == b or not (rank[b] < rank[a] or (rank[a] == rank[b] and ROOMS[rank[a]] in INDEPENDENT)):
            continue
        for line in graph.get_import_details(importer=i["importer"], imported=i["imported"]):
            found.append(f"{i['importer']} -> {i['imported']} (line {line['line_number']}: {line['line_contents']})")
    return found


def test_rollout_rooms_import_down_only(graph):
    assert not room_breaches(graph), (
        "imports against rollout/'s rooms orchestration | testing > agents > engine > lobby (move the "
        "shared piece down to the lowest room that needs it, as EngineError sits beside Completion in "
        "rollout/engine/engine.py):\n" + "\n".join(room_breaches(graph))
    )


def test_every_rollout_module_has_a_room(graph):
    """A new room or lobby module must be placed (import-linter's contract is exhaustive too)."""
    placed = {room for group in ROOMS for room in group}
    children = {m.split(".")[1] for m in graph.find_children("rollout")}
    assert children == placed, f"not placed: {sorted(children - placed)}; gone: {sorted(placed - children)}"


def test_the_contracts_match_these_lists():
    """pyproject.toml's import-linter contracts state the same layers as this file."""
    contracts = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["tool"][
        "importlinter"
    ]["contracts"]
    rooms = next(c for c in contracts if c.get("containers") == ["rollout"])
    groups = [tuple(x.strip() for x in layer.replace(":", "|").split("|")) for layer in rooms["layers"]]
    independent = {g for g, layer in zip(groups, rooms["layers"]) if "|" in layer}
    assert (tuple(groups), independent, rooms["exhaustive"]) == (ROOMS, INDEPENDENT, True)
    assert any(c["layers"] == list(LAYERS) and "containers" not in c for c in contracts)


def test_the_development_tree_names_every_module():
    """docs/development.md's tree has one line per module of the packages and scripts/ (the package
    __init__.py files left out), and no line for a module that is gone."""
    import re

    root = Path(__file__).resolve().parents[1]
    text = (root / "docs" / "development.md").read_text()
    tree = text.split("## The tree", 1)[1].split("```", 2)[1]
    listed, folders = set(), []
    for line in tree.splitlines():
        if not (m := re.match(r"( *)(\S+)", line)):
            continue
        depth, name = len(m.group(1)) // 2, m.group(2)
        folders[depth:] = [name] if name.endswith("/") else []
        if name.endswith(".py"):
            listed.add("".join(folders[:depth]) + name)
    modules = {
        str(p.relative_to(root))
        for top in ("rollout", "trainer", "harnesses", "scripts")
        for p in (root / top).rglob("*.py")
        if p.name != "__init__.py"
    }
    assert listed == modules, f"missing from the tree: {sorted(modules - listed)}; gone: {sorted(listed - modules)}"


def test_the_graph_counts_lazy_imports(graph):
    """An import inside a function is an edge too (trainer/evaluation.py imports the fleet lazily)."""
    [detail] = graph.get_import_details(importer="trainer.evaluation", imported="rollout.orchestration.fleet")
    assert detail["line_contents"].startswith("from rollout.orchestration.fleet import")
    assert graph.direct_import_exists(importer="trainer.evaluation", imported="rollout.orchestration.fleet")


def test_scripts_import_only_installed_packages():
    """scripts/ run against the installed packages (pip install .): no sys.path edits, nothing from tests/."""
    import ast

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
