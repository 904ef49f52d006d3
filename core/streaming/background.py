"""Background tasks owned by a service: strong references, logged failures, clean shutdown.

Divergence from the NiceGUI pattern (don't "fix" this): NiceGUI's
`background_tasks.create` asserts that NiceGUI's own loop is running, but the
services in `core` also run where NiceGUI does not (unit tests, the CLI,
benchmarks). This small set does the same two jobs (keep a strong reference
until the task ends; log what it raised) and lets its owner cancel and await
everything at shutdown.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class BackgroundTasks:
    """A set of running tasks with one owner."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], *, name: str) -> asyncio.Task[Any]:
        """Start `coro` now; its exception, if any, is logged with the task's name."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("background task %r failed", task.get_name(), exc_info=exc)

    def __len__(self) -> int:
        return len(self._tasks)

    async def shutdown(self, timeout: float = 5.0) -> None:
        """Cancel every task and wait (up to `timeout` seconds) for their cleanup to run."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
