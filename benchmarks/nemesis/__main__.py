"""``python -m benchmarks.nemesis``: see ``benchmarks/nemesis/command.py``."""

import sys

from . import main

sys.exit(main())
