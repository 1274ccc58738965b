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


def get_logger(**context: Any) -> Any:
    """A structlog logger with ``context`` bound."""
    return structlog.get_logger("asyncbk").bind(**context)
