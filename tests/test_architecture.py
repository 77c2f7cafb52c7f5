"""The package import graph: no circle, and imports run with the data flow (docs/architecture.md).

Every module of mxsim is parsed with ``ast`` and every import counts, including those inside
functions (a lazy import is still a dependency). A package's node is its first name under
``mxsim`` (``mxsim.replay.run`` -> ``replay``; a top-level module is its own node).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "mxsim"

# Left to right: a package may import only packages of its own layer or of layers to its left.
LAYERS = (
    # the top-level modules every package may use: errors, limits, files, optional imports,
    # compiles, thread counts
    ("errors", "limits", "fileio", "_optional", "_compile", "_threads", "mxsim"),
    ("formats",),
    ("exact",),  # exact codes, product pairs and FP32 bits for crafted inputs (golden, probe)
    ("quantize",),
    ("datapath",),
    ("parallel",),  # process pools over datapath work, for the consumers
    (
        "trace",
        "capture",
        "replay",
        "inloop",
        "evaluate",
        "cycles",
        "golden",
        "sweep",
        "probe",
        "cmodel",
        "rtl",
    ),
    ("cli",),
)
# Within the consumers' layer, what each package may import (capture -> trace -> replay, the
# in-the-loop runner on top of all three, evaluation on top of the runner).
CONSUMER_IMPORTS = {
    "trace": set(),
    "capture": {"trace"},
    "replay": {"trace", "cycles"},
    "inloop": {"trace", "capture", "replay"},
    "evaluate": {"trace", "capture", "replay", "inloop"},
    "cycles": set(),
    "golden": set(),
    "sweep": {"trace", "replay", "rtl"},
    "probe": set(),
    "cmodel": {"golden"},
    "rtl": set(),
}


def _module_name(path: Path) -> tuple[list[str], bool]:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        return parts[:-1], True
    return parts, False


def _exists(parts: list[str]) -> bool:
    base = REPO.joinpath(*parts)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _imported_modules(path: Path) -> list[list[str]]:
    """Every mxsim module ``path`` imports (at the top or in a function), as name parts."""
    parts, is_package = _module_name(path)
    package = parts if is_package else parts[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name.split(".") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = base + (node.module.split(".") if node.module else [])
            if node.module:
                found.append(module)
            else:  # ``from . import x``: x is a module when one exists, else a name of the package
                found += [
                    module + [alias.name] if _exists(module + [alias.name]) else module
                    for alias in node.names
                ]
    return [name for name in found if name[0] == "mxsim"]


def _node(parts: list[str]) -> str:
    return parts[1] if len(parts) > 1 else "mxsim"


def package_graph() -> dict[str, set[str]]:
    """package -> the packages its modules import (itself excluded)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        source = _node(_module_name(path)[0])
        targets = graph.setdefault(source, set())
        targets.update(_node(name) for name in _imported_modules(path) if _node(name) != source)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    rank = {name: index for index, layer in enumerate(LAYERS) for name in layer}
    consumers = set(CONSUMER_IMPORTS)
    bad = []
    for source, targets in sorted(graph.items()):
        for target in sorted(targets):
            if source not in rank or target not in rank:
                continue
            if rank[target] > rank[source]:
                bad.append(f"{source} -> {target} (against the data flow)")
            elif (
                source in consumers
                and target in consumers
                and target not in CONSUMER_IMPORTS[source]
            ):
                bad.append(
                    f"{source} -> {target} (allowed for {source}: {sorted(CONSUMER_IMPORTS[source]) or 'none'})"
                )
    return bad


def test_the_graph_sees_lazy_relative_and_package_imports():
    graph = package_graph()
    assert "errors" in graph["formats"]
    assert (
        "trace" in graph["replay"]
    )  # ``from ..trace import conv`` and ``from ..trace.model import ...``
    assert "inloop" in graph["cli"]  # imported inside a function only
    assert {"capture", "replay", "trace", "inloop"} <= set(graph)


def test_the_checks_find_a_circle_and_an_upward_import():
    graph = {
        "trace": {"errors"},
        "replay": {"trace", "inloop"},
        "inloop": {"replay"},
        "errors": set(),
    }
    assert find_cycle(graph) == ["inloop", "replay", "inloop"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert layering_violations(
        {"trace": {"replay"}, "datapath": {"cycles"}, "replay": {"inloop"}}
    ) == [
        "datapath -> cycles (against the data flow)",
        "replay -> inloop (allowed for replay: ['cycles', 'trace'])",
        "trace -> replay (allowed for trace: none)",
    ]


def test_no_import_circle_between_packages():
    cycle = find_cycle(package_graph())
    assert cycle is None, f"import circle: {' -> '.join(cycle)}"


def test_imports_follow_the_data_flow():
    assert layering_violations(package_graph()) == []


def test_every_package_and_top_level_module_has_a_layer():
    placed = {name for layer in LAYERS for name in layer}
    assert set(package_graph()) - placed == set(), (
        "place each new package or top-level module in LAYERS"
    )
