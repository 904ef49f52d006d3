"""What a log line is about, where the code knows it: the chat session and the delegated task.

`bound(session_id=..., task_id=...)` sets them for the code inside it (a context variable: each asyncio
task has its own copy, so a turn's lines carry its session and nobody else's); `JsonLogFormatter` writes
them into each record, with the time, level, logger and message, one JSON object per line
(`LOG_FORMAT=json`, docs/ARCHITECTURE.md, "Logs").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

_context: ContextVar[dict[str, str]] = ContextVar("log_context", default={})  # noqa: B039 (never mutated)


@contextmanager
def bound(**ids: str | None) -> Iterator[None]:
    """Lines logged inside carry these ids (those given and not None), besides any bound around it."""
    token = _context.set({**_context.get(), **{k: v for k, v in ids.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def current() -> dict[str, str]:
    """The ids bound where this runs."""
    return dict(_context.get())


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, the bound ids, the error."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON (a traceback, when there is one, as the `error` field)."""
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_context.get(),
        }
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)
