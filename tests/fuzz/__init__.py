"""Fuzzing live nodes with mutated input (docs/fuzz.md): ``python -m tests.fuzz`` or ``hastandby bench fuzz``."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """The command line of ``__main__.py`` (imported lazily: importing a kind must not parse arguments)."""
    from .__main__ import main as run

    return run(argv)
