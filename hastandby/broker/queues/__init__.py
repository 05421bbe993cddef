"""Queues and routing: queues and their kinds, scheduled delivery, exchanges, the registry, replication ids."""
