"""What the node lets a client do and take: authority, resource limits, the memory alarm, backlog, the fence."""
