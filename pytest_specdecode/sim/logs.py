"""Log lines in SGLang's style, on stderr, flushed line by line.

SGLang prefixes scheduler lines with the rank (``[2026-11-29 12:00:00 TP0] ...``, with TP > 1)
and main-process lines with the time only (``[2026-11-29 12:00:00] ...``). A launcher reads the
load phase from the log while the server starts, so every record is flushed as it is written.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
SIM_LOGGER = "pytest_specdecode.sim"
SCHEDULER_LOGGER = "pytest_specdecode.sim.scheduler"

main_log = logging.getLogger(SIM_LOGGER)


class _SGLangFormatter(logging.Formatter):
    def __init__(self, rank: bool = True) -> None:
        super().__init__()
        self._rank = rank

    def format(self, record: logging.LogRecord) -> str:
        rank = " TP0" if self._rank and record.name == SCHEDULER_LOGGER else ""
        return f"[{self.formatTime(record, DATE_FORMAT)}{rank}] {record.getMessage()}" + (
            "\n" + self.formatException(record.exc_info) if record.exc_info else ""
        )


def configure_logging(level: str, *, rank: bool = True) -> None:
    """SGLang's format on stderr; ``rank``: prefix scheduler lines with `` TP0`` (SGLang does
    with more than one TP rank; a TP-1 server's lines carry the time only)."""
    handler = logging.StreamHandler(sys.stderr)  # StreamHandler flushes after every record
    handler.setFormatter(_SGLangFormatter(rank))
    logger = logging.getLogger(SIM_LOGGER)
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False


def uvicorn_log_config(level: str) -> dict[str, Any]:
    """uvicorn's own lines (``Uvicorn running on ...``) with SGLang's timestamp prefix."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "default": {
                "()": "uvicorn.logging.DefaultFormatter",
                "fmt": "[%(asctime)s] %(levelprefix)s %(message)s",
                "datefmt": DATE_FORMAT,
                "use_colors": False,
            },
            "access": {
                "()": "uvicorn.logging.AccessFormatter",
                "fmt": '[%(asctime)s] %(levelprefix)s %(client_addr)s - "%(request_line)s" '
                "%(status_code)s",
                "datefmt": DATE_FORMAT,
                "use_colors": False,
            },
        },
        "handlers": {
            "default": {
                "formatter": "default",
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
            },
            "access": {
                "formatter": "access",
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
            },
        },
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": level.upper(), "propagate": False},
            "uvicorn.error": {"level": level.upper()},
            "uvicorn.access": {"handlers": ["access"], "level": level.upper(), "propagate": False},
        },
    }
