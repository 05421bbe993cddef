"""``hastandby.testing``'s chosen surface: what ``__all__`` names, the docstring table says, and the benchmarks
share only through it (never another benchmark's private name)."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import hastandby.testing as testing

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "hastandby" / "testing"


def _table() -> list[tuple[list[str], list[str]]]:
    """Each row of the docstring table: its modules, and the names it says they export here."""
    rows = []
    for line in (testing.__doc__ or "").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("``"):
            rows.append((re.findall(r"``(\w+)``", cells[0]), re.findall(r"``(\w+)``", cells[2])))
    return rows


def test_every_exported_name_resolves_to_a_module_of_its_row_of_the_table() -> None:
    row_of = {name: modules for modules, names in _table() for name in names}
    assert sorted(row_of) == sorted(testing.__all__)
    for name in testing.__all__:
        value = getattr(testing, name)
        defined_in = [m for m in row_of[name] if getattr(importlib.import_module(f"hastandby.testing.{m}"), name,
                                                         None) is value]
        assert defined_in, f"{name} is not in {row_of[name]}"


def test_the_table_names_every_module_of_the_harness() -> None:
    modules = sorted(path.stem for path in HARNESS.glob("*.py") if path.stem != "__init__")
    assert sorted(m for modules, _ in _table() for m in modules) == modules


def test_importing_the_package_imports_none_of_its_modules() -> None:
    """So that ``python -m hastandby.testing.numbered_client`` (and the others run so) runs its module once."""
    code = ("import sys, hastandby.testing; "
            "print(sorted(m for m in sys.modules if m.startswith('hastandby.testing.')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert result.stdout.strip() == "[]"


def test_no_benchmark_imports_another_ones_private_name() -> None:
    """What benchmarks share lives in ``hastandby.testing`` (``bench``) or is public in its benchmark."""
    private = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("benchmarks")):
                private += [f"{path.name}: {node.module}.{alias.name}"
                            for alias in node.names if alias.name.startswith("_")]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr.startswith("_") \
                    and not node.attr.startswith("__") and node.value.id in {p.stem for p in path.parent.glob("*.py")}:
                private.append(f"{path.name}: {node.value.id}.{node.attr}")
    assert private == []
