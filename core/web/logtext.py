r"""How text that came from outside goes into a log line: short, on one line, without terminal codes.

An agent, a client or a fetched document can put anything in the text we log: `\r` and `\n` that
start what looks like a log line of our own, ANSI colour codes that rewrite the operator's terminal,
or 100 KB in one id. `loggable` keeps the first `limit` characters and writes every control or
other non-printable character as an escape (`\r`, `\x1b`, `\u2028`); letters of every script stay.
"""

from __future__ import annotations

import logging

DEFAULT_LIMIT = 200
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def loggable(value: object, limit: int = DEFAULT_LIMIT) -> str:
    """`str(value)` shortened to `limit` characters (saying how many were cut), with control characters escaped."""
    text = value if isinstance(value, str) else str(value)
    cut = len(text) - limit
    if cut > 0:
        text = text[:limit]
    escaped = "".join(ch if ch.isprintable() else _NAMED.get(ch) or _escape(ch) for ch in text)
    return f"{escaped}… (+{cut} characters)" if cut > 0 else escaped


def without_password(url: str | None) -> str:
    """A server URL as it may be logged: `redis://:secret@host:6379/0` → `redis://***@host:6379/0`."""
    if not url:
        return "none"
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    if sep and "@" in authority:
        authority = "***@" + authority.rpartition("@")[2]
    return f"{scheme}{sep}{authority}{slash}{path}"


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


# The a2a-sdk logs a request that fails validation at ERROR with a traceback, as if it were a fault of
# ours. Its dispatcher then logs the error it answers as one WARNING line ("Request Error ..."), so
# there the first record is dropped; its v0.3 adapter does not, so there the record is shortened.
# Records are known by their message: what failed is the client's request, whatever the exception.
SDK_CLIENT_FAULTS = {
    "a2a.server.routes.jsonrpc_dispatcher": (
        {"Failed to parse request params", "Failed to validate base JSON-RPC request"},
        True,
    ),
    "a2a.compat.v0_3.jsonrpc_adapter": ({"Failed to validate base JSON-RPC request for v0.3"}, False),
}


class ClientFaultFilter(logging.Filter):
    """A logged client fault becomes one WARNING line without a traceback, or nothing.

    Args:
        messages: the log messages (format strings) that report a bad request.
        drop: drop those records instead (the logger reports the answer to the client anyway).
    """

    def __init__(self, messages: set[str], *, drop: bool = False) -> None:
        super().__init__()
        self.messages = frozenset(messages)
        self.drop = drop

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep the record (shortened) or drop it, when it reports a bad request rather than a fault of ours."""
        if record.msg not in self.messages:
            return True
        if self.drop:
            return False
        exc = record.exc_info[1] if record.exc_info else None
        detail = f": {loggable(type(exc).__name__ + ': ' + str(exc), 300)}" if exc is not None else ""
        record.msg, record.args = f"{record.getMessage()}{detail}", None
        record.exc_info = record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def install_client_fault_filter() -> None:
    """Attach a `ClientFaultFilter` to each a2a-sdk logger that reports bad requests."""
    for name, (messages, drop) in SDK_CLIENT_FAULTS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, ClientFaultFilter) for f in logger.filters):
            logger.addFilter(ClientFaultFilter(messages, drop=drop))


# Library records that are detail, not news: logged at INFO by their library, demoted to DEBUG here
# (issue 14: the a2a-sdk logs a whole agent card at INFO each time it fetches one).
SDK_DEBUG_DETAIL: dict[str, set[str]] = {
    "a2a.client.card_resolver": {"Successfully fetched agent card data from %s: %s"},
}


class DemoteToDebugFilter(logging.Filter):
    """A record with one of `messages` becomes DEBUG: kept only when its logger is enabled for DEBUG."""

    def __init__(self, messages: set[str]) -> None:
        super().__init__()
        self.messages = frozenset(messages)

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep other records; demote these, and drop them unless DEBUG is on for their logger."""
        if record.msg not in self.messages:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def install_debug_detail_filter() -> None:
    """Attach a `DemoteToDebugFilter` to each library logger of `SDK_DEBUG_DETAIL`."""
    for name, messages in SDK_DEBUG_DETAIL.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, DemoteToDebugFilter) for f in logger.filters):
            logger.addFilter(DemoteToDebugFilter(messages))
