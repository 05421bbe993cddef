"""The docs name only modules that exist, and the README stays short.

Every Markdown file of the checkout (README.md, docs/, benchmarks/README.md,
...; not node_modules, build outputs or results) is read for what looks like
a module: a path to a ``.py`` file, a dotted ``hastandby.x.y`` (or
``benchmarks.``, ``tests.``, ``spark_analysis.``) name, and a folder in
backticks (```ha/```, ```broker/queues/```).  Each must exist in the tree,
as a path relative to the repository root, ``hastandby/``,
``hastandby/broker/``, ``tests/``, ``benchmarks/``, ``scripts/`` or the
document's own folder; a bare file name (``states.py``) or folder (```ha/```)
must be one somewhere in the code.  A renamed or removed module then fails
here instead of sending a reader to a file that is not there.

Also: docs/architecture.md's Layers chart is ``tests/unit/test_layers.py``'s
``LAYERS`` and ``BROKER_LAYERS`` (the same layers in the same order, lowest
first, each row naming its modules and packages), and README.md, which is
for users, stays at most 150 lines.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.unit.test_layers import BROKER_LAYERS, LAYERS

ROOT = Path(__file__).resolve().parents[2]

# Not part of the checkout's docs, or not tracked: nothing under them is read or required.
SKIPPED_DIRS = {".git", ".venv", "node_modules", "build", "results", "test-artifacts", ".cluster",
                ".pytest_cache", ".mypy_cache", ".ruff_cache", "__pycache__", "spark-warehouse",
                "metastore_db"}
# Where a relative path may start.
BASES = ("", "hastandby", "hastandby/broker", "tests", "benchmarks", "scripts")
# The code's folders: a bare file or folder name must be one of theirs.
CODE_DIRS = ("hastandby", "tests", "benchmarks", "scripts", "examples", "spark_analysis")
# Places a doc may name that the checkout does not hold: ignored outputs (made by a run) and other projects.
NOT_IN_TREE = (
    "build/", "results/", ".cluster/", ".venv/", "test-artifacts/",  # made by setup, runs and benchmarks
    "src/qpid/", "trio/", "qpid/", "jepsen/",  # other projects, named as examples to follow
)
# Dotted names checked as modules (the first part is a top-level package of the checkout).
DOTTED = re.compile(r"(?<![\w./-])((?:hastandby|benchmarks|tests|spark_analysis)(?:\.[A-Za-z_]\w*)+)")
# A folder name the reader fills in: `DATA_DIR/acl`.
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*|<[^>]*>")
# A path to a Python file, with or without folders.
PY_PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[A-Za-z_]\w*\.py)\b")
# A code span holding a relative path with a slash (a folder if it ends with one).
SPAN = re.compile(r"`([\w.-]+(?:/[\w.-]+)*/|[\w.-]+(?:/[\w.-]+)+)`")


def _docs() -> list[Path]:
    found = []
    for path in sorted(ROOT.rglob("*.md")):
        parts = path.relative_to(ROOT).parts
        if any(part in SKIPPED_DIRS or part.endswith(".egg-info") for part in parts[:-1]):
            continue
        found.append(path)
    return found


def _code_names() -> tuple[set[str], set[str]]:
    """Every file name and every folder name under the code's folders."""
    files: set[str] = set()
    folders: set[str] = set()
    for top in CODE_DIRS:
        for path in (ROOT / top).rglob("*"):
            if any(part in SKIPPED_DIRS for part in path.relative_to(ROOT).parts):
                continue
            (folders if path.is_dir() else files).add(path.name)
    folders.update(path.name for path in ROOT.iterdir() if path.is_dir() and path.name not in SKIPPED_DIRS)
    return files, folders


FILES, FOLDERS = _code_names()


def _real(path: Path) -> bool:
    """A file, or a folder with something in it besides ``__pycache__`` (what a moved package leaves behind)."""
    return path.is_file() or (path.is_dir() and any(child.name != "__pycache__" for child in path.iterdir()))


def _exists(reference: str, doc: Path) -> bool:
    name = reference.rstrip("/")
    if reference.startswith(NOT_IN_TREE) or reference.startswith("-"):
        return True  # an ignored output, another project, or an option's value (`--out/node-logs/`)
    segments = name.split("/")
    if any(PLACEHOLDER.fullmatch(segment) for segment in segments):
        return True  # `DATA_DIR/acl`: a place the reader chooses
    if len(segments) == 1:
        return name in (FOLDERS if reference.endswith("/") else FILES | FOLDERS)
    if not reference.endswith("/") and "." not in segments[-1] and segments[0] not in FOLDERS:
        return True  # `cut/urls`, `FAULT/VIA`: a label with a slash, not a path
    bases = [ROOT / base for base in BASES] + [doc.parent]
    return any(_real(base / name) for base in bases)


def _module_exists(dotted: str) -> bool:
    """``a.b.c`` is a module or package, or a module and a name it defines (a class, function or constant)."""
    if dotted in FILES:
        return True  # `hastandby.env`: a file of the checkout with a dotted name
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        path = ROOT.joinpath(*parts[:cut])
        source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if not source.is_file():
            continue
        rest = parts[cut:]
        if not rest:
            return True
        name = re.escape(rest[0])
        defined = rf"^\s*(?:async\s+def|def|class)\s+{name}\b|^{name}\s*[:=]|^\s*(?:from|import)\s.*\b{name}\b"
        return len(rest) <= 2 and re.search(defined, source.read_text(), re.MULTILINE) is not None
    return False


def _references(text: str) -> list[tuple[str, str]]:
    """(kind, what) for everything in ``text`` that names a module or a folder."""
    found = [("path", match) for match in PY_PATH.findall(text)]
    found += [("path", match) for match in SPAN.findall(text) if not match.endswith(".py")]
    found += [("module", match) for match in DOTTED.findall(text)]
    return found


def _missing(doc: Path) -> list[str]:
    text = doc.read_text()
    wrong = []
    for kind, what in _references(text):
        if what.startswith(("http", "www.")) or "://" in what:
            continue
        ok = _module_exists(what.rstrip(".")) if kind == "module" else _exists(what, doc)
        if not ok:
            wrong.append(f"{doc.name}: {what}")
    return sorted(set(wrong))


DOCS = _docs()


def test_the_docs_are_found() -> None:
    names = {str(doc.relative_to(ROOT)) for doc in DOCS}
    assert {"README.md", "benchmarks/README.md", "docs/architecture.md"} <= names
    assert not any("node_modules" in name for name in names)


@pytest.mark.parametrize("doc", DOCS, ids=[str(doc.relative_to(ROOT)) for doc in DOCS])
def test_every_module_a_doc_names_exists(doc: Path) -> None:
    assert _missing(doc) == []


def test_the_checker_catches_a_missing_module(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text(
        "See `lifecycle/ha_node.py`, `browser/`, hastandby.wiring.events and `ha/`, `broker/queues/`,"
        " hastandby.ha.node, examples/app.py and `states.py`.\n"
    )
    assert [line.split(": ", 1)[1] for line in _missing(doc)] == [
        "browser/", "hastandby.wiring.events", "lifecycle/ha_node.py"]


def _chart_rows(heading: str) -> list[list[list[str]]]:
    """The tables under ``heading`` in docs/architecture.md, up to the next ``## ``: their rows' cells, header left out."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    tables: list[list[list[str]]] = []
    current: list[list[str]] | None = None
    for line in section.splitlines():
        if not line.startswith("|"):
            current = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if current is None:
            current = []
            tables.append(current)  # the header row starts a table; the next is its rule
        elif not set(cells[0]) <= set("-: "):
            current.append(cells)
    return tables


def _named(prefix: str, top: str) -> str | None:
    """How the chart names the module or package ``prefix`` (from ``hastandby/``), None if it is not in the tree yet.

    ``top``'s own ``__init__.py`` is a module of the lowest layer, written as that file."""
    path = ROOT.joinpath(*prefix.split("."))
    shown = path.relative_to(ROOT / "hastandby").as_posix()
    if prefix == top:
        return "__init__.py" if shown == "." else f"{shown}/__init__.py"
    if path.is_dir():
        return f"{shown}/"
    return f"{shown}.py" if path.with_suffix(".py").is_file() else None


@pytest.mark.parametrize("table, layers, top", [(0, LAYERS, "hastandby"), (1, BROKER_LAYERS, "hastandby.broker")],
                         ids=["package", "broker"])
def test_the_architecture_chart_is_the_layer_table(
        table: int, layers: list[tuple[str, tuple[str, ...]]], top: str) -> None:
    """docs/architecture.md's Layers chart is test_layers.py's table: its layers, lowest first, each with its modules."""
    rows = _chart_rows("## Layers")[table]
    assert [row[0] for row in rows] == [name for name, _ in layers]
    for row, (name, prefixes) in zip(rows, layers):
        spans = set(re.findall(r"`([^`]+)`", row[1]))
        wanted = {shown for prefix in prefixes if (shown := _named(prefix, top)) is not None}
        assert sorted(wanted - spans) == [], f"layer {name}: the chart's package column names {sorted(spans)}"


def test_the_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; the detail belongs in docs/"
