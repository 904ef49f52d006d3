"""Small asyncio helpers every part of `core` may use (the bottom of the layering, docs/ARCHITECTURE.md)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel `task` (if there is one) and wait until it has ended; its cancellation is not raised here."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


class ReadyBatches(Generic[T]):
    """Batches from an async iterator: wait for one item, then take every further one that is ready now.

    `async for` over the source takes one item per step, which would cost one
    write per event. `async for batch in ReadyBatches(source, limit)` steps the
    source's `__anext__()` coroutine by hand: when it finishes without
    suspending, its item was ready; when it suspends (nothing queued), the
    half-run step is parked and the next batch awaits it to completion, exactly
    as a task would have. The end of the source, or its error, is raised by the
    step after the items that came before it.
    """

    __slots__ = ("_source", "_limit", "_parked", "_error")

    def __init__(self, source: AsyncIterator[T], limit: int) -> None:
        self._source = source
        self._limit = limit
        self._parked: tuple[Any, Any] | None = None  # (the suspended __anext__ coroutine, what it yielded)
        self._error: BaseException | None = None

    def __aiter__(self) -> ReadyBatches[T]:
        return self

    async def __anext__(self) -> list[T]:
        """The next batch: at least one item, then as many more (up to the limit) as are ready now."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self._parked is None:
            items = [await self._source.__anext__()]
        else:
            coro, yielded = self._parked
            self._parked = None
            items = [await finish_step(coro, yielded)]
        while len(items) < self._limit:
            # An async generator's `__anext__` is an awaitable with `send` (not typed so): stepped by hand.
            step: Any = self._source.__anext__()
            try:
                yielded = step.send(None)
            except StopIteration as done:
                items.append(done.value)
                continue
            except Exception as exc:  # StopAsyncIteration, SubscriberOverflowError, ...
                self._error = exc
                break
            self._parked = (step, yielded)
            break
        return items

    def close(self) -> None:
        """Abandon a parked step (its cleanup runs now)."""
        if self._parked is not None:
            coro, _ = self._parked
            self._parked = None
            coro.close()


async def finish_step(coro: Any, yielded: Any) -> Any:
    """Drive a coroutine that suspended on `yielded` to its end, as asyncio's Task would; its result."""
    while True:
        try:
            if yielded is None:  # a bare `yield` (asyncio.sleep(0)): give the loop one turn
                await asyncio.sleep(0)
            else:
                # What Task does with a future it is handed: it takes over the "blocking" flag.
                yielded._asyncio_future_blocking = False
                await yielded
        except BaseException as exc:  # cancellation, or the future's error: the coroutine handles it
            try:
                yielded = coro.throw(exc)
            except StopIteration as done:
                return done.value
            continue
        try:
            yielded = coro.send(None)
        except StopIteration as done:
            return done.value
