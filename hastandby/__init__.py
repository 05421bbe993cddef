"""hastandby: a hot-standby AMQP 1.0 broker cluster.

Layers (imports point downwards only): ``cli`` -> ``lifecycle`` -> ``browser`` /
``wiring`` -> ``broker``.  The broker core knows nothing of HA; HA plugs in
through the observer, completion and admission hooks the core exposes.
"""

__version__ = "0.1.0"
