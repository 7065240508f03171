"""Imports point down only: between the top-level packages (studies | tools > trainer > rollout >
harnesses), and inside each between its rooms and modules (rollout/: orchestration > gateway > agents >
engine > the lobby: config, trace, ...; trainer/, harnesses/, studies/, tools/ likewise).

harnesses/ are the user's plugins, rollout/ runs them, trainer/ drives rollout/: the product. studies/
(research with the product) and tools/ (the workshop: benches, the GPU check, the corpora, fault
injection, the config reference) sit beside it, run from the checkout, out of the wheel: they use the
product, which never imports them, and not each other. Inside rollout/, the
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

LAYERS = (
    ("studies", "tools"),
    ("trainer",),
    ("rollout",),
    ("harnesses",),
)  # highest first; a group's don't import each other
PACKAGES = tuple(p for group in LAYERS for p in group)
PRODUCT = ("rollout", "trainer", "harnesses")  # the wheel (pyproject.toml); tools/ and studies/ are the workshop
# Layers inside a package, highest first: each a group of its children; the children of a group listed
# in INDEPENDENT do not import each other, those of another group may.
CONTAINED = {
    "rollout": (  # its rooms and the lobby
        ("orchestration",),
        ("gateway",),
        ("agents",),
        ("engine",),
        ("checks", "config", "faultpoints", "log", "models", "placement", "stats", "trace", "viewer"),
    ),
    "rollout.orchestration": (("fleet",), ("cluster", "watchdog"), ("worker",), ("router", "buffer")),
    "rollout.gateway": (
        ("server",),
        ("chat", "responses"),
        ("sessions",),
        ("prompts", "transport"),
        ("tool_calls",),
        ("messages",),
    ),
    "rollout.agents": (("client",), ("chat_format",)),
    "trainer": (
        ("loop",),
        ("run_dir", "summary", "evaluation", "steps"),
        ("policy",),
        ("checkpoint", "weight_sync", "metrics"),
        ("learner_group",),
        ("learner",),
        ("losses", "advantages", "weight_transport", "hf_folder", "rank_env", "torch_load", "gather"),
        ("packing", "checks", "ledger"),
        ("config",),
    ),
    "harnesses": (("programs",), ("tasks",), ("verifiers",), ("base",)),
    # the checks over the studies, the two studies, their shared driver and contrasts, items, statistics
    "studies": (("results_check", "plot_results"), ("team", "relay"), ("study", "contrasts"), ("items",), ("stats",)),
    # the tools stand on the corpora and the fault injection
    "tools": (("bench", "gpu_check", "config_reference"), ("corpora", "faults")),
}
# The groups whose children do not import each other (a `|` in pyproject.toml); the lobby's `:` lets its
# modules import each other.
INDEPENDENT = {
    ("cluster", "watchdog"),
    ("router", "buffer"),
    ("chat", "responses"),
    ("prompts", "transport"),
    ("run_dir", "summary", "evaluation", "steps"),
    ("checkpoint", "weight_sync", "metrics"),
    ("losses", "advantages", "weight_transport", "hf_folder", "rank_env", "torch_load", "gather"),
    ("packing", "checks", "ledger"),
    ("results_check", "plot_results"),
    ("team", "relay"),
    ("study", "contrasts"),
    ("bench", "gpu_check", "config_reference"),
    ("corpora", "faults"),
}


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def test_no_import_goes_up_the_layers(graph):
    upward = [
        f"{i['importer']} -> {i['imported']} (line {line['line_number']}: {line['line_contents']})"
        for k, group in enumerate(LAYERS)
        for lower in group
        for higher in [p for g in LAYERS[:k] for p in g] + [p for p in group if p != lower]
        for i in graph.find_matching_direct_imports(import_expression=f"{lower}.** -> {higher}.**")
        for line in graph.get_import_details(importer=i["importer"], imported=i["imported"])
    ]
    assert not upward, (
        "imports that go up the layers studies | tools > trainer > rollout > harnesses (hand the lower layer "
        "what it needs instead, as the rollout worker hands harnesses the gateway):\n" + "\n".join(upward)
    )


def test_the_product_never_imports_the_studies(graph):
    """rollout/, trainer/ and harnesses/ (the wheel) import nothing of studies/, lazily or not: the
    studies run from the checkout only."""
    found = [
        f"{i['importer']} -> {i['imported']}"
        for top in PRODUCT
        for i in graph.find_matching_direct_imports(import_expression=f"{top}.** -> studies.**")
    ]
    assert not found, "the product imports the studies (move the piece it needs into the product):\n" + "\n".join(found)


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
    assert any(c["layers"] == [" | ".join(g) for g in LAYERS] and "containers" not in c for c in contracts)


def test_the_development_tree_names_every_module():
    """docs/development.md's tree has one line per module of the packages, studies/, tools/ and scripts/
    (the package __init__.py files left out, tools/gpu_check/__main__.py named), and no line for a module
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
        for top in ("rollout", "trainer", "harnesses", "studies", "tools", "scripts")
        for p in (root / top).rglob("*.py")
        if p.name != "__init__.py"
    }
    assert listed == modules, f"missing from the tree: {sorted(modules - listed)}; gone: {sorted(listed - modules)}"


def cycles(graph) -> list[list[str]]:
    """The import cycles among the product's modules (Tarjan's strongly connected components of more
    than one module), lazy and TYPE_CHECKING imports included."""
    modules = sorted(graph.modules)
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(m: str) -> None:  # recursion depth is at most the module count (~100)
        index[m] = low[m] = len(index)
        stack.append(m)
        on_stack.add(m)
        for n in sorted(graph.find_modules_directly_imported_by(m)):
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in on_stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            component = []
            while (n := stack.pop()) != m:
                on_stack.discard(n)
                component.append(n)
            on_stack.discard(m)
            if component:
                found.append(sorted([m, *component]))

    for m in modules:
        if m not in index:
            visit(m)
    return found


def test_no_module_imports_itself_through_others(graph):
    """No import cycle anywhere in the product, a lazy import's included: a cycle a lazy import hides
    (checkpoint -> learner_group -> learner -> checkpoint was one) is a layer missing its rule."""
    assert not cycles(graph), cycles(graph)


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


def test_scripts_import_only_installed_packages():
    """scripts/ run against the installed packages (pip install .): no sys.path edits, no module loaded
    from a file path (importlib.util.spec_from_file_location), nothing from tests/, tools/, studies/ or
    scripts/, and no bare import of a sibling script (`from relay import ...`)."""
    scripts = Path(__file__).resolve().parents[1] / "scripts"
    siblings = {p.stem for p in scripts.rglob("*.py")}
    found = []
    for path in sorted(scripts.rglob("*.py")):
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
