"""hastandby: a hot-standby AMQP 1.0 broker cluster.

Layers, lowest first (imports point downwards only; tests/unit/test_layers.py
checks it, docs/architecture.md draws it): ``settings`` and ``files`` ->
``security`` -> ``broker`` -> ``replication`` -> ``node`` -> ``lifecycle``
(the pure state table) -> ``election`` -> ``host`` -> ``ha`` (hot standby)
beside ``dr`` -> ``cli``.  The broker core knows nothing of HA; HA plugs in
through the hooks, observers and completions the core exposes.
"""

__version__ = "0.1.0"
