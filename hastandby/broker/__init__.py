"""The message broker, which knows nothing of replication.

``server.py`` (the AMQP node's events), ``links.py`` (producers' and
consumers' links), ``management.py`` (the management address), ``errors.py``
and ``vocabulary.py`` sit at the top; the rest is one sub-package per
concern: ``transport/``, ``queues/``, ``store/``, ``message/``,
``admission/``.
"""
