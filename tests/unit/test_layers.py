"""The package's layers, read from its imports: who may import whom, and no import loop anywhere.

Every module of ``hastandby/`` belongs to one layer of ``LAYERS`` (lowest
first) and imports only its own layer and those below, so the folder names
and docs/architecture.md's chart say the same thing.  ``ha/`` (hot standby)
and ``dr/`` share a layer and never import each other; both build on
``replication/``.  Inside ``broker/`` the sub-packages are layered the same
way.  Only the driver and the links module talk to the proton C binding
(``cproton``), so a proton upgrade that changes it is fixed in two files.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "hastandby"

# Lowest first: a module may import modules of its own layer and of the layers before it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("hastandby", "hastandby.files", "hastandby.logs", "hastandby.connect_timeout",
                    "hastandby.settings")),
    ("security", ("hastandby.security",)),
    ("broker", ("hastandby.broker",)),
    ("client", ("hastandby.client", "hastandby.verify")),
    ("replication", ("hastandby.replication",)),
    ("node", ("hastandby.node", "hastandby.access")),
    ("lifecycle", ("hastandby.lifecycle",)),
    ("election", ("hastandby.election",)),
    ("host", ("hastandby.host",)),
    ("ha and dr", ("hastandby.ha", "hastandby.dr")),
    ("process", ("hastandby.cli", "hastandby.metrics", "hastandby.local_cluster", "hastandby.local_processes",
                 "hastandby.__main__")),
    ("harness", ("hastandby.testing",)),
]

# The same inside broker/, lowest first.
BROKER_LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("words", ("hastandby.broker", "hastandby.broker.errors", "hastandby.broker.vocabulary")),
    ("message", ("hastandby.broker.message",)),
    ("queues", ("hastandby.broker.queues",)),
    ("store", ("hastandby.broker.store",)),
    ("admission", ("hastandby.broker.admission",)),
    ("transport", ("hastandby.broker.transport",)),
    ("node", ("hastandby.broker.links", "hastandby.broker.management", "hastandby.broker.server")),
]

SIBLINGS = [("hastandby.ha", "hastandby.dr")]  # one layer, never importing each other


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _all_modules() -> dict[str, Path]:
    return {_module_name(path): path for path in PACKAGE.rglob("*.py") if "__pycache__" not in path.parts}


MODULES = _all_modules()


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (``from package import module`` names the module), relative ones resolved."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                found.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in MODULES else module)
    return found


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _rank(module: str, layers: list[tuple[str, tuple[str, ...]]]) -> int | None:
    """The index of the layer ``module`` belongs to (the longest prefix wins), None if none names it."""
    best: tuple[int, int] | None = None
    for index, (_, prefixes) in enumerate(layers):
        for prefix in prefixes:
            if _within(module, prefix) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    return None if best is None else best[0]


def test_every_module_has_a_layer() -> None:
    assert [m for m in sorted(MODULES) if _rank(m, LAYERS) is None] == []
    broker = [m for m in sorted(MODULES) if _within(m, "hastandby.broker")]
    assert [m for m in broker if _rank(m, BROKER_LAYERS) is None] == []


@pytest.mark.parametrize("layers", [LAYERS, BROKER_LAYERS], ids=["package", "broker"])
def test_each_layer_imports_only_itself_and_what_lies_below(layers: list[tuple[str, tuple[str, ...]]]) -> None:
    scope = [m for m in MODULES if _rank(m, layers) is not None]
    wrong = []
    for module in sorted(scope):
        mine = _rank(module, layers)
        assert mine is not None
        for imported in sorted(_imports(MODULES[module])):
            if imported not in MODULES:
                continue
            theirs = _rank(imported, layers)
            if theirs is not None and theirs > mine:
                wrong.append(f"{module} ({layers[mine][0]}) imports {imported} ({layers[theirs][0]})")
    assert wrong == []


def test_hot_standby_and_dr_never_import_each_other() -> None:
    wrong = [
        f"{module} imports {imported}"
        for a, b in SIBLINGS
        for mine, other in ((a, b), (b, a))
        for module in sorted(MODULES)
        if _within(module, mine)
        for imported in sorted(_imports(MODULES[module]))
        if _within(imported, other)
    ]
    assert wrong == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_loop() -> None:
    """No two modules import each other, directly or around a loop (imports under TYPE_CHECKING count too)."""
    graph = {name: {m for m in _imports(path) if m in MODULES and m != name} for name, path in MODULES.items()}
    assert _cycles(graph) == []


def test_the_loop_finder_finds_loops() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_only_the_driver_and_links_use_the_c_binding() -> None:
    users = {
        str(path.relative_to(PACKAGE))
        for path in MODULES.values()
        if any(module == "cproton" or module.startswith("cproton.") for module in _imports(path))
    }
    assert users == {"broker/transport/driver.py", "broker/links.py"}


def test_imports_resolve() -> None:
    """The checks above read imports right: a package's module imported by name counts as that module."""
    assert "hastandby.replication.batching" in _imports(PACKAGE / "replication" / "subscription.py")
    assert "hastandby.broker.queues.lineage" in _imports(PACKAGE / "ha" / "primary.py")


# -- the harness: hastandby/testing, shared by tests/ and benchmarks/ -----------------------------------------------

ROOT = PACKAGE.parent
HARNESS = PACKAGE / "testing"

# The one test of a benchmark's own logic (its command-line parser), which imports that benchmark; nothing else
# in tests/ imports benchmarks/, and nothing in benchmarks/ imports tests/.
TESTS_OF_BENCHMARKS = {
    "tests/unit/test_failover_cases.py",  # the failover benchmark's own case parser
}


def _python_files(folder: Path) -> list[Path]:
    return sorted(path for path in folder.rglob("*.py") if "__pycache__" not in path.parts)


def _importing(paths: list[Path], prefixes: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in paths
        for module in sorted(_imports(path))
        if any(module == p or module.startswith(p + ".") for p in prefixes)
    ]


def test_the_harness_imports_neither_tests_nor_benchmarks() -> None:
    """``hastandby/testing`` is what both import (as trio ships ``trio/testing``); it imports neither, nor pytest."""
    assert _importing(_python_files(HARNESS), ("tests", "benchmarks", "pytest")) == []


def test_the_product_never_imports_the_harness() -> None:
    product = [path for path in _python_files(PACKAGE) if HARNESS not in path.parents]
    assert _importing(product, ("hastandby.testing",)) == []


def test_tests_and_benchmarks_meet_only_in_the_harness() -> None:
    tests = [path for path in _python_files(ROOT / "tests")
             if str(path.relative_to(ROOT)) not in TESTS_OF_BENCHMARKS]
    benchmarks = _python_files(ROOT / "benchmarks")
    assert _importing(tests, ("benchmarks",)) == []
    assert _importing(benchmarks, ("tests",)) == []


def test_the_exemptions_are_still_needed() -> None:
    """Each test named in ``TESTS_OF_BENCHMARKS`` still imports ``benchmarks`` (drop it from the list once not)."""
    stale = [name for name in sorted(TESTS_OF_BENCHMARKS) if not _importing([ROOT / name], ("benchmarks",))]
    assert stale == []
