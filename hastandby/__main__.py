"""``python -m hastandby`` runs the CLI."""

from hastandby.cli import main

main()
