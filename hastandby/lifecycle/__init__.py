"""The node's life as a pure state table: connecting -> catchup -> backup -> primary, and standalone.

``states.py`` is the table (every transition and its actions), ``effects.py``
its one interpreter, ``promotion.py`` an operator's promotion decided over
the cluster's state.  Nothing here does I/O; see docs/lifecycle.md.
"""
