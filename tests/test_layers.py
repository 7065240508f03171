"""Imports point down only: between the top-level packages (tools > trainer > rollout > harnesses),
between rollout/'s rooms (orchestration > agents > engine > the lobby: config, trace, ...) and between
tools/'s pieces (bench | gpu_check | config_reference > corpora | faults).

harnesses/ are the user's plugins, rollout/ runs them, trainer/ drives rollout/: the product. tools/ is
the workshop beside it (benches, the GPU check, the corpora, fault injection, the config reference),
run from the checkout: it uses the product, and the product never imports it. Inside rollout/, the
orchestration drives the agents, which call the engines; every room may use the lobby, which imports no
room (docs/development.md). The graph is grimp's (import-linter's library), which sees every import
statement, including the lazy ones inside functions and those under TYPE_CHECKING; `make lint` checks the
same rules with import-linter's `layers` contracts (pyproject.toml, [tool.importlinter])."""

import ast
import tomllib
from pathlib import Path

import grimp
import pytest

pytestmark = pytest.mark.unit

LAYERS = ("tools", "trainer", "rollout", "harnesses")  # highest first
PRODUCT = ("rollout", "trainer", "harnesses")  # the wheel (pyproject.toml); tools/ and studies/ are the workshop
# Layers inside a package, highest first: each a group of its children; the children of a group listed
# in INDEPENDENT do not import each other, those of another group may.
CONTAINED = {
    "rollout": (  # its rooms and the lobby
        ("orchestration",),
        ("agents",),
        ("engine",),
        ("checks", "config", "faultpoints", "log", "models", "placement", "stats", "trace", "viewer"),
    ),
    "rollout.orchestration": (("fleet",), ("cluster", "watchdog"), ("worker",), ("router", "buffer")),
    # the tools stand on the corpora and the fault injection
    "tools": (("bench", "gpu_check", "config_reference"), ("corpora", "faults")),
}
INDEPENDENT = {
    ("cluster", "watchdog"),
    ("router", "buffer"),
    ("bench", "gpu_check", "config_reference"),
    ("corpora", "faults"),
}


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
        "imports that go up the layers tools > trainer > rollout > harnesses (hand the lower layer "
        "what it needs instead, as the rollout worker hands harnesses the gateway):\n" + "\n".join(upward)
    )


def breaches(graph, container: str) -> list[str]:
    """Every import between two children of `container` that goes up its layers, or across an
    independent group."""
    groups = CONTAINED[container]
    rank = {child: k for k, group in enumerate(groups) for child in group}
    depth = container.count(".") + 1
    found = []
    for i in graph.find_matching_direct_imports(import_expression=f"{container}.** -> {container}.**"):
        a, b = (i[side].split(".")[depth] for side in ("importer", "imported"))
        if a == b or not (rank[b] < rank[a] or (rank[a] == rank[b] and groups[rank[a]] in INDEPENDENT)):
            continue
        for line in graph.get_import_details(importer=i["importer"], imported=i["imported"]):
            found.append(f"{i['importer']} -> {i['imported']} (line {line['line_number']}: {line['line_contents']})")
    return found


@pytest.mark.parametrize("container", CONTAINED)
def test_inside_a_package_imports_go_down_only(graph, container):
    found = breaches(graph, container)
    assert not found, (
        f"imports against {container}'s layers {CONTAINED[container]} (move the shared piece down to the "
        f"lowest one that needs it, as EngineError sits beside Completion in rollout/engine/engine.py):\n"
        + "\n".join(found)
    )


@pytest.mark.parametrize("container", CONTAINED)
def test_every_module_has_a_layer(graph, container):
    """A new room, lobby module or orchestration module must be placed (import-linter's contracts are
    exhaustive too)."""
    placed = {child for group in CONTAINED[container] for child in group}
    children = {m.rpartition(".")[2] for m in graph.find_children(container)}
    assert children == placed, f"not placed: {sorted(children - placed)}; gone: {sorted(placed - children)}"


def test_the_contracts_match_these_lists():
    """pyproject.toml's import-linter contracts state the same layers as this file."""
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    contracts = pyproject["tool"]["importlinter"]["contracts"]
    stated = {}
    for c in contracts:
        if c.get("containers"):
            groups = tuple(tuple(x.strip() for x in layer.replace(":", "|").split("|")) for layer in c["layers"])
            independent = {g for g, layer in zip(groups, c["layers"]) if "|" in layer}
            stated[c["containers"][0]] = (groups, independent, c["exhaustive"])
    expected = {k: (v, {g for g in v if g in INDEPENDENT}, True) for k, v in CONTAINED.items()}
    assert stated == expected
    assert any(c["layers"] == list(LAYERS) and "containers" not in c for c in contracts)


def test_the_development_tree_names_every_module():
    """docs/development.md's tree has one line per module of the packages, tools/ and scripts/ (the
    package __init__.py files left out, tools/gpu_check/__main__.py named), and no line for a module
    that is gone."""
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
        for top in ("rollout", "trainer", "harnesses", "tools", "scripts")
        for p in (root / top).rglob("*.py")
        if p.name != "__init__.py"
    }
    assert listed == modules, f"missing from the tree: {sorted(modules - listed)}; gone: {sorted(listed - modules)}"


def test_the_graph_counts_lazy_imports(graph):
    """An import inside a function is an edge too (trainer/evaluation.py imports the fleet lazily)."""
    [detail] = graph.get_import_details(importer="trainer.evaluation", imported="rollout.orchestration.fleet")
    assert detail["line_contents"].startswith("from rollout.orchestration.fleet import")
    assert graph.direct_import_exists(importer="trainer.evaluation", imported="rollout.orchestration.fleet")


def imported_names(node: ast.AST) -> list[str]:
    """The modules an import statement names ([] for any other node); a relative import's as `.name`."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        return ["." * node.level + (node.module or "")]
    return []


# The user's doors import only the product: nothing from the workshop (tools/, studies/), from tests/,
# or from scripts/ itself (a script is thin glue over the packages, STYLE.md)
NOT_FOR_SCRIPTS = ("tests", "tools", "studies", "scripts")
# scripts/results_check.py moves to studies/ with the studies (another branch, at the same time); its
# spec_from_file_location of scripts/relay_runs.py goes with it. Drop this once the move has landed.
LEAVING_SCRIPTS = {"results_check.py"}


def test_scripts_import_only_installed_packages():
    """scripts/ run against the installed packages (pip install .): no sys.path edits, no module loaded
    from a file path (importlib.util.spec_from_file_location), nothing from tests/, tools/, studies/ or
    scripts/, and no bare import of a sibling script (`from relay import ...`)."""
    scripts = Path(__file__).resolve().parents[1] / "scripts"
    siblings = {p.stem for p in scripts.rglob("*.py")}
    found = []
    for path in sorted(scripts.rglob("*.py")):
        if path.name in LEAVING_SCRIPTS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", None) == "sys":
                found.append(f"{path.name}:{node.lineno}: sys.path")
            if (isinstance(node, ast.Attribute) and node.attr == "spec_from_file_location") or (
                isinstance(node, ast.Name) and node.id == "spec_from_file_location"
            ):
                found.append(f"{path.name}:{node.lineno}: spec_from_file_location")
            for n in imported_names(node):
                top = n.split(".")[0]
                if n.startswith(".") or top in NOT_FOR_SCRIPTS or top in siblings:
                    found.append(f"{path.name}:{node.lineno}: imports {n}")
    assert not found, found


def test_the_product_imports_no_workshop():
    """rollout/, trainer/ and harnesses/ (the wheel) import nothing from tools/, studies/, scripts/ or
    tests/, lazily or not: those are not installed."""
    root = Path(__file__).resolve().parents[1]
    found = [
        f"{path.relative_to(root)}:{node.lineno}: imports {n}"
        for package in PRODUCT
        for path in sorted((root / package).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        for n in imported_names(node)
        if n.split(".")[0] in NOT_FOR_SCRIPTS
    ]
    assert not found, found


def test_the_import_checks_see_what_they_refuse():
    """The two tests above find each kind of import they refuse."""
    source = "import tools.bench\nfrom studies.team import x\nfrom . import y\nimport scripts.relay as r\n"
    assert [n for node in ast.walk(ast.parse(source)) for n in imported_names(node)] == [
        "tools.bench",
        "studies.team",
        ".",
        "scripts.relay",
    ]
