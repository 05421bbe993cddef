"""The package's layers, read from its imports: who may import whom.

``broker/`` is the message broker and knows nothing of replication;
``replication/`` is what hot standby and DR share; ``browser/`` (hot standby)
and ``dr/`` build on it and never on each other; only the driver and the
links module talk to the proton C binding (``cproton``), so a proton upgrade
that changes it is fixed in two files.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "hastandby"


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, relative imports resolved to absolute names."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
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
            found.add(module)
    return found


def _modules(subpackage: str) -> list[Path]:
    return sorted((PACKAGE / subpackage).rglob("*.py"))


@pytest.mark.parametrize(
    "subpackage, forbidden",
    [
        ("broker", ("hastandby.replication", "hastandby.browser", "hastandby.dr", "hastandby.lifecycle")),
        ("replication", ("hastandby.browser", "hastandby.dr", "hastandby.lifecycle")),
        ("dr", ("hastandby.browser",)),
        ("browser", ("hastandby.dr",)),
    ],
)
def test_layer_imports_only_what_lies_below(subpackage: str, forbidden: tuple[str, ...]) -> None:
    wrong = [
        f"{path.relative_to(PACKAGE)} imports {module}"
        for path in _modules(subpackage)
        for module in _imports(path)
        if module.startswith(forbidden)
    ]
    assert wrong == []


def test_only_the_driver_and_links_use_the_c_binding() -> None:
    users = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if any(module == "cproton" or module.startswith("cproton.") for module in _imports(path))
    }
    assert users == {"broker/driver.py", "broker/links.py"}


def test_relative_imports_resolve() -> None:
    """The checks above read relative imports right: the replication package's own are seen as such."""
    assert "hastandby.replication.batching" in _imports(PACKAGE / "replication" / "subscription.py")


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
