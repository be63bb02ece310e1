"""structlog set-up for every virtbus process: JSON in production, readable in a terminal."""

from __future__ import annotations

import logging
import os
import sys

import structlog


class _TlsEofNoise(logging.Filter):
    """asyncio warns, at the close of every TLS connection, that a protocol's
    `eof_received()` returned true (nats-py's does): noise, not a fault, and never one line
    a person should read."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received()" not in record.getMessage()


_TLS_EOF_NOISE = _TlsEofNoise()


def configure(*, json: bool | None = None, level: str | None = None) -> None:
    """JSON when `VIRTBUS_LOG_FORMAT=json` or stderr is not a terminal, else console lines."""
    logging.getLogger("asyncio").addFilter(_TLS_EOF_NOISE)
    fmt = os.environ.get("VIRTBUS_LOG_FORMAT", "")
    if json is None:
        json = fmt == "json" or (fmt != "console" and not sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    )
    name = (level or os.environ.get("VIRTBUS_LOG_LEVEL", "info")).upper()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, name, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
