r"""How text that came from outside goes into a log line: short, on one line, without terminal codes.

An agent, a client or a fetched document can put anything in the text we log: `\r` and `\n` that
start what looks like a log line of our own, ANSI colour codes that rewrite the operator's terminal,
or 100 KB in one id. `loggable` keeps the first `limit` characters and writes every control or
other non-printable character as an escape (`\r`, `\x1b`, `\u2028`); letters of every script stay.
"""

from __future__ import annotations

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


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
