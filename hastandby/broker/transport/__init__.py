"""Bytes between sockets and proton: the driver (reactor), handshakes, outgoing connections, peers' input."""
