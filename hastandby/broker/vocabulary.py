"""Names and values the broker shares with its clients (the CLI, the management client, ``verify``).

Kept apart so that a client imports them without the broker: ``hastandby``'s
management commands run as one short process each, and importing the
registry (with structlog and the queue kinds) for three constants was most
of a command's start-up.
"""

from __future__ import annotations

from proton import symbol

MANAGEMENT_ADDRESS = "$management"
IDS_PAGE = 10_000  # messages per IDS reply unless asked for fewer
LEVELS = ("none", "configuration", "all")  # qpid.replicate levels
ADMIN_PROPERTY = symbol("qpid.ha-admin")  # the connection property of an admin that may use a backup
