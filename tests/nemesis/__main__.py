"""``python -m tests.nemesis``: see ``tests/nemesis/command.py``."""

import sys

from . import main

sys.exit(main())
