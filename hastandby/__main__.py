"""``python -m hastandby`` runs the CLI."""

from .cli import main

main()
