"""What a measured figure depends on besides the code's commit: the host, and the uncommitted changes.

Every benchmark's JSON carries ``host_info()`` (CPUs, memory, load, Python,
platform, the checkout's commit), and those whose nodes run the working tree
compare ``uncommitted_changes()`` at the start and the end of a run (the
nodes run whatever is checked out, not the commit).
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
from typing import Any

import psutil

from hastandby.testing.paths import repo


def host_info() -> dict[str, Any]:
    """What the figures depend on besides the code."""
    try:
        git = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", "HEAD"],
            check=False,
            cwd=repo(),
            capture_output=True,
            text=True,
            timeout=10,
        )
        commit = git.stdout.strip() if git.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        commit = None
    return {
        "cpu_count": os.cpu_count(),
        "cpu_count_physical": psutil.cpu_count(logical=False),
        "memory_total_mb": psutil.virtual_memory().total / 1e6,
        "load_average": os.getloadavg(),
        "python": sys.version,
        "platform": platform.platform(),
        "git_commit": commit,
    }


def uncommitted_changes() -> dict[str, Any]:
    """Uncommitted changes under hastandby/ (the nodes run the working tree, not the commit)."""
    try:
        status = subprocess.run(["git", "status", "--porcelain", "--", "hastandby"], check=False, cwd=repo(),
                                capture_output=True, text=True, timeout=10)
        diff = subprocess.run(["git", "diff", "HEAD", "--", "hastandby"], check=False, cwd=repo(),
                              capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return {"uncommitted": status.stdout.splitlines(), "diff_sha1": hashlib.sha1(diff.stdout).hexdigest()}
