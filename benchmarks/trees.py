"""The source trees benchmarks start nodes from: this checkout, or an older one (``--baseline-tree``).

An older tree's ``serve`` may lack options of ours; a baseline is started with
those it knows, and whether it knows authentication at all is read from its
``serve --help``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hastandby.client import Login
from hastandby.testing import auth as _auth
from hastandby.testing.paths import repo
from hastandby.testing.processes import python_env

REPO_ROOT = repo()


@dataclass(frozen=True)
class Tree:
    """The source tree nodes are started from, and what its nodes accept.

    ``current`` is this repository, with authentication required
    (``_auth``); a baseline tree is an older checkout whose nodes may have
    no authentication at all (``authenticated=False``: no user arguments,
    clients and management connect anonymously).
    """

    name: str
    root: Path
    authenticated: bool = True
    baseline: bool = False
    journal: bool = False  # every node with a --data-dir, the queues durable (the messages stay non-durable)
    serve_options: frozenset[str] = frozenset()  # a baseline's ``serve`` options (empty: any); others are left out

    def env(self) -> dict[str, str]:
        env = python_env()  # the tree's own package before the venv's editable install of /work/main's
        env["PYTHONPATH"] = os.pathsep.join([str(self.root), *filter(None, [env.get("PYTHONPATH")])])
        return env

    def serve_argv(self) -> list[str]:
        users = _auth.users().serve_arguments() if self.authenticated else []
        return [sys.executable, "-m", "hastandby", "serve", "--log-format", "json", *self._known(users)]

    def _known(self, arguments: list[str]) -> list[str]:
        """``arguments`` without the options an older tree's ``serve`` lacks (and their values), so that
        e.g. 729c9d5, which has ``--users-file`` but not ``--no-allow-anonymous``, can be measured."""
        if not self.serve_options:
            return arguments
        kept: list[str] = []
        skipping = False
        for argument in arguments:
            if argument.startswith("--"):
                skipping = argument not in self.serve_options
            if not skipping:
                kept.append(argument)
        return kept

    def login(self) -> Login:
        """Management: as ``admin``, or anonymously (an explicit empty Login, not the caller's environment)."""
        return _auth.users().login() if self.authenticated else Login()

    def client_environment(self) -> dict[str, str] | None:
        """The C clients' credentials (None: they connect as the stock examples do)."""
        return _auth.users().client_environment() if self.authenticated else None

    def connect_options(self) -> dict[str, Any]:
        return _auth.users().connect_options() if self.authenticated else {}

    def describe(self) -> dict[str, Any]:
        """Commit, uncommitted node changes and where ``hastandby`` is imported from, for the JSON."""
        def git(*argv: str) -> str:
            try:
                return subprocess.run(["git", *argv], cwd=self.root, capture_output=True, text=True, check=False,
                                      timeout=10).stdout.strip()
            except (OSError, subprocess.TimeoutExpired):
                return ""
        imported = subprocess.run([sys.executable, "-c", "import hastandby; print(hastandby.__file__)"],
                                  cwd=self.root, env=self.env(), capture_output=True, text=True, check=False,
                                  timeout=60).stdout.strip()
        # A tree unpacked under build/ of this checkout is no repository of its own: git would name ours.
        own = Path(git("rev-parse", "--show-toplevel") or "/").resolve() == self.root.resolve()
        return {"name": self.name, "root": str(self.root), "commit": git("rev-parse", "HEAD") if own else None,
                "uncommitted_node_changes": git("status", "--porcelain", "--", "hastandby").splitlines() if own else None,
                "hastandby_imported_from": imported, "authentication": self.authenticated,
                "journal": self.journal,
                "serve_arguments": [a if not a.startswith(("/", "--users-file=")) else "<run's file>"
                                    for a in self.serve_argv()[4:]]}


CURRENT = Tree("current", REPO_ROOT)


def baseline_tree(root: Path) -> Tree:
    """A tree to compare against; whether its nodes know authentication is read from its ``serve --help``."""
    root = root.resolve()
    tree = Tree("baseline", root, authenticated=False, baseline=True)
    if not (root / "hastandby" / "__init__.py").is_file():
        raise SystemExit(f"--baseline-tree {root}: no hastandby package there")
    help_text = subprocess.run([sys.executable, "-m", "hastandby", "serve", "--help"], cwd=root, env=tree.env(),
                               capture_output=True, text=True, check=False, timeout=60).stdout
    if "--listen" not in help_text:
        raise SystemExit(f"--baseline-tree {root}: 'python -m hastandby serve --help' failed there")
    options = frozenset(re.findall(r"--[a-z][a-z0-9-]*", help_text))
    tree = Tree("baseline", root, authenticated="--users-file" in options, baseline=True, serve_options=options)
    imported = tree.describe()["hastandby_imported_from"]
    if not imported.startswith(str(root)):
        raise SystemExit(f"--baseline-tree {root}: nodes would import hastandby from {imported}, not the tree")
    return tree
