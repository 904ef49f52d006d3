"""Small asyncio helpers every part of `core` may use (the bottom of the layering, docs/ARCHITECTURE.md)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel `task` (if there is one) and wait until it has ended; its cancellation is not raised here."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
