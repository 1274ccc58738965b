"""structlog set-up.  Components bind context (bookie_id, ledger_id,
request_id) on their loggers; ``configure`` picks console or JSON output."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def configure(level: str = "info", json: bool = False) -> None:
    """Configure structlog (and stdlib logging) for a process; call once at start."""
    level_no = logging.getLevelName(level.upper())
    if not isinstance(level_no, int):
        raise ValueError(f"unknown log level {level!r}")
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=level_no, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")


def _configure_library_default() -> None:
    """Used as a library (the application configured nothing): send asyncbk's records
    through stdlib ``logging`` under the ``asyncbk`` logger, so they follow the
    application's logging set-up and never write to stdout on their own."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.format_exc_info,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.stdlib.BoundLogger,
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )


def get_logger(**context: Any) -> Any:
    """A structlog logger with ``context`` bound."""
    if not structlog.is_configured():
        _configure_library_default()
    return structlog.get_logger("asyncbk").bind(**context)
