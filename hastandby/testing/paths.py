"""Where the harness puts things: the checkout, benchmark results, compiled C clients.

``CHECKOUT`` is the repository this package lies in (its root holds
``pyproject.toml``, ``tests/``, ``benchmarks/``, ``scripts/``), or ``None`` for
an installed package.  Results and build outputs never go into the source
tree's tracked folders:

- ``results_dir()``: ``$HASTANDBY_RESULTS_DIR``, else ``results/`` at the
  checkout's root (ignored by git), else ``./results`` (every benchmark's
  default ``--out``/``--results``, the fuzz runner's ``--json``);
- ``build_dir()``: ``$HASTANDBY_BUILD_DIR``, else ``build/cexamples/`` at
  the checkout's root (ignored), else ``~/.cache/hastandby/cexamples``
  (the C example clients, ``cexamples.build``).
"""

from __future__ import annotations

import os
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
CHECKOUT: Path | None = _ROOT if (_ROOT / "pyproject.toml").is_file() else None

RESULTS_ENV = "HASTANDBY_RESULTS_DIR"
BUILD_ENV = "HASTANDBY_BUILD_DIR"


def repo() -> Path:
    """The checkout's root; for an installed package, the current directory (child processes' cwd)."""
    return CHECKOUT or Path.cwd()


def results_dir() -> Path:
    """Where benchmark results go by default (module doc); not created here."""
    explicit = os.environ.get(RESULTS_ENV)
    if explicit:
        return Path(explicit)
    return (CHECKOUT or Path.cwd()) / "results"


def build_dir() -> Path:
    """Where the C example clients are compiled to by default (module doc); not created here."""
    explicit = os.environ.get(BUILD_ENV)
    if explicit:
        return Path(explicit)
    if CHECKOUT is not None:
        return CHECKOUT / "build" / "cexamples"
    return Path.home() / ".cache" / "hastandby" / "cexamples"
