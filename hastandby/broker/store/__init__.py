"""What survives a restart: the message journal (its format, replay, files) and the durable wiring."""
