"""Limits on what is read from outside: body sizes, and JSON nesting. No dependencies, so every edge can use it.

`read_capped` reads a body (a request's, or a fetched response's) as a stream and gives up as
soon as it is known to be larger than allowed, by its Content-Length or while reading: a huge
body never sits in memory whole.

Python's `json` parser recurses once per level, so a few thousand `[` exhaust the stack
(`RecursionError`), and code that walks what was parsed recurses too. No message of ours nests
anywhere near `MAX_JSON_NESTING`; deeper input is refused as a parse error.

Python also refuses to read an integer of more than `sys.get_int_max_str_digits()` digits (4300),
and `json` lets that `ValueError` through with advice for the server's programmer; `json_error`
says instead what is wrong in words for whoever sent it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from typing import Any

MAX_JSON_NESTING = 64


def json_nesting(value: Any) -> int:
    """How deep lists and objects nest in parsed JSON (without recursion); stops past `MAX_JSON_NESTING`."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if depth > MAX_JSON_NESTING:
                return depth
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def json_error(exc: ValueError) -> str:
    """What is wrong with the text `json.loads` refused with `exc`: where the mistake is, or the number too long."""
    if isinstance(exc, json.JSONDecodeError):
        return str(exc)
    return f"a number has more than {sys.get_int_max_str_digits()} digits"  # int()'s refusal, the only other one


async def read_capped(chunks: AsyncIterator[bytes], limit: int, declared_length: str | None = None) -> bytes | None:
    """The whole body, or None once it is known to exceed `limit` bytes (by its declared length, or while reading)."""
    if declared_length is not None and declared_length.isdigit() and int(declared_length) > limit:
        return None
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)
