"""structlog set-up: human key-value lines on a console, JSON lines for machines."""

from __future__ import annotations

import logging
import sys

FORMATS = ("console", "json")


def configure(fmt: str = "console", level: str = "info") -> None:
    """Route structlog (and stdlib logging, e.g. proton's) to stderr in ``fmt``."""
    import structlog  # here: the CLI reads FORMATS for its options, and a management command needs no structlog

    renderer = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    numeric = getattr(logging, level.upper(), logging.INFO)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
