"""A message as bytes: the few sections and values the broker reads without decoding the whole message."""
