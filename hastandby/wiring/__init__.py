"""Configuration replication: queues, exchanges and bindings, from primary to backups.

``events`` is the wire vocabulary (a snapshot message and change events, as
plain maps) and decides which objects are replicated; ``publisher`` runs on the
primary and emits the snapshot then every change of a registry;
``reconcile`` runs on a backup and applies them to its registry.  All of it is
pure logic over ``hastandby.broker.registry.Registry``: the links that carry
the messages live elsewhere.
"""
