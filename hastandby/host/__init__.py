"""The node's processes and the OS around it: the supervisor, the virtual IP, the role-change hooks.

``supervisor.py`` and ``supervised.py`` (``serve --supervise``: a parent that
restarts a node that stalls or dies), ``virtual_ip.py`` (the address that
follows the primary), ``role_hooks.py`` (``--on-role-change`` commands).
"""
