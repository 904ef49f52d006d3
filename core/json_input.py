"""Limits on JSON read from outside (broker lines, JSON-RPC bodies); no dependencies, so every edge can use it.

Python's `json` parser recurses once per level, so a few thousand `[` exhaust the stack
(`RecursionError`), and code that walks what was parsed recurses too. No message of ours nests
anywhere near `MAX_JSON_NESTING`; deeper input is refused as a parse error.
"""

from __future__ import annotations

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
