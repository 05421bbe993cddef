"""What hot standby and DR replication share: the codec, the batching link, guards, the subscription.

A replicating link carries every message of one queue to one peer that
stores it and says so.  Hot standby (``ha/``: a primary and its backups)
and DR replication (``dr/``: a source and its replica sites) both build their
links from the parts here:

- ``codec``: the wire form of batches, dequeues, id sets and control maps,
  checked at the boundary (``ProtocolError``);
- ``batching.BatchingLink``: an outgoing link that sends a queue's messages
  a batch per delivery and learns which ones the peer stored;
- ``guard.QueueGuard``: holds producers' acknowledgements until one peer has
  their messages;
- ``subscription.ReplicatingSubscription``: a batching link that also sends
  dequeues and runs the id-set catch-up.

Neither ``ha/`` nor ``dr/`` imports the other; both import this package,
and this package imports only ``broker/`` (``tests/unit/test_layers.py``).
"""
