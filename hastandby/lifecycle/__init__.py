"""The node's life as a pure state table: connecting -> catchup -> backup -> primary, and standalone.

``states.py`` is the table (every transition and its actions), ``effects.py``
its one interpreter, ``standing.py`` the rules beside it that decide the
node's state too (which refusals halt it, when it holds data, admits clients,
and what its primary's word on it fires), ``promotion.py`` an operator's
promotion decided over the cluster's state.  Nothing here does I/O; see
docs/lifecycle.md.
"""
